"""RecRec: the reasoner, the two stages, deep supervision, scoring and the IDR, by hand."""

from __future__ import annotations

import copy
import itertools
import math
from collections.abc import Callable

import numpy as np
import pytest
import torch
from torch import Tensor

from seqrec.batch import PAD_ID, SeqBatch
from seqrec.config import ConfigError, TrainConfig
from seqrec.data.batches import TrainBatches
from seqrec.data.sequences import Sequences
from seqrec.models import build_model, build_model_config, recrec
from seqrec.models.base import with_inference_settings
from seqrec.models.recrec import (
    Reads,
    RecRec,
    interest_ce,
    interest_ce_reference,
    interest_diversity,
    interest_scores,
    prefix_mask,
    select_rows,
)
from seqrec.training.loop import build_optimizer, train_one_epoch
from tests.models import test_common
from tests.tiny import NUM_ITEMS, NUM_USERS, TINY_CONFIGS, L

TINY = {k: v for k, v in TINY_CONFIGS["recrec"].items() if k not in ("num_items", "num_users")}
# Small deep supervision so a stage-2 step stays cheap: K=2 rounds of T=2 steps, n=2.
STAGE_2 = {"stage": 2, "rounds": 2, "steps_per_round": 2, "inner_steps": 2}


def make(seed: int = 0, **values: object) -> RecRec:
    torch.manual_seed(seed)
    config = build_model_config(
        {"name": "recrec", **TINY, **values}, num_items=NUM_ITEMS, num_users=NUM_USERS
    )
    model = build_model(config)
    assert isinstance(model, RecRec)
    return model


def randomise_reasoner(model: RecRec) -> RecRec:
    """Non-zero output projections, so that a reasoning step changes S and M."""
    assert model.reasoner is not None
    with torch.no_grad():
        torch.nn.init.normal_(model.reasoner.attn.proj.weight, std=0.3)
        torch.nn.init.normal_(model.reasoner.ffn.w2.weight, std=0.3)
    return model


def record_steps(model: RecRec) -> list[tuple[Tensor, Tensor, Tensor, Tensor]]:
    """Replace ``model.step`` by a wrapper that records (S in, M in, S out, M out)."""
    calls: list[tuple[Tensor, Tensor, Tensor, Tensor]] = []
    step: Callable[..., tuple[Tensor, Tensor]] = model.step

    def recorded(s: Tensor, m: Tensor, *rest: object) -> tuple[Tensor, Tensor]:
        s_out, m_out = step(s, m, *rest)
        calls.append((s, m, s_out, m_out))
        return s_out, m_out

    model.step = recorded
    return calls


# ------------------------------------------------------------------ reasoner and states
def test_reasoner_is_the_identity_at_init() -> None:
    model = make(**STAGE_2)
    reasoner = model.reasoner
    assert reasoner is not None
    x, context, hidden = torch.randn(2, 3, 3, 18), torch.randn(2, 3, 3, 18), torch.randn(2, 5, 18)
    reads = Reads.of(prefix_mask(torch.ones(2, 5, dtype=torch.bool), newest_only=False)[:, :3])
    own, shared = reasoner.context(context), reasoner.context(hidden)
    torch.testing.assert_close(reasoner(x, own, shared, reads), x, rtol=0, atol=0)
    torch.testing.assert_close(reasoner(x, own), x, rtol=0, atol=0)
    randomise_reasoner(model)
    assert not torch.allclose(reasoner(x, own, shared, reads), x)


def test_s0_is_a_fixed_truncated_normal_buffer_not_a_parameter() -> None:
    model = make(**STAGE_2)
    assert "s0" in dict(model.named_buffers())
    assert "s0" not in dict(model.named_parameters())
    assert "s0" in model.state_dict()  # saved with the weights: a loaded model reasons alike
    assert model.s0 is not None
    assert model.s0.shape == (3, 18)
    assert not model.s0.requires_grad
    assert model.s0.abs().max() <= 2.0
    assert model.s0.std() > 0.5  # drawn with std 1, truncated at 2
    assert "s0" not in make().state_dict()  # stage 1 has no reasoner


def test_s0_stays_the_same_through_training_steps(batch: SeqBatch) -> None:
    model = randomise_reasoner(make(**STAGE_2)).train()
    assert model.s0 is not None
    before = model.s0.clone()
    optimizer = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=0.1)
    for _ in range(2):
        optimizer.zero_grad()
        model(batch).loss.backward()
        optimizer.step()
    assert torch.equal(model.s0, before)
    assert torch.equal(make(**STAGE_2).s0, before)  # drawn from the seed, not per run


