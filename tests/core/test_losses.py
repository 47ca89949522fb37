"""Losses by hand, and the fused cross-entropy against its reference (values and gradients)."""

from __future__ import annotations

from functools import partial

import pytest
import torch
import torch.nn.functional as F

from seqrec.losses import (
    bce_with_negatives as bce,
)
from seqrec.losses import (
    bpr,
    bpr_max,
    full_ce_reference,
    fused_full_ce,
    fused_grouped_sampled_softmax,
    gbce,
    sampled_softmax,
    top1_max,
)


def test_bce_by_hand() -> None:
    pos, neg = torch.tensor([0.0, 2.0]), torch.tensor([[0.0], [-1.0]])
    expected = -(F.logsigmoid(pos) + F.logsigmoid(-neg[:, 0])).mean()
    torch.testing.assert_close(bce(pos, neg), expected)


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


def grouped_sampled_softmax_reference(
    hidden: torch.Tensor,
    items: torch.Tensor,
    targets: torch.Tensor,
    groups: torch.Tensor,
    negatives: torch.Tensor,
    log_q: torch.Tensor | None,
) -> torch.Tensor:
    """The generic path: (P, S) logits, the mask of negatives equal to the target, logQ."""
    per_position = negatives[groups]  # (P, S)
    pos = (hidden * items[targets]).sum(-1)
    neg = torch.einsum("pd,psd->ps", hidden, items[per_position])
    if log_q is not None:
        pos, neg = pos - log_q[targets], neg - log_q[per_position]
    return sampled_softmax(pos, neg, per_position != targets.unsqueeze(1))


@pytest.mark.parametrize("with_log_q", [False, True])
@pytest.mark.parametrize(("sizes", "S"), [([1], 1), ([3, 0, 5, 1], 4), ([40, 17, 60], 300)])
def test_fused_grouped_sampled_softmax_matches_the_generic_path(
    sizes: list[int], S: int, with_log_q: bool
) -> None:
    g = torch.Generator().manual_seed(sum(sizes) + S)
    N, D = 23, 6
    P = sum(sizes)
    hidden = torch.randn(P, D, generator=g, requires_grad=True)
    items = torch.randn(N + 1, D, generator=g, requires_grad=True)
    targets = torch.randint(1, N + 1, (P,), generator=g)
    groups = torch.repeat_interleave(torch.arange(len(sizes)), torch.tensor(sizes))
    # drawn with replacement from a small catalogue: duplicates and negatives equal to a
    # position's own target both occur and must be handled as the generic path does
    negatives = torch.randint(1, N + 1, (len(sizes), S), generator=g)
    if P > 1:
        negatives[groups[0], 0] = targets[0]
    log_q = torch.randn(N + 1, generator=g) if with_log_q else None
    expected = grouped_sampled_softmax_reference(hidden, items, targets, groups, negatives, log_q)
    (2 * expected).backward()
    grads = hidden.grad.clone(), items.grad.clone()  # type: ignore[union-attr]
    hidden.grad, items.grad = None, None
    fused = fused_grouped_sampled_softmax(hidden, items, targets, groups, negatives, log_q)
    (2 * fused).backward()
    torch.testing.assert_close(fused, expected)
    torch.testing.assert_close(hidden.grad, grads[0])
    torch.testing.assert_close(items.grad, grads[1])


def test_fused_grouped_sampled_softmax_wants_each_group_in_one_run() -> None:
    hidden, items = torch.randn(3, 2), torch.randn(5, 2)
    with pytest.raises(ValueError, match="consecutive"):
        fused_grouped_sampled_softmax(
            hidden, items, torch.tensor([1, 2, 3]), torch.tensor([0, 1, 0]), torch.ones(2, 3)
        )


