"""The evaluator on hand-made data with a model whose scores we choose."""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import numpy as np
import polars as pl
import pytest
import torch
from torch import Tensor

from seqrec.batch import ModelOutput, SeqBatch
from seqrec.config import ConfigError, EvalConfig, SplitChoice, warn_once
from seqrec.data.idmap import IdMap
from seqrec.data.sequences import EvalSet, PreparedData, Sequences
from seqrec.data.split import leave_one_out
from seqrec.evaluation import (
    NegativeSampler,
    chunk_users,
    evaluate,
    evaluate_model,
    evaluate_variants,
    export_ranks,
    is_rank_file,
)
from seqrec.models.base import ModelConfig, ScoringRecommender, SequentialRecommender

N = 9


@dataclass(frozen=True, kw_only=True)
class FixedConfig(ModelConfig):
    name: ClassVar[str] = "fixed-scores-test-model"  # never registered


class FixedScores(ScoringRecommender):
    """Scores item i as ``weights[i]`` for every user: ranks are known in advance."""

    config_class = FixedConfig

    def __init__(self, weights: Tensor) -> None:
        super().__init__(FixedConfig(num_items=N, max_seq_len=4))
        self.weights = weights

    def forward(self, batch: SeqBatch) -> ModelOutput:
        raise NotImplementedError

    def score(self, input_ids: Tensor, users: Tensor | None = None) -> Tensor:
        return self.weights.unsqueeze(0).expand(input_ids.size(0), -1).clone()


# item i scores i: item 9 is best, item 1 worst; column 0 (padding) would be best if counted
WEIGHTS = torch.tensor([100.0, *range(1, N + 1)])
HISTORIES = Sequences.from_lists([[9, 8], [1], [2, 3, 4, 5, 6, 7], [8]])
TARGETS = np.array([7, 9, 1, 8], dtype=np.int32)  # the last user's target is in its history
EVAL_SET = EvalSet(np.arange(4, dtype=np.int64), HISTORIES, TARGETS)
ALL = Sequences.from_lists([[9, 8, 7], [1, 9], [2, 3, 4, 5, 6, 7, 1], [8, 8]])


def run(config: EvalConfig, weights: Tensor = WEIGHTS) -> np.ndarray:
    result = evaluate(FixedScores(weights), EVAL_SET, config, all_sequences=ALL, num_items=N)
    return result.ranks


def test_full_ranking_with_and_without_filter_seen() -> None:
    # user 0: history {9, 8} removed, 7 is best of the rest -> rank 1
    # user 1: 9 best -> 1; user 2: history {2..7} removed, 1 is worst of {1, 8, 9} -> 3
    # user 3: target 8 is seen and filtered -> behind all 9 items (10): a miss at every k <= 9
    assert run(EvalConfig()).tolist() == [1, 1, 3, 10]
    hits = evaluate(
        FixedScores(WEIGHTS), EVAL_SET, EvalConfig(ks=(9,)), all_sequences=ALL, num_items=N
    )
    assert hits.metrics["HR@9"] == 0.75  # ranked last (9) it once counted as a hit: 1.0
    assert run(EvalConfig(filter_seen=False)).tolist() == [3, 1, 9, 2]


def test_ties_are_pessimistic() -> None:
    assert run(EvalConfig(filter_seen=False), torch.ones(N + 1)).tolist() == [N] * 4


def test_metrics_and_flat_json_keys() -> None:
    result = evaluate(
        FixedScores(WEIGHTS), EVAL_SET, EvalConfig(ks=(1, 5)), all_sequences=ALL, num_items=N
    )
    assert result.metrics["HR@1"] == 0.5
    assert result.metrics["HR@5"] == 0.75
    flat = result.flat()
    assert {"NDCG@5", "HR@1", "MRR@5", "Recall@5", "protocol", "split", "num_users"} <= set(flat)
    assert "full ranking" in str(flat["protocol"])


