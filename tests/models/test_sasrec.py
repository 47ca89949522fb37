"""SASRec properties: causality, padding invariance, every ablation switch, losses by hand."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor

from seqrec.batch import PAD_ID, SeqBatch
from seqrec.models.sasrec import SASRec, SASRecConfig
from tests.tiny import NUM_ITEMS, NUM_USERS, L

CONFIG = SASRecConfig(
    num_items=NUM_ITEMS, num_users=NUM_USERS, max_seq_len=L, hidden_size=18, num_heads=2
)


def build(**changes: object) -> SASRec:
    torch.manual_seed(0)
    return SASRec(dataclasses.replace(CONFIG, **changes)).eval()


def test_causal_future_items_do_not_change_the_past(batch: SeqBatch) -> None:
    model = build()
    t = 4
    changed = batch.input_ids.clone()
    changed[:, t:] = torch.randint(1, NUM_ITEMS + 1, changed[:, t:].shape)
    before, _ = model.encode(batch.input_ids)
    after, _ = model.encode(changed)
    real = (batch.input_ids != PAD_ID)[:, :t]
    torch.testing.assert_close(before[:, :t][real], after[:, :t][real])
    assert not torch.allclose(before[:, t:], after[:, t:])  # the future itself did change


@pytest.mark.parametrize(
    "changes",
    [{}, {"layout": "reference"}, {"layout": "post_ln"}, {"position_origin": "oldest"}],
    ids=str,
)
def test_padding_invariance_extra_left_padding_changes_nothing(
    batch: SeqBatch, changes: dict[str, object]
) -> None:
    model = build(**changes)
    padded = F.pad(batch.input_ids, (3, 0), value=PAD_ID)[:, -L:]  # shift right by 3 columns
    short = batch.input_ids[:, 3:]  # the same rows, 3 fewer columns (row 0 loses items)
    rows = (batch.input_ids[:, :3] == PAD_ID).all(dim=1)  # rows with >= 3 padding columns
    torch.testing.assert_close(model.score(short)[rows], model.score(batch.input_ids)[rows])
    assert padded.shape == batch.input_ids.shape


def test_padding_tokens_do_not_influence_real_positions(batch: SeqBatch) -> None:
    """Padded positions are masked keys: what sits there is irrelevant."""
    model = build()
    scores = model.score(batch.input_ids)
    garbage = batch.input_ids.clone()
    pad = garbage == PAD_ID
    hidden, _ = model.encode(garbage)
    # Replace the embedding of padding by a random vector: outputs at the end must not move.
    with torch.no_grad():
        model.item_emb.weight[PAD_ID] = torch.randn(CONFIG.hidden_size)
    assert pad.any()
    torch.testing.assert_close(model.score(batch.input_ids)[:, 1:], scores[:, 1:])
    assert hidden.shape == (*batch.input_ids.shape, CONFIG.hidden_size)


def test_positions_are_counted_from_the_right(batch: SeqBatch) -> None:
    """The newest item gets position max_seq_len - 1 whatever the batch width."""
    model = build()
    row = batch.input_ids[1:2]  # 3 real items
    narrow = row[:, -3:]
    torch.testing.assert_close(model.score(narrow), model.score(row))


@pytest.mark.parametrize(
    "changes",
    [
        {"positional_embedding": False},
        {"shared_embedding": False},
        {"residual": False},
        {"num_layers": 0},
        {"num_layers": 3},
        {"num_heads": 1},
        {"user_embedding": True},
        {"scale_embedding": False},
        {"loss": "ce"},
        {"loss": "sampled_softmax"},
        {"ffn_size": 37},
        {"dropout_placement": "reference"},
        {"layout": "reference"},
        {"layout": "reference", "dropout_placement": "reference", "residual": False},
        {"layout": "post_ln", "dropout_placement": "bert", "activation": "gelu"},
        {"layout": "post_ln", "residual": False},
        {"position_origin": "oldest"},
        {"init_std": 0.02},
    ],
    ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()),
)
def test_every_ablation_switch_builds_trains_and_scores(
    changes: dict[str, object], batch: SeqBatch
) -> None:
    model = build(**changes).train()
    loss = model(batch).loss
    loss.backward()
    assert torch.isfinite(loss)
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)
    scores = model.eval().score(batch.input_ids, batch.users)
    assert scores.shape == (batch.input_ids.size(0), NUM_ITEMS + 1)


def test_switches_change_the_parameter_set() -> None:
    names = lambda m: {n.split(".")[0] for n, _ in m.named_parameters()}  # noqa: E731
    assert "pos_emb" not in names(build(positional_embedding=False))
    assert "out_emb" in names(build(shared_embedding=False))
    assert "user_emb" in names(build(user_embedding=True))
    assert "blocks" not in names(build(num_layers=0))


def test_user_embedding_needs_users(batch: SeqBatch) -> None:
    model = build(user_embedding=True)
    with pytest.raises(ValueError, match="user embedding"):
        model.score(batch.input_ids)


def test_bce_loss_matches_the_paper_formula(batch: SeqBatch) -> None:
    model = build(num_negatives=1)
    one_negative = dataclasses.replace(batch, negatives=batch.negatives[..., :1])
    hidden, _ = model.encode(batch.input_ids)
    real = batch.labels != PAD_ID
    emb = model.item_emb.weight
    pos = (hidden * emb[batch.labels]).sum(-1)[real]
    negative = one_negative.negatives[..., 0]
    neg = (hidden * emb[negative]).sum(-1)[real]
    hit = (negative == batch.labels)[real]  # an accidental hit is not a negative
    assert hit.any(), "the fixture should exercise accidental hits"
    expected = -(F.logsigmoid(pos) + F.logsigmoid(-neg) * ~hit).mean()
    torch.testing.assert_close(model(one_negative).loss, expected)


def test_ce_loss_is_softmax_over_the_catalogue(batch: SeqBatch) -> None:
    model = build(loss="ce")
    hidden, _ = model.encode(batch.input_ids)
    real = batch.labels != PAD_ID
    logits = hidden[real] @ model.item_emb.weight[1:].T  # padding column excluded
    expected = F.cross_entropy(logits, batch.labels[real] - 1)
    torch.testing.assert_close(model(batch).loss, expected)


def test_attention_weights_are_causal_distributions(batch: SeqBatch) -> None:
    model = build()
    hidden, weights = model.encode(batch.input_ids, need_weights=True)
    fast, none = model.encode(batch.input_ids)
    torch.testing.assert_close(hidden, fast)  # the readable path computes the same thing
    assert none == []
    assert len(weights) == CONFIG.num_layers
    for w in weights:
        assert w.shape == (batch.input_ids.size(0), CONFIG.num_heads, L, L)
        torch.testing.assert_close(w.sum(-1), torch.ones_like(w.sum(-1)))
        assert (w.triu(diagonal=1) == 0).all()  # no weight on the future
        real = batch.input_ids != PAD_ID
        keys_padded = ~real[:, None, None, :] & real[:, None, :, None]
        assert (w[keys_padded.expand_as(w)] == 0).all()  # real queries ignore padding


def test_truncates_to_the_most_recent_items(batch: SeqBatch) -> None:
    model = build(max_seq_len=4)
    torch.testing.assert_close(model.score(batch.input_ids), model.score(batch.input_ids[:, -4:]))


@pytest.mark.parametrize("changes", [{}, {"layout": "reference"}, {"layout": "post_ln"}], ids=str)
def test_last_only_scoring_equals_the_full_encoding(
    batch: SeqBatch, changes: dict[str, object]
) -> None:
    model = build(**changes)
    hidden, _ = model.encode(batch.input_ids)
    last, _ = model.encode(batch.input_ids, last_only=True)
    assert last.shape == (batch.input_ids.size(0), 1, CONFIG.hidden_size)
    torch.testing.assert_close(last[:, 0], hidden[:, -1])


def test_positions_counted_from_the_oldest_item() -> None:
    """position_origin: oldest gives each row's oldest real item position 0 (SASRec+)."""
    model = build(position_origin="oldest", max_seq_len=4)
    ids = torch.tensor([[0, 0, 5, 6], [1, 2, 3, 4]])
    assert model._positions(ids != PAD_ID).tolist() == [[0, 0, 0, 1], [0, 1, 2, 3]]
    # The newest item's position now depends on the history length, unlike the default.
    with torch.no_grad():
        model.pos_emb.weight[1] += 10.0  # type: ignore[union-attr]
    two, three = torch.tensor([[0, 0, 5, 6]]), torch.tensor([[0, 7, 5, 6]])
    hidden_two, _ = model.encode(two)
    hidden_three, _ = model.encode(three)
    assert not torch.allclose(hidden_two[:, -2], hidden_three[:, -2])


