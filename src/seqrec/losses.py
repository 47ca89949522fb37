"""Training objectives as pure functions of logits and masks; models pick one by name."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

# Every sampled loss maps positive logits (P,), negative logits (P, S) and a validity mask
# (P, S) -- False where a negative must be ignored, e.g. an in-batch negative that is the
# position's own target -- to a scalar averaged over positions.
SampledLoss = Callable[[Tensor, Tensor, Tensor | None], Tensor]


def _masked(neg_logits: Tensor, valid: Tensor | None, fill: float) -> Tensor:
    return neg_logits if valid is None else neg_logits.masked_fill(~valid, fill)


def bce_with_negatives(
    pos_logits: Tensor, neg_logits: Tensor, valid: Tensor | None = None
) -> Tensor:
    """SASRec's objective: -[log sigma(r_pos) + sum_s log(1 - sigma(r_neg_s))], mean over P."""
    pos = F.softplus(-pos_logits)  # -log sigma(x)
    neg = F.softplus(_masked(neg_logits, valid, float("-inf"))).sum(dim=-1)  # -log(1 - sigma)
    return (pos + neg).mean()


def sampled_softmax(pos_logits: Tensor, neg_logits: Tensor, valid: Tensor | None = None) -> Tensor:
    """Cross-entropy over {positive} + S negatives, positive at index 0: (P,), (P, S).

    logQ correction is applied by the caller, who knows the sampling distribution.
    """
    neg_logits = _masked(neg_logits, valid, float("-inf"))
    logits = torch.cat([pos_logits.unsqueeze(-1), neg_logits], dim=-1)  # (P, 1 + S)
    return -logits.log_softmax(dim=-1)[:, 0].mean()


def gbce(
    pos_logits: Tensor,
    neg_logits: Tensor,
    valid: Tensor | None = None,
    *,
    num_items: int,
    t: float,
) -> Tensor:
    """gBCE (Petrov & Macdonald, RecSys 2023): BCE whose positive term is raised to beta.

    With k uniform negatives out of N - 1 items the sampling rate is alpha = k / (N - 1) and
    beta = alpha * (t * (1 - 1 / alpha) + 1 / alpha); t = 0 is plain BCE, t = 1 makes the
    model's sigmoid calibrated to the full-softmax probabilities.
    """
    k = neg_logits.size(-1)
    alpha = k / max(num_items - 1, 1)
    beta = alpha * (t * (1.0 - 1.0 / alpha) + 1.0 / alpha)
    pos = beta * F.softplus(-pos_logits)  # -log sigma(x) ** beta
    neg = F.softplus(_masked(neg_logits, valid, float("-inf"))).sum(dim=-1)
    return (pos + neg).mean()


def bpr(pos_logits: Tensor, neg_logits: Tensor, valid: Tensor | None = None) -> Tensor:
    """Bayesian personalised ranking: -log sigma(r_pos - r_neg), mean over valid pairs."""
    pairwise = F.softplus(neg_logits - pos_logits.unsqueeze(-1))  # (P, S)
    if valid is None:
        return pairwise.mean()
    weights = valid.to(pairwise.dtype)
    per_position = (pairwise * weights).sum(-1) / weights.sum(-1).clamp(min=1.0)
    return per_position.mean()


def _negative_softmax(neg_logits: Tensor, valid: Tensor | None) -> Tensor:
    """GRU4Rec's max-losses weight each negative by its softmax score among the negatives."""
    return _masked(neg_logits, valid, float("-inf")).softmax(dim=-1).nan_to_num(0.0)


def bpr_max(
    pos_logits: Tensor, neg_logits: Tensor, valid: Tensor | None = None, *, reg: float = 1.0
) -> Tensor:
    """GRU4Rec+ BPR-max (Hidasi & Karatzoglou, CIKM 2018):
    -log sum_j s_j sigma(r_pos - r_j) + reg * sum_j s_j r_j^2, s = softmax over negatives."""
    weights = _negative_softmax(neg_logits, valid)
    neg = neg_logits.masked_fill(weights == 0, 0.0)  # keeps masked gradients finite
    ranking = (weights * torch.sigmoid(pos_logits.unsqueeze(-1) - neg)).sum(-1)
    ranking_loss = -torch.log(ranking + 1e-24)
    if valid is not None:
        # A position with no valid negative has nothing to rank against: it adds 0 and still
        # counts in the mean, as in bpr and top1_max (not -log(1e-24), about 55).
        ranking_loss = ranking_loss.masked_fill(~valid.any(dim=-1), 0.0)
    return (ranking_loss + reg * (weights * neg.square()).sum(-1)).mean()


