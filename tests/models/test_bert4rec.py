"""BERT4Rec properties: both directions, padding invariance, the cloze masking, [MASK] scoring."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from seqrec.batch import PAD_ID, SeqBatch
from seqrec.config import ConfigError
from seqrec.models.bert4rec import BERT4Rec, BERT4RecConfig, cloze_mask
from tests.tiny import NUM_ITEMS, NUM_USERS, L, S

CONFIG = BERT4RecConfig(
    num_items=NUM_ITEMS, num_users=NUM_USERS, max_seq_len=L, hidden_size=18, num_heads=2
)
MASK_ID = NUM_ITEMS + 1


def build(**changes: object) -> BERT4Rec:
    torch.manual_seed(0)
    return BERT4Rec(dataclasses.replace(CONFIG, **changes)).eval()


def test_sees_both_directions(batch: SeqBatch) -> None:
    """The output at a masked middle position moves when a LATER item changes."""
    model = build()
    ids = batch.input_ids[:1].clone()  # the full row
    t = 3
    ids[0, t] = MASK_ID
    later = ids.clone()
    later[0, t + 2] = later[0, t + 2] % NUM_ITEMS + 1  # another real item
    earlier = ids.clone()
    earlier[0, t - 2] = earlier[0, t - 2] % NUM_ITEMS + 1
    base = model.encode(ids)[0, t]
    assert not torch.allclose(model.encode(later)[0, t], base)
    assert not torch.allclose(model.encode(earlier)[0, t], base)


def test_padding_invariance_extra_left_padding_changes_nothing(batch: SeqBatch) -> None:
    model = build(max_seq_len=L + 4)
    padded = F.pad(batch.input_ids, (3, 0), value=PAD_ID)
    real = batch.input_ids != PAD_ID
    torch.testing.assert_close(
        model.encode(padded)[:, 3:][real], model.encode(batch.input_ids)[real]
    )
    torch.testing.assert_close(model.score(padded), model.score(batch.input_ids))


def test_padding_tokens_do_not_influence_real_positions(batch: SeqBatch) -> None:
    model = build()
    scores = model.score(batch.input_ids)
    assert (batch.input_ids == PAD_ID).any()
    with torch.no_grad():
        model.item_emb.weight[PAD_ID] = torch.randn(CONFIG.hidden_size)
    torch.testing.assert_close(model.score(batch.input_ids)[:, 1:], scores[:, 1:])


def test_mask_is_never_recommended(batch: SeqBatch) -> None:
    model = build()
    with torch.no_grad():  # make [MASK] the best-scoring row, were it a candidate
        model.item_emb.weight[MASK_ID] = 100 * model.item_emb.weight[1:MASK_ID].mean(0)
    scores = model.score(batch.input_ids)
    assert scores.shape == (batch.input_ids.size(0), NUM_ITEMS + 1)
    top = model.recommend(batch.input_ids, k=NUM_ITEMS + 5, exclude_seen=False)
    assert top.shape == (batch.input_ids.size(0), NUM_ITEMS)
    assert (top != MASK_ID).all()
    assert (top != PAD_ID).all()


def test_scores_the_appended_mask(batch: SeqBatch) -> None:
    model = build()
    appended = model.with_mask_appended(batch.input_ids)
    assert (appended[:, -1] == MASK_ID).all()
    torch.testing.assert_close(appended[:, :-1], batch.input_ids[:, 1:])  # oldest dropped
    expected = model.logits(model.encode(appended)[:, -1])
    torch.testing.assert_close(model.score(batch.input_ids), expected)
    # Not the output at the newest history item, and a full window loses its oldest item.
    unmasked = model.logits(model.encode(batch.input_ids)[:, -1])
    assert not torch.allclose(model.score(batch.input_ids), unmasked)
    torch.testing.assert_close(model.score(batch.input_ids), model.score(batch.input_ids[:, 1:]))


def test_last_only_scoring_equals_the_full_encoding(batch: SeqBatch) -> None:
    model = build()
    ids = model.with_mask_appended(batch.input_ids)
    last = model.encode(ids, last_only=True)
    assert last.shape == (ids.size(0), 1, CONFIG.hidden_size)
    torch.testing.assert_close(last[:, 0], model.encode(ids)[:, -1])


def test_cloze_masks_about_mask_prob_of_real_items_never_padding() -> None:
    torch.manual_seed(0)
    lengths = torch.randint(0, 51, (2000,))  # including rows of padding only
    real = torch.arange(50) >= (50 - lengths).unsqueeze(1)  # left-padded (2000, 50)
    chosen = cloze_mask(real, mask_prob=0.2, last_item_mask_prob=0.0)
    assert not (chosen & ~real).any()
    expected = torch.floor(lengths * 0.2 + 0.5).clamp(min=1) * (lengths > 0)  # reference's
    torch.testing.assert_close(chosen.sum(1), expected.long())
    share = chosen.sum() / real.sum()
    assert abs(share.item() - 0.2) < 0.01
    # Every position of a row is equally likely: the newest is masked ~ k / n of the time.
    some = lengths > 0
    newest = chosen[some, -1].float().mean().item()
    assert abs(newest - (expected[some] / lengths[some]).mean().item()) < 0.03


def test_last_item_rows_mask_only_the_newest_item() -> None:
    torch.manual_seed(0)
    real = torch.arange(20) >= torch.randint(0, 18, (4000, 1))
    real[0] = False  # a row of padding only has nothing to mask
    only_last = cloze_mask(real, mask_prob=0.5, last_item_mask_prob=1.0)
    assert not (only_last & ~real).any()
    assert only_last[1:, -1].all()
    assert only_last.sum() == real.size(0) - 1
    mixed = cloze_mask(real, mask_prob=0.5, last_item_mask_prob=0.3)
    single = mixed.sum(1) == 1  # rows with >= 2 items mask >= 1 + 1 otherwise
    assert abs(single.float().mean().item() - 0.3) < 0.03


def test_cloze_rebuilds_the_row_and_replaces_masked_items(batch: SeqBatch) -> None:
    model = build(mask_prob=0.5)
    torch.manual_seed(1)
    masked, labels, negatives = model.cloze(batch)
    assert batch.labels is not None
    full = torch.cat([batch.input_ids, batch.labels[:, -1:]], dim=1)[:, -L:]
    chosen = labels != PAD_ID
    assert chosen.any(dim=1).all()  # every row has a target
    torch.testing.assert_close(labels[chosen], full[chosen])
    assert (masked[chosen] == MASK_ID).all()
    torch.testing.assert_close(masked[~chosen], full[~chosen])  # padding stays padding
    assert negatives is not None
    assert negatives.shape == (*full.shape, S)
    assert (negatives[full != PAD_ID] != PAD_ID).all()  # every real position has negatives


def test_bert_80_10_10_rule() -> None:
    model = build(max_seq_len=60, mask_prob=0.5, mask_token_prob=0.8, last_item_mask_prob=0.0)
    torch.manual_seed(0)
    items = torch.randint(1, NUM_ITEMS + 1, (500, 60))
    batch = SeqBatch(input_ids=items[:, :-1], labels=items[:, 1:])
    masked, labels, _ = model.cloze(batch)
    chosen = labels != PAD_ID
    shown, target = masked[chosen], labels[chosen]
    assert abs((shown == MASK_ID).float().mean().item() - 0.8) < 0.02
    # Kept: 10%, plus random draws that hit the original item (1 / N of the other 10%).
    kept = (shown == target).float().mean().item()
    assert abs(kept - (0.1 + 0.1 / NUM_ITEMS)) < 0.02


def test_ce_loss_is_softmax_over_the_catalogue_at_masked_positions(batch: SeqBatch) -> None:
    model = build()  # eval mode: no dropout, so the forward pass is reproducible
    torch.manual_seed(3)
    masked, labels, _ = model.cloze(batch)
    chosen = labels != PAD_ID
    logits = model.logits(model.encode(masked))[chosen][:, 1:]  # padding column excluded
    expected = F.cross_entropy(logits, labels[chosen] - 1)
    torch.manual_seed(3)
    torch.testing.assert_close(model(batch).loss, expected)


@pytest.mark.parametrize("loss", ["bce", "sampled_softmax", "gbce"])
def test_sampled_losses_train_every_parameter(loss: str, batch: SeqBatch) -> None:
    model = build(loss=loss, num_negatives=S).train()
    value = model(batch).loss
    value.backward()
    assert torch.isfinite(value)
    assert all(p.grad is not None for p in model.parameters())


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"mask_prob": 0.0}, "mask_prob"),
        ({"last_item_mask_prob": 1.5}, "last_item_mask_prob"),
        ({"num_heads": 4}, "divisible"),
        ({"max_seq_len": 1}, "max_seq_len"),
        ({"attention_dropout": 1.0}, "attention_dropout"),
    ],
)
def test_invalid_configs_are_rejected(changes: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        dataclasses.replace(CONFIG, **changes)
