"""DuoRec: CE + lambda * InfoNCE by hand, same-target false negatives, lambda = 0 is SASRec."""

from __future__ import annotations

import dataclasses
import logging

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from seqrec.batch import PAD_ID, SeqBatch
from seqrec.config import ConfigError
from seqrec.data.batches import TrainBatches
from seqrec.data.sequences import Sequences
from seqrec.models import duorec as duorec_module
from seqrec.models.duorec import DuoRec, DuoRecConfig, info_nce
from seqrec.models.sasrec import SASRec, SASRecConfig
from seqrec.training.loop import log_epoch, train_one_epoch
from tests.tiny import NUM_ITEMS, NUM_USERS, L

CONFIG = DuoRecConfig(
    num_items=NUM_ITEMS,
    num_users=NUM_USERS,
    max_seq_len=L,
    hidden_size=18,
    num_heads=2,
    ffn_size=29,
    contrastive_weight=0.3,
    temperature=0.7,
)


def build(**changes: object) -> DuoRec:
    torch.manual_seed(0)
    return DuoRec(dataclasses.replace(CONFIG, **changes)).train()


@pytest.fixture
def duo_batch() -> SeqBatch:
    """4 left-padded rows; rows 0 and 3 share their newest target (a false negative pair)."""
    g = torch.Generator().manual_seed(1)
    items = torch.randint(1, NUM_ITEMS + 1, (4, L + 1), generator=g)
    items[3, -1] = items[0, -1]
    lengths = torch.tensor([L, 4, 2, 5])
    real = torch.arange(L).unsqueeze(0) >= (L - lengths).unsqueeze(1)
    same = torch.randint(1, NUM_ITEMS + 1, (4, 5), generator=g)
    same[1, :2] = PAD_ID
    same[2, :4] = PAD_ID
    return SeqBatch(
        input_ids=torch.where(real, items[:, :-1], PAD_ID),
        labels=torch.where(real, items[:, 1:], PAD_ID),
        same_target_ids=same,
    )


