"""alpha on the attention residual: 1 changes nothing, other values change scores, 0 removes
only the attention residual, and every SASRec-family model inherits it."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch

from seqrec.analysis.hooks import ResidualAnalyzable, analyzable, residual_scale, trace_encode
from seqrec.batch import SeqBatch
from seqrec.evaluation import evaluate
from seqrec.models import MODELS
from seqrec.models.sasrec import SASRec
from seqrec.training.run import data_for_run, load_run
from tests.tiny import TINY_CONFIGS, tiny_model


def test_alpha_one_reproduces_the_evaluator_ranks_exactly(trained_run: Path) -> None:
    run = load_run(trained_run)
    data = data_for_run(run)
    config = dataclasses.replace(run.config.eval, protocol="full", filter_seen=True)

    def ranks() -> np.ndarray:
        kwargs = {"all_sequences": data.sequences, "num_items": data.num_items}
        return evaluate(run.model, data.split.test, config, **kwargs).ranks

    before = ranks()
    with residual_scale(run.model, 0.3):
        changed = ranks()
    with residual_scale(run.model, 1.0):
        again = ranks()
    np.testing.assert_array_equal(again, before)
    assert (changed != before).any()
    assert run.model.residual_scale == 1.0


def test_alpha_one_scores_are_bit_identical(model: SASRec, batch: SeqBatch) -> None:
    reference = model.score(batch.input_ids)
    with residual_scale(model, 0.5):
        halved = model.score(batch.input_ids)
    with residual_scale(model, 1.0):
        assert torch.equal(model.score(batch.input_ids), reference)
    assert not torch.allclose(halved, reference)


def test_alpha_zero_removes_only_the_attention_residual(model: SASRec, batch: SeqBatch) -> None:
    with residual_scale(model, 0.0):
        _, records, _ = trace_encode(model, batch.input_ids)
    for index, record in enumerate(records):
        block = model.blocks[index]
        # h = 0 * x + Attn(LN(x)): the attention sublayer output alone ...
        attended = block.attn(block.ln_attn(record.x), _mask(batch))[0]
        torch.testing.assert_close(record.pre_ln, attended)
        assert not torch.allclose(record.pre_ln, record.x + attended)
        # ... and the FFN keeps its residual: the next input is h + FFN(LN(h)).
        expected = record.pre_ln + block.ffn(block.ln_ffn(record.pre_ln))
        if index + 1 < len(records):
            torch.testing.assert_close(records[index + 1].x, expected)


def _mask(batch: SeqBatch) -> torch.Tensor:
    from seqrec.batch import PAD_ID
    from seqrec.nn.masks import attention_mask

    return attention_mask(batch.input_ids != PAD_ID, causal=True)


def test_alpha_applies_to_every_block_and_the_last_only_path(
    model: SASRec, batch: SeqBatch
) -> None:
    with residual_scale(model, 0.2):
        hidden, records, _ = trace_encode(model, batch.input_ids)
        last, _ = model.encode(batch.input_ids, last_only=True)
    assert [r.residual_scale for r in records] == [0.2, 0.2]
    torch.testing.assert_close(last[:, -1], hidden[:, -1])


def test_duorec_scores_move_with_alpha(batch: SeqBatch) -> None:
    duorec = tiny_model("duorec").eval()
    assert isinstance(duorec, ResidualAnalyzable)
    reference = duorec.score(batch.input_ids)
    with residual_scale(duorec, 0.3):
        assert not torch.allclose(duorec.score(batch.input_ids), reference)
    assert torch.equal(duorec.score(batch.input_ids), reference)


def test_context_manager_restores_after_an_error(model: SASRec) -> None:
    model.residual_scale = 0.7
    seen = []

    def fail() -> None:
        with residual_scale(model, 0.1):
            seen.append(model.residual_scale)
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        fail()
    assert seen == [0.1]
    assert model.residual_scale == 0.7


def test_residual_scale_is_not_saved_and_must_be_finite(model: SASRec) -> None:
    model.residual_scale = 0.5
    assert not any("residual" in key for key in model.state_dict())
    assert "residual_scale" not in model.config.to_dict()
    with pytest.raises(ValueError, match="finite"):
        model.residual_scale = float("nan")


@pytest.mark.parametrize("name", MODELS.names())
def test_sasrec_family_opts_in_and_others_are_refused(name: str) -> None:
    if name not in TINY_CONFIGS:
        pytest.skip(f"{name} has no tiny config yet")
    model = tiny_model(name)
    if isinstance(model, SASRec):  # SASRec, DuoRec, gSASRec, ...
        assert isinstance(analyzable(model), ResidualAnalyzable)
    else:
        with pytest.raises(ValueError, match=f"this run's model is '{name}'"):
            analyzable(model)