def test_reasoning_at_depth_n_is_n_hand_written_steps(batch: SeqBatch) -> None:
    """f^N(M_0): each step n scratchpad updates S <- Reasoner(S, [H; M]) with M fixed, then
    M <- gate(Reasoner(M, S), M), S carried over from the step before."""
    n, depth = 2, 3
    model = randomise_reasoner(make(**{**STAGE_2, "inner_steps": n})).eval()
    reasoner, gate = model.reasoner, model.gate
    assert reasoner is not None
    assert gate is not None
    assert model.s0 is not None
    with torch.no_grad():
        encoded = model.encode(batch.input_ids, newest_only=True)
        hidden = reasoner.context(encoded.hidden)
        s, m = model.s0.expand_as(encoded.interests), encoded.interests
        for _ in range(depth):
            fixed = reasoner.context(m)
            for _ in range(n):
                s = reasoner(s, fixed, hidden, encoded.reads)
            m = gate(reasoner(m, reasoner.context(s)), m)
        torch.testing.assert_close(model.interests(batch.input_ids, depth=depth), m[:, 0])
        assert not torch.allclose(model.interests(batch.input_ids, depth=depth - 1), m[:, 0])


def test_every_round_starts_from_detached_states_and_only_its_last_step_has_grad(
    batch: SeqBatch,
) -> None:
    # a reasoner that is not the identity, so that each step moves S and M
    model = randomise_reasoner(make(rounds=3, steps_per_round=3, stage=2, inner_steps=1))
    calls = record_steps(model)
    model.train()(batch).loss.backward()
    assert len(calls) == 9  # K x T steps
    with_grad = [m_out.requires_grad for _, _, _, m_out in calls]
    assert with_grad == [False, False, True] * 3
    assert not any(s.requires_grad or m.requires_grad for s, m, _, _ in calls)  # detached in
    assert model.s0 is not None
    torch.testing.assert_close(calls[0][0], model.s0.expand_as(calls[0][0]))  # round 1: S_0
    for before, after in itertools.pairwise(calls):  # within and across rounds
        torch.testing.assert_close(after[0], before[2].detach(), rtol=0, atol=0)
        torch.testing.assert_close(after[1], before[3].detach(), rtol=0, atol=0)
    assert not torch.allclose(calls[3][0], model.s0.expand_as(calls[3][0]))  # not S_0 again
    assert all(p.grad is not None for p in model.reasoner.parameters())


def test_round_updates_step_after_every_round_and_the_next_round_reads_the_new_weights(
    batch: SeqBatch,
) -> None:
    """supervision_updates: round (TRM): an optimizer step after each round's loss; the next
    round continues from the detached states with the updated reasoner, its keys of H too."""
    values = {**STAGE_2, "rounds": 3, "dropout": 0.0, "compressor_dropout": 0.0}
    model = randomise_reasoner(make(**values, supervision_updates="round"))
    assert model.config.updates_per_batch == 3
    assert make(**values).config.updates_per_batch == 1  # the default: one step a batch
    by_hand = copy.deepcopy(model).train()

    def sgd(m: RecRec) -> torch.optim.Optimizer:
        return torch.optim.SGD([p for p in m.parameters() if p.requires_grad], lr=0.5)

    optimizer, steps = sgd(model), []
    optimizer.register_step_post_hook(lambda *_: steps.append(len(steps)))
    stats = train_one_epoch(model, [batch], optimizer, device=torch.device("cpu"))
    assert len(steps) == 3

    reasoner, hand_optimizer, expected = by_hand.reasoner, sgd(by_hand), []
    assert reasoner is not None
    assert by_hand.s0 is not None
    encoded, real, targets = by_hand._training_examples(batch)
    s, m = by_hand.s0.expand_as(encoded.interests), encoded.interests
    for _ in range(3):
        # H's keys, read with this round's weights (rows: the packed groups' own)
        shared = select_rows(reasoner.context(encoded.hidden), encoded.rows)
        with torch.no_grad():
            s, m = by_hand.step(s, m, shared, encoded.reads)
        s, m = by_hand.step(s, m, shared, encoded.reads)
        loss = by_hand.objective(encoded.examples(m, real), targets)[0]
        hand_optimizer.zero_grad()
        loss.backward()
        hand_optimizer.step()
        expected.append(float(loss.detach()))
        s, m = s.detach(), m.detach()
    assert [stats.terms[f"round_{k}"] for k in (1, 2, 3)] == pytest.approx(expected, rel=1e-5)
    assert stats.loss == pytest.approx(sum(expected) / 3, rel=1e-5)
    for name, value in by_hand.state_dict().items():
        torch.testing.assert_close(model.state_dict()[name], value, msg=name)
    one_step = randomise_reasoner(make(**values))  # the same rounds, all before one step
    rounds = [float(one_step.train()(batch).terms[f"round_{k}"].detach()) for k in (1, 2, 3)]
    assert rounds[0] == pytest.approx(expected[0], rel=1e-5)
    assert rounds[1] != pytest.approx(expected[1], rel=1e-3)


