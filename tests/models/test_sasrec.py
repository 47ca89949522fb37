"""SASRec properties: causality, padding invariance, every ablation switch, losses by hand."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor

from seqrec.batch import PAD_ID, SeqBatch
from seqrec.config import ConfigError
from seqrec.models.sasrec import (
    Block,
    SASRec,
    SASRecConfig,
    SelfAttention,
    sinusoidal_positions,
)
from seqrec.nn.masks import padding_bias
from tests.tiny import NUM_ITEMS, NUM_USERS, L, assert_causal

CONFIG = SASRecConfig(
    num_items=NUM_ITEMS, num_users=NUM_USERS, max_seq_len=L, hidden_size=18, num_heads=2
)


def build(**changes: object) -> SASRec:
    torch.manual_seed(0)
    return SASRec(dataclasses.replace(CONFIG, **changes)).eval()


LAYOUTS = ["pre_ln", "reference", "post_ln"]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_causal_future_items_do_not_change_the_past(layout: str) -> None:
    model = build(layout=layout)
    assert_causal(lambda ids: model.encode(ids)[0])


@pytest.mark.parametrize(
    "changes",
    [{}, {"layout": "reference"}, {"layout": "post_ln"}, {"position_origin": "oldest"}],
    ids=str,
)
def test_padding_invariance_extra_left_padding_changes_nothing(
    batch: SeqBatch, changes: dict[str, object]
) -> None:
    model = build(max_seq_len=L + 3, **changes)  # room for 3 more columns than the batch has
    ids = batch.input_ids
    short = ids[:, 3:]  # the same rows, 3 fewer columns (row 0 loses items)
    rows = (ids[:, :3] == PAD_ID).all(dim=1)  # rows with >= 3 padding columns
    torch.testing.assert_close(model.score(short)[rows], model.score(ids)[rows])
    padded = F.pad(ids, (3, 0), value=PAD_ID)  # (B, L + 3): every row, 3 more padding columns
    real = ids != PAD_ID
    hidden, _ = model.encode(ids)
    hidden_padded, _ = model.encode(padded)
    torch.testing.assert_close(hidden_padded[:, 3:][real], hidden[real])
    torch.testing.assert_close(model.score(padded), model.score(ids))


def test_padding_tokens_do_not_influence_real_positions(
    batch: SeqBatch, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Padded positions are masked keys: what sits there is irrelevant. ``embed`` zeroes
    them, so garbage is put there after it, where only the attention mask keeps it out."""
    model = build()
    ids = batch.input_ids
    real = ids != PAD_ID
    assert (~real).any()
    hidden, _ = model.encode(ids)
    clean_embed = model.embed
    garbage = torch.randn(*ids.shape, CONFIG.hidden_size) * (~real).unsqueeze(-1)
    monkeypatch.setattr(model, "embed", lambda input_ids: clean_embed(input_ids) + garbage)
    polluted, _ = model.encode(ids)
    assert not torch.equal(polluted[~real], hidden[~real])  # the garbage did get in
    torch.testing.assert_close(polluted[real], hidden[real])


def test_sinusoidal_positions_are_fixed_and_the_transformer_s(batch: SeqBatch) -> None:
    table = sinusoidal_positions(7, 6)
    p, i = 5, 1  # column 2i = sin(p / 10000^(2i/d)), column 2i + 1 its cos
    assert table[p, 2 * i].item() == pytest.approx(math.sin(p / 10000 ** (2 * i / 6)))
    assert table[p, 2 * i + 1].item() == pytest.approx(math.cos(p / 10000 ** (2 * i / 6)))
    assert sinusoidal_positions(4, 5).shape == (4, 5)  # an odd width ends on a sin column
    model = build(position_encoding="sinusoidal").train()
    assert model.pos_emb is not None
    torch.testing.assert_close(model.pos_emb.weight, sinusoidal_positions(L, CONFIG.hidden_size))
    model(batch).loss.backward()
    assert model.pos_emb.weight.grad is None  # not trained
    assert not torch.equal(
        build().eval().score(batch.input_ids), model.eval().score(batch.input_ids)
    )


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


def test_qkv_init_xavier_uniform_reaches_only_the_fused_projection() -> None:
    model = build(init_std=0.02, qkv_init="xavier_uniform", hidden_size=64, num_heads=1)
    bound = (6 / (64 + 3 * 64)) ** 0.5  # Xavier-uniform over the (3D, D) matrix
    for block in model.blocks:
        qkv = block.attn.qkv.weight.detach()
        assert float(qkv.abs().max()) <= bound
        assert abs(float(qkv.std()) - bound / 3**0.5) < 0.01
        assert float(block.attn.qkv.bias.detach().abs().sum()) == 0.0
        assert abs(float(block.attn.proj.weight.detach().std()) - 0.02) < 0.004
    assert abs(float(model.item_emb.weight[1:].detach().std()) - 0.02) < 0.004


