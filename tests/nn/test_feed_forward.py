"""The chunked feed-forward block (``seqrec.nn.feed_forward``) against the same operations
run by autograd, with the dropout masks it draws."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor

from seqrec.nn.feed_forward import (
    INNER_MASK,
    OUTER_MASK,
    fused_ffn_applies,
    gelu_ffn_residual,
)
from seqrec.nn.hashed_dropout import hashed_mask, stream_key

WIDTH, INNER = 6, 24


def weights() -> list[Tensor]:
    g = torch.Generator().manual_seed(1)
    shapes = [(INNER, WIDTH), (INNER,), (WIDTH, INNER), (WIDTH,)]
    return [(torch.randn(*shape, generator=g) * 0.5).requires_grad_() for shape in shapes]


def reference(x: Tensor, params: list[Tensor], p: float, seed: int, chunk: int) -> Tensor:
    """The block op by op, with the masks the fused function draws for each chunk."""
    w1, b1, w2, b2 = params
    flat = x.reshape(-1, WIDTH)
    parts = []
    for index, start in enumerate(range(0, flat.size(0), chunk)):
        x_c = flat[start : start + chunk]
        hidden = F.gelu(x_c @ w1.T + b1)
        if p > 0:
            hidden = hidden * hashed_mask(stream_key(seed, index, INNER_MASK), hidden.shape, p)
        mixed = hidden @ w2.T + b2
        if p > 0:
            mixed = mixed * hashed_mask(stream_key(seed, index, OUTER_MASK), mixed.shape, p)
        parts.append(x_c + mixed)
    return torch.cat(parts).view_as(x)


def grads(out: Tensor, inputs: list[Tensor]) -> list[Tensor]:
    upstream = torch.randn(out.shape, generator=torch.Generator().manual_seed(3))
    return list(torch.autograd.grad((out * upstream).sum(), inputs))


@pytest.mark.parametrize("chunk", [1, 7, 10**6])
@pytest.mark.parametrize("p", [0.0, 0.3])
def test_fused_ffn_matches_autograd_with_the_same_masks(chunk: int, p: float) -> None:
    x = torch.randn(3, 11, WIDTH, generator=torch.Generator().manual_seed(2)).requires_grad_()
    params = weights()
    torch.manual_seed(5)
    actual = gelu_ffn_residual(x, *params, p=p, training=True, chunk_positions=chunk)
    torch.manual_seed(5)  # the seed the function drew from torch's generator
    seed = int(torch.randint(0, 2**62, ()).item()) if p > 0 else 0
    expected = reference(x, params, p, seed, chunk)
    torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-6)
    names = ["x", "w1", "b1", "w2", "b2"]
    inputs = [x, *params]
    for name, a, e in zip(names, grads(actual, inputs), grads(expected, inputs), strict=True):
        torch.testing.assert_close(a, e, rtol=1e-5, atol=1e-5, msg=name)


def test_fused_ffn_drops_only_in_training_and_follows_the_torch_seed() -> None:
    x = torch.randn(40, WIDTH, generator=torch.Generator().manual_seed(4))
    params = [t.detach() for t in weights()]
    plain = x + F.linear(F.gelu(F.linear(x, params[0], params[1])), params[2], params[3])
    evaluated = gelu_ffn_residual(x, *params, p=0.5, training=False)
    torch.testing.assert_close(evaluated, plain)
    torch.manual_seed(0)
    first = gelu_ffn_residual(x, *params, p=0.5, training=True)
    torch.manual_seed(0)
    again = gelu_ffn_residual(x, *params, p=0.5, training=True)
    other = gelu_ffn_residual(x, *params, p=0.5, training=True)
    assert torch.equal(first, again)
    assert not torch.equal(first, other)
    assert not torch.allclose(first, plain)
    # Where the outer dropout drops, only the residual is left: about half the outputs.
    assert ((first == x).float().mean() - 0.5).abs() < 0.1


def test_fused_ffn_refuses_what_it_cannot_compute() -> None:
    params = weights()
    assert not fused_ffn_applies(torch.zeros(2, WIDTH, dtype=torch.float64))
    with pytest.raises(ValueError, match="float32 CPU"):
        gelu_ffn_residual(torch.zeros(2, WIDTH, dtype=torch.float64), *params, p=0.1, training=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not fused_ffn_applies(torch.zeros(2, WIDTH))
    with pytest.raises(ValueError, match="chunk_positions"):
        gelu_ffn_residual(torch.zeros(2, WIDTH), *params, p=0.1, training=True, chunk_positions=0)