def test_init_std_draws_every_matrix_from_that_normal() -> None:
    model = build(init_std=0.02, hidden_size=64, num_heads=1)
    for name, weight in model.named_parameters():
        if weight.dim() == 2:
            rows = (weight[1:] if name.startswith("item_emb") else weight).detach()
            assert abs(float(rows.std()) - 0.02) < 0.004, name
    assert float(model.item_emb.weight[PAD_ID].detach().abs().sum()) == 0.0


def reference_layout_by_hand(
    model: SASRec, ids: torch.Tensor, project: bool, activate: Callable[[Tensor], Tensor]
) -> torch.Tensor:
    """kang205's blocks written out: h = LN(x) + Attn(q = LN(x), k = v = x) with W^O when
    ``project``, then LN(h) + FFN(LN(h)) with ``activate`` between the FFN's layers."""
    real = ids != PAD_ID
    D = CONFIG.hidden_size
    x = model.item_emb(ids) * D**0.5 + model.pos_emb(torch.arange(L))  # type: ignore[misc]
    x = x * real.unsqueeze(-1)
    allowed = torch.tril(torch.ones(L, L, dtype=torch.bool)) & real[:, None, :]
    for block in model.blocks:
        q_in = block.ln_attn(x)
        W, b = block.attn.qkv.weight, block.attn.qkv.bias
        q = q_in @ W[:D].T + b[:D]
        k = x @ W[D : 2 * D].T + b[D : 2 * D]
        v = x @ W[2 * D :].T + b[2 * D :]
        logits = (q @ k.transpose(1, 2) / D**0.5).masked_fill(~allowed, float("-inf"))
        attended = torch.softmax(logits, dim=-1).nan_to_num(0.0) @ v
        h = q_in + (block.attn.proj(attended) if project else attended)
        n = block.ln_ffn(h)
        x = n + block.ffn.fc2(activate(block.ffn.fc1(n)))
    return model.ln_f(x)


