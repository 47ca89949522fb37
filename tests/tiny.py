"""Tiny, distinct, non-power-of-two sizes: a swapped dimension fails loudly."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from seqrec.models import SequentialRecommender, build_model, build_model_config

B, L, S, NUM_ITEMS, NUM_USERS = 3, 7, 5, 37, 4

BASE = {"num_items": NUM_ITEMS, "num_users": NUM_USERS, "max_seq_len": L}

TINY_TIGER = {  # 4 * 5 * 2 = 40 code paths for 37 items
    "codebook_sizes": (4, 5, 2),
    "hidden_size": 18,
    "num_heads": 2,
    "head_size": 7,
    "ffn_size": 29,
    "num_encoder_layers": 2,
    "num_decoder_layers": 2,
    "user_buckets": 3,
    "beam_size": 6,
}

TINY_CONFIGS: dict[str, dict[str, object]] = {  # one line per registered model
    "bert4rec": {**BASE, "hidden_size": 18, "num_heads": 2, "ffn_size": 29, "mask_prob": 0.6},
    "bpr": {**BASE, "hidden_size": 18, "num_negatives": S},
    "caser": {**BASE, "hidden_size": 18, "window": 3, "num_horizontal": 5, "num_negatives": S},
    "duorec": {**BASE, "hidden_size": 18, "num_heads": 2, "ffn_size": 29, "dropout": 0.1},
    "fism": {**BASE, "hidden_size": 18, "num_negatives": S},
    "fmc": {**BASE, "hidden_size": 18, "num_negatives": S},
    "fpmc": {**BASE, "hidden_size": 18, "num_negatives": S},
    "gru4rec": {**BASE, "hidden_size": 18, "num_negatives": S, "dropout": 0.1},
    "gsasrec": {**BASE, "hidden_size": 18, "num_heads": 2, "num_negatives": S, "dropout": 0.1},
    "mamba4rec": {**BASE, "hidden_size": 18, "state_size": 5, "conv_kernel": 3, "dropout": 0.1},
    "pop": {**BASE},
    "rearec": {**BASE, "hidden_size": 18, "num_heads": 2, "dropout": 0.1, "reasoning_steps": 2},
    "recrec": {**BASE, "hidden_size": 18, "num_heads": 2, "num_interests": 3, "ffn_size": 29},
    "sasrec": {**BASE, "hidden_size": 18, "num_heads": 2, "num_negatives": S, "dropout": 0.1},
    "tiger": {**BASE, **TINY_TIGER},
    "transrec": {**BASE, "hidden_size": 18, "num_negatives": S},
    "trierec": {**BASE, **TINY_TIGER},
}

# The dataset registry the foundation issue asks for (`seqrec data list`).
REQUIRED_DATASETS = [
    "ml-1m",
    "ml-100k",
    "amazon-beauty",
    "amazon-sports",
    "amazon-toys",
    "amazon-video-games",
    "yelp",
    "lastfm",
    "steam",
    "synthetic",
]


def tiny_model(name: str, **changes: object) -> SequentialRecommender:
    """The registered model ``name`` at its tiny size, ``changes`` applied to its config."""
    values = {k: v for k, v in TINY_CONFIGS[name].items() if k not in ("num_items", "num_users")}
    config = build_model_config(
        {"name": name, **values, **changes}, num_items=NUM_ITEMS, num_users=NUM_USERS
    )
    return build_model(config)


def assert_causal(encode: Callable[[Tensor], Tensor], rows: int = B, width: int = L) -> None:
    """For every t, another item at every position >= t of unpadded random histories moves
    none of ``encode``'s (rows, width, ...) outputs before t, in any row, and does move some
    at or after t in every row (so the check is not vacuous)."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, NUM_ITEMS + 1, (rows, width), generator=g)
    before = encode(ids)
    for t in range(1, width):
        changed = ids.clone()
        changed[:, t:] = ids[:, t:] % NUM_ITEMS + 1  # another item at each future position
        after = encode(changed)
        torch.testing.assert_close(after[:, :t], before[:, :t], msg=f"t={t}")
        moved = (after[:, t:] - before[:, t:]).abs().flatten(1).amax(dim=1)  # (rows,)
        assert (moved > 1e-3).all(), f"t={t}: the future itself did not change in every row"
