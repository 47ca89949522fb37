"""Caser properties: only the last L items count, convolutions by hand, T targets ahead."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from seqrec.batch import PAD_ID, SeqBatch
from seqrec.config import ConfigError
from seqrec.models.caser import Caser, CaserConfig
from tests.tiny import NUM_ITEMS, NUM_USERS, B, L, S

WINDOW = 3
CONFIG = CaserConfig(
    num_items=NUM_ITEMS,
    num_users=NUM_USERS,
    max_seq_len=L,
    hidden_size=18,
    window=WINDOW,
    num_horizontal=5,
    num_vertical=2,
    targets_ahead=2,
    num_negatives=S,
)


def build(**changes: object) -> Caser:
    torch.manual_seed(0)
    return Caser(dataclasses.replace(CONFIG, **changes)).eval()


def test_only_the_last_window_items_count(batch: SeqBatch) -> None:
    model = build()
    row = batch.input_ids[:1]  # the full row: L real items
    scores = model.score(row, batch.users[:1])
    before_window = row.clone()
    before_window[0, -WINDOW - 1] = row[0, -WINDOW - 1] % NUM_ITEMS + 1
    torch.testing.assert_close(model.score(before_window, batch.users[:1]), scores)
    inside = row.clone()
    inside[0, -WINDOW] = row[0, -WINDOW] % NUM_ITEMS + 1
    assert not torch.allclose(model.score(inside, batch.users[:1]), scores)


def test_user_embedding_personalises_the_scores(batch: SeqBatch) -> None:
    model = build()
    row = batch.input_ids[:1].expand(2, -1)
    scores = model.score(row, torch.tensor([0, 1]))
    assert not torch.allclose(scores[0], scores[1])
    with pytest.raises(ValueError, match="user embedding"):
        model.score(row)


def test_convolutions_by_hand() -> None:
    """Window [e1, e2] with d = 2: the vertical filter is a weighted sum of rows, the
    horizontal filters of heights 1 and 2 are max-pooled dot products."""
    model = build(hidden_size=2, window=2, num_horizontal=1, num_vertical=1, dropout=0.0)
    e1, e2 = torch.tensor([1.0, -2.0]), torch.tensor([0.5, 3.0])
    with torch.no_grad():
        model.item_emb.weight[1], model.item_emb.weight[2] = e1, e2
        assert model.conv_v is not None
        model.conv_v.weight.copy_(torch.tensor([2.0, -1.0]).view(1, 1, 2, 1))
        model.conv_v.bias.fill_(0.25)
        model.conv_h[0].weight.copy_(torch.tensor([1.0, 1.0]).view(1, 1, 1, 2))
        model.conv_h[0].bias.fill_(0.0)
        model.conv_h[1].weight.copy_(torch.tensor([[1.0, 0.0], [0.0, -1.0]]).view(1, 1, 2, 2))
        model.conv_h[1].bias.fill_(1.0)
        model.fc.weight.copy_(torch.eye(2, 4))  # z reads o_v only ...
        model.fc.bias.zero_()
    o_v = 2.0 * e1 - 1.0 * e2 + 0.25  # (1.75, -7.25)
    o_h1 = max(F.relu(e1.sum()), F.relu(e2.sum()))  # max(relu(-1), relu(3.5)) = 3.5
    o_h2 = F.relu(e1[0] - e2[1] + 1.0)  # relu(1 - 3 + 1) = 0
    z = model.encode(torch.tensor([[1, 2]]))
    torch.testing.assert_close(z[0], F.relu(o_v))
    with torch.no_grad():
        model.fc.weight.copy_(torch.eye(2, 4).roll(2, dims=1))  # ... and now o_h only
    z = model.encode(torch.tensor([[1, 2]]))
    torch.testing.assert_close(z[0], torch.stack([o_h1, o_h2]))


@pytest.mark.parametrize("window", [1, 4])
def test_matrix_product_convolutions_equal_conv2d(window: int) -> None:
    """The fast path of encode against the reference's Conv2d calls on the same weights."""
    model = build(window=window, dropout=0.0)
    windows = torch.randint(0, NUM_ITEMS + 1, (11, window))
    x = model.item_emb(windows).unsqueeze(1)  # (M, 1, L, D) as in the reference
    assert model.conv_v is not None
    parts = [model.conv_v(x).flatten(1)]
    parts += [F.relu(conv(x).squeeze(3)).amax(dim=2) for conv in model.conv_h]
    expected = F.relu(model.fc(torch.cat(parts, dim=1)))
    torch.testing.assert_close(model.encode(windows), expected)


def test_training_windows_match_scoring_on_each_prefix(batch: SeqBatch) -> None:
    """Position t of the training pass sees exactly what scoring the prefix up to t sees."""
    model = build()
    hidden = model(batch).hidden
    assert hidden is not None
    for t in range(L):
        prefix = batch.input_ids[:, : t + 1]
        expected = model.score(prefix, batch.users)
        actual = hidden[:, t] @ model.out_emb.weight.T + model.out_bias
        torch.testing.assert_close(actual, expected)


