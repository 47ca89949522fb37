"""PopRec, BPR-MF, FMC, FPMC, TransRec and FISM: what each score depends on, scores by hand,
and training logits that agree with ``score``."""

from __future__ import annotations

import math

import pytest
import torch
from torch import Tensor

from seqrec.batch import PAD_ID, SeqBatch
from seqrec.config import ConfigError
from seqrec.losses import bpr
from seqrec.models import ScoringRecommender, build_model_config
from seqrec.models.fism import FISM
from seqrec.models.fmc import FMC
from seqrec.models.fpmc import FPMC
from seqrec.models.transrec import TransRec, TransRecConfig
from tests.tiny import NUM_ITEMS, NUM_USERS, tiny_model

FIRST_ORDER = [
    ("fmc", {}),
    ("fpmc", {}),
    ("transrec", {}),
    ("transrec", {"distance": "squared_l2"}),
]


def make(name: str, **changes: object) -> ScoringRecommender:
    torch.manual_seed(0)
    model = tiny_model(name, **changes)
    assert isinstance(model, ScoringRecommender)
    return model.eval()


def random_items(like: Tensor) -> Tensor:
    return torch.randint(1, NUM_ITEMS + 1, like.shape, generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize(("name", "changes"), FIRST_ORDER)
def test_first_order_scores_depend_only_on_the_last_item(
    name: str, changes: dict[str, object], batch: SeqBatch
) -> None:
    model = make(name, **changes)
    scores = model.score(batch.input_ids, batch.users)
    earlier = batch.input_ids.clone()
    earlier[:, :-1] = random_items(earlier[:, :-1])
    torch.testing.assert_close(model.score(earlier, batch.users), scores)
    last = batch.input_ids.clone()
    last[:, -1] = last[:, -1] % NUM_ITEMS + 1  # a different newest item in every row
    assert not torch.isclose(model.score(last, batch.users), scores).all(dim=1).any()


def test_pop_ranks_by_training_popularity() -> None:
    """Targets counted over two training batches: 5 four times, 2 three, 9 two, 30 once; the
    order is neither the ids' nor that of first appearance."""
    model = tiny_model("pop").train()
    first = torch.tensor([[PAD_ID, 30, 9, 2, 5], [PAD_ID, PAD_ID, PAD_ID, 5, 2]])
    second = torch.tensor([[PAD_ID, PAD_ID, 5, 2, 9], [PAD_ID, PAD_ID, PAD_ID, PAD_ID, 5]])
    for labels in (first, second):
        inputs = torch.where(labels != PAD_ID, labels % NUM_ITEMS + 1, PAD_ID)  # never counted
        model(SeqBatch(input_ids=inputs, labels=labels))
    thirties = torch.full((1, 5), 30)
    model.eval()(SeqBatch(input_ids=thirties, labels=thirties))  # evaluation does not count
    history = torch.tensor([[PAD_ID, 5, 2], [PAD_ID, PAD_ID, 7]])
    top = model.recommend(history, k=4, exclude_seen=False)
    assert top.tolist() == [[5, 2, 9, 30]] * 2


def test_fmc_previous_and_next_embeddings_are_separate() -> None:
    """N (an item as the previous one) and M (as the next) are two matrices, so a transition
    i -> j may score differently from j -> i; one shared matrix would make them symmetric."""
    model = make("fmc")
    assert isinstance(model, FMC)
    assert model.prev_emb.weight.data_ptr() != model.next_emb.weight.data_ptr()
    items = torch.arange(1, NUM_ITEMS + 1)
    after = model.score(items.unsqueeze(1))[:, 1:]  # (N, N): row i, column j = score(j | i)
    assert not torch.allclose(after, after.T)


def test_bpr_scores_depend_on_the_user_not_the_history(batch: SeqBatch) -> None:
    model = make("bpr")
    scores = model.score(batch.input_ids, batch.users)
    torch.testing.assert_close(model.score(random_items(batch.input_ids), batch.users), scores)
    other = (batch.users + 1) % NUM_USERS
    assert not torch.isclose(model.score(batch.input_ids, other), scores).all(dim=1).any()


def test_bpr_every_training_item_of_the_window_is_a_positive() -> None:
    """Labels are row[1:], so the first item must come from the inputs."""
    model = make("bpr", num_negatives=1).train()
    row = torch.tensor([[PAD_ID, 3, 5, 7]])
    batch = SeqBatch(
        input_ids=row,
        labels=torch.tensor([[PAD_ID, 5, 7, 11]]),
        negatives=torch.tensor([[[PAD_ID], [20], [21], [22]]]),
        users=torch.tensor([1]),
    )
    model(batch).loss.backward()
    grad = model.item_emb.weight.grad
    assert grad is not None
    touched = set(grad.abs().sum(dim=1).nonzero().squeeze(1).tolist())
    assert touched == {3, 5, 7, 11, 20, 21, 22}


def test_fism_is_order_invariant_but_reads_the_whole_history(batch: SeqBatch) -> None:
    model = make("fism")
    scores = model.score(batch.input_ids)
    shuffled = batch.input_ids.clone()
    shuffled[0] = shuffled[0].flip(0)  # row 0 is full: reverse its order
    shuffled[1, -3:] = shuffled[1, -3:].roll(1)  # row 1 has 3 items
    torch.testing.assert_close(model.score(shuffled), scores)
    first = batch.input_ids.clone()
    first[0, 0] = first[0, 0] % NUM_ITEMS + 1  # the oldest item of the full row
    assert not torch.allclose(model.score(first)[0], scores[0])


def test_fism_by_hand_with_alpha() -> None:
    model = make("fism", alpha=0.5)
    assert isinstance(model, FISM)
    P, Q, b = model.history_emb.weight, model.target_emb.weight, model.item_bias
    with torch.no_grad():
        b.copy_(torch.randn(NUM_ITEMS + 1))
    history = torch.tensor([[PAD_ID, 4, 9, 2]])
    user = (P[4] + P[9] + P[2]) / math.sqrt(3)
    torch.testing.assert_close(model.score(history)[0], Q @ user + b)


def test_fpmc_is_mf_plus_fmc_by_hand(batch: SeqBatch) -> None:
    model = make("fpmc")
    assert isinstance(model, FPMC)
    U, V = model.user_emb.weight, model.user_item_emb.weight
    N, M = model.prev_emb.weight, model.next_emb.weight
    u, last = batch.users, batch.input_ids[:, -1]
    expected = torch.stack(
        [
            torch.stack([U[u[b]] @ V[j] + N[last[b]] @ M[j] for j in range(NUM_ITEMS + 1)])
            for b in range(len(u))
        ]
    )
    torch.testing.assert_close(model.score(batch.input_ids, u), expected)


@pytest.mark.parametrize("distance", ["l2", "squared_l2"])
def test_transrec_score_by_hand(distance: str) -> None:
    config = TransRecConfig(num_items=3, num_users=2, hidden_size=2, distance=distance)
    model = TransRec(config).eval()
    with torch.no_grad():
        model.item_emb.weight.copy_(torch.tensor([[0.0, 0.0], [0.6, 0.0], [0.0, 0.5], [2.0, 0.0]]))
        model.translation.copy_(torch.tensor([0.1, 0.0]))
        model.user_translation.weight.copy_(torch.tensor([[0.0, 0.0], [0.0, 0.2]]))
        model.item_bias.copy_(torch.tensor([0.0, 0.3, -0.1, 0.2]))
    # User 1 after item 1: a = gamma_1 + t + t_1 = (0.7, 0.2). Item 3 at (2, 0) lies
    # outside the unit ball and is scored at (1, 0).
    squared = torch.tensor([0.49 + 0.04, 0.01 + 0.04, 0.49 + 0.09, 0.09 + 0.04])
    dist = squared if distance == "squared_l2" else squared.sqrt()
    expected = torch.tensor([0.0, 0.3, -0.1, 0.2]) - dist
    scores = model.score(torch.tensor([[PAD_ID, 2, 1]]), torch.tensor([1]))[0]
    torch.testing.assert_close(scores[1:], expected[1:])


def test_transrec_items_stay_in_the_unit_ball() -> None:
    model = make("transrec")
    assert isinstance(model, TransRec)
    with torch.no_grad():
        model.item_emb.weight.mul_(100.0)
    norms = model.item_points()[1:].norm(dim=1)
    assert norms.max() <= 1.0 + 1e-6
    torch.testing.assert_close(norms, torch.ones_like(norms))


def test_transrec_full_ce_needs_squared_distance() -> None:
    with pytest.raises(ConfigError, match="loss ce needs distance: squared_l2"):
        build_model_config(
            {"name": "transrec", "loss": "ce"}, num_items=NUM_ITEMS, num_users=NUM_USERS
        )
    build_model_config(
        {"name": "transrec", "loss": "ce", "distance": "squared_l2"},
        num_items=NUM_ITEMS,
        num_users=NUM_USERS,
    )


@pytest.mark.parametrize(("name", "changes"), [*FIRST_ORDER, ("fism", {})])
def test_training_logits_are_the_scores_of_each_prefix(
    name: str, changes: dict[str, object], batch: SeqBatch
) -> None:
    """The loss of ``forward`` equals BPR on ``score`` of every prefix (input_ids[:, :t+1])."""
    model = make(name, **changes)
    assert batch.labels is not None
    assert batch.negatives is not None
    pos, neg, valid = [], [], []
    for t in range(batch.input_ids.size(1)):
        scores = model.score(batch.input_ids[:, : t + 1], batch.users)  # (B, N + 1)
        for b in range(batch.input_ids.size(0)):
            target = batch.labels[b, t]
            if target == PAD_ID:
                continue
            negatives = batch.negatives[b, t]
            pos.append(scores[b, target])
            neg.append(scores[b, negatives])
            valid.append(negatives != target)
    expected = bpr(torch.stack(pos), torch.stack(neg), torch.stack(valid))
    torch.testing.assert_close(model(batch).loss, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", ["bpr", "fpmc", "transrec"])
def test_user_models_ask_for_users(name: str, batch: SeqBatch) -> None:
    model = make(name)
    assert model.uses_users
    with pytest.raises(ValueError, match="pass the user indices"):
        model.score(batch.input_ids)