def test_the_interval_of_one_user_is_null_in_json() -> None:
    one = EvalSet(EVAL_SET.users[:1], HISTORIES.take(np.array([0])), EVAL_SET.targets[:1])
    result = evaluate(
        FixedScores(WEIGHTS), one, EvalConfig(ks=(1,)), all_sequences=ALL, num_items=N
    )
    assert math.isnan(result.ci95["HR@1"])
    flat = result.flat()
    assert flat["HR@1_ci95"] is None
    assert flat["HR@1"] == result.metrics["HR@1"]
    json.loads(json.dumps(flat), parse_constant=lambda name: pytest.fail(f"{name} in JSON"))


def test_chunking_does_not_change_ranks() -> None:
    expected = run(EvalConfig()).tolist()
    assert run(EvalConfig(batch_size=1)).tolist() == expected
    assert run(EvalConfig(batch_size=3)).tolist() == expected


def test_chunk_size_follows_the_history_length_on_cpu_unless_set() -> None:
    assert chunk_users(EvalConfig(), max_seq_len=200, device="cpu") == 64
    assert chunk_users(EvalConfig(), max_seq_len=50, device="cpu") == 256
    assert chunk_users(EvalConfig(), max_seq_len=100_000, device="cpu") == 16
    assert chunk_users(EvalConfig(), max_seq_len=200, device="cuda") == 1024
    assert chunk_users(EvalConfig(batch_size=7), max_seq_len=200, device="cpu") == 7
    with pytest.raises(ConfigError, match="eval.batch_size"):
        EvalConfig(batch_size=0)


def test_sampled_negatives_are_unseen_unique_and_seeded() -> None:
    users = np.arange(4, dtype=np.int64)
    sampler = NegativeSampler(ALL, N, None, seed=0)
    negatives = sampler.sample(users, 5)
    for u in range(4):
        row = [i for i in negatives[u].tolist() if i != 0]
        seen = set(ALL[u].tolist())
        assert not seen & set(row)
        assert len(row) == len(set(row)) == min(5, N - len(seen))
    again = NegativeSampler(ALL, N, None, seed=0).sample(users, 5)
    assert torch.equal(negatives, again)


def test_popularity_sampling_prefers_popular_items() -> None:
    big = Sequences.from_lists([[1]] * 2000)
    weights = torch.tensor([0.0, 0, 1, 1, 1, 1, 1, 1, 1, 50])  # item 9 is 50x more popular
    drawn = NegativeSampler(big, N, weights, seed=1).sample(np.arange(2000, dtype=np.int64), 1)
    share = (drawn == 9).float().mean().item()
    assert share > 0.8  # 50 / (50 + 7) = 0.88 in expectation


def test_sampled_protocol_ranks_among_the_candidates() -> None:
    ranks = run(EvalConfig(protocol="sampled", num_negatives=3))
    # user 1 target is item 9, the best item: rank 1 whatever the negatives
    assert ranks[1] == 1
    # user 2 target is item 1, the worst: last among 1 + its unseen negatives ({8, 9})
    assert ranks[2] == 3
    assert (ranks >= 1).all()
    assert (ranks <= 4).all()


def test_uniform_negatives_are_equally_likely_and_follow_the_seed() -> None:
    # 20,000 users who have seen only item 1 each draw one negative from items 2..9.
    users = np.arange(20_000, dtype=np.int64)
    seen_one = Sequences.from_lists([[1]] * len(users))
    drawn = NegativeSampler(seen_one, N, None, seed=0).sample(users, 1).squeeze(1)
    counts = torch.bincount(drawn, minlength=N + 1)
    assert counts[:2].sum() == 0  # neither padding nor the seen item
    share = counts[2:].double() / len(users)
    # The binomial std of one share is sqrt(p (1 - p) / n) = 0.0023 at p = 1/8: allow 5 of them.
    tolerance = 5 * math.sqrt(1 / 8 * 7 / 8 / len(users))
    assert (share - 1 / 8).abs().max().item() < tolerance
    reseeded = NegativeSampler(seen_one, N, None, seed=1).sample(users, 1).squeeze(1)
    assert (reseeded != drawn).double().mean().item() > 0.8  # independent draws: 7/8 differ


