"""The depth curve of a reasoning model: accuracy against the inference depth N.

RecRec learns an improvement operator, so any depth can be used at inference (``model.depth``,
an inference setting). This evaluates a trained run at N = 0..max_depth with the run's own
evaluation protocol (full ranking, filter-seen as configured) and writes

    depth.csv / depth.json   one row per N: NDCG@10, Recall@10, Recall@20 (+ 95% CI
                             half-widths) and, for RecRec, the mean pairwise cosine of the R
                             interests (the quantity the IDR lowers)
    depth.png                the curve (needs matplotlib: ``pip install 'seqrec[plot]'``)
    depth.md                 the table, the best N, the N = 0 -> 1 gain, the N = max drop

    from seqrec.analysis.depth import analyze_depth
    report = analyze_depth("runs/beauty_recrec-stage2", "runs/depth", max_depth=16)
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np
from torch import Tensor

from seqrec.analysis.tables import markdown_table, write_table
from seqrec.config import ConfigError, EvalConfig, SplitChoice
from seqrec.data.sequences import PreparedData
from seqrec.evaluation import EvalShare, describe_protocol, evaluate_model_variants
from seqrec.io import atomic_write, atomic_write_text
from seqrec.models.base import SequentialRecommender, with_inference_settings
from seqrec.models.recrec import RecRec, interest_diversity
from seqrec.training.checkpoint import load_run
from seqrec.training.distributed import data_parallel
from seqrec.training.loop import resolve_device
from seqrec.training.run import data_for_run

logger = logging.getLogger(__name__)

METRICS = ("NDCG@10", "Recall@10", "Recall@20")


@runtime_checkable
class DepthScorer(Protocol):
    """A reasoning model that scores every depth 0..max_depth in one pass."""

    def scores_at_depths(self, input_ids: Tensor, max_depth: int) -> Iterator[Tensor]: ...


# Each depth keeps every user's rank and, per chunk of users, its interests and scores; a
# curve 16 times the paper's 0..16 is far past any collapse and still small in memory.
MAX_DEPTH = 256


def check_depth_model(model: SequentialRecommender, max_depth: int) -> None:
    """Refuse, before any work, a model whose depth cannot be set to 0..max_depth."""
    if not 0 <= max_depth <= MAX_DEPTH:
        raise ConfigError(f"--max-depth must be in 0..{MAX_DEPTH}, got {max_depth}")
    if "depth" not in type(model.config).inference_settings:
        raise ConfigError(
            f"model {model.config.name!r} has no inference depth (model.depth); "
            "the depth curve needs a reasoning model such as recrec (stage 2)"
        )
    if not isinstance(model, DepthScorer):
        raise ConfigError(f"model {model.config.name!r} cannot score its depths in one pass")
    for depth in (0, max_depth):  # the model's own validation (a stage-1 RecRec, ReaRec's K)
        with_inference_settings(model.config, {"depth": depth})


class _DepthSweep:
    """The evaluator's scorer for depths 0..max_depth: one encoder pass and max_depth
    reasoning steps per chunk of users, not one full evaluation per depth. For RecRec it
    also averages the pairwise interest cosine at each depth over the users it scores."""

    def __init__(self, model: SequentialRecommender, max_depth: int) -> None:
        self.model = model
        self.max_depth = max_depth
        self.cosine_sums = [0.0] * (max_depth + 1)
        self.users = 0

    def __call__(self, input_ids: Tensor, users: Tensor) -> Iterator[Tensor]:
        model = self.model
        if isinstance(model, RecRec):
            interests = model.interests_at_depths(input_ids, self.max_depth)
            for depth, m in enumerate(interests):
                self.cosine_sums[depth] += float(interest_diversity(m)) * m.size(0)
            self.users += input_ids.size(0)
            return (model.interest_item_scores(m) for m in interests)
        assert isinstance(model, DepthScorer)  # check_depth_model
        return model.scores_at_depths(input_ids, self.max_depth)

    def mean_cosines(self, share: EvalShare | None = None) -> list[float] | None:
        """None where there is no pair of interests to compare (not RecRec, or R = 1). With
        ``share``, over the users every process scored."""
        if not isinstance(self.model, RecRec) or self.model.config.num_interests < 2:
            return None
        sums = np.array([*self.cosine_sums, self.users], dtype=np.float64)
        if share is not None:
            sums = share.add_up(sums)
        return [float(total / max(sums[-1], 1)) for total in sums[:-1]]


def depth_curve(
    model: SequentialRecommender,
    data: PreparedData,
    eval_config: EvalConfig,
    max_depth: int,
    *,
    split: SplitChoice = "test",
    device: str = "cpu",
    share: EvalShare | None = None,
) -> list[dict[str, Any]]:
    """One row per depth 0..max_depth: NDCG@10, Recall@10/20 with CI half-widths (and, for
    RecRec, the mean pairwise interest cosine), all depths in one pass over the users.
    ``share``: this process scores its share of them, and every process gets every row."""
    check_depth_model(model, max_depth)
    if len(data.eval_set(split)) == 0:
        raise ConfigError(f"the {split} split has no users to evaluate the depth curve on")
    sweep = _DepthSweep(model, max_depth)
    config = dataclasses.replace(eval_config, ks=(10, 20))
    results = evaluate_model_variants(
        model, data, config, sweep, split=split, device=device, share=share
    )
    cosines = sweep.mean_cosines(share)
    rows: list[dict[str, Any]] = []
    for depth, result in enumerate(results):
        row: dict[str, Any] = {"depth": depth}
        row.update({name: result.metrics[name] for name in METRICS})
        row.update({f"{name}_ci95": result.ci95[name] for name in METRICS})
        if cosines is not None:
            row["interest_cosine"] = cosines[depth]
        logger.info("depth %d: NDCG@10 %.4f", depth, row["NDCG@10"])
        rows.append(row)
    return rows


def depth_summary_lines(rows: Sequence[dict[str, Any]]) -> list[str]:
    """What the curve says, in a few lines (for stdout and the Markdown report)."""
    ndcg = [row["NDCG@10"] for row in rows]
    best = int(np.argmax(ndcg))
    lines = [f"best N = {rows[best]['depth']}: NDCG@10 {ndcg[best]:.4f}"]
    if len(rows) > 1:
        gains = np.diff(ndcg)
        step = int(np.argmax(gains))
        largest = (
            f"largest single-step gain: N = {rows[step]['depth']} -> {rows[step + 1]['depth']} "
            f"({gains[step]:+.4f})"
            if gains[step] > 0
            else "no step raises NDCG@10"
        )
        lines.append(
            f"N = 0 -> 1: NDCG@10 {ndcg[0]:.4f} -> {ndcg[1]:.4f} ({gains[0]:+.4f}); {largest}"
        )
        drop = (ndcg[best] - ndcg[-1]) / ndcg[best] if ndcg[best] > 0 else 0.0
        lines.append(f"N = {rows[-1]['depth']}: {100 * drop:.1f}% below the best N")
    if "interest_cosine" in rows[0]:
        at_last = (
            f", {rows[-1]['interest_cosine']:.3f} at N = {rows[-1]['depth']}"
            if len(rows) > 1
            else ""
        )
        lines.append(
            f"mean pairwise interest cosine: {rows[0]['interest_cosine']:.3f} at N = 0{at_last}"
        )
    return lines


def plot_depth_curve(rows: Sequence[dict[str, Any]], path: Path, title: str) -> Path | None:
    """The curve as a PNG; None (and a log line) when matplotlib is not installed."""
    try:
        import matplotlib
    except ImportError:
        logger.warning("matplotlib is not installed (pip install 'seqrec[plot]'): no depth.png")
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    depths = [row["depth"] for row in rows]
    # Left: the metrics with their 95% CIs; right: the change relative to N = 0, where the
    # effect of depth is visible whatever the metrics' scale.
    fig, (ax, rel) = plt.subplots(1, 2, figsize=(10.0, 3.6))
    for name, marker in zip(METRICS, "os^", strict=True):
        values = np.array([row[name] for row in rows])
        ci = np.array([row[f"{name}_ci95"] for row in rows])
        ax.plot(depths, values, marker=marker, markersize=4, label=name)
        ax.fill_between(depths, values - ci, values + ci, alpha=0.15)
        base = values[0] if values[0] > 0 else float("nan")
        rel.plot(depths, 100.0 * (values / base - 1.0), marker=marker, markersize=4, label=name)
    ax.set_ylabel("test metric (full ranking)")
    rel.set_ylabel("change from N = 0 (%)")
    rel.axhline(0.0, color="grey", linewidth=0.8)
    for axis in (ax, rel):
        axis.set_xlabel("inference depth N (reasoning steps)")
        axis.set_xticks(depths)
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    atomic_write(path, lambda tmp: fig.savefig(tmp, dpi=150, format="png"))
    plt.close(fig)
    return path


def analyze_depth(
    run_dir: str | Path,
    out_dir: str | Path,
    max_depth: int = 16,
    data_dir: str | Path | None = None,
    *,
    split: SplitChoice = "test",
    device: str = "auto",
) -> Path | None:
    """The depth curve N = 0..max_depth of a trained run; returns the Markdown report path.

    In processes launched by ``torchrun`` the users are shared among them (each on its own
    GPU when on CUDA) and rank 0 writes the report; the other ranks return None."""
    run = load_run(run_dir)
    check_depth_model(run.model, max_depth)
    with data_parallel(device) as group:
        data = group.local_main_first(lambda: data_for_run(run, data_dir))
        target = str(group.device(resolve_device(device, "device")))
        run.model.to(target)
        rows = depth_curve(
            run.model,
            data,
            run.config.eval,
            max_depth,
            split=split,
            device=target,
            share=group.evaluation_share(),
        )
    if not group.is_main:
        return None
    title = f"{run.model.config.name} on {data.name} ({split}): depth curve"
    protocol = describe_protocol(run.config.eval, data.num_items)
    return write_depth_report(rows, Path(out_dir), title, f"run: `{run_dir}`; {protocol}")


def write_depth_report(
    rows: Sequence[dict[str, Any]], out: Path, title: str, provenance: str
) -> Path:
    """depth.csv/.json, depth.png and depth.md under ``out``; returns the report's path."""
    out.mkdir(parents=True, exist_ok=True)
    files = write_table(rows, out / "depth")
    png = plot_depth_curve(rows, out / "depth.png", title)
    columns = ["depth", *METRICS] + (["interest_cosine"] if "interest_cosine" in rows[0] else [])
    written = [*files, *([png] if png else [])]
    report = out / "depth.md"
    atomic_write_text(
        report,
        "\n\n".join(
            [
                f"# {title}",
                provenance,
                markdown_table(rows, columns),
                "\n".join(f"- {line}" for line in depth_summary_lines(rows)),
                f"![depth curve]({png.name})" if png else "_figure not drawn (no matplotlib)_",
                "files: " + ", ".join(f"[{p.name}]({p.name})" for p in written),
            ]
        )
        + "\n",
    )
    return report
