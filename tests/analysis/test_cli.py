"""``seqrec analyze residual|attention`` on a trained synthetic run: the files, the numbers
that must match ``seqrec evaluate``, and one-line errors."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import seqrec.analysis.figures
from seqrec.cli import main
from seqrec.training.checkpoint import load_run
from seqrec.training.run import evaluate_run
from tests.cli.helpers import one_error_line

FAST = ["--alphas", "0,0.5,1", "--epsilons", "0,0.1", "--shuffle-seeds", "0,1"]
TABLES = [
    "last_item_hits",
    "shuffle",
    "mixing",
    "mixing_by_position",
    "mixing_heatmaps",
    "positions",
    "alpha_sweep",
    "alpha_selection",
    "paper_table2",
    "paper_table3",
    "paper_table4",
]
FIGURES = ["fig1_shuffle", "fig3_mixing_heatmaps", "fig4_alpha", "fig5_recovery"]


@pytest.fixture(scope="module")
def residual_out(trained_run: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("residual") / "out"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SEQREC_OFFLINE", "1")
        code = main(["-q", "analyze", "residual", str(trained_run), "--out", str(out), *FAST])
    assert code == 0
    return out


def test_residual_writes_tables_figures_and_report(residual_out: Path) -> None:
    for name in TABLES:
        assert (residual_out / f"{name}.csv").is_file(), name
        assert isinstance(json.loads((residual_out / f"{name}.json").read_text()), list)
    for name in [*FIGURES, "fig6_alpha_selection"]:
        assert (residual_out / f"{name}.png").stat().st_size > 1000, name
    report = (residual_out / "report.md").read_text()
    for link in FIGURES:
        assert f"({link}.png)" in report
    assert "leave-one-out, as the run was trained" in report
    summary = json.loads((residual_out / "summary.json").read_text())
    assert summary["setting"]["filter_seen"] is True
    assert summary["setting"]["layout"] == "pre_ln"  # the run's layout, described as such
    assert "blocks are pre-LN" in report
    assert "reference layout" not in report
    assert [row["alpha"] for row in summary["alpha_sweep"]] == [0.0, 0.5, 1.0]
    assert len(summary["shuffle"]) == 5  # original + 2 seeds x (partial, full)


def test_residual_alpha_one_equals_seqrec_evaluate(residual_out: Path, trained_run: Path) -> None:
    result, _ = evaluate_run(
        trained_run, overrides={"protocol": "full", "filter_seen": True}, device="cpu"
    )
    summary = json.loads((residual_out / "summary.json").read_text())
    at_one = next(row for row in summary["alpha_sweep"] if row["alpha"] == 1.0)
    assert at_one["HR@10"] == result.metrics["HR@10"]
    assert at_one["NDCG@10"] == result.metrics["NDCG@10"]
    assert at_one["q_test"] in (0.0, None)  # q(1) = 0 by definition (None: S is empty)
    original = next(row for row in summary["shuffle"] if row["condition"] == "original")
    assert original["HR@10"] == result.metrics["HR@10"]
    positions = summary["positions"][0]
    assert positions["HR@10 at L"] == pytest.approx(result.metrics["HR@10"])


def test_residual_ranks_as_the_run_was_evaluated(trained_run: Path, tmp_path: Path) -> None:
    """A run evaluated with seen items kept (the ML-1M Mamba4Rec configs' choice) was analysed
    with them filtered, and its alpha = 1 row was not ``seqrec evaluate``'s."""
    run = tmp_path / "run"
    shutil.copytree(trained_run, run)
    config = json.loads((run / "config.json").read_text())
    config["eval"]["filter_seen"] = False
    (run / "config.json").write_text(json.dumps(config))
    out = tmp_path / "out"
    fastest = ["--alphas", "0,1", "--epsilons", "0", "--shuffle-seeds", "0"]
    assert main(["-q", "analyze", "residual", str(run), "--out", str(out), *fastest]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["setting"]["filter_seen"] is False
    result, _ = evaluate_run(run, device="cpu")  # the run's own protocol
    at_one = next(row for row in summary["alpha_sweep"] if row["alpha"] == 1.0)
    assert at_one["NDCG@10"] == result.metrics["NDCG@10"]
    filtered, _ = evaluate_run(run, overrides={"filter_seen": True}, device="cpu")
    assert filtered.metrics["NDCG@10"] != result.metrics["NDCG@10"]  # the two protocols differ
    assert "the run's eval.filter_seen" in (out / "report.md").read_text()


def test_alpha_sweep_measures_mixing_and_validation_at_each_alpha(
    residual_out: Path, trained_run: Path
) -> None:
    summary = json.loads((residual_out / "summary.json").read_text())
    rows = {row["alpha"]: row for row in summary["alpha_sweep"]}
    for kind in ("sum", "agg"):
        # alpha = 0: nothing is added to the attention output, so +Res mixes as Attn does
        assert rows[0.0][f"mixing_res_{kind}"] == pytest.approx(
            rows[0.0][f"mixing_attn_{kind}"], rel=1e-6
        )
        assert rows[1.0][f"mixing_res_{kind}"] < rows[1.0][f"mixing_attn_{kind}"]
        assert rows[0.5][f"mixing_res_{kind}"] != rows[1.0][f"mixing_res_{kind}"]
    valid, _ = evaluate_run(
        trained_run, split="valid", overrides={"protocol": "full", "filter_seen": True}
    )
    assert rows[1.0]["valid HR@10"] == valid.metrics["HR@10"]


def test_residual_without_matplotlib_still_writes_tables(
    trained_run: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    message = seqrec.analysis.figures.NO_MATPLOTLIB
    monkeypatch.setattr(seqrec.analysis.figures, "matplotlib_missing", lambda: message)
    out = tmp_path / "out"
    args = ["--alphas", "0.5,1", "--epsilons", "0.1", "-k", "5"]
    assert main(["-q", "analyze", "residual", str(trained_run), "--out", str(out), *args]) == 0
    assert "matplotlib is not installed" in capsys.readouterr().err
    assert not list(out.glob("*.png"))
    assert (out / "alpha_sweep.csv").is_file()
    assert "matplotlib is not installed" in (out / "report.md").read_text()


def test_attention_with_genres_writes_heatmaps_and_genre_matrix(
    trained_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    movies = tmp_path / "movies.dat"
    genres = ["Sci-Fi", "Romance", "Animation", "Horror"]
    movies.write_text("".join(f"{i}::Movie {i} (2000)::{genres[i % 4]}\n" for i in range(300)))
    out = tmp_path / "out"
    argv = ["-q", "analyze", "attention", str(trained_run), "--out", str(out)]
    assert main([*argv, "--movies", str(movies), "--per-genre", "20"]) == 0
    for name in ("attention_heatmaps", "genre_attention"):
        assert (out / f"{name}.csv").is_file()
    rows = json.loads((out / "genre_attention.json").read_text())
    assert {row["query_genre"] for row in rows} == set(genres)
    assert (out / "fig_attention_heatmaps.png").is_file()
    assert (out / "fig_genre_attention.png").is_file()
    report = (out / "report.md").read_text()
    assert "Genre x genre" in report
    assert "not ML-1M movies: their ids are read as MovieIDs" in report  # synthetic items
    assert "largest weight is on itself for" in report
    assert "report:" in capsys.readouterr().out


def test_attention_without_genres_says_why(
    trained_run: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    message = seqrec.analysis.figures.NO_MATPLOTLIB
    monkeypatch.setattr(seqrec.analysis.figures, "matplotlib_missing", lambda: message)
    out = tmp_path / "out"
    runs = [str(trained_run), str(trained_run)]  # the same run twice: labels must stay apart
    assert main(["-q", "analyze", "attention", *runs, "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert "genre attention is for ML-1M" in err
    assert "matplotlib is not installed" in err
    rows = json.loads((out / "attention_heatmaps.json").read_text())
    assert len({row["run"] for row in rows}) == 2
    assert all(row["run"].endswith("(positional embedding on)") for row in rows)
    assert not (out / "genre_attention.csv").exists()


@pytest.mark.parametrize("command", ["residual", "attention"])
def test_a_pop_run_is_refused_in_one_line(
    command: str, pop_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    assert main(["analyze", command, str(pop_run), "--out", str(out)]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert "causal self-attention" in line
    assert "'pop'" in line
    assert not out.exists()


@pytest.mark.parametrize("command", ["residual", "attention"])
def test_a_missing_run_dir_is_one_error_line(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["analyze", command, str(tmp_path / "nope"), "--out", str(tmp_path / "out")])
    assert code == 2
    assert "does not exist" in one_error_line(capsys.readouterr().err)


def test_alphas_must_include_one(
    trained_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [
        "analyze",
        "residual",
        str(trained_run),
        "--out",
        str(tmp_path / "o"),
        "--alphas",
        "0,0.5",
    ]
    assert main(argv) == 2
    assert "must include 1.0" in one_error_line(capsys.readouterr().err)


@pytest.mark.parametrize(
    ("command", "flags", "message"),
    [
        ("residual", ["--shuffle-seeds", "1.5"], "--shuffle-seeds: expected whole numbers"),
        ("residual", ["--shuffle-seeds", "-1"], "--shuffle-seeds: expected one or more seeds"),
        ("attention", ["--recent", "0"], "--recent must be >= 1"),
        ("attention", ["--per-genre", "-1"], "--per-genre must be >= 1"),
    ],
)
def test_bad_counts_and_seeds_are_refused_before_any_work(
    command: str, flags: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    argv = ["analyze", command, str(tmp_path / "no-run"), "--out", str(out), *flags]
    assert main(argv) == 2
    assert message in one_error_line(capsys.readouterr().err)  # before the missing run is read
    assert not out.exists()


def test_recent_beyond_the_models_window_is_refused(
    trained_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--recent 10000 once asked for 160 GB; one above max_seq_len padded its heatmaps."""
    window = load_run(trained_run).model.config.max_seq_len
    out = tmp_path / "out"
    argv = ["analyze", "attention", str(trained_run), "--out", str(out), "--recent"]
    assert main([*argv, str(window + 1)]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert line.endswith(
        f"above {trained_run}'s max_seq_len {window}, the most positions it attends over"
    )
    assert not out.exists()


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--alphas", "0,1.5,1"], "--alphas: residual scales must be numbers in [0, 1], got 1.5"),
        (["--alphas=-0.1,1"], "--alphas: residual scales must be numbers in [0, 1], got -0.1"),
        (["--alphas", "nan,1"], "--alphas: residual scales must be numbers in [0, 1], got nan"),
        (["--alphas", "0,1,inf"], "--alphas: residual scales must be numbers in [0, 1], got inf"),
        (["--alphas", ""], "--alphas must include 1.0"),
        (["--alphas", "0.5,1,0.5"], "--alphas: each residual scale once, got 0.5 more than once"),
        (["--epsilons", "0.1,nan"], "--epsilons: relative HR tolerances must be finite"),
        (["--epsilons", ""], "--epsilons: expected one or more relative HR tolerances"),
        (["--alphas", "0,half,1"], "--alphas: expected numbers separated by commas"),
        (["--epsilons", "0.1;0.2"], "--epsilons: expected numbers separated by commas"),
    ],
)
def test_bad_alphas_and_epsilons_are_refused_before_any_work(
    flags: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    argv = ["analyze", "residual", str(tmp_path / "no-run"), "--out", str(out), *flags]
    assert main(argv) == 2
    assert message in one_error_line(capsys.readouterr().err)  # before the missing run is read
    assert not out.exists()


@pytest.mark.parametrize(
    ("movies", "message"),
    [
        ("missing.dat", "does not exist"),
        (".", "is a directory, not a movies.dat file"),
        ("ratings.dat", "is not a MovieLens movies.dat"),
    ],
)
def test_a_bad_movies_file_is_refused_before_any_work(
    movies: str, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "ratings.dat").write_text("1::1193::5::978300760\n1::661::3::978302109\n")
    out = tmp_path / "out"
    path = tmp_path / movies
    argv = ["analyze", "attention", str(tmp_path / "no-run"), "--out", str(out)]
    assert main([*argv, "--movies", str(path)]) == 2
    line = one_error_line(capsys.readouterr().err)  # before the missing run is read
    assert f"--movies {path} {message}" in line
    assert not out.exists()


# The diagnostics are functions of a model and prepared data; loading a run directory is the
# CLI's job (seqrec.analysis.depth, a run-level command, is outside this rule).
DIAGNOSTICS = ["hooks", "decomposition", "residual", "attention", "report", "tables", "figures"]


def test_diagnostics_do_not_import_training_serving_or_cli() -> None:
    from tests.core.test_layering import SRC, imported_modules

    for file in [SRC / "analysis" / f"{name}.py" for name in DIAGNOSTICS]:
        bad = {
            m
            for m in imported_modules(file)
            if m.startswith(("seqrec.training", "seqrec.serving", "seqrec.cli"))
        }
        assert not bad, f"{file.name} imports {sorted(bad)}"


@pytest.mark.parametrize("command", ["residual", "attention", "depth"])
def test_an_analysis_is_not_written_into_a_run_directory(
    command: str, pop_run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = sorted(path.name for path in pop_run.iterdir())
    assert main(["analyze", command, str(pop_run), "--out", str(pop_run)]) == 2
    assert one_error_line(capsys.readouterr().err) == (
        f"error: --out {pop_run} is a run directory; write the analysis to a folder of its "
        f"own, e.g. {pop_run / 'out'}"
    )
    assert sorted(path.name for path in pop_run.iterdir()) == before


def test_alphas_are_reported_as_given(
    trained_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """0.25 and 0.75 were printed as 0.2 and 0.8, and "alpha 1 -> 0" named an end not swept."""
    out = tmp_path / "out"
    argv = ["--alphas", "0.25,0.75,1", "--epsilons", "0", "--shuffle-seeds", "0"]
    assert main(["-q", "analyze", "residual", str(trained_run), "--out", str(out), *argv]) == 0
    printed = capsys.readouterr().out
    assert "alpha sweep: 0.25: HR@10 " in printed
    assert "0.75: HR@10 " in printed
    report = (out / "report.md").read_text()
    assert "- alpha 1 -> 0.25: +LN mixing" in report
    peak = report.split("peaks at alpha = ")[1].split(" ")[0]
    assert peak in ("0.25", "0.75", "1")


@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [
        ("--shuffle-seeds", "0,0", "--shuffle-seeds: each seed once, got '0,0'"),
        (
            "--epsilons",
            "0.1,0.1",
            "--epsilons: each relative HR tolerance once, got 0.1 more than once",
        ),
        ("--k", "0", "--k must be >= 1, got 0"),
        ("--batch-size", "0", "--batch-size must be >= 1, got 0"),
        ("--k", "100000", "--k 100000 is not below the catalogue of"),
    ],
)
def test_repeats_and_bad_counts_are_refused_naming_the_flag(
    trained_run: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    flag: str,
    value: str,
    message: str,
) -> None:
    out = tmp_path / "out"
    assert main(["analyze", "residual", str(trained_run), "--out", str(out), flag, value]) == 2
    assert one_error_line(capsys.readouterr().err).startswith(f"error: {message}")
    assert not out.exists()
