"""The norm decomposition is exact, the fast norms equal the definitions, r_sum vs r_agg."""

from __future__ import annotations

import pytest
import torch

from seqrec.analysis.decomposition import (
    STAGES,
    contribution_norms,
    decompose,
    mixing_ratios,
    ratios_from_components,
)
from seqrec.analysis.hooks import residual_scale, trace_encode
from seqrec.batch import SeqBatch
from seqrec.models.sasrec import AttentionRecord, SASRec
from tests.analysis.conftest import tiny_sasrec

ATOL = 1e-5


@pytest.mark.parametrize("alpha", [1.0, 0.3, 0.0])
@pytest.mark.parametrize(
    "changes",
    [
        {},
        {"num_heads": 1},
        {"residual": False},
        {"layout": "reference"},
        {"layout": "reference", "attention_projection": False},
        {"layout": "post_ln"},
    ],
    ids=str,
)
def test_components_sum_to_what_the_block_computed(
    batch: SeqBatch, alpha: float, changes: dict[str, object]
) -> None:
    model = tiny_sasrec(**changes)
    with residual_scale(model, alpha):
        _, records, _ = trace_encode(model, batch.input_ids)
    assert len(records) == 2
    for record in records:
        parts = decompose(record)
        # sum_j a_ij + b_O = Attn_i, the attention sublayer's output
        torch.testing.assert_close(
            parts.attn.sum(2) + parts.attn_bias, record.attn_output, atol=ATOL, rtol=0
        )
        # sum_j y_ij + b_O = alpha x_i + Attn_i, the residual sum
        torch.testing.assert_close(
            parts.res.sum(2) + parts.attn_bias, record.pre_ln, atol=ATOL, rtol=0
        )
        # sum_j g(y_ij) + g(b_O) + beta = LN(y_i), the LayerNorm the model applied
        torch.testing.assert_close(
            parts.ln.sum(2) + parts.ln_bias + parts.beta, record.ln_output, atol=ATOL, rtol=0
        )


@pytest.mark.parametrize("layout", ["pre_ln", "reference", "post_ln"])
def test_without_an_output_bias_the_components_sum_to_the_layernorm_output_minus_beta(
    batch: SeqBatch, layout: str
) -> None:
    """The specification's statement: sum_j g(y_ij) = LN(y_i) - beta. With an output bias
    b_O, g(b_O) is one more term (the test above); without it there is none."""
    model = tiny_sasrec(layout=layout)
    with torch.no_grad():
        for block in model.blocks:
            block.attn.output_projection()[1].zero_()
    _, records, _ = trace_encode(model, batch.input_ids)
    for record in records:
        parts = decompose(record)
        assert float(parts.ln_bias.abs().max()) == 0.0
        torch.testing.assert_close(
            parts.ln.sum(2), record.ln_output - parts.beta, atol=ATOL, rtol=0
        )


def test_records_are_the_models_own_tensors_and_modules(model: SASRec, batch: SeqBatch) -> None:
    hidden, records, real = trace_encode(model, batch.input_ids)
    plain, _ = model.encode(batch.input_ids)
    torch.testing.assert_close(hidden, plain)  # tracing does not change the computation
    for block, record in zip(model.blocks, records, strict=True):
        assert record.attn is block.attn  # by reference, no copy
        assert record.ln is block.ln_ffn
        torch.testing.assert_close(record.attn_input, block.ln_attn(record.x))
        torch.testing.assert_close(record.ln_output, block.ln_ffn(record.pre_ln))
    # The residual stream: next block input = y + FFN(LN(y)) (the FFN residual).
    block = model.blocks[0]
    torch.testing.assert_close(records[1].x, records[0].pre_ln + block.ffn(records[0].ln_output))
    assert real.shape == batch.input_ids.shape


def test_post_ln_records_name_the_layernorm_after_the_attention_residual(
    batch: SeqBatch,
) -> None:
    model = tiny_sasrec(layout="post_ln")
    hidden, records, _ = trace_encode(model, batch.input_ids)
    for block, record in zip(model.blocks, records, strict=True):
        assert record.ln is block.ln_attn
        torch.testing.assert_close(record.attn_input, record.x)  # no LayerNorm before Attn
        torch.testing.assert_close(record.ln_output, block.ln_attn(record.pre_ln))
    # The stream: next block input = LN_ffn(h + FFN(h)), h the attention sublayer's output.
    first = model.blocks[0]
    after_ffn = records[0].ln_output + first.ffn(records[0].ln_output)
    torch.testing.assert_close(records[1].x, first.ln_ffn(after_ffn))
    last = model.blocks[1]
    output = last.ln_ffn(records[1].ln_output + last.ffn(records[1].ln_output))
    torch.testing.assert_close(hidden, output)  # no final LayerNorm


