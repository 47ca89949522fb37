"""GRU4Rec properties: causality, left padding never reaches the GRU, the loss menu, ELU."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch
import torch.nn.functional as F

from seqrec.batch import PAD_ID, SeqBatch
from seqrec.config import ConfigError
from seqrec.losses import bpr_max, top1_max
from seqrec.models.gru4rec import GRU4Rec, GRU4RecConfig
from seqrec.models.objective import in_batch_negatives
from tests.tiny import NUM_ITEMS, B, L, S, assert_causal

CONFIG = GRU4RecConfig(num_items=NUM_ITEMS, max_seq_len=L, hidden_size=18, num_negatives=S)


def build(**changes: object) -> GRU4Rec:
    torch.manual_seed(0)
    return GRU4Rec(dataclasses.replace(CONFIG, **changes)).eval()


def shared_negatives(batch: SeqBatch) -> SeqBatch:
    """The fixture with GRU4Rec+'s (B, S) negatives, one set shared by a row's positions."""
    g = torch.Generator().manual_seed(1)
    return dataclasses.replace(
        batch, negatives=torch.randint(1, NUM_ITEMS + 1, (B, S), generator=g)
    )


def test_causal_future_items_do_not_change_the_past() -> None:
    model = build()
    assert_causal(model.encode)


def test_states_equal_the_gru_run_on_each_unpadded_row(batch: SeqBatch) -> None:
    """Left padding never reaches the GRU: each row starts from the zero state at its first
    real item, whatever the padding, and padded positions are zero."""
    model = build(num_layers=2)
    hidden = model.encode(batch.input_ids)
    for row, states in zip(batch.input_ids, hidden, strict=True):
        items = row[row != PAD_ID]
        expected, _ = model.gru(model.item_emb(items).unsqueeze(0))  # (1, n, H)
        torch.testing.assert_close(states[-len(items) :], expected[0])
        assert (states[: L - len(items)] == 0).all()


def test_extra_left_padding_changes_nothing(batch: SeqBatch) -> None:
    model, wide = build(), build(max_seq_len=L + 4)  # the same weights
    wider = F.pad(batch.input_ids, (4, 0), value=PAD_ID)
    narrow = batch.input_ids[:, -3:]  # rows 1 and 2 have at most 3 items
    torch.testing.assert_close(wide.score(wider), model.score(batch.input_ids))
    torch.testing.assert_close(model.score(narrow)[1:], model.score(batch.input_ids)[1:])
    hidden = model.encode(batch.input_ids)
    wide_hidden = wide.encode(wider)
    torch.testing.assert_close(wide_hidden[:, 4:], hidden)
    assert (wide_hidden[:, :4] == 0).all()


def test_score_is_the_last_state_against_the_output_matrix(batch: SeqBatch) -> None:
    model = build()
    with torch.no_grad():
        model.item_bias.normal_()  # type: ignore[union-attr]
    hidden = model.encode(batch.input_ids)
    expected = hidden[:, -1] @ model.out_emb.weight.T + model.item_bias  # type: ignore[union-attr]
    torch.testing.assert_close(model.score(batch.input_ids), expected)


def test_truncates_to_the_most_recent_items(batch: SeqBatch) -> None:
    model = build(max_seq_len=4)
    torch.testing.assert_close(model.score(batch.input_ids), model.score(batch.input_ids[:, -4:]))


def test_ce_is_softmax_over_the_catalogue_with_bias(batch: SeqBatch) -> None:
    model = build(loss="ce")
    with torch.no_grad():
        model.item_bias.normal_()  # type: ignore[union-attr]
    hidden = model.encode(batch.input_ids)
    real = batch.labels != PAD_ID
    logits = hidden[real] @ model.out_emb.weight[1:].T + model.item_bias[1:]  # type: ignore[index,union-attr]
    expected = F.cross_entropy(logits, batch.labels[real] - 1)
    torch.testing.assert_close(model(batch).loss, expected)


def _manual_scores(model: GRU4Rec, batch: SeqBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """(P,) target scores and (P, S) scores of each position's row negatives, by hand."""
    hidden = model.encode(batch.input_ids)
    real = batch.labels != PAD_ID
    W, b = model.output_embedding(), model.item_bias
    assert b is not None
    pos = (hidden * W[batch.labels]).sum(-1) + b[batch.labels]  # (B, L)
    negatives = batch.negatives
    if negatives.dim() == 2:  # (B, S) -> (B, L, S)
        negatives = negatives.unsqueeze(1).expand(-1, L, -1)
    neg = torch.einsum("bld,blsd->bls", hidden, W[negatives]) + b[negatives]
    return pos[real], neg[real]


