"""RQ-VAE: learns to reconstruct, levels refine, seeded, saves and loads, resets dead codes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from seqrec.tokenizers.rqvae import RQVAE, RQVAEConfig
from tests.tokenizers.conftest import clustered

SMALL = RQVAEConfig(
    input_dim=12,
    hidden_sizes=(24,),
    latent_dim=6,
    num_levels=3,
    codebook_size=6,
    epochs=30,
    lr=0.1,
    batch_size=256,
    kmeans_iters=10,
)


@pytest.fixture(scope="module")
def fitted() -> tuple[RQVAE, np.ndarray, np.ndarray]:
    x, labels = clustered()
    return RQVAE(SMALL).fit(x), x, labels


def test_reconstruction_beats_the_mean_and_levels_refine(fitted) -> None:  # type: ignore[no-untyped-def]
    model, x, labels = fitted
    codes = model.transform(x)
    assert codes.shape == (600, 3)
    assert codes.dtype == np.int64
    baseline = float(np.mean((x - x.mean(0)) ** 2))
    errors = [float(np.mean((model.decode(codes, levels) - x) ** 2)) for levels in (1, 3)]
    assert errors[1] < baseline / 10
    assert errors[1] < errors[0]
    # Clusters are the main structure: each cluster gets (almost) one first-level code.
    purity = sum(np.bincount(codes[labels == k, 0]).max() for k in range(6)) / len(x)
    assert purity > 0.9


def test_seeded_fits_are_identical() -> None:
    x, _ = clustered(n=300)
    config = RQVAEConfig(**{**SMALL.__dict__, "epochs": 5})
    a, b = RQVAE(config).fit(x), RQVAE(config).fit(x)
    np.testing.assert_array_equal(a.transform(x), b.transform(x))
    for (name, p), q in zip(a.state_dict().items(), b.state_dict().values(), strict=True):
        assert torch.equal(p, q), name


def test_save_load_round_trip(fitted, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    model, x, _ = fitted
    model.save(tmp_path / "tokenizer.pt")
    loaded = RQVAE.load(tmp_path / "tokenizer.pt")
    assert loaded.config == SMALL
    np.testing.assert_array_equal(loaded.transform(x), model.transform(x))
    np.testing.assert_allclose(loaded.decode(model.transform(x)), model.decode(model.transform(x)))


def test_straight_through_gradient_reaches_the_encoder() -> None:
    x, _ = clustered(n=64)
    model = RQVAE(SMALL)
    model.init_codebooks(torch.as_tensor(x), torch.Generator().manual_seed(0))
    loss, _recon, codes = model(torch.as_tensor(x))
    loss.backward()
    assert codes.shape == (64, 3)
    first = model.encoder[0].weight.grad
    assert first is not None
    assert first.abs().sum() > 0
    assert model.codebooks.grad is not None
    assert model.codebooks.grad.abs().sum() > 0


def test_dead_codes_are_reset_from_residuals() -> None:
    model = RQVAE(SMALL)
    used = torch.ones(3, 6, dtype=torch.bool)
    used[1, 2] = False
    residuals = [torch.full((4, 6), float(level + 1)) for level in range(3)]
    before = model.codebooks.detach().clone()
    model._reset_dead_codes(used, residuals, torch.Generator().manual_seed(0))
    after = model.codebooks.detach()
    assert torch.equal(after[1, 2], torch.full((6,), 2.0))
    changed = (after != before).any(-1)
    assert changed.sum() == 1
    assert changed[1, 2]


def test_unfitted_and_too_few_items_are_errors() -> None:
    with pytest.raises(RuntimeError, match="not fitted"):
        RQVAE(SMALL).transform(np.zeros((3, 12), dtype=np.float32))
    with pytest.raises(ValueError, match="needs >= that many items"):
        RQVAE(SMALL).fit(np.zeros((5, 12), dtype=np.float32))
