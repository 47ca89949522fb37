"""Contract tests every registered model must pass, at tiny odd sizes."""

from __future__ import annotations

import dataclasses
import io
import math
import typing

import pytest
import torch

from seqrec.batch import PAD_ID, ModelOutput, SeqBatch
from seqrec.config import ConfigError, warn_once
from seqrec.models import (
    MODELS,
    ScoringRecommender,
    SequentialRecommender,
    build_model,
    build_model_config,
)
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
    zero = [
        n for n, p in model.named_parameters() if p.grad is not None and p.grad.abs().sum() == 0
    ]
    assert not zero, f"parameters whose gradient is all zero: {zero}"


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
    assert list(clone.state_dict()) == list(model.state_dict())
    model.eval()
    clone.eval()
    torch.testing.assert_close(
        model.recommend(batch.input_ids, k=7, users=batch.users),
        clone.recommend(batch.input_ids, k=7, users=batch.users),
    )
    if isinstance(model, ScoringRecommender):  # the whole ranking, not only its top
        assert isinstance(clone, ScoringRecommender)
        with torch.no_grad():
            torch.testing.assert_close(
                model.score(batch.input_ids, batch.users), clone.score(batch.input_ids, batch.users)
            )


@pytest.mark.parametrize("name", sorted(set(MODELS.names()) - COUNTING_MODELS))
def test_overfits_one_batch(name: str, batch: SeqBatch) -> None:
    model = make(name)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    model.train()
    first = model(batch).loss.item()
    losses: list[float] = []
    recent = first
    # Up to 150 steps, stopping once the mean of the last 10 (one step's loss is one dropout
    # draw, and spikes) is below a quarter of the first
    while len(losses) < 150 and not (len(losses) >= 10 and recent < 0.25 * first):
        loss = model(batch).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        recent = sum(losses[-10:]) / len(losses[-10:])
    assert recent < 0.25 * first, (first, losses[-10:])


def test_unknown_model_name_lists_alternatives() -> None:
    with pytest.raises(ConfigError, match="unknown model 'nope'; available: ") as excinfo:
        build_model_config({"name": "nope"}, num_items=NUM_ITEMS)
    # Split the list: a substring test would let "gsasrec" stand in for a missing "sasrec".
    available, hint = str(excinfo.value).split("available: ", 1)[1].split(" (", 1)
    assert sorted(available.split(", ")) == MODELS.names()
    assert hint.startswith("a model of your own: register it with @register_model")


def test_unknown_model_key_lists_valid_keys() -> None:
    with pytest.raises(
        ConfigError, match=r"unknown key\(s\) model.hiden_size; valid .*hidden_size"
    ) as raised:
        build_model_config({"name": "sasrec", "hiden_size": 3}, num_items=NUM_ITEMS)
    assert "num_items" not in str(raised.value)  # it comes from the data, no config sets it
    assert "num_users" not in str(raised.value)


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


def float_fields(name: str) -> list[str]:
    """The float fields (``float`` or ``float | None``) of a registered model's config."""
    config_class = MODELS.get(name).config_class
    hints = typing.get_type_hints(config_class)
    return [
        spec.name
        for spec in dataclasses.fields(config_class)
        if hints[spec.name] is float or float in typing.get_args(hints[spec.name])
    ]


NON_FINITE_CASES = [
    pytest.param(name, field_name, value, id=f"{name}-{field_name}-{value}")
    for name in MODELS.names()
    for field_name in float_fields(name)
    for value in (math.nan, math.inf, -math.inf)
]


@pytest.mark.parametrize(("name", "field_name", "value"), NON_FINITE_CASES)
def test_non_finite_floats_are_config_errors(name: str, field_name: str, value: float) -> None:
    """NaN fails every comparison, so ``x < 0`` range checks let it (and often inf) through;
    every float field of every model must name itself when given one."""
    with pytest.raises(ConfigError, match=rf"model\.{field_name}\b.*\bgot {value}\b"):
        build_model_config({"name": name, field_name: value}, num_items=NUM_ITEMS, num_users=3)


def test_float_fields_are_found() -> None:
    """Guards the case generation above: an empty list would test nothing."""
    assert {"sampling_alpha", "gbce_t", "bpr_max_reg", "init_std"} <= set(float_fields("sasrec"))
    assert float_fields("pop") == []
    assert len(NON_FINITE_CASES) > 100


@pytest.mark.parametrize("name", MODELS.names())
def test_default_configs_build(name: str) -> None:
    config = build_model_config({"name": name}, num_items=NUM_ITEMS, num_users=3)
    assert all(
        getattr(config, field_name) is None or math.isfinite(getattr(config, field_name))
        for field_name in float_fields(name)
    )


