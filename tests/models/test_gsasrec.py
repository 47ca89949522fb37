"""gSASRec: the authors' defaults, gBCE by hand, and t = 0 is SASRec's BCE."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from seqrec.batch import PAD_ID, SeqBatch
from seqrec.config import ConfigError
from seqrec.models.gsasrec import GSASRec, GSASRecConfig
from seqrec.models.sasrec import SASRec, SASRecConfig
from tests.tiny import NUM_ITEMS, NUM_USERS, L, S

CONFIG = GSASRecConfig(
    num_items=NUM_ITEMS,
    num_users=NUM_USERS,
    max_seq_len=L,
    hidden_size=18,
    num_heads=2,
    num_negatives=S,
)


def build(**changes: object) -> GSASRec:
    torch.manual_seed(0)
    return GSASRec(dataclasses.replace(CONFIG, **changes)).eval()


def shared(batch: SeqBatch) -> SeqBatch:
    """The batch with one set of S negatives per row, (B, S), including accidental hits."""
    negatives = batch.negatives[:, -1].clone()  # (B, S): the newest position's set
    negatives[0, 0] = batch.labels[0, -2]  # the target of a real position: must be ignored
    return dataclasses.replace(batch, negatives=negatives)


def test_defaults_are_the_authors_ml1m_config() -> None:
    config = GSASRecConfig(num_items=3416)
    assert (config.hidden_size, config.num_layers, config.num_heads) == (128, 2, 1)
    assert (config.dropout, config.max_seq_len, config.loss) == (0.5, 200, "gbce")
    assert (config.num_negatives, config.gbce_t) == (256, 0.75)
    assert not config.shared_embedding  # reuse_item_embeddings=False
    assert not config.scale_embedding
    needs = config.batch_needs
    assert (needs.num_negatives, needs.shared_negatives, needs.negative_sampler) == (
        256,
        True,
        "uniform",
    )


def test_other_losses_are_refused() -> None:
    with pytest.raises(ConfigError, match="cannot use loss 'ce'"):
        GSASRecConfig(num_items=NUM_ITEMS, loss="ce")


def gbce_by_hand(model: GSASRec, batch: SeqBatch, t: float) -> torch.Tensor:
    hidden, _ = model.encode(batch.input_ids)
    out = model.output_embedding()
    real = batch.labels != PAD_ID
    negatives = batch.negatives
    if negatives.dim() == 2:  # (B, S) -> (B, L, S)
        negatives = negatives.unsqueeze(1).expand(-1, batch.labels.size(1), -1)
    k = negatives.size(-1)
    alpha = k / (NUM_ITEMS - 1)
    beta = alpha * (t * (1 - 1 / alpha) + 1 / alpha)
    pos = (hidden * out[batch.labels]).sum(-1)[real]  # (P,)
    neg = torch.einsum("bld,blsd->bls", hidden, out[negatives])[real]  # (P, S)
    hit = (negatives == batch.labels.unsqueeze(-1))[real]
    # -log(sigma(pos) ** beta) - sum_j log(1 - sigma(neg_j)), accidental hits left out
    per_position = -beta * F.logsigmoid(pos) - (F.logsigmoid(-neg) * ~hit).sum(-1)
    return per_position.mean()


@pytest.mark.parametrize("per_row", [True, False], ids=["shared", "per-position"])
def test_loss_is_gbce_by_hand(batch: SeqBatch, per_row: bool) -> None:
    model = build(shared_negatives=per_row)
    batch = shared(batch) if per_row else batch
    if per_row:  # the hit planted by ``shared`` is ignored, not counted as a negative
        assert (batch.negatives.unsqueeze(1) == batch.labels.unsqueeze(-1)).any()
    torch.testing.assert_close(model(batch).loss, gbce_by_hand(model, batch, t=0.75))


def test_t_zero_is_sasrec_bce_with_the_same_negatives(batch: SeqBatch) -> None:
    gsasrec = build(gbce_t=0.0)
    fields = {f.name for f in dataclasses.fields(SASRecConfig) if f.init}
    values = {k: v for k, v in dataclasses.asdict(gsasrec.config).items() if k in fields}
    sasrec = SASRec(SASRecConfig(**{**values, "loss": "bce"})).eval()
    sasrec.load_state_dict(gsasrec.state_dict())
    for negatives in (batch, shared(batch)):
        torch.testing.assert_close(gsasrec(negatives).loss, sasrec(negatives).loss)
    assert not torch.allclose(build(gbce_t=0.75)(batch).loss, sasrec(batch).loss)


def test_scores_use_the_separate_output_embedding(batch: SeqBatch) -> None:
    model = build()
    assert model.out_emb is not None
    hidden, _ = model.encode(batch.input_ids)
    expected = hidden[:, -1] @ model.out_emb.weight.T
    torch.testing.assert_close(model.score(batch.input_ids), expected)
