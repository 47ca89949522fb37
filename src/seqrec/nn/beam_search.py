"""Trie-constrained beam search over semantic-ID code paths.

``constrained_beam_search`` decodes every user of a batch and every beam at once: one call of
the model's decode step per code level, valid-next-code masks gathered from the trie by
indexing. ``reference_beam_search`` is the readable definition of the same search, one user
and one beam at a time with a dict trie; the tests check that both return the same items and
``benchmarks/generative.py`` times one against the other.

Scores are sums of the per-level log-probabilities the model assigns (the log-softmax over the
level's codes, before masking, as Hugging Face's prefix-constrained generation does); invalid
codes are removed, not renormalised away.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from seqrec.batch import PAD_ID
from seqrec.nn.code_trie import CodeTrie

# (B, b, t) codes chosen so far for each beam -> (B, b, V) log-probs of the next level's code.
DecodeStep = Callable[[Tensor], Tensor]


@dataclass(frozen=True)
class BeamResult:
    items: Tensor  # (B, beam) item ids, best first; PAD_ID where fewer valid items exist
    scores: Tensor  # (B, beam) log-probability of each item's path; -inf where PAD_ID


def _unique_history(exclude: Tensor) -> Tensor:
    """(B, L) item ids -> the same with repeated ids (and padding) set to PAD_ID."""
    ordered = exclude.sort(dim=1).values
    repeat = torch.zeros_like(ordered, dtype=torch.bool)
    repeat[:, 1:] = ordered[:, 1:] == ordered[:, :-1]
    return ordered.masked_fill(repeat, PAD_ID)


def _excluded_below(
    candidates: Tensor, depth: int, trie: CodeTrie, exclude: Tensor | None
) -> Tensor:
    """(B, b, V) candidate nodes at ``depth`` -> how many excluded items lie below each."""
    if exclude is None:
        return torch.zeros_like(candidates)
    ancestors = trie.item_path[exclude][..., depth]  # (B, L); -1 for padding
    hit = candidates.unsqueeze(-1) == ancestors[:, None, None, :]  # (B, b, V, L)
    return (hit & (candidates.unsqueeze(-1) >= 0)).sum(-1)


@torch.no_grad()
def constrained_beam_search(
    step: DecodeStep,
    trie: CodeTrie,
    batch_size: int,
    beam_size: int,
    exclude: Tensor | None = None,
) -> BeamResult:
    """The ``beam_size`` best code paths of the trie for each of ``batch_size`` users.

    exclude: (B, L) item ids no path may end in (a user's history; PAD_ID = none). A prefix
        all of whose items are excluded is pruned at once, so excluded items never take a
        beam's place.
    """
    device = trie.code.device
    B = batch_size
    nodes = torch.zeros(B, 1, dtype=torch.long, device=device)  # every beam starts at the root
    scores = torch.zeros(B, 1, device=device)
    paths = torch.zeros(B, 1, 0, dtype=torch.long, device=device)
    exclude = None if exclude is None else _unique_history(exclude)
    for depth in range(1, trie.num_levels + 1):
        log_probs = step(paths).float()  # (B, b, V)
        children = trie.children(nodes)  # (B, b, V)
        alive = (children >= 0) & (
            trie.leaf_count[children.clamp(min=0)] > _excluded_below(children, depth, trie, exclude)
        )
        candidates = (scores.unsqueeze(-1) + log_probs).masked_fill(~alive, float("-inf"))
        width = min(beam_size, candidates[0].numel())
        scores, flat = candidates.view(B, -1).topk(width, dim=1)  # (B, width)
        parent, code = flat // trie.vocab_size, flat % trie.vocab_size
        nodes = children.view(B, -1).gather(1, flat)
        dead = scores == float("-inf")  # fewer valid paths than beams
        nodes, code = nodes.masked_fill(dead, -1), code.masked_fill(dead, 0)
        paths = torch.cat(
            [paths.gather(1, parent[..., None].expand(-1, -1, depth - 1)), code[..., None]], 2
        )
    items = torch.where(nodes >= 0, trie.leaf_item[nodes.clamp(min=0)], PAD_ID)
    return BeamResult(items=items, scores=scores)


class DictTrie:
    """The same trie as nested dicts, code -> subtree, items at the leaves (the reference)."""

    def __init__(self, trie: CodeTrie) -> None:
        self.root: dict[int, object] = {}
        for item, path in enumerate(trie.item_path.tolist()):
            if item == PAD_ID:
                continue
            node = self.root
            codes = [int(trie.code[n]) for n in path[1:]]
            for code in codes[:-1]:
                node = node.setdefault(code, {})  # type: ignore[assignment]
            node[codes[-1]] = item

    @staticmethod
    def items_below(node: object) -> list[int]:
        if isinstance(node, int):
            return [node]
        assert isinstance(node, dict)
        return [item for child in node.values() for item in DictTrie.items_below(child)]


def reference_beam_search(
    step: Callable[[list[int]], Tensor],
    trie: DictTrie,
    beam_size: int,
    exclude: set[int] | None = None,
) -> list[tuple[int, float]]:
    """One user: ``step(path)`` -> (V,) log-probs of the next code after ``path``.

    Returns up to ``beam_size`` (item, score) pairs, best first.
    """
    exclude = exclude or set()
    beams: list[tuple[list[int], float, object]] = [([], 0.0, trie.root)]
    while beams and isinstance(beams[0][2], dict):
        candidates: list[tuple[list[int], float, object]] = []
        for path, score, node in beams:  # a Python loop over beams, as peers decode
            log_probs = step(path)
            assert isinstance(node, dict)
            for code, child in node.items():
                if all(item in exclude for item in DictTrie.items_below(child)):
                    continue
                candidates.append(([*path, code], score + float(log_probs[code]), child))
        candidates.sort(key=lambda c: -c[1])
        beams = candidates[:beam_size]
    return [(int(node), score) for _, score, node in beams]  # type: ignore[call-overload]
