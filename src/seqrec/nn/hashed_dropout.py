"""Dropout masks that are a function of (key, element index): drawn again instead of kept.

A generator-drawn mask must be stored for the backward pass or redrawn from a generator
re-seeded to the same state, and drawing it through torch's CPU generator is most of what
dropout costs. Here element i of a mask with key k keeps its value when

    h_i = fmix32((i * 0x9E3779B1 + k) mod 2^32) >= round(p * 2^32)

(fmix32 is MurmurHash3's 32-bit finaliser, a bijection that mixes every input bit into every
output bit), and a kept value is multiplied by 1 / (1 - round(p * 2^32) / 2^32), the inverse
of the realised keep probability, so the expectation is unchanged. ``hashed_mask`` computes
the mask with PyTorch operations (the reference); ``hashed_dropout_`` multiplies a tensor by
it in place, in one compiled pass that never materialises the mask when numba is installed
(``seqrec.nn.dropout_kernel``), and through ``hashed_mask`` otherwise. Both give the same
floats.

Keys come from ``stream_key(seed, index, stream)``: one seed per call drawn from torch's
generator (so ``torch.manual_seed`` fixes a run), and an index and a stream number for each
of the call's masks. Two keys k0, k1 give the same sequence of hashes at an offset of
(k1 - k0) / 0x9E3779B1 mod 2^32 elements, so two masks of n elements share values only when
that offset is under n: for keys that are themselves hashes, with probability about
2n / 2^32 (5e-4 at n = 2^20), and then only partly.
"""

from __future__ import annotations

import functools
from types import ModuleType
from typing import TypeVar

import torch
from torch import Tensor

MASK32 = 0xFFFFFFFF
GOLDEN = 0x9E3779B1  # 2^32 / golden ratio, odd: i -> i * GOLDEN is a bijection mod 2^32
FMIX_1 = 0x85EBCA6B
FMIX_2 = 0xC2B2AE35


Hash = TypeVar("Hash", int, Tensor)


def _fmix32(h: Hash) -> Hash:
    """MurmurHash3's finaliser of 32-bit values, on a Python int or an int64 tensor (whose
    products wrap modulo 2^64, so their low 32 bits are the uint32 products')."""
    h = h ^ (h >> 16)
    h = (h * FMIX_1) & MASK32
    h = h ^ (h >> 13)
    h = (h * FMIX_2) & MASK32
    return h ^ (h >> 16)


def stream_key(seed: int, index: int, stream: int) -> int:
    """The 32-bit key of mask ``stream`` of chunk ``index`` of a call seeded with ``seed``."""
    if seed < 0 or index < 0 or stream < 0:
        raise ValueError(f"seed, index and stream must be >= 0, got {seed}, {index}, {stream}")
    key = _fmix32((seed ^ (seed >> 32)) & MASK32)
    key = _fmix32(key ^ _fmix32((index * GOLDEN) & MASK32))
    return _fmix32(key ^ _fmix32(((stream + 1) * FMIX_2) & MASK32))


def drop_threshold(p: float) -> int:
    """round(p * 2^32): hashes below it are dropped."""
    if not 0.0 <= p < 1.0:
        raise ValueError(f"dropout probability must be in [0, 1), got {p}")
    return round(p * 2**32)


def hashed_keep_scale(p: float) -> float:
    """What kept values are multiplied by: the inverse of the realised keep probability."""
    return 1.0 / (1.0 - drop_threshold(p) / 2**32)


def hashed_mask(key: int, shape: tuple[int, ...], p: float) -> Tensor:
    """The float32 mask of ``key`` over ``shape`` (row-major element order): 0 where dropped,
    ``hashed_keep_scale(p)`` where kept."""
    n = 1
    for size in shape:
        n *= size
    h = _fmix32((torch.arange(n, dtype=torch.int64) * GOLDEN + key) & MASK32)
    keep = h >= drop_threshold(p)
    return (keep.to(torch.float32) * hashed_keep_scale(p)).view(shape)


def hashed_dropout_(x: Tensor, key: int, p: float) -> Tensor:
    """x * ``hashed_mask(key, x.shape, p)``, in place; x itself when p = 0. x must be a
    contiguous float32 CPU tensor."""
    if p == 0.0:
        return x
    if x.dtype != torch.float32 or x.device.type != "cpu" or not x.is_contiguous():
        raise ValueError("hashed_dropout_ needs a contiguous float32 CPU tensor")
    kernel = _dropout_kernel()
    if kernel is None:
        return x.mul_(hashed_mask(key, tuple(x.shape), p))
    kernel.hashed_dropout_flat(
        x.detach().view(-1).numpy(), key, drop_threshold(p), hashed_keep_scale(p)
    )
    return x


@functools.cache
def _dropout_kernel() -> ModuleType | None:
    """``seqrec.nn.dropout_kernel``, or None when numba is not installed or does not load."""
    try:
        from seqrec.nn import dropout_kernel
    except (ImportError, OSError):
        return None
    return dropout_kernel