def top1_max(pos_logits: Tensor, neg_logits: Tensor, valid: Tensor | None = None) -> Tensor:
    """GRU4Rec+ TOP1-max: sum_j s_j (sigma(r_j - r_pos) + sigma(r_j^2))."""
    weights = _negative_softmax(neg_logits, valid)
    neg = neg_logits.masked_fill(weights == 0, 0.0)
    terms = torch.sigmoid(neg - pos_logits.unsqueeze(-1)) + torch.sigmoid(neg.square())
    return (weights * terms).sum(-1).mean()


def full_ce_reference(hidden: Tensor, items: Tensor, labels: Tensor) -> Tensor:
    """Mean softmax cross-entropy of ``hidden @ items.T`` over items 1..N (0 is padding).

    hidden: (P, D), items: (N + 1, D), labels: (P,) in 1..N.
    """
    return F.cross_entropy(hidden @ items[1:].T, labels - 1)


class _FusedFullCE(torch.autograd.Function):
    """``full_ce_reference`` with its gradients computed chunk by chunk in the forward pass.

    The (P, N) logits are never stored: each chunk's softmax becomes its gradient in place,
    (softmax - onehot) / P, and is multiplied straight into grad_hidden and grad_items.
    The backward pass only scales them by the incoming gradient.
    """

    @staticmethod
    def forward(
        ctx: torch.autograd.function.FunctionCtx,
        hidden: Tensor,
        items: Tensor,
        labels: Tensor,
        chunk: int,
    ) -> Tensor:
        P = hidden.size(0)
        catalogue = items[1:]  # (N, D): the padding row takes no part
        needs_grad = ctx.needs_input_grad[0] or ctx.needs_input_grad[1]  # type: ignore[attr-defined]
        grad_hidden = torch.empty_like(hidden) if needs_grad else None
        grad_items = torch.zeros_like(items) if needs_grad else None
        total = hidden.new_zeros((), dtype=torch.float64)
        for start in range(0, P, chunk):
            h = hidden[start : start + chunk]  # (c, D)
            target = (labels[start : start + chunk] - 1).unsqueeze(1)  # (c, 1)
            logits = h @ catalogue.T  # (c, N)
            picked = logits.gather(1, target)  # (c, 1)
            # log-sum-exp written out so that one exp pass serves the loss and the gradient
            peak = logits.amax(dim=1, keepdim=True)  # (c, 1)
            probs = logits.sub_(peak).exp_()  # in place: exp(logit - max)
            norm = probs.sum(dim=1, keepdim=True)  # (c, 1)
            total += (norm.log() + peak - picked).sum(dtype=torch.float64)
            if grad_hidden is not None and grad_items is not None:
                probs.mul_(norm.mul_(P).reciprocal_())  # softmax / P
                probs.scatter_add_(1, target, torch.full_like(picked, -1.0 / P))
                grad_hidden[start : start + chunk] = probs @ catalogue
                grad_items[1:].addmm_(probs.T, h)
        ctx.save_for_backward(grad_hidden, grad_items)  # type: ignore[arg-type]
        return (total / P).to(hidden.dtype)

    @staticmethod
    def backward(
        ctx: torch.autograd.function.FunctionCtx, grad_output: Tensor
    ) -> tuple[Tensor | None, Tensor | None, None, None]:
        grad_hidden, grad_items = ctx.saved_tensors  # type: ignore[attr-defined]
        return grad_hidden * grad_output, grad_items * grad_output, None, None


def fused_full_ce(hidden: Tensor, items: Tensor, labels: Tensor, chunk: int = 256) -> Tensor:
    """Same value and gradients as ``full_ce_reference``, with memory bounded by ``chunk``
    positions and about 3x less time on CPU (no (P, N) tensors kept for backward)."""
    # In float32 even under bf16 autocast: the chunks' products must match the float32
    # gradient buffers they are accumulated into.
    with torch.autocast(hidden.device.type, enabled=False):
        loss: Tensor = _FusedFullCE.apply(  # type: ignore[no-untyped-call]
            hidden.float(), items.float(), labels.long(), chunk
        )
    return loss