@pytest.mark.parametrize(
    ("name", "values"),
    [  # the ends of the documented ranges stay valid
        ("sasrec", {"dropout": 0.0, "init_std": 0.02, "sampling_alpha": 0.0, "bpr_max_reg": 0.0}),
        ("sasrec", {"gbce_t": 0.0}),
        ("gsasrec", {"gbce_t": 1.0}),
        ("bert4rec", {"mask_prob": 1.0, "mask_token_prob": 0.0, "last_item_mask_prob": 1.0}),
        ("duorec", {"contrastive_weight": 0.0, "temperature": 0.05}),
        ("fism", {"alpha": 0.0}),
        ("fism", {"alpha": 1.0}),
        ("gru4rec", {"elu_param": 0.0, "embedding_dropout": 0.0}),
        ("rearec", {"kl_weight": 0.0, "temperature": 0.07}),
        ("recrec", {"idr_weight": 0.0, "compressor_dropout": 0.0}),
    ],
)
def test_boundary_floats_stay_valid(name: str, values: dict[str, float]) -> None:
    build_model_config({"name": name, **values}, num_items=NUM_ITEMS, num_users=3)


# Models that declare a loss that splits by rows (ModelConfig.loss_splits_by_rows) at their
# tiny size with these changes: they may train a batch in parts (train.batch_parts) and on
# several data-parallel ranks.
SPLITS_BY_ROWS: dict[str, dict[str, object]] = {
    # every row masks only its newest item: the masks do not depend on the draws
    "bert4rec": {"last_item_mask_prob": 1.0},
    "bpr": {},
    "caser": {},
    "fism": {},
    "fmc": {},
    "fpmc": {},
    "gru4rec": {"negative_sampler": "uniform"},  # its default draws in-batch negatives
    "gsasrec": {},
    "mamba4rec": {},
    "rearec": {},
    "recrec": {},
    "sasrec": {},
    "tiger": {},
    "transrec": {},
    "trierec": {},
}


def without_dropout(name: str, **changes: object) -> SequentialRecommender:
    """The tiny model with every dropout rate at zero: parts and whole draw no masks."""
    config = tiny_model(name, **changes).config
    rates = {
        f.name: 0.0
        for f in dataclasses.fields(config)
        if "dropout" in f.name and isinstance(getattr(config, f.name), float)
    }
    torch.manual_seed(0)
    return tiny_model(name, **changes, **rates)


def test_the_models_whose_loss_splits_by_rows() -> None:
    def declares(name: str) -> bool:
        return tiny_model(name, **SPLITS_BY_ROWS.get(name, {})).config.loss_splits_by_rows

    assert {name for name in MODELS.names() if declares(name)} == set(SPLITS_BY_ROWS)
    assert not tiny_model("gru4rec").config.loss_splits_by_rows  # in-batch negatives


def test_every_model_that_learns_can_train_data_parallel() -> None:
    """Its loss splits by rows, or gathers the rows it couples over the ranks (DuoRec's
    InfoNCE, in-batch negatives): a model that does neither could not be trained on more
    than one process."""
    for name in sorted(set(MODELS.names()) - COUNTING_MODELS):
        for changes in ({}, {"loss": "bpr", "negative_sampler": "in_batch"}):
            try:
                config = tiny_model(name, **changes).config
            except ConfigError:  # the model has no such loss
                continue
            assert config.loss_splits_by_rows or config.loss_gathers_rows, (name, changes)
    assert tiny_model("duorec").config.loss_gathers_rows
    assert tiny_model("sasrec", loss="bpr", negative_sampler="in_batch").config.loss_gathers_rows


def rows(batch: SeqBatch, keep: slice) -> SeqBatch:
    """The rows ``keep`` of every per-row field (log_q is the sampler's, not a row's), each
    history cut to the part's own longest, as ``TrainBatches`` pads a part."""

    def width(ids: torch.Tensor) -> int:
        return max(int((ids != PAD_ID).sum(dim=1).max()), 1)

    part = dataclasses.replace(
        batch,
        **{
            f.name: getattr(batch, f.name)[keep]
            for f in dataclasses.fields(batch)
            if f.name != "log_q" and getattr(batch, f.name) is not None
        },
    )
    L = width(part.input_ids)
    return dataclasses.replace(
        part,
        input_ids=part.input_ids[:, -L:],
        labels=None if part.labels is None else part.labels[:, -L:],
        negatives=(
            part.negatives[:, -L:]
            if part.negatives is not None and part.negatives.dim() == 3
            else part.negatives
        ),
        same_target_ids=(
            None
            if part.same_target_ids is None
            else part.same_target_ids[:, -width(part.same_target_ids) :]
        ),
    )


# Other settings that declare it: full CE uses no negatives, in-batch or not.
MORE_SPLITS_BY_ROWS: list[tuple[str, dict[str, object]]] = [("gru4rec", {"loss": "ce"})]


