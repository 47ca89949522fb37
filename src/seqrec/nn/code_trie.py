"""The prefix tree (trie) of the items' semantic-ID code paths, stored as flat tensors.

Nodes are numbered breadth first: the root is 0, then the depth-1 nodes in code order, then
the depth-2 nodes in lexicographic order of their paths, and so on. The children of a node are
therefore consecutive ids sorted by code (a CSR layout): ``first_child[n]`` and
``child_count[n]`` give them, ``code[c]`` is the code on the edge into ``c``. Memory is
O(number of nodes), whatever the codebook size, and every query below is tensor indexing: no
Python loop over items, users or beams.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

import numpy as np
import torch
from torch import Tensor

from seqrec.batch import PAD_ID


@dataclass(frozen=True)
class CodeTrie:
    """Built by ``CodeTrie.build(codes)``; every field is a 1-D int64 tensor over nodes
    unless stated otherwise."""

    first_child: Tensor  # id of the node's first child (0 for leaves)
    child_count: Tensor  # number of children (0 for leaves)
    code: Tensor  # code on the edge from the parent (-1 for the root)
    depth: Tensor  # 0 for the root, M for leaves
    leaf_item: Tensor  # item id of a leaf, PAD_ID for inner nodes
    leaf_count: Tensor  # items (leaves) below the node
    item_path: Tensor  # (N + 1, M + 1): the node at each depth 0..M of item i's path; row 0 = -1
    vocab_size: int  # V: the largest codebook, the width of ``children`` tables

    @classmethod
    def build(cls, codes: Tensor | np.ndarray, vocab_size: int | None = None) -> CodeTrie:
        """codes: (N + 1, M) item i's code path in row i (row 0, padding, is ignored).

        Paths must be unique (semantic IDs append a disambiguation level for that) and codes
        non-negative. ``vocab_size``: the width of the model's per-step log-probabilities,
        which codes no item uses may leave above the largest code (None: that code + 1).
        """
        paths = np.asarray(codes.cpu() if isinstance(codes, Tensor) else codes)[1:]
        paths = paths.astype(np.int64)
        if paths.ndim != 2 or len(paths) == 0 or paths.shape[1] == 0:
            raise ValueError(f"codes must be (N + 1, M) with N, M >= 1, got {paths.shape}")
        if (paths < 0).any():
            raise ValueError("item codes must be non-negative (row 0 is the padding row)")
        num_items, depth_m = paths.shape
        width = int(paths.max()) + 1
        if vocab_size is not None and vocab_size < width:
            raise ValueError(f"code {width - 1} is outside a vocabulary of {vocab_size}")
        if len(np.unique(paths, axis=0)) != num_items:
            raise ValueError(
                "two items share a code path; semantic IDs need a disambiguation level "
                "(the tokenizers append a disambiguation level)"
            )
        # node_of[d][i]: node id of item i's depth-d prefix; nodes of depth d are numbered in
        # lexicographic order of their prefixes, after all nodes of depth < d.
        node_of = [np.zeros(num_items, dtype=np.int64)]
        codes_of_node = [np.array([-1])]
        depth_of_node = [np.array([0])]
        next_id = 1
        for d in range(1, depth_m + 1):
            prefixes, inverse = np.unique(paths[:, :d], axis=0, return_inverse=True)
            node_of.append(next_id + inverse.reshape(-1))
            codes_of_node.append(prefixes[:, -1])
            depth_of_node.append(np.full(len(prefixes), d))
            next_id += len(prefixes)
        num_nodes = next_id
        parent = np.full(num_nodes, -1, dtype=np.int64)
        for d in range(1, depth_m + 1):
            parent[node_of[d]] = node_of[d - 1]
        child_count = np.bincount(parent[1:], minlength=num_nodes)
        # Parents never decrease with the node id (breadth first, lexicographic within a
        # depth), so the children of p are the run of ids whose parent is p.
        first_child = 1 + np.searchsorted(parent[1:], np.arange(num_nodes), side="left")
        first_child[child_count == 0] = 0
        item_path = np.full((num_items + 1, depth_m + 1), -1, dtype=np.int64)
        item_path[1:] = np.stack(node_of, axis=1)
        leaf_item = np.full(num_nodes, PAD_ID, dtype=np.int64)
        leaf_item[node_of[depth_m]] = np.arange(1, num_items + 1)
        leaf_count = np.bincount(item_path[1:].reshape(-1), minlength=num_nodes)
        as_tensor = torch.from_numpy
        return cls(
            first_child=as_tensor(first_child),
            child_count=as_tensor(child_count.astype(np.int64)),
            code=as_tensor(np.concatenate(codes_of_node).astype(np.int64)),
            depth=as_tensor(np.concatenate(depth_of_node).astype(np.int64)),
            leaf_item=as_tensor(leaf_item),
            leaf_count=as_tensor(leaf_count.astype(np.int64)),
            item_path=as_tensor(item_path),
            vocab_size=width if vocab_size is None else vocab_size,
        )

    @property
    def num_levels(self) -> int:
        return self.item_path.size(1) - 1

    @property
    def num_nodes(self) -> int:
        return self.first_child.size(0)

    def to(self, device: torch.device | str) -> CodeTrie:
        moved = {
            f.name: getattr(self, f.name).to(device)
            for f in fields(self)
            if isinstance(getattr(self, f.name), Tensor)
        }
        return replace(self, **moved)

    def children(self, nodes: Tensor) -> Tensor:
        """nodes (...,) -> (..., V): the child reached by each code, -1 where the code is not
        a child (or the node is -1)."""
        flat = nodes.reshape(-1)
        real = flat >= 0
        counts = torch.where(real, self.child_count[flat.clamp(min=0)], 0)
        table = torch.full(
            (flat.numel(), self.vocab_size), -1, dtype=torch.long, device=flat.device
        )
        total = int(counts.sum())
        if total:
            row = torch.repeat_interleave(torch.arange(flat.numel(), device=flat.device), counts)
            starts = torch.cumsum(counts, 0) - counts  # where each node's children begin
            rank = torch.arange(total, device=flat.device) - starts[row]
            child = self.first_child[flat[row]] + rank
            table[row, self.code[child]] = child
        return table.view(*nodes.shape, self.vocab_size)

    def node_of_path(self, paths: Tensor) -> Tensor:
        """paths (..., d) codes from the root -> (...,) the node they reach, -1 if none."""
        node = torch.zeros(paths.shape[:-1], dtype=torch.long, device=paths.device)
        for level in range(paths.size(-1)):  # a loop over code levels (M <= ~5), not items
            nxt = self.children(node)
            code = paths[..., level].clamp(0, self.vocab_size - 1)
            found = nxt.gather(-1, code.unsqueeze(-1)).squeeze(-1)
            bad = (node < 0) | (paths[..., level] < 0) | (paths[..., level] >= self.vocab_size)
            node = torch.where(bad, -1, found)
        return node