def test_eval_seed_reaches_the_sampled_protocol() -> None:
    # Target item 1 scores 5.5 and item i scores i, so the rank (1 or 2) tells whether the one
    # negative was below or above the target: rank 2 for half of the draws.
    users = 2000
    eval_set = EvalSet(
        np.arange(users, dtype=np.int64),
        Sequences.from_lists([[1]] * users),
        np.ones(users, dtype=np.int32),
    )
    repeat_one = Sequences.from_lists([[1, 1]] * users)
    weights = torch.tensor([100.0, 5.5, *range(2, N + 1)])

    def ranks(seed: int) -> np.ndarray:
        config = EvalConfig(protocol="sampled", num_negatives=1, seed=seed)
        model = FixedScores(weights)
        return evaluate(model, eval_set, config, all_sequences=repeat_one, num_items=N).ranks

    first = ranks(seed=0)
    assert abs((first == 2).mean() - 0.5) < 5 * math.sqrt(0.25 / users)
    assert np.array_equal(ranks(seed=0), first)
    assert (ranks(seed=1) != first).mean() > 0.3  # independent draws: half differ


def test_sampled_protocol_ties_count_against_the_model() -> None:
    # Constant scores: every negative ties with the target and is placed above it. User 2
    # has two unseen items (8 and 9), so two negatives, not three.
    ranks = run(EvalConfig(protocol="sampled", num_negatives=3), torch.ones(N + 1))
    assert ranks.tolist() == [4, 4, 3, 4]


def test_reported_ci95_is_the_normal_interval_of_the_per_user_values() -> None:
    config = EvalConfig(ks=(1, 5))
    result = evaluate(FixedScores(WEIGHTS), EVAL_SET, config, all_sequences=ALL, num_items=N)
    assert result.ranks.tolist() == [1, 1, 3, 10]
    per_user = {"HR@1": [1.0, 1.0, 0.0, 0.0], "NDCG@5": [1.0, 1.0, 0.5, 0.0]}
    for name, values in per_user.items():
        expected = 1.959964 * statistics.stdev(values) / math.sqrt(len(values))
        assert math.isclose(result.ci95[name], expected, rel_tol=1e-9), name
    assert math.isclose(result.ci95["HR@1"], 0.565793, rel_tol=1e-5)  # 1.96 * sqrt(1/3) / 2
    flat = result.flat()
    assert set(result.ci95) == set(result.metrics)
    assert {name: flat[f"{name}_ci95"] for name in result.ci95} == result.ci95