def nce_by_hand(
    first: torch.Tensor, second: torch.Tensor, targets: torch.Tensor | None, tau: float
) -> torch.Tensor:
    """One anchor at a time: its partner against every other view it may be contrasted with."""
    z = torch.cat([first, second])
    n = z.size(0)
    total = z.new_zeros(())
    for i in range(n):
        j = (i + n // 2) % n
        others = [
            k
            for k in range(n)
            if k not in (i, j)
            and (targets is None or targets[k % (n // 2)] != targets[i % (n // 2)])
        ]
        logits = z[i] @ z[[j, *others]].T / tau
        total = total - logits.log_softmax(-1)[0]
    return total / n


def loss_by_hand(model: DuoRec, batch: SeqBatch) -> torch.Tensor:
    """CE at every real position + lambda * InfoNCE of the newest states (dropout off),
    each InfoNCE example weighed as one of the CE's positions."""
    config = model.config
    hidden, _ = model.encode(batch.input_ids)
    real = batch.labels != PAD_ID
    ce = F.cross_entropy(hidden[real] @ model.item_emb.weight[1:].T, batch.labels[real] - 1)
    view, _ = model.encode(batch.input_ids)  # without dropout every pass is the same view
    same, _ = model.encode(batch.same_target_ids)
    a, s = view[:, -1], same[:, -1]
    if config.similarity == "cos":
        a, s = F.normalize(a, dim=-1), F.normalize(s, dim=-1)
    targets = batch.labels[:, -1] if config.mask_same_target else None
    tau = config.temperature
    pairs = {"us_x": [(a, s)], "un": [(a, a)], "su": [(a, s)], "us": [(a, a), (a, s)]}
    contrastive = sum(nce_by_hand(x, y, targets, tau) for x, y in pairs[config.contrast])
    per_example = batch.labels.size(0) / real.sum()  # one contrastive example per row
    return ce + config.contrastive_weight * per_example * contrastive


@pytest.mark.parametrize(
    "changes",
    [
        {},
        {"mask_same_target": False},
        {"similarity": "cos"},
        {"contrast": "un"},
        {"contrast": "su"},
        {"contrast": "us"},
    ],
    ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()) or "us_x",
)
def test_loss_is_ce_plus_lambda_infonce_by_hand(
    duo_batch: SeqBatch, changes: dict[str, object]
) -> None:
    model = build(dropout=0.0, **changes)
    torch.testing.assert_close(model(duo_batch).loss, loss_by_hand(model, duo_batch))


@pytest.mark.parametrize("contrast", ["us_x", "un", "us"])
def test_the_unsupervised_view_is_a_second_dropout_pass(
    duo_batch: SeqBatch, contrast: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The by-hand tests run without dropout, where every pass is the same view: here the
    unsupervised view must be a fresh dropout draw, not the training pass reused."""
    calls: list[tuple[torch.Tensor, torch.Tensor]] = []

    def recording(first: torch.Tensor, second: torch.Tensor, **kwargs: object) -> torch.Tensor:
        calls.append((first.detach(), second.detach()))
        return info_nce(first, second, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(duorec_module, "info_nce", recording)
    for dropout in (0.5, 0.0):
        calls.clear()
        model = build(dropout=dropout, contrast=contrast)
        hidden = model(duo_batch).hidden
        assert hidden is not None
        trained = hidden[:, -1].detach()  # the training pass's newest state
        # us_x contrasts the dropout view with the same-target one; un and us put the
        # training pass first and the dropout view second (us: in its first term).
        if contrast == "us_x":
            unsupervised = calls[0][0]
        else:
            torch.testing.assert_close(calls[0][0], trained)
            unsupervised = calls[0][1]
        if dropout > 0:
            assert not torch.allclose(unsupervised, trained)
        else:
            torch.testing.assert_close(unsupervised, trained)


def test_the_loss_reports_its_two_terms(duo_batch: SeqBatch) -> None:
    model = build(dropout=0.0)
    output = model(duo_batch)
    assert set(output.terms) == {"next_item", "contrastive"}
    share = 4 / int((duo_batch.labels != PAD_ID).sum())  # 4 rows, 4 contrastive examples
    combined = output.terms["next_item"] + 0.3 * share * output.terms["contrastive"]
    torch.testing.assert_close(output.loss, combined)
    assert output.terms["contrastive"] > 0
    assert build(contrastive_weight=0.0)(duo_batch).terms == {}


def test_the_training_log_has_each_terms_epoch_mean(
    duo_batch: SeqBatch, caplog: pytest.LogCaptureFixture
) -> None:
    model = build(dropout=0.0)
    stats = train_one_epoch(model, [duo_batch, duo_batch], None, device=torch.device("cpu"))
    with torch.no_grad():  # no optimizer: both batches saw the same weights
        output = model(duo_batch)
    assert stats.terms["contrastive"] == pytest.approx(float(output.terms["contrastive"]))
    share = 4 / int((duo_batch.labels != PAD_ID).sum())
    expected = stats.terms["next_item"] + 0.3 * share * stats.terms["contrastive"]
    assert stats.loss == pytest.approx(expected)
    row = {"epoch": 1, "loss": stats.loss, "epoch_seconds": 1.0}
    row.update({f"loss_{name}": value for name, value in stats.terms.items()})
    with caplog.at_level(logging.INFO, logger="seqrec.training.loop"):
        log_epoch(row)
    assert f"(next_item {stats.terms['next_item']:.4f}, contrastive " in caplog.text


def test_same_target_views_are_not_negatives(duo_batch: SeqBatch) -> None:
    g = torch.Generator().manual_seed(2)
    first, second = torch.randn(2, 4, 6, generator=g)
    targets = duo_batch.labels[:, -1]
    assert targets[0] == targets[3]
    assert len(set(targets.tolist())) == 3
    masked = info_nce(first, second, temperature=0.7, targets=targets)
    torch.testing.assert_close(masked, nce_by_hand(first, second, targets, 0.7))
    assert not torch.allclose(masked, info_nce(first, second, temperature=0.7))
    # Two rows with one target: each view has only its partner left, whatever the vectors.
    same = torch.tensor([5, 5])
    torch.testing.assert_close(
        info_nce(first[:2], second[:2], temperature=0.7, targets=same), torch.tensor(0.0)
    )
    assert info_nce(first[:2], second[:2], temperature=0.7) > 0


def test_lambda_zero_is_sasrec_ce_on_the_same_weights(batch: SeqBatch) -> None:
    duorec = build(contrastive_weight=0.0)  # dropout 0.5: the same seed, the same masks
    fields = {f.name for f in dataclasses.fields(SASRecConfig) if f.init}
    values = {k: v for k, v in dataclasses.asdict(duorec.config).items() if k in fields}
    sasrec = SASRec(SASRecConfig(**values)).train()
    sasrec.load_state_dict(duorec.state_dict())
    torch.manual_seed(1)
    expected = sasrec(batch).loss
    torch.manual_seed(1)
    torch.testing.assert_close(duorec(batch).loss, expected)
    torch.manual_seed(1)
    assert not torch.allclose(build()(batch).loss, expected)


def test_batch_needs_ask_for_same_target_sequences_only_when_used() -> None:
    assert CONFIG.batch_needs.same_target_sequences
    assert CONFIG.batch_needs.num_negatives == 0  # full CE needs no negatives
    assert not dataclasses.replace(CONFIG, contrast="un").batch_needs.same_target_sequences
    assert not dataclasses.replace(CONFIG, contrastive_weight=0.0).batch_needs.same_target_sequences
    sampled = dataclasses.replace(CONFIG, loss="bce", num_negatives=3).batch_needs
    assert sampled.same_target_sequences
    assert sampled.num_negatives == 3


def test_missing_same_target_sequences_is_a_clear_error(batch: SeqBatch) -> None:
    with pytest.raises(ValueError, match="same_target_ids"):
        build()(dataclasses.replace(batch, same_target_ids=None))
    build(contrast="un")(dataclasses.replace(batch, same_target_ids=None))  # not needed


def test_invalid_settings_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="user embedding"):
        dataclasses.replace(CONFIG, user_embedding=True)
    with pytest.raises(ConfigError, match="temperature"):
        dataclasses.replace(CONFIG, temperature=0.0)
    with pytest.raises(ConfigError, match="contrastive_weight"):
        dataclasses.replace(CONFIG, contrastive_weight=-1.0)


def one_library_batch(model: DuoRec, rows: list[list[int]], rng: np.random.Generator) -> SeqBatch:
    """The single training batch the library builds from ``rows`` for ``model``'s needs."""
    batches = TrainBatches(
        Sequences.from_lists(rows),
        users=np.arange(len(rows)),
        num_items=NUM_ITEMS,
        max_seq_len=L,
        batch_size=sum(len(r) for r in rows),  # more than rows or prefixes: one batch
        needs=model.batch_needs,
    )
    (batch,) = list(batches.epoch(rng))
    return batch


def test_trains_on_the_library_batches_with_a_sampled_loss() -> None:
    rng = np.random.default_rng(0)
    rows = [list(rng.integers(1, NUM_ITEMS + 1, size=n)) for n in (6, 3, 9, 2, 5)]
    rows[1][-1] = rows[0][-1]  # a target with another occurrence to pick as positive
    model = build(loss="bce", num_negatives=3)
    batch = one_library_batch(model, rows, rng)
    assert batch.same_target_ids is not None
    assert batch.negatives is not None
    loss = model(batch).loss
    loss.backward()
    assert torch.isfinite(loss)
    assert all(p.grad is not None for p in model.parameters())


def test_prefix_examples_train_every_prefix_with_its_own_contrastive_term() -> None:
    rng = np.random.default_rng(0)
    rows = [list(rng.integers(1, NUM_ITEMS + 1, size=n)) for n in (6, 3, 9, 2, 5)]
    model = build(examples="prefixes", dropout=0.0)
    assert model.config.batch_needs.prefix_examples
    assert not CONFIG.batch_needs.prefix_examples
    batch = one_library_batch(model, rows, rng)
    assert batch.labels is not None
    assert batch.input_ids.size(0) == sum(len(r) - 1 for r in rows)  # one example per target
    assert (batch.labels[:, :-1] == PAD_ID).all()
    # the loss: CE of each example's newest state + lambda * InfoNCE over the examples
    hidden, _ = model.encode(batch.input_ids)
    items = model.output_embedding()
    ce = F.cross_entropy(hidden[:, -1] @ items[1:].T, batch.labels[:, -1] - 1)
    torch.testing.assert_close(model(batch).loss, loss_by_hand(model, batch))
    assert not torch.allclose(model(batch).loss, ce)
    torch.testing.assert_close(
        build(examples="prefixes", dropout=0.0, contrastive_weight=0.0)(batch).loss, ce
    )
