"""The chunked selective scan, the numba CPU kernel and the CUDA kernel against the
sequential reference: values and gradients, odd sizes, chunk and group boundaries, left
padding, extreme decays, float64, dispatch, concurrent calls."""

from __future__ import annotations

import functools
import logging
import math
import os
import subprocess
import sys
import threading
from typing import Any, get_args

import numba
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import Tensor

from seqrec.nn import scan_kernel
from seqrec.nn import selective_scan as scan_module
from seqrec.nn.selective_scan import (
    SCANS,
    ScanImpl,
    check_scan_impl,
    selective_scan,
    selective_scan_cuda,
    selective_scan_fast,
    selective_scan_numba,
    selective_scan_reference,
)

# float32 fast path against a float64 reference, relative to the largest magnitude.
RTOL, ATOL = 1e-4, 1e-5
# float64 against float64: the two differ only in the order of the additions.
RTOL64, ATOL64 = 1e-12, 1e-12


def inputs(
    batch: int, channels: int, length: int, state: int, seed: int = 0, dt_scale: float = 1.0
) -> list[Tensor]:
    """u, delta, A, B, C, D in mamba's layout, float64, requiring grad."""
    g = torch.Generator().manual_seed(seed)
    u = torch.randn(batch, channels, length, generator=g, dtype=torch.float64)
    delta = F.softplus(torch.randn(batch, channels, length, generator=g, dtype=torch.float64))
    A = -torch.exp(torch.randn(channels, state, generator=g, dtype=torch.float64))
    B = torch.randn(batch, state, length, generator=g, dtype=torch.float64)
    C = torch.randn(batch, state, length, generator=g, dtype=torch.float64)
    D = torch.randn(channels, generator=g, dtype=torch.float64)
    return [t.requires_grad_() for t in (u, delta * dt_scale, A, B, C, D)]


def values_and_grads(
    scan: object, args: list[Tensor], seed: int = 1, *, through_last: bool = True, **kw: object
) -> list[Tensor]:
    """y, the last state and the gradients of a random linear function of both (of y alone
    unless ``through_last``)."""
    y, last = scan(*args, return_last_state=True, **kw)  # type: ignore[operator]
    g = torch.Generator().manual_seed(seed)
    gy = torch.randn(y.shape, generator=g, dtype=torch.float64).to(y)
    gl = torch.randn(last.shape, generator=g, dtype=torch.float64).to(last)
    loss = (y * gy).sum() + ((last * gl).sum() if through_last else 0)
    grads = torch.autograd.grad(loss, args)
    return [y, last, *grads]


def assert_close_scaled(
    actual: Tensor, expected: Tensor, name: str, rtol: float = RTOL, atol: float = ATOL
) -> None:
    scale = expected.abs().max().item() or 1.0
    torch.testing.assert_close(
        actual.double() / scale, expected.double() / scale, rtol=rtol, atol=atol, msg=name
    )


def float32(args: list[Tensor]) -> list[Tensor]:
    return [t.detach().float().requires_grad_() for t in args]


NAMES = ["y", "last_state", "du", "ddelta", "dA", "dB", "dC", "dD"]


@pytest.mark.parametrize(
    ("batch", "channels", "length", "state", "chunk", "group"),
    [
        (1, 3, 1, 1, None, None),  # a single step
        (3, 5, 7, 5, 2, 2),  # last chunk and last group partial
        (5, 4, 33, 16, 3, 2),
        (3, 6, 33, 5, 4, 1),  # 33 = 8 * 4 + 1: a last chunk of one step
        (2, 3, 37, 4, 37, 2),  # one chunk of odd length
        (3, 6, 65, 5, 16, 3),
        (1, 2, 65, 1, 1, 1),  # one step per chunk
        (3, 4, 200, 16, None, None),  # the default plan
        (4, 4, 200, 5, 7, 3),
    ],
)
def test_fast_matches_reference(
    batch: int, channels: int, length: int, state: int, chunk: int | None, group: int | None
) -> None:
    args = inputs(batch, channels, length, state)
    expected = values_and_grads(selective_scan_reference, args)
    actual = values_and_grads(
        selective_scan_fast, float32(args), chunk_size=chunk, group_size=group
    )
    for name, a, e in zip(NAMES, actual, expected, strict=True):
        assert a.dtype == torch.float32, name
        assert a.shape == e.shape, name
        assert_close_scaled(a, e, name)


