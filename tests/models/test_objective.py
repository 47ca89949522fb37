"""The loss menu through a model: config-time checks, batch needs, logQ, sharing, in-batch."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

import pytest
import torch
import torch.nn.functional as F

from seqrec.batch import PAD_ID, BatchNeeds, SeqBatch
from seqrec.config import ConfigError, warn_once
from seqrec.models import build_model, build_model_config
from seqrec.models.objective import ItemLossConfig, LossName, dot_product_loss
from seqrec.models.sasrec import SASRec
from tests.tiny import NUM_ITEMS, NUM_USERS


def sasrec(**overrides: Any) -> SASRec:
    torch.manual_seed(0)
    config = build_model_config(
        {"name": "sasrec", "hidden_size": 8, "dropout": 0.0, "max_seq_len": 7, **overrides},
        num_items=NUM_ITEMS,
        num_users=NUM_USERS,
    )
    model = build_model(config)
    assert isinstance(model, SASRec)
    return model.eval()


@dataclass(frozen=True, kw_only=True)
class CEOnlyConfig(ItemLossConfig):
    name: ClassVar[str] = "ce-only"
    supported_losses: ClassVar[tuple[LossName, ...]] = ("ce",)


def test_a_loss_the_model_cannot_use_fails_at_config_time() -> None:
    with pytest.raises(ConfigError, match="cannot use loss 'bpr'; it supports: ce"):
        CEOnlyConfig(num_items=5, loss="bpr")


def test_an_unknown_loss_lists_the_menu() -> None:
    with pytest.raises(ConfigError, match="'nope' is not one of 'ce', 'bce', 'sampled_softmax'"):
        sasrec(loss="nope")


@pytest.mark.parametrize(
    ("settings", "needs"),
    [
        ({"loss": "ce"}, BatchNeeds()),
        ({"loss": "bce", "num_negatives": 3}, BatchNeeds(num_negatives=3)),
        (
            {"loss": "sampled_softmax", "negative_sampler": "popularity", "num_negatives": 4},
            BatchNeeds(num_negatives=4, negative_sampler="popularity", log_q=True),
        ),
        (
            {"loss": "sampled_softmax", "negative_sampler": "in_batch", "num_negatives": 4},
            BatchNeeds(negative_sampler="in_batch", log_q=True),
        ),
        (
            {"loss": "sampled_softmax", "num_negatives": 4, "logq_correction": False},
            BatchNeeds(num_negatives=4),
        ),
        (
            {
                "loss": "sampled_softmax",
                "negative_sampler": "distinct",
                "num_negatives": 4,
                "shared_negatives": True,
            },
            BatchNeeds(num_negatives=4, negative_sampler="distinct", shared_negatives=True),
        ),
        (
            {"loss": "gbce", "num_negatives": 9, "shared_negatives": True},
            BatchNeeds(num_negatives=9, shared_negatives=True),
        ),
    ],
)
def test_batch_needs_follow_the_loss(settings: dict[str, Any], needs: BatchNeeds) -> None:
    assert sasrec(**settings).batch_needs == needs


def test_the_distinct_sampler_draws_one_set_per_sequence() -> None:
    with pytest.raises(ConfigError, match="set model.shared_negatives: true"):
        sasrec(loss="sampled_softmax", negative_sampler="distinct", num_negatives=4)


def real_states(model: SASRec, batch: SeqBatch) -> tuple[torch.Tensor, torch.Tensor]:
    hidden, _ = model.encode(batch.input_ids)
    assert batch.labels is not None
    real = batch.labels != PAD_ID
    return hidden[real], batch.labels[real]


def test_shared_negatives_equal_the_same_negatives_at_every_position(batch: SeqBatch) -> None:
    model = sasrec(loss="bce", num_negatives=4, shared_negatives=True)
    shared = torch.randint(1, NUM_ITEMS + 1, (batch.input_ids.size(0), 4))
    per_position = shared.unsqueeze(1).expand(-1, batch.input_ids.size(1), -1)
    a = model(dataclasses.replace(batch, negatives=shared)).loss
    b = model(dataclasses.replace(batch, negatives=per_position.contiguous())).loss
    torch.testing.assert_close(a, b)


def test_sampled_softmax_subtracts_log_q_from_every_logit(batch: SeqBatch) -> None:
    model = sasrec(loss="sampled_softmax", num_negatives=5, negative_sampler="popularity")
    log_q = torch.randn(NUM_ITEMS + 1)
    corrected = dataclasses.replace(batch, log_q=log_q)
    h, targets = real_states(model, batch)
    assert batch.negatives is not None
    assert batch.labels is not None
    negatives = batch.negatives[batch.labels != PAD_ID]  # (P, S)
    emb = model.item_emb.weight
    pos = (h * emb[targets]).sum(-1) - log_q[targets]
    neg = torch.einsum("pd,psd->ps", h, emb[negatives]) - log_q[negatives]
    neg = neg.masked_fill(negatives == targets.unsqueeze(1), float("-inf"))
    logits = torch.cat([pos.unsqueeze(1), neg], dim=1)
    expected = F.cross_entropy(logits, torch.zeros_like(targets))
    torch.testing.assert_close(model(corrected).loss, expected)
    assert not torch.allclose(model(batch).loss, expected)  # without log_q: uncorrected


def test_in_batch_negatives_are_other_targets(batch: SeqBatch) -> None:
    model = sasrec(loss="sampled_softmax", num_negatives=6, negative_sampler="in_batch")
    no_negatives = dataclasses.replace(batch, negatives=None)
    h, targets = real_states(model, batch)
    torch.manual_seed(3)
    loss = model(no_negatives).loss
    torch.manual_seed(3)
    shared = targets[torch.randint(targets.numel(), (6,))]
    emb = model.item_emb.weight
    neg = (h @ emb[shared].T).masked_fill(shared == targets.unsqueeze(1), float("-inf"))
    logits = torch.cat([(h * emb[targets]).sum(-1, keepdim=True), neg], dim=1)
    torch.testing.assert_close(loss, F.cross_entropy(logits, torch.zeros_like(targets)))


@pytest.mark.parametrize("loss", ["ce", "bce"])
def test_item_bias_is_added_to_every_score(batch: SeqBatch, loss: str) -> None:
    model = sasrec(loss=loss, num_negatives=5)
    hidden, _ = model.encode(batch.input_ids)
    bias = torch.randn(NUM_ITEMS + 1)
    assert batch.labels is not None
    items = model.item_emb.weight
    with_bias = dot_product_loss(model.config, hidden, batch.labels, batch, items, bias)
    # the same scores from explicit vectors: [h, 1] . [E_j, b_j]
    ones = torch.ones(*hidden.shape[:-1], 1)
    folded = dot_product_loss(
        model.config,
        torch.cat([hidden, ones], -1),
        batch.labels,
        batch,
        torch.cat([items, bias.unsqueeze(1)], 1),
    )
    torch.testing.assert_close(with_bias, folded)
    plain = dot_product_loss(model.config, hidden, batch.labels, batch, items)
    assert not torch.allclose(with_bias, plain)


def test_a_sampled_loss_without_negatives_says_what_is_missing(batch: SeqBatch) -> None:
    model = sasrec(loss="bpr", num_negatives=2)
    with pytest.raises(ValueError, match="loss 'bpr' needs batch.negatives"):
        model(dataclasses.replace(batch, negatives=None))


@pytest.mark.parametrize(
    ("values", "unread"),
    [
        ({"loss": "ce", "num_negatives": 64, "gbce_t": 0.5}, "model.num_negatives, model.gbce_t"),
        ({"loss": "bce", "logq_correction": False}, "model.logq_correction"),
        ({"loss": "bce", "sampling_alpha": 0.3}, "model.sampling_alpha"),  # uniform sampler
    ],
)
def test_a_loss_field_the_loss_never_reads_is_named(
    values: dict[str, Any], unread: str, caplog: pytest.LogCaptureFixture
) -> None:
    """These trained exactly as without them, and nothing said so."""
    warn_once.cache_clear()
    with caplog.at_level("WARNING", logger="seqrec.config"):
        build_model_config({"name": "sasrec", **values}, num_items=NUM_ITEMS)
        build_model_config({"name": "sasrec", **values}, num_items=NUM_ITEMS)  # said once
    assert [r.getMessage().split(" do")[0] for r in caplog.records] == [unread]
    caplog.clear()
    read = {"name": "sasrec", "loss": "sampled_softmax", "logq_correction": False}
    build_model_config(read, num_items=NUM_ITEMS)
    assert not caplog.records