@pytest.mark.parametrize("elu_param", [0.0, 0.5])
@pytest.mark.parametrize("shared", [True, False], ids=["row_negatives", "position_negatives"])
def test_bpr_max_matches_the_formula(elu_param: float, shared: bool, batch: SeqBatch) -> None:
    model = build(
        loss="bpr_max",
        negative_sampler="popularity",
        shared_negatives=shared,
        bpr_max_reg=0.7,
        elu_param=elu_param,
        dropout=0.0,
    )
    with torch.no_grad():
        model.item_bias.normal_()  # type: ignore[union-attr]
    data = shared_negatives(batch) if shared else batch
    pos, neg = _manual_scores(model, data)
    if elu_param:
        pos, neg = F.elu(pos, elu_param), F.elu(neg, elu_param)
    real = data.labels != PAD_ID
    negatives = data.negatives if data.negatives.dim() == 3 else data.negatives.unsqueeze(1)
    hits = (negatives == data.labels.unsqueeze(-1)).expand(-1, L, -1)[real]  # ignored
    expected = bpr_max(pos, neg, ~hits, reg=0.7)
    torch.testing.assert_close(model(data).loss, expected)


def test_elu_with_in_batch_negatives_matches_the_formula(batch: SeqBatch) -> None:
    model = build(loss="top1_max", elu_param=0.5, dropout=0.0)
    hidden = model.encode(batch.input_ids)
    real = batch.labels != PAD_ID
    targets = batch.labels[real]
    torch.manual_seed(5)
    shared = in_batch_negatives(model.config, targets)  # (S,) drawn from the targets
    W, b = model.output_embedding(), model.item_bias
    assert b is not None
    pos = F.elu((hidden[real] * W[targets]).sum(-1) + b[targets], 0.5)
    neg = F.elu(hidden[real] @ W[shared].T + b[shared], 0.5)
    expected = top1_max(pos, neg, shared.unsqueeze(0) != targets.unsqueeze(1))
    torch.manual_seed(5)
    torch.testing.assert_close(model(batch).loss, expected)


@pytest.mark.parametrize("loss", ["bpr_max", "top1_max"])
@pytest.mark.parametrize("elu_param", [0.0, 0.5])
def test_gru4rec_plus_losses_with_shared_negatives_train(
    loss: str, elu_param: float, batch: SeqBatch
) -> None:
    config = {"loss": loss, "negative_sampler": "popularity", "shared_negatives": True}
    model = build(**config, elu_param=elu_param, sampling_alpha=0.75).train()
    assert model.batch_needs.shared_negatives
    assert model.batch_needs.num_negatives == S
    data = shared_negatives(batch)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    first = model(data).loss
    for _ in range(30):
        loss_value = model(data).loss
        optimizer.zero_grad()
        loss_value.backward()
        optimizer.step()
    assert torch.isfinite(first)
    assert loss_value.item() < first.item()
    assert all(p.grad is not None for p in model.parameters())


@pytest.mark.parametrize(
    "changes",
    [
        {"shared_embedding": True},
        {"item_bias": False},
        {"num_layers": 2},
        {"embedding_size": 11},
        {"embedding_dropout": 0.3},
        {"loss": "ce"},
        {"loss": "bce", "negative_sampler": "uniform"},
        {"loss": "sampled_softmax", "negative_sampler": "in_batch"},
        {"loss": "top1_max", "negative_sampler": "in_batch", "elu_param": 1.0},
    ],
    ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()),
)
def test_every_switch_builds_trains_and_scores(changes: dict[str, object], batch: SeqBatch) -> None:
    model = build(**changes).train()
    loss = model(batch).loss
    loss.backward()
    assert torch.isfinite(loss)
    assert all(p.grad is not None for p in model.parameters())
    scores = model.eval().score(batch.input_ids)
    assert scores.shape == (B, NUM_ITEMS + 1)