@pytest.mark.parametrize(("length", "chunk"), [(1, None), (7, 3), (33, 8), (50, 64), (61, 16)])
def test_fast_in_float64_matches_tightly(length: int, chunk: int | None) -> None:
    """float64 in, float64 all the way: agreement to rounding, so no approximation hides."""
    args = inputs(3, 5, length, 6, seed=7)
    expected = values_and_grads(selective_scan_reference, args)
    actual = values_and_grads(selective_scan_fast, args, chunk_size=chunk, group_size=2)
    for name, a, e in zip(NAMES, actual, expected, strict=True):
        assert a.dtype == torch.float64, name
        assert_close_scaled(a, e, name, rtol=RTOL64, atol=ATOL64)


@pytest.mark.parametrize("length", range(1, 18))
def test_parallel_scans_are_the_recurrences(length: int) -> None:
    """The in-place Blelloch scans against the loops they replace, every length to 17."""
    g = torch.Generator().manual_seed(length)
    links = torch.rand(length - 1, 3, generator=g, dtype=torch.float64)
    x = torch.randn(length, 3, generator=g, dtype=torch.float64)
    scratch = torch.empty(length, 3, dtype=torch.float64)
    forward, backward = x.clone(), x.clone()
    scan_module._scan_(links, forward, scratch)
    scan_module._reverse_scan_(links, backward, scratch)
    expected_forward, expected_backward = x.clone(), x.clone()
    for t in range(1, length):
        expected_forward[t] += links[t - 1] * expected_forward[t - 1]
    for t in range(length - 2, -1, -1):
        expected_backward[t] += links[t] * expected_backward[t + 1]
    torch.testing.assert_close(forward, expected_forward, rtol=1e-14, atol=1e-14)
    torch.testing.assert_close(backward, expected_backward, rtol=1e-14, atol=1e-14)


def test_reference_is_the_recurrence_by_hand() -> None:
    """One channel, one state, two steps: h0 = d0 B0 x0, h1 = e^(d1 A) h0 + d1 B1 x1."""
    u = torch.tensor([[[1.0, 2.0]]])
    delta = torch.tensor([[[0.5, 0.25]]])
    A, D = torch.tensor([[-2.0]]), torch.tensor([7.0])
    B, C = torch.tensor([[[3.0, 4.0]]]), torch.tensor([[[5.0, 6.0]]])
    h0 = 0.5 * 3.0 * 1.0
    h1 = math.exp(0.25 * -2.0) * h0 + 0.25 * 4.0 * 2.0
    expected = torch.tensor([[[5.0 * h0 + 7.0 * 1.0, 6.0 * h1 + 7.0 * 2.0]]])
    for scan in (selective_scan_reference, selective_scan_fast):
        y, last = scan(u, delta, A, B, C, D, return_last_state=True)
        torch.testing.assert_close(y, expected)
        torch.testing.assert_close(last, torch.tensor([[[h1]]]))