@pytest.mark.parametrize("shared", [False, True], ids=["position_negatives", "row_negatives"])
def test_bce_over_the_next_t_targets_matches_the_formula(shared: bool, batch: SeqBatch) -> None:
    model = build(shared_negatives=shared)
    g = torch.Generator().manual_seed(1)
    if shared:
        batch = dataclasses.replace(
            batch, negatives=torch.randint(1, NUM_ITEMS + 1, (B, S), generator=g)
        )
    hidden = model(batch).hidden
    assert hidden is not None
    W, bias = model.out_emb.weight, model.out_bias
    terms = []
    for b in range(B):
        for t in range(L):
            for k in range(CONFIG.targets_ahead):
                if batch.input_ids[b, t] == PAD_ID or t + k >= L:
                    continue
                target = batch.labels[b, t + k]
                negatives = batch.negatives[b] if shared else batch.negatives[b, t + k]
                pos = hidden[b, t] @ W[target] + bias[target]
                neg = W[negatives] @ hidden[b, t] + bias[negatives]
                valid = negatives != target
                terms.append(F.softplus(-pos) + (F.softplus(neg) * valid).sum())
    torch.testing.assert_close(model(batch).loss, torch.stack(terms).mean())


def test_one_target_ahead_trains_on_the_next_item_only(batch: SeqBatch) -> None:
    model = build(targets_ahead=1, loss="ce")
    hidden = model(batch).hidden
    assert hidden is not None
    real = batch.labels != PAD_ID
    logits = hidden[real] @ model.out_emb.weight[1:].T + model.out_bias[1:]
    expected = F.cross_entropy(logits, batch.labels[real] - 1)
    torch.testing.assert_close(model(batch).loss, expected)


@pytest.mark.parametrize("shared", [False, True], ids=["position_negatives", "row_negatives"])
def test_targets_ahead_beyond_the_batch_width_add_nothing(shared: bool, batch: SeqBatch) -> None:
    """T larger than a batch's padded width (short histories) used to fail with a shape error:
    the copies past the width have no targets, so the loss is that of T = width."""
    if shared:
        g = torch.Generator().manual_seed(1)
        batch = dataclasses.replace(
            batch, negatives=torch.randint(1, NUM_ITEMS + 1, (B, S), generator=g)
        )
    width = batch.input_ids.size(1)
    beyond = build(targets_ahead=width + 2, shared_negatives=shared)(batch).loss
    within = build(targets_ahead=width, shared_negatives=shared)(batch).loss
    torch.testing.assert_close(beyond, within)


@pytest.mark.parametrize(
    "changes",
    [
        {"num_vertical": 0},
        {"num_horizontal": 0},
        {"user_embedding": False},
        {"conv_activation": "tanh", "fc_activation": "identity"},
        {"targets_ahead": 1},
        {"window": 1},
        {"window": L + 2},
        {"loss": "ce"},
        {"loss": "bpr_max", "negative_sampler": "popularity", "shared_negatives": True},
        {"loss": "top1_max", "negative_sampler": "popularity", "shared_negatives": True},
        {"loss": "sampled_softmax", "negative_sampler": "in_batch"},
    ],
    ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()),
)
def test_every_switch_builds_trains_and_scores(changes: dict[str, object], batch: SeqBatch) -> None:
    model = build(**changes).train()
    if model.config.shared_negatives:
        g = torch.Generator().manual_seed(1)
        negatives = torch.randint(1, NUM_ITEMS + 1, (B, S), generator=g)
        batch = dataclasses.replace(batch, negatives=negatives)
    loss = model(batch).loss
    loss.backward()
    assert torch.isfinite(loss)
    assert all(p.grad is not None for p in model.parameters())
    users = batch.users if model.uses_users else None
    scores = model.eval().score(batch.input_ids, users)
    assert scores.shape == (B, NUM_ITEMS + 1)


def test_switches_change_the_parameter_set() -> None:
    def names(model: Caser) -> set[str]:
        return {n.split(".")[0] for n, _ in model.named_parameters()}

    assert "user_emb" not in names(build(user_embedding=False))
    assert not build(user_embedding=False).uses_users
    assert build().uses_users
    assert "conv_v" not in names(build(num_vertical=0))
    assert "conv_h" not in names(build(num_horizontal=0))
    assert build(user_embedding=False).out_emb.embedding_dim == CONFIG.hidden_size


def test_invalid_configs_are_rejected() -> None:
    with pytest.raises(ConfigError, match="cannot both be 0"):
        build(num_vertical=0, num_horizontal=0)
    with pytest.raises(ConfigError, match="needs the number of users"):
        build(num_users=0)
    with pytest.raises(ConfigError, match="must be >= 1"):
        build(targets_ahead=0)