def test_trace_needs_eval_mode_and_all_positions(model: SASRec, batch: SeqBatch) -> None:
    with pytest.raises(ValueError, match="eval mode and all positions"):
        model.encode(batch.input_ids, last_only=True, trace=[])
    model.train()
    with pytest.raises(ValueError, match="eval mode and all positions"):
        model.encode(batch.input_ids, trace=[])


@pytest.mark.parametrize("alpha", [1.0, 0.4])
@pytest.mark.parametrize("heads", [1, 2, 3])
def test_fast_norms_equal_the_definitions(batch: SeqBatch, alpha: float, heads: int) -> None:
    model = tiny_sasrec(num_heads=heads)
    with residual_scale(model, alpha):
        _, records, real = trace_encode(model, batch.input_ids)
    for record in records:
        parts = decompose(record)
        norms = contribution_norms(record)
        for stage, components in zip(STAGES, (parts.attn, parts.res, parts.ln), strict=True):
            torch.testing.assert_close(
                norms.matrix[stage], components.norm(dim=-1), atol=ATOL, rtol=1e-4
            )
            fast = mixing_ratios(norms, stage)
            slow = ratios_from_components(components)
            for f, s in zip(fast, slow, strict=True):
                torch.testing.assert_close(f[real], s[real], atol=ATOL, rtol=1e-4)


def _record(
    values: torch.Tensor, weights: torch.Tensor, x: torch.Tensor, alpha: float
) -> AttentionRecord:
    """A one-head, D = 2 record with W_O = I and no biases: a_ij = w_ij v_j."""
    model = tiny_sasrec(hidden_size=2, num_heads=1, num_layers=1)
    block = model.blocks[0]
    with torch.no_grad():
        block.attn.proj.weight.copy_(torch.eye(2))
        block.attn.proj.bias.zero_()
        block.ln_ffn.weight.fill_(1.0)
        block.ln_ffn.bias.zero_()
    attn = torch.einsum("bhij,bhjd->bid", weights, values)
    y = alpha * x + attn
    return AttentionRecord(
        x=x,
        attn_input=x,
        weights=weights,
        values=values,
        attn_output=attn,
        residual_scale=alpha,
        pre_ln=y,
        ln_output=block.ln_ffn(y).detach(),
        attn=block.attn,
        ln=block.ln_ffn,
    )


def test_r_sum_and_r_agg_by_hand_when_context_cancels() -> None:
    """Position 2 attends 1/3 to each of three sources; the two context vectors cancel.

    a_20 = (1, 0), a_21 = (-1, 0), a_22 = (0, 1):
    r_sum = (1 + 1) / (1 + 1 + 1) = 2/3, r_agg = ||(0, 0)|| / (0 + 1) = 0.
    """
    values = torch.tensor([[3.0, 0.0], [-3.0, 0.0], [0.0, 3.0]]).view(1, 1, 3, 2)
    weights = torch.tensor([[1.0, 0, 0], [0.5, 0.5, 0], [1 / 3, 1 / 3, 1 / 3]]).view(1, 1, 3, 3)
    record = _record(values, weights, torch.zeros(1, 3, 2), alpha=0.0)
    r_sum, r_agg = mixing_ratios(contribution_norms(record), "attn")
    assert r_sum[0, 2].item() == pytest.approx(2 / 3)
    assert r_agg[0, 2].item() == pytest.approx(0.0, abs=1e-6)
    # Position 1: a_10 = (1.5, 0), a_11 = (-1.5, 0): half of the norm is context.
    assert r_sum[0, 1].item() == pytest.approx(0.5)
    assert r_agg[0, 1].item() == pytest.approx(0.5)
    assert r_sum[0, 0].item() == 0.0  # the first position has no context


def test_residual_enters_only_the_self_component_by_hand() -> None:
    """+Res: y_22 = a_22 + alpha x_2; with x_2 = (0, 2) and alpha = 1, ||y_22|| = 3."""
    values = torch.tensor([[3.0, 0.0], [0.0, 0.0], [0.0, 3.0]]).view(1, 1, 3, 2)
    weights = torch.tensor([[1.0, 0, 0], [0.5, 0.5, 0], [1 / 3, 1 / 3, 1 / 3]]).view(1, 1, 3, 3)
    x = torch.tensor([[[0.0, 0.0], [0.0, 0.0], [0.0, 2.0]]])
    record = _record(values, weights, x, alpha=1.0)
    r_sum, r_agg = mixing_ratios(contribution_norms(record), "res")
    # context a_20 = (1, 0) (norm 1); self (0, 1) + (0, 2) = (0, 3) (norm 3)
    assert r_sum[0, 2].item() == pytest.approx(1 / 4)
    assert r_agg[0, 2].item() == pytest.approx(1 / 4)
    attn_sum, _ = mixing_ratios(contribution_norms(record), "attn")
    assert attn_sum[0, 2].item() == pytest.approx(1 / 2)  # residual lowers the mixing ratio