def test_torch_init_keeps_pytorchs_defaults_and_excludes_init_std() -> None:
    model = build(init="torch", hidden_size=64, num_heads=1, shared_embedding=False)
    for embedding in (model.item_emb, model.out_emb, model.pos_emb):
        assert embedding is not None
        rows = embedding.weight[1:] if embedding.padding_idx is not None else embedding.weight
        assert abs(float(rows.detach().std()) - 1.0) < 0.05
    assert model.out_emb is not None
    for padded in (model.item_emb, model.out_emb):
        assert float(padded.weight[PAD_ID].detach().abs().sum()) == 0.0
    bound = 1 / 64**0.5  # nn.Linear's default: uniform in +-1/sqrt(fan_in), bias included
    qkv = model.blocks[0].attn.qkv
    assert float(qkv.weight.detach().abs().max()) <= bound
    assert abs(float(qkv.weight.detach().std()) - bound / 3**0.5) < 0.01
    assert 0.0 < float(qkv.bias.detach().abs().max()) <= bound
    with pytest.raises(ConfigError, match="replaces model.init"):
        dataclasses.replace(CONFIG, init="torch", init_std=0.02)


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


def perturbed(model: SASRec) -> SASRec:
    """``model`` with every parameter moved off its initial value: LayerNorms away from (1, 0)
    and biases away from 0, so that swapping two of them, or dropping one, shows."""
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.2 * torch.randn_like(parameter))
    return model


def allowed_keys(ids: Tensor) -> Tensor:
    """(B, L) -> (B, L, L) bool: query i may attend to real keys j <= i, and to itself."""
    real = ids != PAD_ID
    allowed = torch.tril(torch.ones(L, L, dtype=torch.bool)) & real[:, None, :]
    return allowed | torch.eye(L, dtype=torch.bool)


def attention_by_hand(
    attn: SelfAttention, queries: Tensor, keys_values: Tensor, allowed: Tensor
) -> tuple[Tensor, Tensor]:
    """Multi-head attention written out one head at a time: head h owns rows h*d:(h+1)*d of
    W^Q, W^K and W^V (d = D / H); softmax(Q_h K_h^T / sqrt(d)) V_h; the heads concatenated in
    order, then W^O. Returns the output (B, L, D) and the weights (B, H, L, L)."""
    D = queries.size(-1)
    H = attn.num_heads
    d = D // H
    W, b = attn.qkv.weight, attn.qkv.bias
    W_O, b_O = attn.output_projection()
    heads, weights = [], []
    for h in range(H):
        rows = slice(h * d, (h + 1) * d)
        q = queries @ W[:D][rows].T + b[:D][rows]
        k = keys_values @ W[D : 2 * D][rows].T + b[D : 2 * D][rows]
        v = keys_values @ W[2 * D :][rows].T + b[2 * D :][rows]
        logits = (q @ k.transpose(1, 2) / d**0.5).masked_fill(~allowed, float("-inf"))
        weights.append(torch.softmax(logits, dim=-1))
        heads.append(weights[-1] @ v)
    return torch.cat(heads, dim=-1) @ W_O.T + b_O, torch.stack(weights, dim=1)


def block_by_hand(block: Block, x: Tensor, allowed: Tensor, layout: str, residual: bool) -> Tensor:
    """One block's formula (ReLU FFN); without ``residual`` every skip term is dropped:
    pre_ln   h = x + Attn(LN1 x),                  out = h + FFN(LN2 h)
    reference h = LN1 x + Attn(q = LN1 x, kv = x), out = LN2 h + FFN(LN2 h)
    post_ln  h = LN1(x + Attn(x)),                 out = LN2(h + FFN(h))"""
    keep = 1.0 if residual else 0.0

    def ffn(t: Tensor) -> Tensor:
        out: Tensor = block.ffn.fc2(torch.relu(block.ffn.fc1(t)))
        return out

    if layout == "post_ln":
        h = block.ln_attn(keep * x + attention_by_hand(block.attn, x, x, allowed)[0])
        return block.ln_ffn(keep * h + ffn(h))
    n = block.ln_attn(x)
    if layout == "reference":
        m = block.ln_ffn(keep * n + attention_by_hand(block.attn, n, x, allowed)[0])
        return keep * m + ffn(m)
    h = keep * x + attention_by_hand(block.attn, n, n, allowed)[0]
    return keep * h + ffn(block.ln_ffn(h))