def test_reference_layout_is_kang205s_block(batch: SeqBatch) -> None:
    model = build(layout="reference", num_heads=1)
    ids = batch.input_ids
    real = ids != PAD_ID
    expected = reference_layout_by_hand(model, ids, project=True, activate=torch.relu)
    hidden, _ = model.encode(ids)
    torch.testing.assert_close(hidden[real], expected[real])


def test_gsasrec_ports_block_has_no_output_projection_and_a_linear_ffn(batch: SeqBatch) -> None:
    """gSASRec's PyTorch port: the reference block without W^O and with a linear FFN,
    FFN(n) = W2 (W1 n + b1) + b2."""
    model = build(
        layout="reference", num_heads=1, attention_projection=False, activation="identity"
    )
    assert not any(".proj." in name for name, _ in model.named_parameters())
    ids = batch.input_ids
    real = ids != PAD_ID
    expected = reference_layout_by_hand(model, ids, project=False, activate=lambda t: t)
    hidden, _ = model.encode(ids)
    torch.testing.assert_close(hidden[real], expected[real])


def test_post_ln_layout_is_recboles_encoder(batch: SeqBatch) -> None:
    """LN over item + position embeddings, then per block h = LN(x + Attn(x)),
    LN(h + FFN(h)) with GELU, and no LayerNorm after the last block, written out by hand."""
    model = build(layout="post_ln", activation="gelu", num_heads=1, scale_embedding=False)
    with torch.no_grad():  # LayerNorms away from (1, 0), so swapping two of them shows
        for parameter in model.parameters():
            parameter.add_(0.2 * torch.randn_like(parameter))
    ids = batch.input_ids
    real = ids != PAD_ID
    D = CONFIG.hidden_size
    x = model.emb_ln(model.item_emb(ids) + model.pos_emb(torch.arange(L)))  # type: ignore[misc]
    x = x * real.unsqueeze(-1)
    allowed = torch.tril(torch.ones(L, L, dtype=torch.bool)) & real[:, None, :]
    for block in model.blocks:
        q, k, v = block.attn.qkv(x).split(D, dim=-1)
        logits = (q @ k.transpose(1, 2) / D**0.5).masked_fill(~allowed, float("-inf"))
        weights = torch.softmax(logits, dim=-1).nan_to_num(0.0)
        h = block.ln_attn(x + block.attn.proj(weights @ v))
        x = block.ln_ffn(h + block.ffn.fc2(F.gelu(block.ffn.fc1(h))))
    hidden, _ = model.encode(ids)
    torch.testing.assert_close(hidden[real], x[real])
    assert isinstance(model.ln_f, torch.nn.Identity)


def test_bert_dropout_placement_drops_attention_weights_and_sublayer_outputs() -> None:
    paper, bert = build(), build(dropout_placement="bert", layout="post_ln")
    assert paper.blocks[0].attn.dropout == 0.0
    assert paper.blocks[0].dropout.p > 0
    assert bert.blocks[0].attn.dropout == CONFIG.dropout > 0
    assert bert.blocks[0].dropout.p == CONFIG.dropout
    assert bert.blocks[0].ffn.dropout.p == 0.0
