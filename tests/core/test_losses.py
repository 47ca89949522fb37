"""Losses by hand, and the fused cross-entropy against its reference (values and gradients)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from seqrec.losses import bce_with_negatives, full_ce_reference, fused_full_ce, sampled_softmax


def test_bce_by_hand() -> None:
    pos, neg = torch.tensor([0.0, 2.0]), torch.tensor([[0.0], [-1.0]])
    expected = -(F.logsigmoid(pos) + F.logsigmoid(-neg[:, 0])).mean()
    torch.testing.assert_close(bce_with_negatives(pos, neg), expected)


def test_sampled_softmax_by_hand() -> None:
    pos, neg = torch.tensor([1.0]), torch.tensor([[1.0, 1.0, 1.0]])
    torch.testing.assert_close(sampled_softmax(pos, neg), torch.log(torch.tensor(4.0)))


@pytest.mark.parametrize(
    ("P", "N", "D", "chunk"), [(1, 2, 3, 1), (37, 11, 5, 7), (300, 97, 16, 64)]
)
def test_fused_ce_matches_reference_values_and_gradients(
    P: int, N: int, D: int, chunk: int
) -> None:
    g = torch.Generator().manual_seed(P)
    hidden = torch.randn(P, D, generator=g, requires_grad=True)
    items = torch.randn(N + 1, D, generator=g, requires_grad=True)
    labels = torch.randint(1, N + 1, (P,), generator=g)
    expected = full_ce_reference(hidden, items, labels)
    (3 * expected).backward()
    grads = hidden.grad.clone(), items.grad.clone()  # type: ignore[union-attr]
    hidden.grad, items.grad = None, None
    fused = fused_full_ce(hidden, items, labels, chunk=chunk)
    (3 * fused).backward()
    torch.testing.assert_close(fused, expected)
    torch.testing.assert_close(hidden.grad, grads[0])
    torch.testing.assert_close(items.grad, grads[1])
    assert (items.grad[0] == 0).all()  # type: ignore[index]  # padding gets no gradient


def test_fused_ce_without_gradients() -> None:
    hidden, items = torch.randn(5, 4), torch.randn(8, 4)
    labels = torch.tensor([1, 2, 3, 7, 7])
    torch.testing.assert_close(
        fused_full_ce(hidden, items, labels), full_ce_reference(hidden, items, labels)
    )
