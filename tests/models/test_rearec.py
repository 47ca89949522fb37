"""ReaRec (ERL): reasoning tokens, their mask, the ensemble objective, by hand."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from seqrec.batch import PAD_ID, SeqBatch
from seqrec.config import ConfigError
from seqrec.models import build_model, build_model_config
from seqrec.models.base import with_inference_settings
from seqrec.models.rearec import ReaRec, kl_diversity, reasoning_mask
from tests.tiny import NUM_ITEMS, NUM_USERS, TINY_CONFIGS

TINY = {k: v for k, v in TINY_CONFIGS["rearec"].items() if k not in ("num_items", "num_users")}


def make(**values: object) -> ReaRec:
    torch.manual_seed(0)
    config = build_model_config(
        {"name": "rearec", **TINY, **values}, num_items=NUM_ITEMS, num_users=NUM_USERS
    )
    model = build_model(config)
    assert isinstance(model, ReaRec)
    return model


def test_reasoning_mask() -> None:
    real = torch.tensor([[False, True, True]])
    mask = reasoning_mask(real, torch.tensor([1, 2]), steps=2)[0, 0]  # T = 3 + 2 * 2
    assert mask.shape == (7, 7)
    assert not mask[:3, 3:].any()  # items never read reasoning tokens
    assert mask[:3, :3].tolist() == [
        [True, False, False],
        [False, True, False],
        [False, True, True],
    ]
    # tokens, step-major: (k=1, t=1), (k=1, t=2), (k=2, t=1), (k=2, t=2)
    assert mask[3:, :3].tolist() == [[False, True, False], [False, True, True]] * 2
    assert mask[3:, 3:].tolist() == [
        [True, False, False, False],
        [False, True, False, False],
        [True, False, True, False],
        [False, True, False, True],
    ]


SASREC_PLUS = {
    "layout": "reference",
    "dropout_placement": "reference",
    "init_std": 0.02,
    "position_origin": "oldest",
}


@pytest.mark.parametrize("backbone", [{}, SASREC_PLUS], ids=["default", "sasrec-plus"])
def test_depth_zero_is_the_backbone(batch: SeqBatch, backbone: dict[str, object]) -> None:
    model = make(temperature=0.5, backbone_options=backbone).eval()
    model.config = with_inference_settings(model.config, {"depth": 0})
    with torch.no_grad():
        torch.testing.assert_close(
            model.score(batch.input_ids), model.backbone.score(batch.input_ids) / 0.5
        )
        model.config = with_inference_settings(model.config, {"depth": 2})
        assert not torch.allclose(
            model.score(batch.input_ids), model.backbone.score(batch.input_ids) / 0.5
        )


def test_every_position_reasons_as_if_it_were_the_newest(batch: SeqBatch) -> None:
    model = make().eval()
    with torch.no_grad():
        every = model.reasoning_states(batch.input_ids, 2, newest_only=False)  # (B, L, 3, D)
        newest = model.reasoning_states(batch.input_ids, 2, newest_only=True)  # (B, 1, 3, D)
        torch.testing.assert_close(every[:, -1], newest[:, 0])
        t = 3  # and a position's states never depend on later items
        changed = batch.input_ids.clone()
        changed[:, t + 1 :] = torch.randint(1, NUM_ITEMS + 1, changed[:, t + 1 :].shape)
        after = model.reasoning_states(changed, 2, newest_only=False)
    real = (batch.input_ids != PAD_ID)[:, : t + 1]
    torch.testing.assert_close(every[:, : t + 1][real], after[:, : t + 1][real])


def test_kl_diversity_by_hand() -> None:
    g = torch.Generator().manual_seed(0)
    states = torch.randn(5, 3, 4, generator=g)
    items = torch.randn(9, 4, generator=g)
    logits = states @ items[1:].T / 0.7  # (P, T, N)
    log_p = logits.log_softmax(-1)
    expected = torch.stack(
        [
            F.kl_div(log_p[:, i], log_p[:, j], log_target=True, reduction="batchmean")
            for i in range(3)
            for j in range(3)
            if i != j
        ]
    ).mean()
    torch.testing.assert_close(kl_diversity(states, items, 0.7, chunk=2), expected)
    same = states[:, :1].expand(5, 3, 4)
    torch.testing.assert_close(kl_diversity(same, items, 0.7), torch.tensor(0.0))
    assert kl_diversity(states[:, :1], items, 0.7).item() == 0.0


def test_erl_objective_by_hand(batch: SeqBatch) -> None:
    model = make(dropout=0.0, kl_weight=0.2, temperature=0.5).train()
    output = model(batch)
    loss = output.loss
    torch.testing.assert_close(loss, output.terms["next_item"] - 0.2 * output.terms["kl_diversity"])
    assert make(kl_weight=0.0)(batch).terms == {}
    states = model.reasoning_states(batch.input_ids, 2, newest_only=False)
    real = batch.labels != PAD_ID
    chosen = states[real]
    items = model.backbone.output_embedding()
    ce = F.cross_entropy(chosen.mean(1) @ items[1:].T / 0.5, batch.labels[real] - 1)
    torch.testing.assert_close(loss, ce - 0.2 * kl_diversity(chosen, items, 0.5))


def test_post_ln_backbone_is_refused() -> None:
    with pytest.raises(ConfigError, match="cannot use layout: post_ln"):
        make(backbone_options={"layout": "post_ln"})


def test_depth_cannot_exceed_the_trained_steps() -> None:
    with pytest.raises(ConfigError, match=r"model.depth must be in 0..2"):
        make(depth=3)
    with pytest.raises(ConfigError, match="model.hidden_size cannot change after training"):
        with_inference_settings(make().config, {"hidden_size": 4})


def test_scores_at_depths_are_the_scores_at_each_depth(batch: SeqBatch) -> None:
    model = make(reasoning_steps=3).eval()
    with torch.no_grad():
        swept = list(model.scores_at_depths(batch.input_ids, 3))
        assert len(swept) == 4
        for depth, scores in enumerate(swept):
            model.config = with_inference_settings(model.config, {"depth": depth})
            torch.testing.assert_close(scores, model.score(batch.input_ids))