def test_left_padding_with_zero_delta_and_input_is_invisible() -> None:
    """Rows padded on the left (Delta = 0, x = 0 there) give the unpadded rows' outputs."""
    batch, channels, length, state, pad = 3, 4, 19, 5, torch.tensor([0, 6, 11])
    args = [t.detach().float() for t in inputs(batch, channels, length, state)]
    u, delta, A, B, C, D = args
    real = (torch.arange(length) >= pad[:, None]).float()[:, None, :]  # (B, 1, L)
    B = B * torch.randn(batch, 1, length)  # garbage B, C at padded positions must not matter
    fast = functools.partial(selective_scan_fast, chunk_size=4, group_size=2)
    for scan in (selective_scan_reference, fast):
        y, last = scan(u * real, delta * real, A, B, C, D, return_last_state=True)
        for row in range(batch):
            p = int(pad[row])
            alone, alone_last = scan(
                u[row : row + 1, :, p:],
                delta[row : row + 1, :, p:],
                A,
                B[row : row + 1, :, p:],
                C[row : row + 1, :, p:],
                D,
                return_last_state=True,
            )
            torch.testing.assert_close(y[row : row + 1, :, p:], alone, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(last[row : row + 1], alone_last, rtol=1e-5, atol=1e-5)


def test_left_padded_gradients_match_reference() -> None:
    """Mamba4Rec's padding (x = 0 and Delta = 0 before a row's first item, garbage B and C
    there): values and gradients as the reference's, across chunk and group boundaries."""
    batch, length, pad = 3, 23, torch.tensor([0, 5, 17])
    real = (torch.arange(length) >= pad[:, None]).double()[:, None, :]  # (B, 1, L)
    u, delta, A, B, C, D = (t.detach() for t in inputs(batch, 4, length, 5, seed=11))
    args = [t.requires_grad_() for t in (u * real, delta * real, A, B, C, D)]
    expected = values_and_grads(selective_scan_reference, args)
    actual = values_and_grads(selective_scan_fast, float32(args), chunk_size=4, group_size=2)
    for name, a, e in zip(NAMES, actual, expected, strict=True):
        assert_close_scaled(a, e, name)


@pytest.mark.parametrize("dt_scale", [1e-4, 30.0])
def test_extreme_decays_stay_finite_and_match(dt_scale: float) -> None:
    """Delta A down to about -500 per step (exp underflows to 0) and near 0 (no decay)."""
    args = inputs(3, 4, 41, 16, seed=3, dt_scale=dt_scale)
    expected = values_and_grads(selective_scan_reference, args)
    actual = values_and_grads(selective_scan_fast, float32(args), chunk_size=5, group_size=2)
    for name, a, e in zip(NAMES, actual, expected, strict=True):
        assert torch.isfinite(a).all(), name
        assert_close_scaled(a, e, name)


def test_fast_keeps_the_input_dtype_and_skips_d() -> None:
    args = [t.detach().float() for t in inputs(2, 3, 9, 4)]
    y, last = selective_scan_fast(*args[:5])
    assert y.dtype == torch.float32
    assert y.shape == (2, 3, 9)
    assert last is None
    expected, _ = selective_scan_reference(*args[:5])
    torch.testing.assert_close(y, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["chunk_size", "group_size"])
def test_chunk_and_group_sizes_must_be_positive(name: str) -> None:
    args = [t.detach().float() for t in inputs(1, 2, 9, 3)]
    with pytest.raises(ValueError, match=f"{name} must be >= 1"):
        selective_scan_fast(*args, **{name: 0})


def test_default_plan_keeps_chunks_to_the_budget() -> None:
    """Training sizes: chunks of a few steps over groups of rows; one user: one chunk."""
    u = torch.empty(64, 128, 200)
    steps, rows = scan_module._chunk_plan(u, 32, None, None)
    assert steps >= scan_module._MIN_STEPS
    assert steps * rows * 128 * 32 <= scan_module._CHUNK_ELEMENTS["cpu"]
    assert scan_module._chunk_plan(torch.empty(1, 128, 200), 32, None, None) == (128, 1)


def test_every_implementation_has_an_entry() -> None:
    assert set(get_args(ScanImpl)) == {"auto", *SCANS}


def test_auto_on_cpu_picks_numba_and_says_so(caplog: pytest.LogCaptureFixture) -> None:
    scan_module.log_auto_choice.cache_clear()
    args = [t.detach().float() for t in inputs(2, 3, 5, 4)]
    with caplog.at_level(logging.INFO, logger="seqrec.nn.selective_scan"):
        y, _ = selective_scan(*args, impl="auto")
        selective_scan(*args, impl="auto")
    assert [r.getMessage() for r in caplog.records] == [
        "selective scan 'auto' uses the 'numba' implementation on cpu"
    ]
    torch.testing.assert_close(y, selective_scan(*args, impl="reference")[0])


def test_auto_without_numba_picks_fast_and_names_the_extra(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    scan_module.log_auto_choice.cache_clear()
    monkeypatch.setattr(scan_module, "_numba_kernel", lambda: None)
    args = [t.detach().float() for t in inputs(2, 3, 5, 4)]
    with caplog.at_level(logging.INFO, logger="seqrec.nn.selective_scan"):
        y, _ = selective_scan(*args, impl="auto")
    assert len(caplog.records) == 1
    assert "uses the 'fast' implementation on cpu" in caplog.records[0].getMessage()
    assert "pip install 'seqrec[numba]'" in caplog.records[0].getMessage()
    torch.testing.assert_close(y, selective_scan(*args, impl="reference")[0])
    with pytest.raises(RuntimeError, match=r"pip install 'seqrec\[numba\]'"):
        check_scan_impl("numba")
    scan_module.log_auto_choice.cache_clear()


def test_auto_falls_back_to_fast_where_the_kernel_does_not_apply() -> None:
    """float64, or a positive A (growth, not decay): auto takes the chunked path and matches."""
    args = [t.detach() for t in inputs(2, 3, 6, 4)]
    y, _ = selective_scan(*args, impl="auto")
    assert y.dtype == torch.float64
    torch.testing.assert_close(y, selective_scan_reference(*args)[0], rtol=1e-12, atol=1e-12)
    u, delta, A, B, C, D = (t.float() for t in args)
    grows = [u, delta * 0.1, A.abs() * 0.1, B, C, D]
    y, _ = selective_scan(*grows, impl="auto")
    torch.testing.assert_close(y, selective_scan_reference(*grows)[0], rtol=1e-5, atol=1e-5)


def test_asking_for_cuda_without_the_kernel_names_the_extra(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(scan_module, "_mamba_kernel", lambda: None)
    with pytest.raises(RuntimeError, match=r"pip install 'seqrec\[mamba\]'"):
        check_scan_impl("cuda")
    args = [t.detach().float() for t in inputs(1, 2, 3, 2)]
    with pytest.raises(RuntimeError, match=r"pip install 'seqrec\[mamba\]'"):
        selective_scan(*args, impl="cuda")
    check_scan_impl("auto")  # the others never raise here (numba is installed)
    check_scan_impl("fast")
    check_scan_impl("numba")


def test_asking_for_cuda_without_a_gpu_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(scan_module, "_mamba_kernel", lambda: selective_scan_reference)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(RuntimeError, match="needs a CUDA device"):
        check_scan_impl("cuda")
    args = [t.detach().float() for t in inputs(1, 2, 3, 2)]
    with pytest.raises(RuntimeError, match="needs CUDA tensors"):
        selective_scan_cuda(*args)


@pytest.mark.parametrize(
    ("batch", "channels", "length", "state"),
    [(1, 3, 1, 1), (3, 5, 7, 5), (5, 4, 33, 16), (2, 3, 64, 32), (3, 4, 200, 16)],
)
def test_numba_matches_reference(batch: int, channels: int, length: int, state: int) -> None:
    args = inputs(batch, channels, length, state)
    expected = values_and_grads(selective_scan_reference, args)
    actual = values_and_grads(selective_scan_numba, float32(args))
    for name, a, e in zip(NAMES, actual, expected, strict=True):
        assert a.dtype == torch.float32, name
        assert a.shape == e.shape, name
        assert_close_scaled(a, e, name)


@pytest.mark.parametrize("dt_scale", [1e-4, 30.0])
def test_numba_extreme_decays_stay_finite_and_match(dt_scale: float) -> None:
    args = inputs(3, 4, 41, 16, seed=3, dt_scale=dt_scale)
    expected = values_and_grads(selective_scan_reference, args)
    actual = values_and_grads(selective_scan_numba, float32(args))
    for name, a, e in zip(NAMES, actual, expected, strict=True):
        assert torch.isfinite(a).all(), name
        assert_close_scaled(a, e, name)


def test_numba_left_padded_gradients_match_reference() -> None:
    batch, length, pad = 3, 23, torch.tensor([0, 5, 17])
    real = (torch.arange(length) >= pad[:, None]).double()[:, None, :]  # (B, 1, L)
    u, delta, A, B, C, D = (t.detach() for t in inputs(batch, 4, length, 5, seed=11))
    args = [t.requires_grad_() for t in (u * real, delta * real, A, B, C, D)]
    expected = values_and_grads(selective_scan_reference, args)
    actual = values_and_grads(selective_scan_numba, float32(args))
    for name, a, e in zip(NAMES, actual, expected, strict=True):
        assert_close_scaled(a, e, name)


def compiled_scan_versions() -> set[tuple[Any, ...]]:
    """The argument types of every compiled version of the scan's two passes."""
    passes = [scan_kernel.scan_forward_kernel, scan_kernel.scan_backward_kernel]
    return {args for kernel in passes for args in kernel.overloads}


def the_two_layouts() -> set[tuple[Any, ...]]:
    """Each pass's versions for C-contiguous and for any-strided sequence arrays."""
    return {sig.args for layout in ("C", "A") for sig in scan_kernel.scan_signatures(layout)}


@pytest.mark.parametrize("length", [64, 101])
def test_numba_skips_whole_segments_of_left_padding_and_writes_what_they_compute(
    length: int,
) -> None:
    """Told how many leading steps of each row are padding (u = 0 and Delta = 0 there), the
    kernel skips whole segments of them and writes every output, segment state and gradient
    exactly as it does when it computes every step. Outputs start as NaN, so one left unwritten
    shows."""
    segment = scan_kernel.SEGMENT
    pads = [0, 5, segment, segment + 1, 2 * segment + 3, length - 1, length, length + 7]
    rows, channels, state = len(pads), 6, 4
    rng = np.random.default_rng(0)
    u = rng.standard_normal((rows, length, channels), dtype=np.float32)
    delta = rng.random((rows, length, channels), dtype=np.float32)
    for row, pad in enumerate(pads):
        u[row, :pad], delta[row, :pad] = 0.0, 0.0
    A = -rng.random((state, channels), dtype=np.float32) * 2
    Bt, Ct = (rng.standard_normal((rows, length, state), dtype=np.float32) for _ in range(2))
    skip = rng.standard_normal(channels, dtype=np.float32)
    grad_y = rng.standard_normal((rows, length, channels), dtype=np.float32)
    grad_last = rng.standard_normal((rows, state, channels), dtype=np.float32)
    segments = -(-length // segment)

    def nan(*shape: int) -> np.ndarray:
        return np.full(shape, np.nan, dtype=np.float32)

    def run(padding: list[int]) -> list[np.ndarray]:
        y, starts, last = nan(*u.shape), nan(rows, segments, state, channels), nan(*grad_last.shape)
        counts = np.array(padding, dtype=np.int64)
        scan_kernel.scan_forward(u, delta, A, Bt, Ct, skip, y, starts, last, counts)
        grads = [nan(*u.shape), nan(*u.shape), nan(rows, state, channels)]
        grads += [nan(*Bt.shape), nan(*Ct.shape), nan(rows, channels)]
        scan_kernel.scan_backward(
            u, delta, A, Bt, Ct, skip, starts, grad_y, grad_last, *grads, counts
        )
        return [y, starts, last, *grads]

    names = ["y", "starts", "last", "u", "delta", "A rows", "B", "C", "D rows"]
    skipped, computed = run(pads), run([0] * rows)
    for name, a, e in zip(names, skipped, computed, strict=True):
        assert not np.isnan(a).any(), name
        np.testing.assert_array_equal(a, e, err_msg=name)


def test_a_scan_pass_called_with_the_wrong_number_of_arrays_says_how_many_it_takes() -> None:
    arrays = [np.zeros((1, 2, 3), dtype=np.float32)] * 2
    with pytest.raises(TypeError, match="scan_forward_kernel takes 10 arrays, got 2"):
        scan_kernel.scan_forward(*arrays)
    with pytest.raises(TypeError, match="scan_backward_kernel takes 16 arrays, got 2"):
        scan_kernel.scan_backward(*arrays)


def test_numba_reads_inputs_of_any_layout_and_broadcast_gradients() -> None:
    """Channel-minor tensors seen through transposes of strided slices, mixed with one whose
    time-major view is contiguous, and the expanded gradient that ``.sum()`` sends back: the
    kernel reads strides, it copies nothing, and the mix runs on the version compiled for
    any strides, not on a new compilation."""
    batch, channels, length, state = 3, 6, 37, 4
    expected_args = inputs(batch, channels, length, state, seed=5)
    u, delta, A, B, C, D = (t.detach().float() for t in expected_args)

    def every_other_channel(t: Tensor) -> Tensor:  # (B, X, L) seen in a (B, L, 2X) tensor
        wide = torch.zeros(t.size(0), t.size(2), 2 * t.size(1))
        wide[:, :, ::2] = t.transpose(1, 2)
        return wide[:, :, ::2].transpose(1, 2)

    mixed = [every_other_channel(u), delta.transpose(1, 2).contiguous().transpose(1, 2), A]
    mixed += [every_other_channel(B), every_other_channel(C), D]
    actual_args = [t.requires_grad_() for t in mixed]
    assert not any(actual_args[i].transpose(1, 2).is_contiguous() for i in (0, 3, 4))

    def grads(scan: object, args: list[Tensor]) -> list[Tensor]:
        y, last = scan(*args, return_last_state=True)  # type: ignore[operator]
        return [y, last, *torch.autograd.grad(y.sum() + last.sum(), args)]

    expected = grads(selective_scan_reference, expected_args)
    actual = grads(selective_scan_numba, actual_args)
    for name, a, e in zip(NAMES, actual, expected, strict=True):
        assert_close_scaled(a, e, name)
    assert compiled_scan_versions() <= the_two_layouts()


def test_numba_compiles_a_pass_only_for_the_layouts_it_is_called_with() -> None:
    """A fresh process that runs the forward pass on contiguous arrays gets that one
    version; Fortran-ordered arrays then add the any-strides one; the backward pass, never
    called, is never compiled (numba's disk cache may supply what it compiles)."""
    script = """
import numpy as np
from seqrec.nn import scan_kernel as k

def layouts(kernel):
    return sorted(args[0].layout for args in kernel.overloads)

def random(*shape):
    return np.random.default_rng(len(shape)).random(shape, dtype=np.float32)

rows, length, channels, state = 2, 5, 3, 4
u, delta, Bt, Ct = (random(rows, length, n) for n in (channels, channels, state, state))
A, skip = -random(state, channels), random(channels)
starts, last = random(rows, 1, state, channels), random(rows, state, channels)
k.scan_forward(u, delta, A, Bt, Ct, skip, np.empty_like(u), starts, last, np.zeros(rows, np.int64))
print(layouts(k.scan_forward_kernel), layouts(k.scan_backward_kernel))
u, delta, Bt, Ct = (x.copy(order="F") for x in (u, delta, Bt, Ct))
k.scan_forward(u, delta, A, Bt, Ct, skip, np.empty_like(u), starts, last, np.zeros(rows, np.int64))
print(layouts(k.scan_forward_kernel), layouts(k.scan_backward_kernel))
"""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines() == ["['C'] []", "['A', 'C'] []"]


def test_numba_uses_full_avx512_vectors_unless_the_user_chose_the_features() -> None:
    """On a CPU with AVX-512 the kernels are compiled without LLVM's preference for 256-bit
    vectors; elsewhere, and whenever NUMBA_CPU_FEATURES is set, numba's choice stands."""
    script = """
import numba
from numba.core.codegen import get_host_cpu_features
from seqrec.nn import scan_kernel
print(get_host_cpu_features())
print(numba.config.CPU_FEATURES)
"""

    def features_after_import(env: dict[str, str]) -> tuple[str, str]:
        done = subprocess.run(
            [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=env
        )
        assert done.returncode == 0, done.stderr[-2000:]
        host, chosen = done.stdout.splitlines()
        return host, chosen

    env = {k: v for k, v in os.environ.items() if k != "NUMBA_CPU_FEATURES"}
    host, chosen = features_after_import(env)
    if "+avx512f" in host.split(","):
        assert chosen == host + ",-prefer-256-bit"
    else:
        assert chosen == "None"
    _, chosen = features_after_import({**env, "NUMBA_CPU_FEATURES": "+sse2"})
    assert chosen == "+sse2"


def test_numba_keeps_the_input_dtype_and_only_its_inputs_get_gradients() -> None:
    args = [t.detach() for t in inputs(2, 3, 9, 4)]
    half = [t.bfloat16() if i in (0, 1, 3, 4) else t.float() for i, t in enumerate(args)]
    y, last = selective_scan_numba(*half[:5])
    assert y.dtype == torch.bfloat16
    assert last is None
    expected, _ = selective_scan_reference(*(t.float() for t in half[:5]))
    torch.testing.assert_close(y.float(), expected, rtol=1e-2, atol=1e-2)
    u, delta, A, B, C, D = (t.float() for t in args)
    B.requires_grad_()
    (selective_scan_numba(u, delta, A, B, C, D)[0] ** 2).sum().backward()
    assert B.grad is not None
    assert u.grad is None


def test_numba_refuses_what_it_cannot_compute() -> None:
    args = [t.detach() for t in inputs(1, 2, 5, 3)]
    with pytest.raises(ValueError, match="use 'fast' for float64"):
        selective_scan_numba(*args)
    u, delta, A, B, C, D = (t.float() for t in args)
    with pytest.raises(ValueError, match="needs A <= 0 and delta >= 0"):
        selective_scan_numba(u, delta, -A, B, C, D)
    with pytest.raises(ValueError, match="needs A <= 0 and delta >= 0"):
        selective_scan_numba(u, -delta, A, B, C, D)


def test_numba_exp_is_accurate_and_exact_at_zero() -> None:
    x = -np.concatenate([np.linspace(0.0, 87.0, 200_001), np.geomspace(1e-9, 1.0, 1001)])
    approx = scan_kernel.exp_nonpositive(x.astype(np.float32)).astype(np.float64)
    exact = np.exp(x.astype(np.float32).astype(np.float64))
    assert np.max(np.abs(approx - exact) / exact) < 1e-6
    assert scan_kernel.exp_nonpositive(np.zeros(3, dtype=np.float32)).tolist() == [1.0] * 3
    assert scan_kernel.exp_nonpositive(np.array([-200.0], dtype=np.float32))[0] < 1e-37


def test_numba_leaves_torch_thread_count_alone() -> None:
    """The kernel runs with torch's thread count and never changes it (numba's OpenMP layer
    would: it shares libgomp with torch)."""
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        args = [t.detach().float() for t in inputs(2, 3, 9, 4)]
        selective_scan_numba(*args)
        assert torch.get_num_threads() == 1
        assert numba.get_num_threads() == 1
        assert numba.threading_layer() == "workqueue"
    finally:
        torch.set_num_threads(before)


def test_numba_calls_from_several_threads_agree() -> None:
    """A server scores in threads: concurrent kernel calls take turns and stay correct."""
    args = [t.detach().float() for t in inputs(4, 8, 50, 16)]
    expected, _ = selective_scan_numba(*args)
    results: list[Tensor] = []
    errors: list[BaseException] = []

    def work() -> None:
        try:
            for _ in range(5):
                results.append(selective_scan_numba(*args)[0])
        except BaseException as error:  # surfaced below, not lost in the thread
            errors.append(error)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    assert len(results) == 20
    for y in results:
        torch.testing.assert_close(y, expected, rtol=0, atol=0)


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("dtype", "rtol", "atol"), [(torch.float32, 1e-3, 2e-3), (torch.bfloat16, 5e-2, 5e-2)]
)
@pytest.mark.parametrize("length", [1, 7, 65, 200])
def test_cuda_kernel_matches_reference(
    dtype: torch.dtype, rtol: float, atol: float, length: int
) -> None:
    """As mamba's own test: outputs and gradients, per-dtype tolerances (A, D in float32).
    mamba-ssm's backward ignores the last state's gradient (its kernel returns the state
    detached), so the gradients compared are those of y alone."""
    pytest.importorskip("mamba_ssm")
    cpu = inputs(3, 8, length, 16, seed=5)
    cuda = [
        t.detach().to("cuda", dtype if i not in (2, 5) else torch.float32).requires_grad_()
        for i, t in enumerate(cpu)
    ]
    expected = values_and_grads(selective_scan_reference, cpu, through_last=False)
    actual = values_and_grads(selective_scan_cuda, cuda, through_last=False)
    for name, a, e in zip(NAMES, actual, expected, strict=True):
        scale = e.abs().max().item() or 1.0
        torch.testing.assert_close(
            a.double().cpu() / scale, e / scale, rtol=rtol, atol=atol, msg=name
        )
