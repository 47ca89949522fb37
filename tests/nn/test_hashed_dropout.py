"""Hash-keyed dropout masks (``seqrec.nn.hashed_dropout``): the compiled pass against the
PyTorch reference, and the statistics a dropout mask must have."""

from __future__ import annotations

import pytest
import torch

from seqrec.nn import hashed_dropout
from seqrec.nn.hashed_dropout import (
    hashed_dropout_,
    hashed_keep_scale,
    hashed_mask,
    stream_key,
)


@pytest.mark.parametrize("shape", [(1,), (7, 13), (3, 5, 129)])
@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_in_place_dropout_multiplies_by_the_reference_mask(
    shape: tuple[int, ...], p: float
) -> None:
    assert hashed_dropout._dropout_kernel() is not None, "the dev environment has numba"
    x = torch.randn(shape, generator=torch.Generator().manual_seed(0))
    key = stream_key(123, 4, 1)
    dropped = hashed_dropout_(x.clone(), key, p)
    assert torch.equal(dropped, x * hashed_mask(key, shape, p))


def test_without_numba_the_reference_mask_is_applied(monkeypatch: pytest.MonkeyPatch) -> None:
    x = torch.randn(40, 9, generator=torch.Generator().manual_seed(1))
    key = stream_key(7, 0, 0)
    compiled = hashed_dropout_(x.clone(), key, 0.3)
    monkeypatch.setattr(hashed_dropout, "_dropout_kernel", lambda: None)
    assert torch.equal(hashed_dropout_(x.clone(), key, 0.3), compiled)


@pytest.mark.parametrize("p", [0.05, 0.2, 0.5])
def test_mask_keeps_one_minus_p_and_preserves_the_mean(p: float) -> None:
    n = 200_000
    mask = hashed_mask(stream_key(99, 2, 0), (n,), p)
    kept = mask > 0
    values = mask.unique()
    assert values.numel() == 2
    assert values[0] == 0.0
    assert values[1].item() == pytest.approx(hashed_keep_scale(p))
    tolerance = 4 * (p * (1 - p) / n) ** 0.5  # four standard deviations
    assert abs(kept.float().mean().item() - (1 - p)) < tolerance
    assert abs(mask.double().mean().item() - 1.0) < tolerance / (1 - p)
    # Neighbouring elements are not correlated: pairs keep together as often as chance says.
    together = (kept[1:] & kept[:-1]).float().mean().item()
    assert abs(together - (1 - p) ** 2) < 4 * tolerance


def test_masks_of_different_keys_are_independent() -> None:
    p, n = 0.5, 100_000
    keys = [stream_key(5, index, stream) for index in range(3) for stream in range(2)]
    assert len(set(keys)) == len(keys)
    masks = [hashed_mask(key, (n,), p) > 0 for key in keys]
    for i in range(len(masks)):
        for j in range(i + 1, len(masks)):
            agreement = (masks[i] == masks[j]).float().mean().item()
            assert abs(agreement - 0.5) < 0.01, (i, j)


def test_stream_key_depends_on_every_argument_and_rejects_negatives() -> None:
    seed = 2**40 + 3
    base = stream_key(seed, 1, 0)
    assert stream_key(seed, 1, 0) == base
    others = [stream_key(3, 1, 0), stream_key(seed, 2, 0), stream_key(seed, 1, 1)]
    assert len({base, *others}) == 4
    assert 0 <= base < 2**32
    with pytest.raises(ValueError, match=">= 0"):
        stream_key(-1, 0, 0)


def test_bad_probability_and_tensor_are_refused() -> None:
    with pytest.raises(ValueError, match=r"\[0, 1\)"):
        hashed_mask(1, (4,), 1.0)
    with pytest.raises(ValueError, match="contiguous float32"):
        hashed_dropout_(torch.zeros(4, 4).T, 1, 0.5)
    with pytest.raises(ValueError, match="contiguous float32"):
        hashed_dropout_(torch.zeros(4, dtype=torch.float64), 1, 0.5)
    x = torch.randn(3)
    assert hashed_dropout_(x, 1, 0.0) is x