def test_n_zero_keeps_the_scratchpad_at_s0(batch: SeqBatch) -> None:
    for n, fixed in ((0, True), (2, False)):
        model = randomise_reasoner(make(**{**STAGE_2, "inner_steps": n}))
        calls = record_steps(model)
        model.eval().score(batch.input_ids)
        assert model.s0 is not None
        s_after = calls[-1][2]
        assert torch.equal(s_after, model.s0.expand_as(s_after)) == fixed


def test_gates(batch: SeqBatch) -> None:
    m0 = make(**STAGE_2).eval().interests(batch.input_ids, depth=0)
    models = {gate: make(**STAGE_2, gate=gate).eval() for gate in ("overwrite", "gru", "gru_cell")}
    assert models["overwrite"].gate is None
    # While the reasoner is the identity (at init), overwriting and the GRU update gate keep
    # M_0 at any depth; a GRU cell on normalised states does not.
    torch.testing.assert_close(models["overwrite"].interests(batch.input_ids, depth=2), m0)
    torch.testing.assert_close(models["gru"].interests(batch.input_ids, depth=2), m0)
    assert not torch.allclose(models["gru_cell"].interests(batch.input_ids, depth=1), m0, atol=0.1)
    weights = randomise_reasoner(models["overwrite"]).reasoner.state_dict()
    deeper = {}
    for gate, model in models.items():
        model.reasoner.load_state_dict(weights)
        deeper[gate] = model.interests(batch.input_ids, depth=1)
    assert not torch.allclose(deeper["overwrite"], deeper["gru"], atol=1e-3)
    assert not torch.allclose(deeper["gru"], deeper["gru_cell"], atol=1e-3)


def test_gru_update_gate_by_hand() -> None:
    gate = make(**STAGE_2).gate
    assert gate is not None
    update, state = torch.randn(2, 1, 3, 18), torch.randn(2, 1, 3, 18)
    ln = torch.nn.functional.layer_norm
    inputs = torch.cat([ln(update, (18,)), ln(state, (18,))], dim=-1)
    z = torch.sigmoid(inputs @ gate.update_gate.weight.T + gate.update_gate.bias)
    torch.testing.assert_close(gate(update, state), z * state + (1 - z) * update)


def test_prefix_examples_read_only_their_past(batch: SeqBatch) -> None:
    model = make().eval()
    t = 4
    changed = batch.input_ids.clone()
    changed[:, t + 1 :] = torch.randint(1, NUM_ITEMS + 1, changed[:, t + 1 :].shape)
    with torch.no_grad():
        before = model.encode(batch.input_ids, newest_only=False).interests
        after = model.encode(changed, newest_only=False).interests
    real = (batch.input_ids != PAD_ID)[:, : t + 1]
    torch.testing.assert_close(before[:, : t + 1][real], after[:, : t + 1][real])
    assert not torch.allclose(before[:, -1], after[:, -1])


def test_prefix_mask() -> None:
    real = torch.tensor([[False, True, True]])
    assert prefix_mask(real, newest_only=True).tolist() == [[[False, True, True]]]
    assert prefix_mask(real, newest_only=False).tolist() == [
        [[True, False, False], [False, True, False], [False, True, True]]
    ]  # a padded group reads only itself (never fully masked; discarded later)


