"""Paired comparison of exported ranks: differences by hand, alignment by user, clear errors."""

from __future__ import annotations

import json
import math
import subprocess
from pathlib import Path

import polars as pl
import pytest

from seqrec.analysis.compare import paired_differences, read_ranks
from tests.cli.helpers import SEQREC


def write(path: Path, users: list[str], targets: list[str], ranks: list[int]) -> Path:
    pl.DataFrame({"user_id": users, "target": targets, "rank": ranks}).write_csv(path)
    return path


def test_differences_match_a_hand_computation_and_align_by_user(tmp_path: Path) -> None:
    a = write(tmp_path / "a.csv", ["u1", "u2", "u3", "u4"], ["i1", "i2", "i3", "i4"], [1, 3, 20, 2])
    # the same users in another order; u3 gains, u1 loses
    b = write(tmp_path / "b.csv", ["u4", "u3", "u2", "u1"], ["i4", "i3", "i2", "i1"], [2, 5, 3, 11])
    (hr, ndcg, mrr) = paired_differences(read_ranks(a), read_ranks(b), (10,), bootstrap=200)
    ndcg_a = [1.0, 1 / math.log2(4), 0.0, 1 / math.log2(3)]
    ndcg_b = [0.0, 1 / math.log2(4), 1 / math.log2(6), 1 / math.log2(3)]  # u1, u2, u3, u4
    diffs = [x - y for x, y in zip(ndcg_a, ndcg_b, strict=True)]
    mean = sum(diffs) / 4
    std = math.sqrt(sum((d - mean) ** 2 for d in diffs) / 3)
    assert ndcg.metric == "NDCG@10"
    assert ndcg.mean_a == pytest.approx(sum(ndcg_a) / 4)
    assert ndcg.difference == pytest.approx(mean)
    assert ndcg.standard_error == pytest.approx(std / 2)
    assert ndcg.ci_low <= mean <= ndcg.ci_high
    assert hr.difference == pytest.approx(0.0)  # u1 leaves the top 10, u3 enters it
    assert mrr.difference == pytest.approx((1.0 - 1 / 5) / 4)


def test_identical_files_differ_by_exactly_zero(tmp_path: Path) -> None:
    a = write(tmp_path / "a.csv", ["1", "2", "3"], ["7", "8", "9"], [1, 4, 30])
    for row in paired_differences(read_ranks(a), read_ranks(a), (5, 10), bootstrap=50):
        assert row.difference == 0.0
        assert (row.ci_low, row.ci_high, row.z) == (0.0, 0.0, 0.0)


def test_files_of_different_users_or_targets_are_refused(tmp_path: Path) -> None:
    a = read_ranks(write(tmp_path / "a.csv", ["1", "2"], ["7", "8"], [1, 2]))
    other_users = read_ranks(write(tmp_path / "b.csv", ["1", "3"], ["7", "8"], [1, 2]))
    other_targets = read_ranks(write(tmp_path / "c.csv", ["1", "2"], ["7", "9"], [1, 2]))
    with pytest.raises(ValueError, match="different users"):
        paired_differences(a, other_users)
    with pytest.raises(ValueError, match="different targets"):
        paired_differences(a, other_targets)


@pytest.mark.parametrize("ks", [(0,), (10, -1), ()])
def test_cut_offs_below_one_are_refused(tmp_path: Path, ks: tuple[int, ...]) -> None:
    a = read_ranks(write(tmp_path / "a.csv", ["1", "2"], ["7", "8"], [1, 2]))
    with pytest.raises(ValueError, match="cut-offs k must be >= 1"):
        paired_differences(a, a, ks)


