"""The fused CPU Mamba block (``seqrec.nn.mamba_inner``) and its conv kernel against the same
computation written op by op with the sequential reference scan."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor

from seqrec.nn.mamba_inner import fused_block_applies, mamba_inner_numba
from seqrec.nn.selective_scan import numba_turn, numpy_views, selective_scan_reference


def left_padded(rows: int, length: int, lengths: list[int]) -> Tensor:
    """(rows, length) bool, True at the last ``lengths[r]`` positions of row r."""
    return torch.arange(length) >= (length - torch.tensor(lengths)).unsqueeze(1)


def block_params(channels: int, width: int, rank: int, state: int, model: int) -> dict[str, Tensor]:
    g = torch.Generator().manual_seed(1)

    def rand(*shape: int, scale: float = 0.5) -> Tensor:
        return (torch.randn(*shape, generator=g) * scale).requires_grad_()

    A = torch.arange(1, state + 1, dtype=torch.float32).repeat(channels, 1)
    return {
        "in_proj_weight": rand(2 * channels, model),
        "conv_weight": rand(channels, 1, width),
        "conv_bias": rand(channels),
        "x_proj_weight": rand(rank + 2 * state, channels),
        "dt_proj_weight": rand(channels, rank),
        "dt_proj_bias": rand(channels, scale=1.0),
        "A_log": (torch.log(A) + 0.1 * torch.randn(channels, state, generator=g)).requires_grad_(),
        "D": rand(channels, scale=1.0),
        "out_proj_weight": rand(model, channels),
    }


def block_reference(hidden: Tensor, real: Tensor, p: dict[str, Tensor]) -> Tensor:
    """MambaBlock's computation, op by op."""
    channels, state = p["A_log"].shape
    rank = p["dt_proj_weight"].size(1)
    length, width = hidden.size(1), p["conv_weight"].size(-1)
    x, z = (hidden @ p["in_proj_weight"].T).chunk(2, dim=-1)
    conv = F.conv1d(
        x.transpose(1, 2), p["conv_weight"], p["conv_bias"], padding=width - 1, groups=channels
    )[..., :length]
    u = F.silu(conv) * real.unsqueeze(1)  # (B, C, L)
    dt, B, C = (u.transpose(1, 2) @ p["x_proj_weight"].T).split([rank, state, state], dim=-1)
    delta = F.softplus(dt @ p["dt_proj_weight"].T + p["dt_proj_bias"]) * real.unsqueeze(-1)
    y, _ = selective_scan_reference(
        u, delta.transpose(1, 2), -torch.exp(p["A_log"]), B.transpose(1, 2), C.transpose(1, 2),
        p["D"],
    )  # fmt: skip
    return (y.transpose(1, 2) * F.silu(z)) @ p["out_proj_weight"].T


def block_input(rows: int, length: int, width: int, real: Tensor) -> Tensor:
    hidden = torch.randn(rows, length, width, generator=torch.Generator().manual_seed(2))
    return (hidden * real.unsqueeze(-1)).requires_grad_()  # padded positions enter as zeros


def grads(out: Tensor, inputs: list[Tensor]) -> list[Tensor]:
    weights = torch.randn(out.shape, generator=torch.Generator().manual_seed(3))
    return list(torch.autograd.grad((out * weights).sum(), inputs))