def test_reads_blocks_span_only_the_positions_their_groups_read() -> None:
    real = torch.tensor(
        [[False, False, True, True, True, True], [False, False, False, True, True, True]]
    )
    reads = Reads.of(prefix_mask(real, newest_only=False), block=2)
    # groups 0-1 read only themselves (padding); 2-3 read 2..3; 4-5 read 2..5 (row 0)
    assert reads.blocks == (
        (slice(0, 2), slice(0, 2)),
        (slice(2, 4), slice(2, 4)),
        (slice(4, 6), slice(2, 6)),
    )
    newest = Reads.of(prefix_mask(real, newest_only=True))
    assert newest.blocks == ((slice(0, 32), slice(2, 6)),)


@pytest.mark.parametrize("with_own_keys", [True, False])
def test_attention_in_blocks_equals_attention_over_every_position(with_own_keys: bool) -> None:
    torch.manual_seed(0)
    B, L, R, D, C = 3, 11, 4, 8, 5
    attention = recrec.GroupAttention(D, num_heads=2, bias=True)
    real = torch.arange(L).expand(B, L) >= torch.tensor([[0], [4], [9]])  # left padding
    mask = prefix_mask(real, newest_only=False)
    x = torch.randn(B, L, R, D, requires_grad=True)
    hidden = torch.randn(B, L, D, requires_grad=True)
    context = torch.randn(B, L, C, D)
    whole = Reads(mask, ((slice(0, L), slice(0, L)),))
    blocked = Reads.of(mask, block=3)
    assert len(blocked.blocks) == 4
    assert blocked.blocks[0][1] == slice(0, 3)

    def attend(reads: Reads) -> tuple[Tensor, ...]:
        own = attention.keys(context) if with_own_keys else None
        out = attention(x, own, attention.keys(hidden), reads)
        weights = torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
        return (out, *torch.autograd.grad((out * weights).sum(), [x, hidden]))

    for got, expected in zip(attend(blocked), attend(whole), strict=True):
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("newest_only", [False, True])
def test_recency_bias_counts_distance_from_each_groups_newest_position(newest_only: bool) -> None:
    """A large bias at distance 0 makes each group read only its newest position: its prefix's
    last item, or the row's newest; blocks of groups change nothing."""
    torch.manual_seed(0)
    B, L, R, D = 3, 7, 2, 8
    attention = recrec.GroupAttention(D, num_heads=2, bias=True)
    real = torch.arange(L).expand(B, L) >= torch.tensor([[0], [2], [5]])
    mask = prefix_mask(real, newest_only)
    G = mask.size(1)
    x, hidden = torch.randn(B, G, R, D), torch.randn(B, L, D)
    keys = attention.keys(hidden)
    recency = torch.zeros(2, L)
    recency[:, 0] = 50.0
    out = attention(x, None, keys, Reads.of(mask, block=2), recency)
    values = keys[1].movedim(1, 2).reshape(B, L, D)  # (B, L, D), heads side by side
    newest = torch.arange(L).expand(B, L) if not newest_only else torch.full((B, 1), L - 1)
    expected = attention.proj(values.gather(1, newest.unsqueeze(-1).expand(B, G, D)))
    torch.testing.assert_close(out, expected.unsqueeze(2).expand(B, G, R, D))
    random = torch.randn(2, L)
    blocked = attention(x, None, keys, Reads.of(mask, block=2), random)
    whole = attention(x, None, keys, Reads(mask, ((slice(0, G), slice(0, L)),)), random)
    torch.testing.assert_close(blocked, whole)


def test_compressor_recency_starts_as_the_plain_compressor_and_packs_as_the_grid(
    batch: SeqBatch,
) -> None:
    plain, biased = make().eval(), make(compressor_recency=True).eval()
    biased.load_state_dict(plain.state_dict(), strict=False)
    recency = [layer.recency for layer in biased.compressor.layers]
    assert all(isinstance(r, torch.nn.Parameter) and not r.any() for r in recency)
    real = batch.labels != PAD_ID
    with torch.no_grad():
        expected = plain.encode(batch.input_ids, newest_only=False).interests
        torch.testing.assert_close(
            biased.encode(batch.input_ids, newest_only=False).interests, expected
        )
        for r in recency:
            r.normal_()
        grid = biased.encode(batch.input_ids, newest_only=False).interests
        packed = biased.encode(batch.input_ids, newest_only=False, groups=real).interests
    assert not torch.allclose(grid[real], expected[real])
    torch.testing.assert_close(packed[:, 0], grid[real])


