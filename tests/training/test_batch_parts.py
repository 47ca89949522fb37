"""train.batch_parts: a batch trained in length-sorted parts takes the whole batch's step."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest
import torch

from seqrec.batch import BatchNeeds, SeqBatch
from seqrec.cli import main
from seqrec.config import ConfigError, TrainConfig
from seqrec.data.batches import TrainBatches
from seqrec.data.sequences import Sequences
from seqrec.models import build_model, build_model_config
from seqrec.training.loop import train_one_epoch
from tests.cli.helpers import losses, tiny_raw, write_yaml

NUM_ITEMS = 30


def histories(seed: int = 0) -> Sequences:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(2, 25, size=23)
    return Sequences.from_lists([rng.integers(1, NUM_ITEMS + 1, n).tolist() for n in lengths])


def batches(parts: int, batch_size: int = 10, needs: BatchNeeds | None = None) -> TrainBatches:
    sequences = histories()
    users = np.arange(len(sequences.lengths), dtype=np.int64)
    return TrainBatches(
        sequences, users, NUM_ITEMS, 16, batch_size, needs=needs or BatchNeeds(), parts=parts
    )


def rows_of(batch: SeqBatch) -> list[int]:
    assert batch.users is not None
    return batch.users.tolist()


def test_parts_hold_the_batch_rows_sorted_by_length_each_padded_to_its_own() -> None:
    whole = list(batches(parts=1).steps(np.random.default_rng(3)))
    split = list(batches(parts=3).steps(np.random.default_rng(3)))
    assert len(whole) == len(split) == 3  # 23 users in batches of 10
    lengths = histories().lengths
    for (batch,), parts in zip(whole, split, strict=True):
        assert len(parts) == 3
        assert sorted(rows_of(batch)) == sorted(r for p in parts for r in rows_of(p))
        assert sum(p.num_targets for p in parts) == batch.num_targets
        part_lengths = [lengths[rows_of(p)] for p in parts]
        for shorter, longer in itertools.pairwise(part_lengths):
            assert shorter.max() <= longer.min()
        for part, part_length in zip(parts, part_lengths, strict=True):
            assert part.input_ids.size(1) == min(int(part_length.max()) - 1, 16)
        assert sum(p.input_ids.numel() for p in parts) < batch.input_ids.numel()


def test_a_batch_smaller_than_the_parts_is_not_split_into_empty_parts() -> None:
    steps = list(batches(parts=4, batch_size=5).steps(np.random.default_rng(0)))
    assert [len(step) for step in steps] == [4, 4, 4, 4, 3]  # the last batch has 3 users
    assert all(len(rows_of(part)) >= 1 for step in steps for part in step)


SASREC = {"name": "sasrec", "hidden_size": 16, "max_seq_len": 16, "dropout": 0.0}
RECREC = {
    **SASREC,
    "name": "recrec",
    "num_interests": 3,
    "compressor_dropout": 0.0,
    "compressor_layers": 1,
}

# RecRec's stage 2 stepping after each of its 3 supervision rounds: in parts, every step
# accumulates all parts' losses of its round
STAGE_2_ROUNDS: dict[str, object] = {
    "stage": 2,
    "rounds": 3,
    "steps_per_round": 2,
    "inner_steps": 1,
    "supervision_updates": "round",
}


@pytest.mark.parametrize(
    "section",
    [
        {**SASREC, "loss": "ce"},
        {**SASREC, "loss": "bce"},
        RECREC,
        {**RECREC, "stage": 2, "rounds": 2, "steps_per_round": 2, "inner_steps": 1},
        {**RECREC, **STAGE_2_ROUNDS},
        {**RECREC, "train_positions": "last"},
        {"name": "bert4rec", "hidden_size": 16, "max_seq_len": 16, "dropout": 0.0,
         "last_item_mask_prob": 1.0},
        {"name": "caser", "hidden_size": 16, "max_seq_len": 16, "dropout": 0.0},
        {"name": "bpr", "hidden_size": 16},
    ],
    ids=[
        "sasrec-ce",
        "sasrec-bce",
        "recrec-stage1",
        "recrec-stage2",
        "recrec-stage2-rounds",
        "recrec-newest-positions",
        "bert4rec",
        "caser",
        "bpr",
    ],
)  # fmt: skip
def test_one_step_in_parts_equals_the_whole_batch_step(section: dict[str, object]) -> None:
    """Same rows, no dropout: the updated weights agree (BCE with the whole batch's
    negatives given to the parts, since the sampler draws them in another order). BERT4Rec
    masks each row's newest item only, so that the parts draw the same masks; it, Caser,
    BPR and RecRec on its newest positions average their losses over other positions than
    the batch's labelled ones (``ModelOutput.num_targets``)."""
    config = build_model_config(section, num_items=NUM_ITEMS, num_users=len(histories().lengths))
    assert config.loss_splits_by_rows
    (whole,) = next(batches(1, needs=config.batch_needs).steps(np.random.default_rng(5)))
    order = torch.argsort(torch.tensor(histories().lengths)[whole.users], stable=True)
    pieces = [order[:4], order[4:7], order[7:]]
    parts = [
        SeqBatch(
            input_ids=whole.input_ids[p],
            labels=whole.labels[p] if whole.labels is not None else None,
            negatives=whole.negatives[p] if whole.negatives is not None else None,
            users=whole.users[p] if whole.users is not None else None,
        )
        for p in pieces
    ]
    results = []
    for step in ([whole], parts):
        torch.manual_seed(0)
        model = build_model(config)
        optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
        stats = train_one_epoch(model, [step], optimizer, device=torch.device("cpu"))
        results.append((stats, model.state_dict()))
    (stats_whole, weights_whole), (stats_parts, weights_parts) = results
    assert stats_parts.targets == stats_whole.targets
    assert stats_parts.loss == pytest.approx(stats_whole.loss, rel=1e-5)
    for name, value in weights_whole.items():
        torch.testing.assert_close(weights_parts[name], value, rtol=1e-5, atol=1e-6, msg=name)
    torch.manual_seed(0)
    untouched = build_model(config).state_dict()
    assert any(not torch.equal(weights_whole[name], value) for name, value in untouched.items())


def test_parts_must_fit_the_batch() -> None:
    with pytest.raises(ConfigError, match=r"train.batch_parts must be in \[1, batch_size = 8\]"):
        TrainConfig(batch_size=8, batch_parts=9)
    with pytest.raises(ConfigError, match="train.batch_parts"):
        TrainConfig(batch_parts=0)


def test_a_loss_that_couples_rows_refuses_parts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    raw = tiny_raw()
    raw["model"] = {"name": "duorec", "hidden_size": 16, "num_heads": 1}
    raw["train"] = {**raw["train"], "batch_parts": 2}
    config = write_yaml(tmp_path / "duorec.yaml", raw)
    assert main(["train", "--config", str(config), "--out", str(tmp_path / "run")]) != 0
    assert "train.batch_parts needs a loss that splits by rows" in capsys.readouterr().err


def test_training_in_parts_through_the_cli(tmp_path: Path) -> None:
    raw = tiny_raw()
    raw["train"] = {**raw["train"], "batch_parts": 4}
    config = write_yaml(tmp_path / "parts.yaml", raw)
    assert main(["train", "--config", str(config), "--out", str(tmp_path / "run")]) == 0
    assert len(losses(tmp_path / "run")) == 3
    assert all(np.isfinite(losses(tmp_path / "run")))