@pytest.fixture
def one_thread() -> Iterator[None]:
    """One torch thread: the block then takes chunks of a single user when told to."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize("chunk_positions", [1, 10**6], ids=["user-by-user", "one-chunk"])
@pytest.mark.parametrize(
    ("rows", "length", "channels", "width", "rank", "state", "lengths"),
    [
        (3, 37, 10, 4, 2, 5, [37, 20, 1]),
        (2, 70, 16, 3, 1, 3, [70, 3]),  # more than two scan segments
        (1, 5, 7, 1, 3, 1, [5]),
        (2, 2, 9, 4, 2, 4, [2, 1]),  # shorter than the conv
    ],
)
@pytest.mark.usefixtures("one_thread")
def test_fused_block_matches_the_reference(
    rows: int,
    length: int,
    channels: int,
    width: int,
    rank: int,
    state: int,
    lengths: list[int],
    chunk_positions: int,
) -> None:
    real = left_padded(rows, length, lengths)
    hidden = block_input(rows, length, 6, real)
    params = block_params(channels, width, rank, state, model=6)
    inputs = [hidden, *params.values()]
    expected = block_reference(hidden, real, params)
    actual = mamba_inner_numba(hidden, real, **params, chunk_positions=chunk_positions)
    torch.testing.assert_close(actual, expected, rtol=1e-4, atol=1e-5)
    names = ["hidden", *params]
    for name, a, e in zip(names, grads(actual, inputs), grads(expected, inputs), strict=True):
        torch.testing.assert_close(a, e, rtol=1e-4, atol=1e-4, msg=name)


def test_fused_block_without_conv_bias_and_at_padded_positions() -> None:
    real = left_padded(2, 9, [9, 4])
    hidden = block_input(2, 9, 5, real)
    params = block_params(6, 4, 1, 3, model=5)
    params["conv_bias"] = torch.zeros(6)
    expected = block_reference(hidden, real, params)
    actual = mamba_inner_numba(hidden, real, **{**params, "conv_bias": None})
    torch.testing.assert_close(actual, expected, rtol=1e-4, atol=1e-5)
    # Padded positions: no input, the identity on the state, so their output is zero.
    assert torch.all(actual[~real] == 0)


def test_conv_kernel_matches_conv1d_and_its_gradients() -> None:
    rows, length, channels, width = 3, 11, 5, 4
    real = left_padded(rows, length, [11, 6, 2])
    xz = block_input(rows, length, 2 * channels, real)
    weight = torch.randn(channels, 1, width, requires_grad=True)
    bias = torch.randn(channels, requires_grad=True)
    conv = F.conv1d(xz[..., :channels].transpose(1, 2), weight, bias, padding=width - 1, groups=5)
    expected = (F.silu(conv[..., :length]) * real.unsqueeze(1)).transpose(1, 2)
    g_u = torch.randn(rows, length, channels)
    g_xz, g_weight, g_bias = torch.autograd.grad(expected, [xz, weight, bias], g_u)

    taps = weight.detach()[:, 0].T.contiguous()
    mask = real.float()
    u = torch.empty(rows, length, channels)
    out_xz = torch.full_like(xz, 7.0)  # the z half must be left alone
    out_w, out_b = torch.empty(rows, width, channels), torch.empty(rows, channels)
    with numba_turn() as kernel:
        kernel.conv_silu_forward(*numpy_views(xz, taps, bias, mask, u))
        kernel.conv_silu_backward(*numpy_views(xz, taps, bias, mask, g_u, out_xz, out_w, out_b))
    torch.testing.assert_close(u, expected.detach(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(out_xz[..., :channels], g_xz[..., :channels])
    assert torch.all(out_xz[..., channels:] == 7.0)
    torch.testing.assert_close(out_w.sum(0).T.unsqueeze(1), g_weight)
    torch.testing.assert_close(out_b.sum(0), g_bias)


def test_fused_block_refuses_what_it_cannot_compute() -> None:
    xz = torch.zeros(1, 3, 8, dtype=torch.float64)
    assert not fused_block_applies(xz)
    params = block_params(4, 2, 1, 2, model=3)
    with pytest.raises(ValueError, match="float32 CPU"):
        mamba_inner_numba(xz, torch.ones(1, 3, dtype=torch.bool), **params)
    with pytest.raises(ValueError, match="chunk_positions"):
        mamba_inner_numba(xz.float(), torch.ones(1, 3), **params, chunk_positions=0)


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("chunk_positions", [1, 10**6], ids=["user-by-user", "one-chunk"])
def test_newest_only_is_the_last_position_of_the_full_output(chunk_positions: int) -> None:
    real = left_padded(3, 41, [41, 9, 1])
    hidden = block_input(3, 41, 6, real)
    params = block_params(10, 4, 2, 5, model=6)
    full = mamba_inner_numba(hidden, real, **params, chunk_positions=chunk_positions)
    with torch.no_grad():  # the scoring path: only the newest position is projected out
        newest = mamba_inner_numba(
            hidden, real, **params, chunk_positions=chunk_positions, newest_only=True
        )
    assert newest.shape == (3, 1, 6)
    torch.testing.assert_close(newest, full[:, -1:].detach())
    # With a gradient to compute, the same values, and the gradient flows.
    with_grad = mamba_inner_numba(hidden, real, **params, newest_only=True)
    torch.testing.assert_close(with_grad, newest)
    (g_hidden,) = torch.autograd.grad(with_grad.sum(), [hidden])
    assert g_hidden.abs().sum() > 0