# ------------------------------------------------------------------ scoring and losses
def test_log_mean_exp_scoring_by_hand() -> None:
    interests = torch.tensor([[[1.0, 0.0], [0.0, 2.0]]])  # (1, R=2, D=2)
    items = torch.tensor([[0.0, 0.0], [1.0, 1.0], [2.0, 0.0]])  # PAD, item 1, item 2
    scores = interest_scores(interests, items, temperature=0.5)
    # item 1: s_1 = 1 / 0.5 = 2, s_2 = 2 / 0.5 = 4; item 2: s_1 = 4, s_2 = 0
    expected = [math.log((math.exp(2) + math.exp(4)) / 2), math.log((math.exp(4) + 1) / 2)]
    torch.testing.assert_close(scores[0, 1:], torch.tensor(expected))


def test_scoring_in_blocks_of_users_changes_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    g = torch.Generator().manual_seed(0)
    interests, items = torch.randn(7, 3, 5, generator=g), torch.randn(11, 5, generator=g)
    logits = torch.einsum("brd,nd->brn", interests, items) / 0.7
    expected = logits.logsumexp(dim=1) - math.log(3)
    monkeypatch.setattr(recrec, "SCORE_BLOCK", 2 * 3 * 11)  # blocks of 2 users: 2, 2, 2, 1
    torch.testing.assert_close(interest_scores(interests, items, 0.7), expected)
    monkeypatch.undo()  # one block
    torch.testing.assert_close(interest_scores(interests, items, 0.7), expected)
    assert interest_scores(interests[:0], items, 0.7).shape == (0, 11)


def test_the_interest_ce_is_the_cross_entropy_of_the_scores() -> None:
    g = torch.Generator().manual_seed(1)
    interests, items = torch.randn(6, 3, 5, generator=g), torch.randn(NUM_ITEMS + 1, 5, generator=g)
    targets = torch.randint(1, NUM_ITEMS + 1, (6,), generator=g)
    scores = interest_scores(interests, items, 0.4)[:, 1:]  # without the padding column
    torch.testing.assert_close(
        interest_ce_reference(interests, items, targets, 0.4),
        torch.nn.functional.cross_entropy(scores, targets - 1),
    )


def test_the_model_scores_with_its_temperature(batch: SeqBatch) -> None:
    model = make(temperature=0.5).eval()
    with torch.no_grad():
        m0 = model.interests(batch.input_ids)
        expected = interest_scores(m0, model.items(), 0.5)
        torch.testing.assert_close(model.score(batch.input_ids), expected)
        assert not torch.allclose(expected, interest_scores(m0, model.items(), 1.0))


def test_fused_interest_ce_matches_the_reference() -> None:
    g = torch.Generator().manual_seed(0)
    interests = torch.randn(11, 3, 5, generator=g, requires_grad=True)
    items = torch.randn(NUM_ITEMS + 1, 5, generator=g, requires_grad=True)
    targets = torch.randint(1, NUM_ITEMS + 1, (11,), generator=g)
    fused = interest_ce(interests, items, targets, 0.7)
    reference = interest_ce_reference(interests, items, targets, 0.7)
    torch.testing.assert_close(fused, reference)
    grads = torch.autograd.grad(fused, (interests, items))
    expected = torch.autograd.grad(reference, (interests, items))
    for got, want in zip(grads, expected, strict=True):
        torch.testing.assert_close(got, want)
    # with R = 1 it is the ordinary softmax cross-entropy
    logits = interests[:, 0] @ items[1:].T / 0.7
    torch.testing.assert_close(
        interest_ce(interests[:, :1], items, targets, 0.7),
        torch.nn.functional.cross_entropy(logits, targets - 1),
    )


def test_idr_by_hand() -> None:
    interests = torch.tensor([[[1.0, 0.0], [0.0, 3.0], [2.0, 2.0]]])
    # cosines: (1, 2) = 0, (1, 3) = (2, 3) = 1 / sqrt(2); both orders, over R (R - 1) = 6
    torch.testing.assert_close(interest_diversity(interests), torch.tensor(math.sqrt(2) / 3))
    same = torch.ones(4, 3, 2)
    torch.testing.assert_close(interest_diversity(same), torch.tensor(1.0))
    opposite = torch.tensor([[[1.0, 0.0], [-2.0, 0.0]]])  # signed cosine, not its magnitude
    torch.testing.assert_close(interest_diversity(opposite), torch.tensor(-1.0))
    assert interest_diversity(torch.randn(4, 1, 2)).item() == 0.0