@pytest.mark.parametrize(("split", "target"), [("valid", 6), ("test", 7)])
def test_evaluate_model_never_samples_the_target_or_any_item_of_the_sequence(
    split: SplitChoice, target: int
) -> None:
    # Every evaluated user has seen items 1..7: under "valid" the history passed is 1..5, the
    # target 6 and the later test item 7; only 8 and 9 may be drawn. Row 0 is too short to be
    # evaluated and has seen exactly 8 and 9, so reading it for an evaluated user would also fail.
    sequences = Sequences.from_lists([[8, 9]] + [[1, 2, 3, 4, 5, 6, 7]] * 20)
    id_map = IdMap(users=[f"u{u}" for u in range(21)], items=[str(i) for i in range(1, N + 1)])
    data = PreparedData("hand-made", "test", sequences, None, id_map, leave_one_out(sequences))
    config = EvalConfig(protocol="sampled", num_negatives=2)

    def model(unseen_score: float) -> FixedScores:
        weights = torch.full((N + 1,), 10.0)  # every item of the sequence above the target
        weights[target] = 5.0
        weights[[8, 9]] = unseen_score
        return FixedScores(weights)

    below = evaluate_model(model(unseen_score=1.0), data, config, split=split)
    assert below.users.tolist() == list(range(1, 21))
    assert below.ranks.tolist() == [1] * 20  # nothing above the target was drawn
    above = evaluate_model(model(unseen_score=20.0), data, config, split=split)
    assert above.ranks.tolist() == [3] * 20  # and both unseen items were


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_export_ranks_uses_original_ids(tmp_path, suffix: str) -> None:  # type: ignore[no-untyped-def]
    result = evaluate(FixedScores(WEIGHTS), EVAL_SET, EvalConfig(), all_sequences=ALL, num_items=N)
    id_map = IdMap(users=["u0", "u1", "u2", "u3"], items=[f"i{k}" for k in range(1, N + 1)])
    path = tmp_path / f"ranks{suffix}"
    export_ranks(result, id_map, path)
    frame = pl.read_csv(path) if suffix == ".csv" else pl.read_parquet(path)
    assert frame.columns == ["user_id", "target", "rank", "protocol"]
    assert frame["protocol"].unique().to_list() == [result.protocol]
    assert frame["user_id"].to_list() == ["u0", "u1", "u2", "u3"]
    assert frame["target"].to_list() == ["i7", "i9", "i1", "i8"]
    assert frame["rank"].to_list() == [1, 1, 3, 10]
    with pytest.raises(ValueError, match="use a .csv or .parquet"):
        export_ranks(result, id_map, tmp_path / "ranks.txt")
    assert not list(tmp_path.glob(".*tmp"))


def test_export_config_is_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        EvalConfig().protocol = "sampled"  # type: ignore[misc]


@pytest.mark.parametrize(
    "config",
    [EvalConfig(batch_size=3), EvalConfig(protocol="sampled", num_negatives=3, batch_size=3)],
    ids=["full", "sampled"],
)
def test_score_variants_in_one_pass_equal_separate_evaluations(config: EvalConfig) -> None:
    reversed_weights = torch.tensor([100.0, *range(N, 0, -1)])
    model = FixedScores(WEIGHTS)
    calls: list[int] = []

    def both(input_ids: Tensor, users: Tensor) -> list[Tensor]:
        calls.append(input_ids.size(0))
        rows = input_ids.size(0)
        return [w.unsqueeze(0).expand(rows, -1).clone() for w in (WEIGHTS, reversed_weights)]

    results = evaluate_variants(model, EVAL_SET, config, both, all_sequences=ALL, num_items=N)
    assert sum(calls) == len(EVAL_SET)  # every user scored once for both variants
    assert results[0].ranks.tolist() == run(config).tolist()
    assert results[1].ranks.tolist() == run(config, reversed_weights).tolist()
    assert results[0].ranks.tolist() != results[1].ranks.tolist()


def test_sampled_protocol_refuses_more_negatives_than_the_catalogue_holds() -> None:
    # every user interacted with at least its target: N - 1 items are left to sample from
    with pytest.raises(
        ConfigError,
        match=r"^eval\.num_negatives=9 is more than the catalogue of 9 items holds besides the "
        r"target; the largest value that works is 8$",
    ):
        run(EvalConfig(protocol="sampled", num_negatives=N))
    assert (run(EvalConfig(protocol="sampled", num_negatives=N - 1)) >= 1).all()
    run(EvalConfig(num_negatives=N))  # the full protocol does not use it