@pytest.mark.parametrize(("name", "changes"), sorted(SPLITS_BY_ROWS.items()) + MORE_SPLITS_BY_ROWS)
def test_a_loss_that_splits_by_rows_gives_the_batch_gradient_in_parts(
    name: str, changes: dict[str, object], batch: SeqBatch
) -> None:
    """Each part's loss weighted by its share of the positions sums to the batch's gradient:
    what batch_parts and data-parallel ranks rely on."""
    model = without_dropout(name, **changes).train()
    assert model.config.loss_splits_by_rows
    if model.config.batch_needs.prefix_examples:  # one example a row: its target is last
        labels = torch.zeros_like(batch.input_ids)
        labels[:, -1] = (batch.input_ids[:, -1] % NUM_ITEMS) + 1
        batch = dataclasses.replace(batch, labels=labels)
    params = [p for p in model.parameters() if p.requires_grad]

    def positions(output: ModelOutput, part: SeqBatch) -> int:
        return part.num_targets if output.num_targets is None else output.num_targets

    whole_output = model(batch)
    whole = torch.autograd.grad(whole_output.loss, params, allow_unused=True)
    outputs = [
        (model(part), part) for part in (rows(batch, slice(0, 1)), rows(batch, slice(1, None)))
    ]
    total = sum(positions(output, part) for output, part in outputs)
    assert total == positions(whole_output, batch)
    summed = torch.autograd.grad(
        sum(output.loss * (positions(output, part) / total) for output, part in outputs),
        params,
        allow_unused=True,
    )
    for param_name, a, b in zip(
        [n for n, p in model.named_parameters() if p.requires_grad], whole, summed, strict=True
    ):
        if a is None or b is None:
            assert (a is None) == (b is None), param_name
            continue
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-6, msg=param_name)


@pytest.mark.parametrize("name", MODELS.names())
def test_a_history_scores_the_same_however_wide_its_batch_pads(name: str) -> None:
    """A part, a rank's share and an evaluation chunk each pad to their own longest history."""
    model = without_dropout(name).eval()
    history = torch.tensor([[5, 17, 3]])
    wide = torch.cat([torch.full((1, 4), PAD_ID), history], dim=1)
    users = torch.tensor([1])
    with torch.no_grad():
        if isinstance(model, ScoringRecommender):
            torch.testing.assert_close(model.score(wide, users), model.score(history, users))
            return
        losses = []  # a generative model: the loss of its next item, teacher-forced
        for ids in (history, wide):
            labels = torch.zeros_like(ids)
            labels[:, -1] = 9
            losses.append(model(SeqBatch(input_ids=ids, labels=labels, users=users)).loss)
        torch.testing.assert_close(losses[1], losses[0])


AT_LEAST_ONE_CASES = [
    pytest.param(name, field_name, value, id=f"{name}-{field_name}-{value}")
    for name in MODELS.names()
    for field_name in MODELS.get(name).config_class.at_least_one
    for value in (0, -1)
]


@pytest.mark.parametrize(("name", "field_name", "value"), AT_LEAST_ONE_CASES)
def test_counts_that_must_be_positive_say_so(name: str, field_name: str, value: int) -> None:
    """Every integer field is checked against 0 by the base config; a count a model cannot
    run with at 0 must state its own bound (Mamba4Rec's num_layers -1 once said ">= 0")."""
    with pytest.raises(ConfigError, match=rf"model\.{field_name} must be >= 1, got {value}$"):
        build_model_config({"name": name, field_name: value}, num_items=NUM_ITEMS, num_users=3)


def test_positive_count_cases_cover_the_deep_models() -> None:
    covered = {name for name in MODELS.names() if MODELS.get(name).config_class.at_least_one}
    assert {"mamba4rec", "gru4rec", "caser", "recrec", "tiger", "trierec"} <= covered


@pytest.mark.parametrize(
    ("section", "unread", "warning"),
    [
        (
            {"name": "duorec", "contrastive_weight": 0.0},
            {"temperature": 0.5, "similarity": "cos"},
            "model.temperature, model.similarity do nothing with model.contrastive_weight: 0 "
            "(no contrastive term)",
        ),
        (
            {"name": "sasrec", "positional_embedding": False},
            {"position_origin": "oldest"},
            "model.position_origin does nothing with model.positional_embedding: false",
        ),
        (
            {"name": "recrec", "stage": 1},
            {"inner_steps": 5, "gate": "overwrite"},
            "model.inner_steps, model.gate do nothing in stage 1, which has no reasoner",
        ),
        (
            {"name": "sasrec", "loss": "bce", "negative_sampler": "in_batch"},
            {"shared_negatives": True},
            "model.shared_negatives does nothing with model.loss: bce and "
            "model.negative_sampler: in_batch",
        ),
    ],
    ids=["duorec-no-contrast", "sasrec-no-positions", "recrec-stage-1", "in-batch-shared"],
)
def test_a_field_the_model_never_reads_is_named_once(
    section: dict[str, object],
    unread: dict[str, object],
    warning: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """These were accepted and ignored without a word."""
    warn_once.cache_clear()
    with caplog.at_level("WARNING", logger="seqrec.config"):
        build_model_config(section, num_items=NUM_ITEMS)  # the defaults: nothing to say
        assert not caplog.records
        for _ in range(2):
            build_model_config({**section, **unread}, num_items=NUM_ITEMS)
    assert [record.getMessage() for record in caplog.records] == [warning]