def test_depth_zero_scores_from_the_compressor_output(batch: SeqBatch) -> None:
    model = randomise_reasoner(make(**STAGE_2)).eval()
    with torch.no_grad():
        hidden, _ = model.backbone.encode(batch.input_ids)
        reads = Reads.of(prefix_mask(batch.input_ids != PAD_ID, newest_only=True))
        m0 = model.compressor(hidden, reads)[:, 0]
        expected = interest_scores(m0, model.backbone.output_embedding(), 1.0)
        model.config = with_inference_settings(model.config, {"depth": 0})
        torch.testing.assert_close(model.score(batch.input_ids), expected)
        model.config = with_inference_settings(model.config, {"depth": 3})
        assert not torch.allclose(model.score(batch.input_ids), expected)


@pytest.mark.parametrize("pack_below", [0.0, 2.0], ids=["grid", "packed"])
def test_the_objective_is_ce_plus_lambda_idr(
    batch: SeqBatch, pack_below: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(recrec, "PACK_BELOW", pack_below)
    model = make(idr_weight=0.3, compressor_dropout=0.0, dropout=0.0).train()
    loss = model(batch).loss
    m = model.encode(batch.input_ids, newest_only=False).interests  # every group, unpacked
    real = batch.labels != PAD_ID
    targets = batch.labels[real]
    ce = interest_ce_reference(m[real], model.items(), targets, 1.0)
    torch.testing.assert_close(loss, ce + 0.3 * interest_diversity(m[real]))


# ------------------------------------------------------------------ stages
def test_stage_2_freezes_backbone_and_compressor(batch: SeqBatch) -> None:
    model = make(**STAGE_2)
    frozen = {
        name: p.detach().clone()
        for name, p in model.named_parameters()
        if name.startswith(("backbone.", "compressor."))
    }
    optimizer = build_optimizer(model, TrainConfig(lr=1e-2))
    assert optimizer is not None
    in_optimizer = {id(p) for group in optimizer.param_groups for p in group["params"]}
    names = {n for n, p in model.named_parameters() if id(p) in in_optimizer}
    assert names
    assert all(n.startswith(("reasoner.", "gate.")) for n in names)
    reasoner_before = {n: p.detach().clone() for n, p in model.named_parameters() if n in names}
    model.train()
    loss = model(batch).loss
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    for name, p in model.named_parameters():
        if name in frozen:
            assert torch.equal(p, frozen[name]), name
    assert any(
        not torch.equal(p, reasoner_before[n]) for n, p in model.named_parameters() if n in names
    )


@pytest.mark.parametrize("recency", [False, True], ids=["plain", "recency"])
@pytest.mark.parametrize("pack_below", [0.0, 2.0], ids=["grid", "packed"])
def test_packed_groups_reason_as_the_full_grid(
    batch: SeqBatch, pack_below: float, recency: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Packed, only the labelled groups are computed; their states, at every depth, and the
    deep-supervision loss are those of the same groups in the (B, G) grid."""
    monkeypatch.setattr(recrec, "PACK_BELOW", pack_below)  # training packs every part, or none
    switches = {"compressor_recency": recency, "reasoner_recency": recency}
    model = randomise_reasoner(make(**STAGE_2, **switches, compressor_dropout=0.0)).train()
    if recency:
        assert model.reasoner is not None
        assert model.reasoner.recency is not None
        with torch.no_grad():
            model.reasoner.recency.normal_()
            for layer in model.compressor.layers:
                layer.recency.normal_()
    real = batch.labels != PAD_ID
    assert not real.all()  # the batch has padded positions to leave out
    with torch.no_grad():
        grid = model.encode(batch.input_ids, newest_only=False)
        packed = model.encode(batch.input_ids, newest_only=False, groups=real)
        assert packed.interests.shape[:2] == (int(real.sum()), 1)
        grid_states = [grid.interests, *model.reason(grid, 4)]
        packed_states = [packed.interests, *model.reason(packed, 4)]
        for on_grid, on_packed in zip(grid_states, packed_states, strict=True):
            torch.testing.assert_close(on_packed[:, 0], on_grid[real])
        loss = model(batch).loss  # K = 2 rounds of T = 2 steps: the states at depths 2 and 4
    targets = batch.labels[real]
    rounds = [model.objective(grid_states[n][real], targets)[0] for n in (2, 4)]
    torch.testing.assert_close(loss, torch.stack(rounds).mean())


def test_reasoner_recency_starts_at_zero_and_is_trained_in_stage_2(batch: SeqBatch) -> None:
    plain = randomise_reasoner(make(**STAGE_2)).eval()
    biased = make(**STAGE_2, reasoner_recency=True).eval()
    biased.load_state_dict(plain.state_dict(), strict=False)
    assert biased.reasoner is not None
    assert biased.reasoner.recency is not None
    assert not biased.reasoner.recency.any()
    with torch.no_grad():
        torch.testing.assert_close(biased.score(batch.input_ids), plain.score(batch.input_ids))
    biased.train()
    biased(batch).loss.backward()
    trained = {name for name, p in biased.named_parameters() if p.grad is not None}
    assert "reasoner.recency" in trained
    assert not any(name.startswith(("backbone.", "compressor.")) for name in trained)


def test_stage_2_keeps_compressor_dropout_on_and_the_backbone_deterministic(
    batch: SeqBatch,
) -> None:
    model = make(**STAGE_2, compressor_dropout=0.5, dropout=0.5).train()
    assert model.compressor.training
    assert not model.backbone.training
    with torch.no_grad():
        first = model.encode(batch.input_ids, newest_only=True)
        second = model.encode(batch.input_ids, newest_only=True)
    torch.testing.assert_close(first.hidden, second.hidden)  # backbone: eval mode
    assert not torch.allclose(first.interests, second.interests)  # compressor: dropout draws
    assert make(compressor_dropout=0.5, dropout=0.5).train().backbone.training  # stage 1


@pytest.mark.parametrize("compressor_dropout", [0.5, 0.0])
def test_stage_2_training_draws_compressor_dropout_only(
    batch: SeqBatch, compressor_dropout: float
) -> None:
    model = make(**STAGE_2, compressor_dropout=compressor_dropout, dropout=0.5).train()
    first, second = model(batch).loss, model(batch).loss  # through forward, as training runs
    assert torch.equal(first, second) == (compressor_dropout == 0.0)


def test_stage_2_backbone_dropout_is_a_switch_for_training_only(batch: SeqBatch) -> None:
    model = make(**STAGE_2, stage2_backbone_dropout=True, dropout=0.5).train()
    assert model.backbone.training
    assert all(not p.requires_grad for p in model.backbone.parameters())  # still frozen
    with torch.no_grad():
        first = model.encode(batch.input_ids, newest_only=True)
        second = model.encode(batch.input_ids, newest_only=True)
    assert not torch.allclose(first.hidden, second.hidden)
    assert not model.eval().backbone.training


@pytest.mark.parametrize(
    "check",
    [
        test_common.test_loss_is_finite_and_reaches_every_parameter,
        test_common.test_recommend_skips_padding_and_history,
        test_common.test_rows_do_not_leak_into_each_other,
        test_common.test_state_dict_round_trip,
    ],
    ids=lambda f: f.__name__,
)
def test_stage_2_meets_the_model_contract(
    check: Callable[[RecRec, SeqBatch], None], batch: SeqBatch
) -> None:
    check(randomise_reasoner(make(**STAGE_2)), batch)


@pytest.mark.parametrize("positions", ["last", "prefixes"])
def test_bert4rec_backbone_trains_on_newest_positions(positions: str, batch: SeqBatch) -> None:
    with pytest.raises(ConfigError, match="bidirectional.*train_positions: last or prefixes"):
        make(backbone="bert4rec")
    model = make(backbone="bert4rec", train_positions=positions)
    loss = model.train()(batch).loss
    loss.backward()
    unused = [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None]
    assert not unused
    assert not model.backbone.out_bias.requires_grad
    assert model.eval().recommend(batch.input_ids, k=5).shape == (3, 5)


def library_batch(model: RecRec, rows: list[list[int]]) -> SeqBatch:
    """The one training batch the library builds from ``rows`` for ``model``."""
    batches = TrainBatches(
        Sequences.from_lists(rows),
        users=np.arange(len(rows)),
        num_items=NUM_ITEMS,
        max_seq_len=model.config.max_seq_len,
        batch_size=sum(len(r) for r in rows),  # more than rows or targets: one batch
        needs=model.batch_needs,
    )
    (batch,) = list(batches.epoch(np.random.default_rng(0)))
    return batch


@pytest.mark.parametrize("stage", [1, 2])
def test_prefix_examples_train_what_every_prefix_of_a_row_trains(stage: int) -> None:
    """A causal backbone that numbers positions from the oldest item gives a prefix the same
    states alone as inside its row, so one example per target (``prefixes``) has the loss of
    every prefix read from one encoding of its row (``all``); ``last`` trains less."""
    generator = torch.Generator().manual_seed(0)
    lengths = (6, 3, L + 1)  # the longest row fills the window: none is cut
    rows = [torch.randint(1, NUM_ITEMS + 1, (n,), generator=generator).tolist() for n in lengths]
    values: dict[str, object] = {
        "dropout": 0.0,
        "compressor_dropout": 0.0,
        "backbone_options": {"position_origin": "oldest"},
        **(STAGE_2 if stage == 2 else {}),
    }
    losses = {}
    for positions in ("all", "last", "prefixes"):
        model = make(train_positions=positions, **values)
        if stage == 2:
            randomise_reasoner(model)
        batch = library_batch(model, rows)
        assert model.batch_needs.prefix_examples == (positions == "prefixes")
        assert model.config.loss_splits_by_rows
        examples = {"all": len(rows), "last": len(rows), "prefixes": sum(len(r) - 1 for r in rows)}
        assert batch.input_ids.size(0) == examples[positions]
        output = model.train()(batch)
        targets = {"all": sum(len(r) - 1 for r in rows), "last": len(rows)}
        assert output.num_targets == targets.get(positions, examples[positions])  # its mean's
        losses[positions] = output.loss
    torch.testing.assert_close(losses["prefixes"], losses["all"])
    assert not torch.allclose(losses["last"], losses["all"])


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"depth": 3}, "stage-1 RecRec has no reasoner"),
        ({"backbone_options": {"hiden": 1}}, r"unknown key\(s\) model.backbone_options.hiden"),
        ({"backbone_options": {"hidden_size": 8}}, "may not set hidden_size"),
        (  # ignored once (and "loss" failed with "got multiple values for keyword argument")
            {"backbone_options": {"loss": "bce", "num_negatives": 64}},
            r"may not set loss, num_negatives: they shape sasrec's own training objective, "
            "and recrec trains its backbone with its own loss",
        ),
        (
            {
                "backbone": "bert4rec",
                "train_positions": "last",
                "backbone_options": {"mask_prob": 0.9},
            },
            "may not set mask_prob: they shape bert4rec's own",
        ),
        (
            {"backbone_options": {"init_std": -1.0}},
            "model.backbone_options.init_std must be a finite number > 0",
        ),
        ({"backbone_options": {"dropout_placement": "x"}}, "model.backbone_options.dropout_pl"),
        ({"backbone_options": [1]}, "model.backbone_options must be a mapping"),
        (
            {"backbone_options": {"user_embedding": True}},
            "model.backbone_options.user_embedding: RecRec reads only",
        ),
        ({"hidden_size": 18, "attention_heads": 4}, "divisible by model.attention_heads"),
        ({"stage": 2, "depth": -1}, "model.depth must be >= 0"),
    ],
)
def test_config_errors(values: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        make(**values)


def test_depth_is_an_inference_setting_and_nothing_else_is() -> None:
    config = make(**STAGE_2).config
    assert config.inference_depth == 4  # K x T
    assert with_inference_settings(config, {"depth": 7}).inference_depth == 7
    with pytest.raises(ConfigError, match=r"model.num_interests cannot change after training"):
        with_inference_settings(config, {"num_interests": 2})
    assert make().config.inference_depth == 0


def test_scores_at_depths_are_the_scores_at_each_depth(batch: SeqBatch) -> None:
    model = make(**STAGE_2, gate="gru_cell").eval()  # the others start as the identity
    with torch.no_grad():
        swept = list(model.scores_at_depths(batch.input_ids, 5))  # beyond the training depth of 4
        assert len(swept) == 6
        for depth, scores in enumerate(swept):
            model.config = with_inference_settings(model.config, {"depth": depth})
            torch.testing.assert_close(scores, model.score(batch.input_ids))
        assert not torch.allclose(swept[0], swept[5])
