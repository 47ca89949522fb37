"""Contract tests every registered model must pass, at tiny odd sizes."""

from __future__ import annotations

import dataclasses
import io

import pytest
import torch

from seqrec.batch import PAD_ID, SeqBatch
from seqrec.config import ConfigError
from seqrec.models import MODELS, SequentialRecommender, build_model, build_model_config
from tests.tiny import NUM_ITEMS, TINY_CONFIGS, tiny_model

# Models that learn by counting, not by gradient descent: no parameters, nothing to overfit.
COUNTING_MODELS = {"pop"}


def make(name: str) -> SequentialRecommender:
    torch.manual_seed(0)
    return tiny_model(name)


@pytest.fixture(params=MODELS.names())
def model(request: pytest.FixtureRequest) -> SequentialRecommender:
    return make(request.param)


def test_every_registered_model_has_a_tiny_config() -> None:
    assert set(MODELS.names()) == set(TINY_CONFIGS)


def test_loss_is_finite_and_reaches_every_parameter(
    model: SequentialRecommender, batch: SeqBatch
) -> None:
    loss = model.train()(batch).loss
    assert loss.ndim == 0
    assert torch.isfinite(loss)
    if any(p.requires_grad for p in model.parameters()):
        loss.backward()
    unused = [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None]
    assert not unused, f"parameters without gradient: {unused}"


def test_trains_and_scores_under_bf16_autocast(
    model: SequentialRecommender, batch: SeqBatch
) -> None:
    """``train.precision: bf16`` runs the forward pass under autocast on CPUs too."""
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = model.train()(batch).loss
    assert torch.isfinite(loss)
    if any(p.requires_grad for p in model.parameters()):
        loss.backward()
        assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        top = model.eval().recommend(batch.input_ids, 5, users=batch.users)
    assert top.shape == (batch.input_ids.size(0), 5)


def test_recommend_skips_padding_and_history(model: SequentialRecommender, batch: SeqBatch) -> None:
    model.train()(batch)  # counting models learn here
    top = model.eval().recommend(batch.input_ids, k=10, users=batch.users)
    assert top.shape == (batch.input_ids.size(0), 10)
    assert (top != PAD_ID).all()
    assert not (top.unsqueeze(2) == batch.input_ids.unsqueeze(1)).any()
    assert all(len(set(row.tolist())) == 10 for row in top)


def test_recommend_can_keep_history(model: SequentialRecommender, batch: SeqBatch) -> None:
    top = model.eval().recommend(
        batch.input_ids, k=NUM_ITEMS, exclude_seen=False, users=batch.users
    )
    assert sorted(top[0].tolist()) == list(range(1, NUM_ITEMS + 1))


def test_rows_do_not_leak_into_each_other(model: SequentialRecommender, batch: SeqBatch) -> None:
    model.train()(batch)
    model.eval()
    together = model.recommend(batch.input_ids, k=5, users=batch.users)
    alone = torch.cat(
        [
            model.recommend(row.unsqueeze(0), k=5, users=user.unsqueeze(0))
            for row, user in zip(batch.input_ids, batch.users, strict=True)
        ]
    )
    torch.testing.assert_close(together, alone)


def test_state_dict_round_trip(model: SequentialRecommender, batch: SeqBatch) -> None:
    model.train()(batch)
    buffer = io.BytesIO()
    torch.save(model.state_dict(), buffer)
    buffer.seek(0)
    clone = build_model(model.config)
    clone.load_state_dict(torch.load(buffer, weights_only=True))
    model.eval()
    clone.eval()
    torch.testing.assert_close(
        model.recommend(batch.input_ids, k=7, users=batch.users),
        clone.recommend(batch.input_ids, k=7, users=batch.users),
    )


@pytest.mark.parametrize("name", sorted(set(MODELS.names()) - COUNTING_MODELS))
def test_overfits_one_batch(name: str, batch: SeqBatch) -> None:
    model = make(name)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    model.train()
    first = model(batch).loss.item()
    losses = []
    for _ in range(150):
        loss = model(batch).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    # The mean of the last steps: one step's loss is one dropout draw, and spikes
    recent = sum(losses[-10:]) / 10
    assert recent < 0.25 * first, (first, losses[-10:])


def test_unknown_model_name_lists_alternatives() -> None:
    with pytest.raises(ConfigError, match="unknown model 'nope'; available: .*sasrec"):
        build_model_config({"name": "nope"}, num_items=NUM_ITEMS)


def test_unknown_model_key_lists_valid_keys() -> None:
    with pytest.raises(
        ConfigError, match=r"unknown key\(s\) model.hiden_size; valid .*hidden_size"
    ):
        build_model_config({"name": "sasrec", "hiden_size": 3}, num_items=NUM_ITEMS)


def test_num_items_comes_from_the_data() -> None:
    with pytest.raises(ConfigError, match="num_items comes from the data"):
        build_model_config({"name": "sasrec", "num_items": 5}, num_items=NUM_ITEMS)


@pytest.mark.parametrize("name", MODELS.names())
def test_negative_counts_and_empty_widths_are_config_errors(name: str) -> None:
    """Every model's integer fields are checked when its config is built, not deep in a
    layer's constructor: no negative count, no width (``*_size``) of 0."""
    config_class = MODELS.get(name).config_class
    defaults = config_class(num_items=NUM_ITEMS, num_users=3)
    integers = [
        spec.name
        for spec in dataclasses.fields(defaults)
        if spec.name not in ("num_items", "num_users")
        and type(getattr(defaults, spec.name)) is int  # not bool, not an unset None
    ]
    assert "max_seq_len" in integers
    for field_name in integers:
        bad = [-1, 0] if field_name.endswith("_size") else [-1]
        for value in bad:
            with pytest.raises(ConfigError, match=f"model.{field_name}"):
                config_class(num_items=NUM_ITEMS, num_users=3, **{field_name: value})
