"""The CPU dropout mask and the attention fast path against their references."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from seqrec.nn import attention as attention_module
from seqrec.nn.attention import attention, attention_reference
from seqrec.nn.dropout import dropout, keep_mask
from seqrec.nn.masks import attention_bias, attention_mask, padding_bias


@pytest.mark.parametrize("p", [0.1, 0.2, 0.5, 0.9])
def test_keep_mask_has_the_asked_rate_and_no_pattern(p: float) -> None:
    torch.manual_seed(0)
    mask = keep_mask((1001, 999), p, torch.device("cpu"))
    assert mask.shape == (1001, 999)
    rate = mask.float().mean().item()
    assert abs(rate - (1 - p)) < 0.005
    # Both halves of each draw, and rows and columns, carry the same rate (no stripes).
    flat = mask.view(-1)
    assert abs(flat[0::2].float().mean().item() - flat[1::2].float().mean().item()) < 0.01
    assert (mask.float().mean(dim=0) - (1 - p)).abs().max() < 0.1


def test_keep_mask_follows_the_torch_seed() -> None:
    torch.manual_seed(3)
    a = keep_mask((64, 33), 0.3, torch.device("cpu"))
    torch.manual_seed(3)
    b = keep_mask((64, 33), 0.3, torch.device("cpu"))
    assert torch.equal(a, b)


def test_dropout_preserves_the_expectation_and_zeroes_the_rest() -> None:
    torch.manual_seed(0)
    x = torch.ones(2000, 500)
    y = dropout(x, 0.2, training=True)
    assert abs(y.mean().item() - 1.0) < 0.01
    kept = y[y != 0]
    torch.testing.assert_close(kept, torch.full_like(kept, 1 / (1 - 13107 / 65536)))
    assert dropout(x, 0.2, training=False) is x


def test_dropout_gradient_uses_the_same_mask() -> None:
    x = torch.randn(50, 40, requires_grad=True)
    y = dropout(x, 0.5, training=True)
    y.sum().backward()
    assert x.grad is not None
    torch.testing.assert_close(x.grad, (y.detach() / x.detach()).nan_to_num())


def _qkv(seed: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(3, 2, 7, 5, generator=g) for _ in range(3))
    real = torch.tensor([[True] * 7, [False] * 4 + [True] * 3, [False] * 6 + [True]])
    return q, k, v, attention_mask(real, causal=True)


def test_attention_fast_path_matches_reference_without_dropout() -> None:
    q, k, v, mask = _qkv(0)
    expected, weights = attention_reference(q, k, v, mask)
    torch.testing.assert_close(attention(q, k, v, mask), expected)
    sdpa = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    torch.testing.assert_close(sdpa, expected)
    assert torch.isfinite(weights).all()


def test_attention_with_dropout_is_the_reference_with_the_same_draws() -> None:
    q, k, v, mask = _qkv(1)
    torch.manual_seed(5)
    fast = attention(q, k, v, mask, dropout_p=0.3, training=True)
    torch.manual_seed(5)
    reference, _ = attention_reference(q, k, v, mask, dropout_p=0.3, training=True)
    torch.testing.assert_close(fast, reference)


def _assert_dropout_attention_matches_reference(
    tensors: list[torch.Tensor], mask: torch.Tensor | None, p: float, seed: int
) -> list[torch.Tensor]:
    """Runs ``attention_reference`` and ``attention`` with dropout on fresh leaf copies of
    ``tensors`` (q, k, v, and the bias when ``mask`` is None) under the same torch seed,
    asserts equal outputs and gradients, and returns the fast path's [output, *gradients]."""
    results = []
    for path in (attention_reference, attention):
        inputs = [t.clone().requires_grad_() for t in tensors]
        masks = [] if mask is None else [mask]
        torch.manual_seed(seed)
        out = path(*inputs, *masks, dropout_p=p, training=True)
        out = out[0] if isinstance(out, tuple) else out
        (out * torch.arange(out.numel()).view_as(out).sin()).sum().backward()
        results.append([out.detach(), *(t.grad for t in inputs)])
    for fast, reference in zip(results[1], results[0], strict=True):
        torch.testing.assert_close(fast, reference)
    return results[1]


@pytest.mark.parametrize("chunk_weights", [1, 100, 1 << 18])  # 3 chunks, 2 chunks, 1 chunk
@pytest.mark.parametrize("additive", [False, True])
def test_attention_with_dropout_has_the_reference_gradients(
    monkeypatch: pytest.MonkeyPatch, chunk_weights: int, additive: bool
) -> None:
    monkeypatch.setattr(attention_module, "_CHUNK_WEIGHTS", chunk_weights)
    q, k, v, mask = _qkv(4)
    if additive:
        mask = attention_bias(mask, q.dtype)
    fast = _assert_dropout_attention_matches_reference([q, k, v], mask, p=0.4, seed=6)
    assert (fast[1] != 0).any()