@pytest.mark.parametrize("residual", [True, False], ids=["residual", "no_residual"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_blocks_match_their_formula_by_hand(batch: SeqBatch, layout: str, residual: bool) -> None:
    """Two heads, every layout, with and without residual connections, block by block."""
    model = perturbed(build(layout=layout, residual=residual, num_heads=2))
    ids = batch.input_ids
    real = ids != PAD_ID
    x = model.embed(ids)
    for block in model.blocks:
        x = block_by_hand(block, x, allowed_keys(ids), layout, residual)
    hidden, _ = model.encode(ids)
    torch.testing.assert_close(hidden[real], model.ln_f(x)[real])


@pytest.mark.parametrize("layout", LAYOUTS)
def test_residual_false_removes_the_residual_connections(batch: SeqBatch, layout: str) -> None:
    """The switch changes the function, not the parameters: same seed, same weights."""
    default, plain = build(layout=layout), build(layout=layout, residual=False)
    weights, plain_weights = default.state_dict(), plain.state_dict()
    assert weights.keys() == plain_weights.keys()
    assert all(torch.equal(weights[name], plain_weights[name]) for name in weights)
    real = batch.input_ids != PAD_ID
    hidden, _ = default.encode(batch.input_ids)
    plain_hidden, _ = plain.encode(batch.input_ids)
    assert not torch.allclose(hidden[real], plain_hidden[real], atol=1e-3)


@pytest.mark.parametrize("num_heads", [1, 2, 3, 6])
def test_attention_sublayer_splits_and_merges_heads_as_by_hand(
    batch: SeqBatch, num_heads: int
) -> None:
    model = perturbed(build(num_heads=num_heads))
    attn = model.blocks[0].attn
    ids = batch.input_ids
    real = ids != PAD_ID
    x = torch.randn(*ids.shape, CONFIG.hidden_size, generator=torch.Generator().manual_seed(2))
    expected, expected_weights = attention_by_hand(attn, x, x, allowed_keys(ids))
    mask = padding_bias(real, causal=True, dtype=x.dtype)
    fast, _ = attn(x, mask)
    readable, weights = attn(x, mask, need_weights=True)
    assert weights is not None
    torch.testing.assert_close(fast[real], expected[real])
    torch.testing.assert_close(readable[real], expected[real])
    queries = real[:, None, :].expand(-1, num_heads, -1)  # (B, H, L) real query rows
    torch.testing.assert_close(weights[queries], expected_weights[queries])


def test_two_heads_differ_from_one_head_with_the_same_weights(batch: SeqBatch) -> None:
    two = build(num_heads=2)
    one = build(num_heads=1)
    one.load_state_dict(two.state_dict())  # the head count adds no parameters
    real = batch.input_ids != PAD_ID
    assert not torch.allclose(
        one.encode(batch.input_ids)[0][real], two.encode(batch.input_ids)[0][real]
    )


DROPOUT_SITES = {
    "paper": {"embeddings", "sublayer_outputs"},
    "reference": {"embeddings", "attention_weights", "ffn_layers"},
    "bert": {"embeddings", "attention_weights", "sublayer_outputs"},
}


def random_sites(model: SASRec, ids: Tensor) -> set[str]:
    """The places where two training-mode passes over the same input differ."""
    real = ids != PAD_ID
    x = model.eval().embed(ids)
    mask = padding_bias(real, causal=True, dtype=x.dtype)
    block = model.blocks[0]
    runs: dict[str, Callable[[], Tensor]] = {
        "embeddings": lambda: model.embed(ids),
        "attention_weights": lambda: block.attn(x, mask)[0],
        "ffn_layers": lambda: block.ffn(x),
        "sublayer_outputs": lambda: block.dropout(x),
    }
    model.train()
    return {site for site, run in runs.items() if not torch.allclose(run()[real], run()[real])}


@pytest.mark.parametrize("placement", list(DROPOUT_SITES))
def test_dropout_is_random_in_training_only(batch: SeqBatch, placement: str) -> None:
    ids = batch.input_ids
    real = ids != PAD_ID
    model = build(dropout=0.3, dropout_placement=placement)
    assert random_sites(model, ids) == DROPOUT_SITES[placement]
    x = model.eval().embed(ids)
    mask = padding_bias(real, causal=True, dtype=x.dtype)
    block = model.blocks[0]
    torch.testing.assert_close(block(x, mask)[0], block(x, mask)[0])
    torch.testing.assert_close(model.encode(ids)[0], model.encode(ids)[0])
    model.train()  # the block applies its dropout, and so does the whole model
    assert not torch.allclose(block(x, mask)[0][real], block(x, mask)[0][real])
    calls: list[Tensor] = []
    hook = block.dropout.register_forward_hook(lambda module, args, out: calls.append(out))
    block(x, mask)
    hook.remove()
    assert len(calls) == 2  # the sublayer dropout wraps both sublayers' outputs
    assert not torch.allclose(model.encode(ids)[0][real], model.encode(ids)[0][real])
    deterministic = build(dropout=0.0, dropout_placement=placement)
    assert random_sites(deterministic, ids) == set()
    torch.testing.assert_close(deterministic.encode(ids)[0], deterministic.encode(ids)[0])


def test_unshared_output_embedding_is_what_scores(batch: SeqBatch) -> None:
    """shared_embedding: false scores with N: with N = 0 every item scores the same, while
    with the input embedding M = 0 (positions only) the items still score differently."""
    model = build(shared_embedding=False)
    assert model.out_emb is not None
    with torch.no_grad():
        model.out_emb.weight.zero_()
    scores = model.score(batch.input_ids)
    torch.testing.assert_close(scores, scores[:, :1].expand_as(scores))
    model = build(shared_embedding=False)
    with torch.no_grad():
        model.item_emb.weight.zero_()
    scores = model.score(batch.input_ids)[:, 1:]  # (B, N) without the padding column
    assert (scores.std(dim=1) > 1e-3).all()