class _FusedGroupedSampledSoftmax(torch.autograd.Function):
    """``sampled_softmax`` over negatives that a group of consecutive positions shares, with
    the gradients computed group by group in the forward pass (as ``_FusedFullCE``).

    The generic path builds (P, S) logits, a (P, S) validity mask and their concatenation
    with the positives, and keeps them for backward; with S in the thousands (SASRec+ 3000)
    those tensors, not the encoder, set the step time. Here only one group's (c, S) block
    exists at a time.
    """

    @staticmethod
    def forward(
        ctx: torch.autograd.function.FunctionCtx,
        hidden: Tensor,
        items: Tensor,
        targets: Tensor,
        group_sizes: list[int],
        negatives: Tensor,
        log_q: Tensor | None,
    ) -> Tensor:
        P = hidden.size(0)
        needs_grad = ctx.needs_input_grad[0] or ctx.needs_input_grad[1]  # type: ignore[attr-defined]
        grad_hidden = torch.empty_like(hidden) if needs_grad else None
        grad_items = torch.zeros_like(items) if needs_grad else None
        total = hidden.new_zeros((), dtype=torch.float64)
        start = 0
        for group, size in enumerate(group_sizes):
            if size == 0:
                continue
            end = start + size
            h = hidden[start:end]  # (c, D)
            target = targets[start:end]  # (c,)
            negative = negatives[group]  # (S,)
            target_rows, negative_rows = items[target], items[negative]  # (c, D), (S, D)
            pos = (h * target_rows).sum(1)  # (c,)
            neg = h @ negative_rows.T  # (c, S)
            if log_q is not None:
                pos = pos - log_q[target]
                neg.sub_(log_q[negative])
            neg.masked_fill_(negative.unsqueeze(0) == target.unsqueeze(1), float("-inf"))
            peak = torch.maximum(neg.amax(dim=1), pos).unsqueeze(1)  # (c, 1)
            probs = neg.sub_(peak).exp_()  # in place: exp(logit - max); masked ones are 0
            pos_prob = (pos.unsqueeze(1) - peak).exp_()  # (c, 1)
            norm = probs.sum(dim=1, keepdim=True).add_(pos_prob)  # (c, 1)
            total += (norm.log() + peak - pos.unsqueeze(1)).sum(dtype=torch.float64)
            if grad_hidden is not None and grad_items is not None:
                scale = norm.mul_(P).reciprocal_()  # 1 / (P * norm)
                probs.mul_(scale)  # d loss / d negative logit
                d_pos = pos_prob.mul_(scale).sub_(1.0 / P)  # d loss / d positive logit, (c, 1)
                grad_hidden[start:end] = probs @ negative_rows + d_pos * target_rows
                grad_items.index_add_(0, negative, probs.T @ h)
                grad_items.index_add_(0, target, d_pos * h)
            start = end
        ctx.save_for_backward(grad_hidden, grad_items)  # type: ignore[arg-type]
        return (total / P).to(hidden.dtype)

    @staticmethod
    def backward(
        ctx: torch.autograd.function.FunctionCtx, grad_output: Tensor
    ) -> tuple[Tensor | None, Tensor | None, None, None, None, None]:
        grad_hidden, grad_items = ctx.saved_tensors  # type: ignore[attr-defined]
        return grad_hidden * grad_output, grad_items * grad_output, None, None, None, None


def fused_grouped_sampled_softmax(
    hidden: Tensor,
    items: Tensor,
    targets: Tensor,
    groups: Tensor,
    negatives: Tensor,
    log_q: Tensor | None = None,
) -> Tensor:
    """``sampled_softmax`` of the scores <h, E_j> (minus log q(j) when given), for negatives
    shared by groups of positions: the same value and gradients, a fraction of the memory.

    hidden: (P, D); items: (N + 1, D); targets: (P,); groups: (P,) the group of each
    position, non-decreasing (positions of a group are consecutive); negatives: (G, S) the
    ids each group shares; log_q: optional (N + 1,). A negative equal to a position's target
    is ignored for that position.
    """
    if groups.numel() > 1 and bool((groups[1:] < groups[:-1]).any()):
        raise ValueError("the positions of a group must be consecutive (groups non-decreasing)")
    sizes = torch.bincount(groups, minlength=negatives.size(0)).tolist()
    with torch.autocast(hidden.device.type, enabled=False):
        loss: Tensor = _FusedGroupedSampledSoftmax.apply(  # type: ignore[no-untyped-call]
            hidden.float(),
            items.float(),
            targets.long(),
            sizes,
            negatives.long(),
            None if log_q is None else log_q.float(),
        )
    return loss