def test_cross_attention_with_dropout_and_a_per_head_bias_matches_the_reference(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """T5's case: 4 queries over 7 keys, a learned (1, H, Lq, Lk) bias with -inf, 2 users a
    chunk: outputs and the gradients of q, k, v and the bias."""
    monkeypatch.setattr(attention_module, "_CHUNK_WEIGHTS", 2 * 2 * 4 * 7)
    g = torch.Generator().manual_seed(11)
    q = torch.randn(5, 2, 4, 3, generator=g)
    k, v = (torch.randn(5, 2, 7, 3, generator=g) for _ in range(2))
    bias = torch.randn(1, 2, 4, 7, generator=g)
    bias[..., :2] = float("-inf")
    fast = _assert_dropout_attention_matches_reference([q, k, v, bias], None, p=0.25, seed=8)
    assert torch.equal(fast[2][..., :2, :], torch.zeros(5, 2, 2, 3))  # masked keys


@pytest.mark.parametrize("chunk_weights", [1, 2 * 2 * 4 * 7, 1 << 18])  # 5, 3, 1 chunks
def test_bias_terms_act_as_their_sum_in_outputs_and_gradients(
    monkeypatch: pytest.MonkeyPatch, chunk_weights: int
) -> None:
    """TIGER's encoder bias as terms: learned (1, H, Lq, Lk) positions, a (B, 1, 1, Lk)
    padding mask and a learned per-user (B, 1, Lq, Lk) term, against their sum."""
    monkeypatch.setattr(attention_module, "_CHUNK_WEIGHTS", chunk_weights)
    g = torch.Generator().manual_seed(12)
    q = torch.randn(5, 2, 4, 3, generator=g)
    k, v = (torch.randn(5, 2, 7, 3, generator=g) for _ in range(2))
    positions = torch.randn(1, 2, 4, 7, generator=g)
    per_user = torch.randn(5, 1, 4, 7, generator=g)
    padding = torch.zeros(5, 1, 1, 7)
    padding[1, ..., :3] = float("-inf")
    padding[3, ..., :6] = float("-inf")
    outcomes = []
    for as_terms, p in [(False, 0.25), (True, 0.25), (False, 0.0), (True, 0.0)]:
        leaves = [t.clone().requires_grad_() for t in (q, k, v, positions, per_user)]
        terms = (leaves[3], padding, leaves[4])
        torch.manual_seed(9)
        out = attention(*leaves[:3], terms if as_terms else sum(terms[1:], terms[0]), p, True)
        (out * torch.arange(out.numel()).view_as(out).cos()).sum().backward()
        outcomes.append([out.detach(), *(t.grad for t in leaves)])
    for summed, as_terms in (outcomes[:2], outcomes[2:]):
        for expected, actual in zip(summed, as_terms, strict=True):
            torch.testing.assert_close(actual, expected)
    assert (outcomes[1][4] != 0).any()  # the positions learn
    assert torch.equal(outcomes[1][5][3, 0, :, :6], torch.zeros(4, 6))  # not through -inf


def test_no_query_row_is_fully_masked() -> None:
    real = torch.tensor([[False, False, True], [False, False, False]])
    mask = attention_mask(real, causal=True)
    assert mask.any(dim=-1).all()


def test_dropout_is_the_masked_scale_of_its_own_draws() -> None:
    x = torch.randn(37, 61)
    torch.manual_seed(2)
    y = dropout(x, 0.3, training=True)
    torch.manual_seed(2)
    keep = keep_mask(x.shape, 0.3, x.device)
    assert keep.dtype == torch.uint8
    assert set(keep.unique().tolist()) <= {0, 1}
    torch.testing.assert_close(y, torch.where(keep.bool(), x / (1 - 19661 / 65536), 0.0))


def test_attention_takes_the_additive_mask_with_the_same_result() -> None:
    q, k, v, mask = _qkv(2)
    bias = attention_bias(mask, q.dtype)
    assert bias.dtype == q.dtype
    assert bias.shape == mask.shape
    assert torch.equal(bias == 0, mask)
    assert bool(torch.isneginf(bias[~mask]).all())
    expected, weights = attention_reference(q, k, v, mask)
    from_bias, bias_weights = attention_reference(q, k, v, bias)
    torch.testing.assert_close(from_bias, expected)
    torch.testing.assert_close(bias_weights, weights)
    torch.testing.assert_close(attention(q, k, v, bias), expected)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_padding_bias_is_the_bool_mask_converted(causal: bool, dtype: torch.dtype) -> None:
    real = torch.tensor([[True] * 7, [False] * 4 + [True] * 3, [False] * 7])
    expected = attention_bias(attention_mask(real, causal=causal), dtype)
    bias = padding_bias(real, causal=causal, dtype=dtype)
    assert bias.dtype == dtype
    assert torch.equal(bias, expected)