def test_gbce_by_hand_and_its_limits() -> None:
    pos, neg = torch.tensor([0.5, -1.0]), torch.tensor([[0.2, -0.3], [1.0, 0.0]])
    num_items, t = 11, 0.75
    alpha = 2 / 10
    beta = alpha * (t * (1 - 1 / alpha) + 1 / alpha)
    expected = -(beta * F.logsigmoid(pos) + F.logsigmoid(-neg).sum(-1)).mean()
    torch.testing.assert_close(gbce(pos, neg, num_items=num_items, t=t), expected)
    torch.testing.assert_close(gbce(pos, neg, num_items=num_items, t=0.0), bce(pos, neg))
    # with every other item sampled (k = N - 1) beta is 1 for any t
    full = torch.zeros(2, 10)
    torch.testing.assert_close(
        gbce(pos, full, num_items=11, t=0.9), gbce(pos, full, num_items=11, t=0.0)
    )


def test_gbce_pinned_beta() -> None:
    """k = 2 negatives of N - 1 = 10 items: alpha = 0.2, and t = 0.75 gives
    beta = 0.2 * (0.75 * (1 - 5) + 5) = 0.4, written out rather than recomputed."""
    pos, neg = torch.tensor([0.5, -1.0]), torch.tensor([[0.2, -0.3], [1.0, 0.0]])
    expected = -(0.4 * F.logsigmoid(pos) + F.logsigmoid(-neg).sum(-1)).mean()
    torch.testing.assert_close(gbce(pos, neg, num_items=11, t=0.75), expected)


def test_bpr_by_hand() -> None:
    pos, neg = torch.tensor([1.0]), torch.tensor([[0.0, 3.0]])
    expected = -(F.logsigmoid(torch.tensor(1.0)) + F.logsigmoid(torch.tensor(-2.0))) / 2
    torch.testing.assert_close(bpr(pos, neg), expected)


def test_bpr_max_and_top1_max_by_hand() -> None:
    pos, neg = torch.tensor([0.5]), torch.tensor([[1.0, -2.0, 0.0]])
    s = neg.softmax(-1)
    expected = -torch.log((s * torch.sigmoid(pos - neg)).sum()) + 0.5 * (s * neg**2).sum()
    torch.testing.assert_close(bpr_max(pos, neg, reg=0.5), expected)
    top1 = (s * (torch.sigmoid(neg - pos) + torch.sigmoid(neg**2))).sum()
    torch.testing.assert_close(top1_max(pos, neg), top1)


LOSSES = {
    "bce": bce,
    "sampled_softmax": sampled_softmax,
    "bpr": bpr,
    "bpr_max": bpr_max,
    "top1_max": top1_max,
    "gbce": partial(gbce, num_items=50, t=0.5),
}


@pytest.mark.parametrize("name", LOSSES)
def test_masked_negatives_are_as_if_absent_with_finite_gradients(name: str) -> None:
    loss = LOSSES[name]
    g = torch.Generator().manual_seed(1)
    pos = torch.randn(4, generator=g, requires_grad=True)
    neg = torch.randn(4, 3, generator=g, requires_grad=True)
    valid = torch.tensor([[True, False, True]] * 4)
    value = loss(pos, neg, valid)
    value.backward()
    assert neg.grad is not None
    assert torch.isfinite(neg.grad).all()
    assert (neg.grad[:, 1] == 0).all()
    if name != "gbce":  # gbce's beta depends on the number of sampled negatives
        torch.testing.assert_close(value, loss(pos, neg[:, [0, 2]]))


@pytest.mark.parametrize("name", ["bpr", "bpr_max", "top1_max"])
def test_a_position_without_valid_negatives_adds_zero(name: str) -> None:
    """A position whose negatives are all masked adds 0 and still counts in the mean (the
    pairwise losses agree on this); the other positions' losses are unchanged."""
    loss = LOSSES[name]
    g = torch.Generator().manual_seed(3)
    pos = torch.randn(3, generator=g, requires_grad=True)
    neg = torch.randn(3, 4, generator=g, requires_grad=True)
    valid = torch.tensor([[True, False, True, True], [False] * 4, [True, True, False, True]])
    kept = [0, 2]
    value = loss(pos, neg, valid)
    assert torch.isfinite(value)
    torch.testing.assert_close(value, loss(pos[kept], neg[kept], valid[kept]) * 2 / 3)
    value.backward()
    assert pos.grad is not None
    assert neg.grad is not None
    assert torch.isfinite(neg.grad).all()
    assert pos.grad[1] == 0
    assert (neg.grad[1] == 0).all()