@pytest.mark.parametrize(
    ("config", "warning"),
    [
        (
            EvalConfig(ks=(5, 9), filter_seen=False),
            "eval.ks 9 is not below the catalogue of 9 items",
        ),
        (
            EvalConfig(protocol="sampled", num_negatives=4, ks=(5,)),
            "eval.ks 5 is not below the 5 candidates (target + eval.num_negatives)",
        ),
    ],
)
def test_a_cut_off_every_target_makes_is_warned_about(
    config: EvalConfig, warning: str, caplog: pytest.LogCaptureFixture
) -> None:
    warn_once.cache_clear()
    with caplog.at_level("WARNING", logger="seqrec.config"):
        ranks = run(config)
    assert (ranks <= max(config.ks)).all()  # what the warning is about
    assert [r.getMessage() for r in caplog.records] == [
        f"{warning}: every target ranked is within it, so HR@{max(config.ks)} says nothing "
        "about the model"
    ]
    caplog.clear()
    warn_once.cache_clear()
    with caplog.at_level("WARNING", logger="seqrec.config"):
        run(dataclasses.replace(config, ks=(min(config.ks) - 1,)))
    assert caplog.records == []


def test_sampled_protocol_names_the_users_with_fewer_unseen_items() -> None:
    model = FixedScores(WEIGHTS)
    # user 2 has seen 7 of the 9 items: 2 negatives, not 3, and the description says so
    three = evaluate(
        model,
        EVAL_SET,
        EvalConfig(protocol="sampled", num_negatives=3),
        all_sequences=ALL,
        num_items=N,
    )
    assert three.protocol.startswith(
        "sampled: target + 3 uniform-sampled items the user never interacted with; 1 users had "
        "fewer unseen items and were ranked against all of them (not comparable"
    )
    two = evaluate(
        model,
        EVAL_SET,
        EvalConfig(protocol="sampled", num_negatives=2),
        all_sequences=ALL,
        num_items=N,
    )
    assert "fewer unseen" not in two.protocol


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_export_ranks_replaces_its_own_export_and_no_other_file(
    tmp_path: Path, suffix: str
) -> None:
    result = evaluate(FixedScores(WEIGHTS), EVAL_SET, EvalConfig(), all_sequences=ALL, num_items=N)
    id_map = IdMap(users=["u0", "u1", "u2", "u3"], items=[f"i{k}" for k in range(1, N + 1)])
    path = tmp_path / f"ranks{suffix}"
    export_ranks(result, id_map, path)
    assert is_rank_file(path)
    export_ranks(result, id_map, path)  # an earlier export is replaced

    other = tmp_path / f"data{suffix}"
    frame = pl.DataFrame({"user_id": ["u1"], "item_id": ["i1"], "timestamp": [1]})
    frame.write_csv(other) if suffix == ".csv" else frame.write_parquet(other)
    before = other.read_bytes()
    assert not is_rank_file(other)
    with pytest.raises(ValueError, match="exists and is not a rank file written by seqrec"):
        export_ranks(result, id_map, other)
    assert other.read_bytes() == before
    assert not list(tmp_path.glob(".*tmp"))


def test_a_rank_file_is_recognised_by_its_exact_csv_header(tmp_path: Path) -> None:
    cases = {
        "user_id,target,rank\n": True,
        "user_id,target,rank\r\nu1,i1,1\r\n": True,
        "user_id,target,rank": True,
        "user_id,target,ranking\n": False,
        "user_id,target\n": False,
        "rank,target,user_id\n": False,
        "": False,
    }
    for i, (text, expected) in enumerate(cases.items()):
        path = tmp_path / f"f{i}.csv"
        path.write_text(text, newline="")
        assert is_rank_file(path) == expected, text


def test_a_nan_score_is_a_miss_not_a_hit() -> None:
    """NaN compares false with everything: the target's NaN once ranked it first (HR 1, NDCG
    infinite), another item's NaN once ranked below it."""
    weights = WEIGHTS.clone()
    weights[7] = float("nan")  # user 0's target
    config = EvalConfig(filter_seen=False)
    ranks = run(config, weights)
    assert ranks[0] == N + 1  # behind the N candidates
    result = evaluate(FixedScores(weights), EVAL_SET, config, all_sequences=ALL, num_items=N)
    assert all(math.isfinite(v) for v in result.metrics.values())
    assert run(config)[1] == 1  # item 9 scores best: user 1's target ranks first ...
    weights = WEIGHTS.clone()
    weights[3] = float("nan")
    assert run(config, weights)[1] == 2  # ... and second behind a NaN


