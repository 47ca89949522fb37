"""The oneDNN linear layer (``seqrec.nn.linear``) against ``F.linear``: outputs and every
gradient, and the inputs it leaves to ``F.linear``."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.flop_counter import FlopCounterMode

from seqrec.nn.linear import (
    ONEDNN_PRODUCT,
    Linear,
    onednn_linear,
    onednn_linear_applies,
    product_flops,
)


def inputs(bias: bool) -> tuple[Tensor, Tensor, Tensor | None]:
    g = torch.Generator().manual_seed(0)
    # (5, 3, 7) seen through a transpose: a non-contiguous (3, 5, 7) input
    x = torch.randn(5, 3, 7, generator=g).transpose(0, 1).requires_grad_()
    weight = torch.randn(11, 7, generator=g).requires_grad_()
    return x, weight, torch.randn(11, generator=g).requires_grad_() if bias else None


def grads(out: Tensor, wrt: list[Tensor]) -> list[Tensor]:
    upstream = torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
    return list(torch.autograd.grad((out * upstream).sum(), wrt))


@pytest.mark.parametrize("bias", [True, False])
def test_onednn_linear_matches_f_linear_in_outputs_and_gradients(bias: bool) -> None:
    x, weight, b = inputs(bias)
    wrt = [t for t in (x, weight, b) if t is not None]
    out, expected = onednn_linear(x, weight, b), F.linear(x, weight, b)
    assert out.shape == (3, 5, 11)
    torch.testing.assert_close(out, expected)
    for got, want in zip(grads(out, wrt), grads(expected, wrt), strict=True):
        torch.testing.assert_close(got, want)


def test_onednn_linear_computes_only_the_gradients_asked_for() -> None:
    x, weight, b = inputs(bias=True)
    frozen = weight.detach()
    (grad_x,) = grads(onednn_linear(x, frozen, b.detach()), [x])  # type: ignore[union-attr]
    torch.testing.assert_close(grad_x, grads(F.linear(x, frozen), [x])[0])
    x_const = x.detach()
    (grad_w,) = grads(onednn_linear(x_const, weight), [weight])
    torch.testing.assert_close(grad_w, grads(F.linear(x_const, weight), [weight])[0])


def test_linear_module_is_nn_linear_with_the_same_state_dict() -> None:
    torch.manual_seed(0)
    layer = Linear(7, 11)
    reference = torch.nn.Linear(7, 11)
    reference.load_state_dict(layer.state_dict())
    x = inputs(bias=False)[0]
    torch.testing.assert_close(layer(x), reference(x))
    with torch.no_grad():
        torch.testing.assert_close(layer(x), reference(x))


def test_other_inputs_go_to_f_linear_and_onednn_linear_refuses_them() -> None:
    layer = Linear(7, 11).double()
    x = torch.randn(2, 7, dtype=torch.float64)
    assert not onednn_linear_applies(x, layer.weight)
    torch.testing.assert_close(layer(x), F.linear(x, layer.weight, layer.bias))
    with pytest.raises(ValueError, match="float32 CPU"):
        onednn_linear(x, layer.weight)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not onednn_linear_applies(x.float(), layer.weight.float())
        assert layer.float()(x.float()).dtype == torch.bfloat16  # autocast's own product


def test_flop_counter_counts_the_onednn_products_as_f_linear_s() -> None:
    x, weight, b = inputs(bias=True)
    counts = []
    for product in (onednn_linear, F.linear):
        with FlopCounterMode(display=False, custom_mapping={ONEDNN_PRODUCT: product_flops}) as c:
            product(x, weight, b).sum().backward()
        counts.append(c.get_total_flops())
    assert counts[0] == counts[1] == 3 * 2 * 15 * 7 * 11  # forward, input and weight grads