def test_switches_change_the_parameter_set() -> None:
    def names(model: GRU4Rec) -> set[str]:
        return {n.split(".")[0] for n, _ in model.named_parameters()}

    assert "out_emb" not in names(build(shared_embedding=True))
    assert "item_bias" not in names(build(item_bias=False))
    assert build(embedding_size=11).item_emb.embedding_dim == 11


def test_invalid_configs_are_rejected() -> None:
    with pytest.raises(ConfigError, match="shared_embedding needs embedding_size"):
        build(shared_embedding=True, embedding_size=7)
    with pytest.raises(ConfigError, match="elu_param applies to sampled losses"):
        build(loss="ce", elu_param=0.5)
    with pytest.raises(ConfigError, match="cannot use loss"):
        build(loss="nope")


@pytest.mark.gpu
def test_cuda_matches_cpu(batch: SeqBatch) -> None:
    """cuDNN's GRU against the CPU one on the same weights, scores and gradients."""
    cpu = build(dropout=0.0, loss="bpr_max", negative_sampler="uniform", elu_param=0.5)
    gpu = copy.deepcopy(cpu).cuda()
    torch.testing.assert_close(
        gpu.score(batch.input_ids.cuda()).cpu(), cpu.score(batch.input_ids), atol=1e-4, rtol=1e-4
    )
    cpu_loss, gpu_loss = cpu(batch).loss, gpu(batch.to("cuda")).loss
    cpu_loss.backward()
    gpu_loss.backward()
    torch.testing.assert_close(gpu_loss.cpu(), cpu_loss, atol=1e-4, rtol=1e-4)
    for (name, p_cpu), p_gpu in zip(cpu.named_parameters(), gpu.parameters(), strict=True):
        assert p_cpu.grad is not None, name
        assert p_gpu.grad is not None, name
        torch.testing.assert_close(p_gpu.grad.cpu(), p_cpu.grad, atol=1e-4, rtol=1e-3, msg=name)


def _left_padded(lengths: list[int], width: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    ids = torch.full((len(lengths), width), PAD_ID, dtype=torch.long)
    for row, n in enumerate(lengths):
        ids[row, width - n :] = torch.randint(1, NUM_ITEMS + 1, (n,), generator=g)
    return ids


@pytest.mark.parametrize(
    "changes", [{}, {"num_layers": 2}, {"item_bias": False, "shared_embedding": True}]
)
def test_incremental_steps_equal_scoring_the_whole_history(changes: dict[str, object]) -> None:
    model = build(**changes)
    ids = _left_padded([2, 5, 1], width=L - 2, seed=3)  # room for two more items within L
    state, scores = model.init_state(ids)
    torch.testing.assert_close(scores, model.score(ids))
    g = torch.Generator().manual_seed(7)
    new = torch.randint(1, NUM_ITEMS + 1, (2, ids.size(0)), generator=g)
    for item_ids in new:
        ids = torch.cat([ids, item_ids.unsqueeze(1)], dim=1)
        state, scores = model.step(state, item_ids)
        assert state.shape == (model.config.num_layers, ids.size(0), model.config.hidden_size)
        torch.testing.assert_close(scores, model.score(ids), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(state, model.init_state(ids)[0], atol=1e-5, rtol=1e-5)


def test_init_state_reads_histories_longer_than_max_seq_len() -> None:
    model = build()
    ids = _left_padded([L + 4], width=L + 4, seed=5)
    _, scores = model.init_state(ids)
    state, _ = model.init_state(ids[:, :L])
    for item in ids[0, L:]:
        state, stepped = model.step(state, item.view(1))
    torch.testing.assert_close(scores, stepped, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(scores, model.score(ids))  # score reads the newest L only


def test_incremental_inputs_are_checked() -> None:
    model = build()
    with pytest.raises(ValueError, match="at least one real item"):
        model.init_state(torch.tensor([[PAD_ID, PAD_ID], [PAD_ID, 3]]))
    state, _ = model.init_state(torch.tensor([[PAD_ID, 3]]))
    with pytest.raises(ValueError, match="real item for every user"):
        model.step(state, torch.tensor([PAD_ID]))