class ListingModel(SequentialRecommender):
    """A generative-style model: a top-k list, no scores; subclasses say which list."""

    config_class = FixedConfig

    def __init__(self) -> None:
        super().__init__(FixedConfig(num_items=N, max_seq_len=4))

    def forward(self, batch: SeqBatch) -> ModelOutput:
        raise NotImplementedError


class ShortLists(ListingModel):
    """Lists shorter than the k it is asked for."""

    def recommend(
        self, input_ids: Tensor, k: int, exclude_seen: bool = True, users: Tensor | None = None
    ) -> Tensor:
        return torch.tensor([[7, 9]]).expand(input_ids.size(0), 2)


def test_a_list_or_score_matrix_of_the_wrong_shape_is_refused() -> None:
    """A list of 2 for k = 10 once made every miss rank 2, a hit at every k above it."""
    with pytest.raises(ValueError, match=r"recommend returned shape \(4, 2\) for 4 users; it "):
        evaluate(ShortLists(), EVAL_SET, EvalConfig(), all_sequences=ALL, num_items=N)
    narrow = FixedScores(WEIGHTS[:-1])  # no column for item N: an off-by-one
    with pytest.raises(ValueError, match=r"score returned shape \(4, 9\) .* \(B, N \+ 1\)"):
        evaluate(narrow, EVAL_SET, EvalConfig(), all_sequences=ALL, num_items=N)


class TopByWeight(ListingModel):
    """Items by ``WEIGHTS``; like TIGER it excludes every item of the ``input_ids`` it is
    given, however long, when asked to."""

    def recommend(
        self, input_ids: Tensor, k: int, exclude_seen: bool = True, users: Tensor | None = None
    ) -> Tensor:
        scores = WEIGHTS.unsqueeze(0).repeat(input_ids.size(0), 1)
        scores[:, 0] = float("-inf")
        if exclude_seen:
            scores = scores.scatter(1, input_ids, float("-inf"))
        top = scores.topk(N, dim=1)
        items = top.indices.masked_fill(top.values == float("-inf"), 0)
        return torch.nn.functional.pad(items, (0, k - N))


class PlainTopK(ListingModel):
    """A top-k written to the contract: k never beyond the catalogue, so no padding to it."""

    def recommend(
        self, input_ids: Tensor, k: int, exclude_seen: bool = True, users: Tensor | None = None
    ) -> Tensor:
        assert k <= N
        scores = WEIGHTS.unsqueeze(0).repeat(input_ids.size(0), 1)
        scores[:, 0] = float("-inf")
        if exclude_seen:
            scores = scores.scatter(1, input_ids, float("-inf"))
        top = scores.topk(k, dim=1)
        return top.indices.masked_fill(top.values == float("-inf"), 0)


def test_a_list_model_is_never_asked_for_more_items_than_the_catalogue() -> None:
    """A k beyond it (eval.ks, recommend -k, a request) reached the model's own top-k, which
    failed; the list is padded to k instead."""
    config = EvalConfig(ks=(1, N + 5))
    plain = evaluate(PlainTopK(), EVAL_SET, config, all_sequences=ALL, num_items=N)
    padded = evaluate(TopByWeight(), EVAL_SET, config, all_sequences=ALL, num_items=N)
    assert plain.ranks.tolist() == padded.ranks.tolist()


def test_filter_seen_removes_the_whole_history_from_a_generative_list() -> None:
    """User 2's history (6 items) is longer than max_seq_len (4): items 2 and 3 were once left
    in the list, which put the target (item 1, the worst) at rank 5 instead of 3."""
    ranks = evaluate(TopByWeight(), EVAL_SET, EvalConfig(), all_sequences=ALL, num_items=N).ranks
    assert ranks.tolist()[:3] == [1, 1, 3]  # as the scoring model's: [1, 1, 3, 9]