def test_malformed_rank_files_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="does not exist"):
        read_ranks(tmp_path / "missing.csv")
    (tmp_path / "cols.csv").write_text("user,rank\n1,2\n")
    with pytest.raises(ValueError, match="lacks column"):
        read_ranks(tmp_path / "cols.csv")
    (tmp_path / "zero.csv").write_text("user_id,target,rank\n1,2,0\n")
    with pytest.raises(ValueError, match=">= 1"):
        read_ranks(tmp_path / "zero.csv")
    (tmp_path / "ragged.csv").write_text("user_id,target,rank\n1,2,1\n1,3,4,5,6\n")
    with pytest.raises(ValueError, match="not a readable rank file") as ragged:
        read_ranks(tmp_path / "ragged.csv")
    assert "\n" not in str(ragged.value)  # Polars' advice on its own options is left out
    (tmp_path / "twice.csv").write_text("user_id,target,rank\n1,2,1\n1,3,4\n")
    with pytest.raises(ValueError, match="more than once"):
        read_ranks(tmp_path / "twice.csv")


def test_the_command_prints_json_and_fails_cleanly(tmp_path: Path) -> None:
    a = write(tmp_path / "a.csv", ["1", "2", "3"], ["7", "8", "9"], [1, 4, 30])
    b = write(tmp_path / "b.csv", ["1", "2", "3"], ["7", "8", "9"], [2, 4, 3])
    done = subprocess.run(
        [SEQREC, "compare", a, b, "--k", "10", "--json"], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    rows = {row["metric"]: row for row in json.loads(done.stdout)}
    assert set(rows) == {"HR@10", "NDCG@10", "MRR@10"}
    assert rows["HR@10"]["difference"] == pytest.approx(-1 / 3)
    bad = subprocess.run(
        [SEQREC, "compare", a, tmp_path / "none.csv"], capture_output=True, text=True
    )
    assert bad.returncode == 2
    assert "Traceback" not in bad.stderr
    assert "does not exist" in bad.stderr


def test_files_of_two_protocols_are_refused(tmp_path: Path) -> None:
    def ranks(name: str, protocol: str) -> pl.DataFrame:
        frame = pl.DataFrame(
            {"user_id": ["1", "2"], "target": ["7", "8"], "rank": [1, 2], "protocol": protocol}
        )
        frame.write_csv(tmp_path / name)
        return read_ranks(tmp_path / name)

    full, sampled = ranks("a.csv", "full ranking"), ranks("b.csv", "sampled: target + 100")
    with pytest.raises(ValueError, match=r"different protocols \(A: full ranking; B: sampled"):
        paired_differences(full, sampled)
    older = read_ranks(write(tmp_path / "c.csv", ["1", "2"], ["7", "8"], [1, 2]))
    assert paired_differences(full, older, bootstrap=10)  # a file without it: not refused
    assert paired_differences(full, ranks("d.csv", "full ranking"), bootstrap=10)


def test_a_generative_list_counts_unlisted_targets_as_misses_up_to_its_length(
    tmp_path: Path,
) -> None:
    """A generative model ranks only its top-K list: an empty rank is a miss at k <= K, and a
    larger k cannot be computed from the file (it once counted every unlisted user a hit)."""
    listed = tmp_path / "tiger.csv"
    listed.write_text("user_id,target,rank\n1,7,1\n2,8,\n3,9,10\n4,6,\n")
    tiger = read_ranks(listed)
    ranking = read_ranks(
        write(tmp_path / "s.csv", ["1", "2", "3", "4"], list("7896"), [1, 2, 3, 50])
    )
    (hr,) = [
        r for r in paired_differences(tiger, ranking, (10,), bootstrap=10) if r.metric == "HR@10"
    ]
    assert hr.mean_a == pytest.approx(2 / 4)
    assert hr.mean_b == pytest.approx(3 / 4)
    with pytest.raises(ValueError, match=r"rank file A ranks the targets only within .* k <= 10"):
        paired_differences(tiger, ranking, (10, 20))


def test_a_cut_off_given_twice_or_a_negative_seed_is_refused(tmp_path: Path) -> None:
    """compare printed every metric twice; numpy said "expected non-negative integer"."""
    ranks = read_ranks(write(tmp_path / "a.csv", ["u1", "u2"], ["i1", "i2"], [1, 3]))
    with pytest.raises(ValueError, match=r"each cut-off k once, got \[10, 10\]"):
        paired_differences(ranks, ranks, (10, 10))
    with pytest.raises(ValueError, match="the bootstrap seed must be >= 0, got -1"):
        paired_differences(ranks, ranks, (10,), seed=-1)
