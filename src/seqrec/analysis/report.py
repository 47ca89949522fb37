"""``seqrec analyze residual``: every residual-dominance diagnostic on one trained model,
written as CSV + JSON tables, PNG figures in the paper's layouts and a Markdown report with
the paper's Table 2/3/4 numbers beside ours.

The protocol is the paper's: full-catalogue ranking, seen items filtered except on the
paper's repeat-consumption datasets. Given the run's own ``eval.filter_seen`` (the CLI gives
it), other datasets follow it instead, so that alpha = 1 ranks as ``seqrec evaluate``
(``filter_seen_policy``). It runs on whatever split the run was trained with. The paper uses the
global temporal split with GTS-Last targets; on data without timestamps the report says
that leave-one-out was used instead.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from seqrec.analysis import figures
from seqrec.analysis.decomposition import STAGE_LABELS, STAGES
from seqrec.analysis.hooks import ResidualAnalyzable, analyzable, residual_scale
from seqrec.analysis.residual import (
    KINDS,
    LastItemHits,
    MixingSummary,
    filter_seen_policy,
    last_item_hits,
    mixing_summary,
    position_ranks,
    position_table,
    recoverable,
    recovery,
    select_alpha,
    shuffle_evaluation,
)
from seqrec.analysis.tables import markdown_table, write_json, write_table
from seqrec.config import EvalConfig
from seqrec.data.sequences import PreparedData
from seqrec.evaluation import evaluate_model
from seqrec.io import atomic_write_text
from seqrec.models.base import SequentialRecommender

logger = logging.getLogger(__name__)

ALPHAS = tuple(round(0.1 * i, 1) for i in range(11))
EPSILONS = (0.0, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.3)

# How the analysed block adds the attention residual (SASRecConfig.layout).
LAYOUT_TEXT = {
    "pre_ln": "The model's blocks are pre-LN: the residual sum is y = alpha x + Attn(LN(x)) "
    "and the LayerNorm after it is the FFN's input norm.",
    "reference": "The model's blocks have the SASRec reference layout: queries LN(x), keys and "
    "values x, the residual sum y = alpha LN(x) + Attn(LN(x), x), so the residual branch is "
    "the normalised query, and the LayerNorm after it is the FFN's input norm.",
    "post_ln": "The model's blocks are post-LN (BERT, RecBole): the residual sum is "
    "y = alpha x + Attn(x) and the LayerNorm after it is the attention sublayer's own, "
    "whose output the FFN reads.",
}

# Our registry names -> the paper's dataset names.
PAPER_NAMES = {
    "amazon-beauty": "Beauty",
    "amazon-sports": "Sports",
    "amazon-toys": "Toys",
    "amazon-video-games": "Video",
    "diginetica": "Diginetica",
    "ml-1m": "ML-1M",
    "steam": "Steam",
    "beeradvocate": "BeerAdvocate",
    "zvuk": "Zvuk",
}

# Table 2: mean mixing ratio (Attn, +Res, +LN) per model.
PAPER_TABLE2: dict[str, dict[str, tuple[float, float, float]]] = {
    "sasrec": {
        "Beauty": (0.776, 0.119, 0.119),
        "Sports": (0.775, 0.126, 0.122),
        "Toys": (0.772, 0.123, 0.123),
        "Video": (0.798, 0.169, 0.169),
        "Diginetica": (0.721, 0.150, 0.149),
        "ML-1M": (0.856, 0.395, 0.386),
        "Steam": (0.794, 0.317, 0.276),
        "BeerAdvocate": (0.959, 0.301, 0.287),
        "Zvuk": (0.941, 0.267, 0.265),
    },
    "duorec": {
        "Beauty": (0.776, 0.116, 0.115),
        "Sports": (0.790, 0.119, 0.119),
        "Toys": (0.780, 0.121, 0.121),
        "Video": (0.773, 0.170, 0.170),
        "Diginetica": (0.724, 0.152, 0.151),
        "ML-1M": (0.862, 0.367, 0.359),
        "Steam": (0.767, 0.299, 0.277),
        "BeerAdvocate": (0.949, 0.311, 0.307),
        "Zvuk": (0.926, 0.274, 0.271),
    },
}
# Table 3 (SASRec): mixing ratio by layer at positions L, L-1, L-2.
PAPER_TABLE3: dict[str, dict[int, tuple[float, float, float]]] = {
    "Toys": {1: (0.1278, 0.1283, 0.1251), 2: (0.1182, 0.1178, 0.1135)},
    "ML-1M": {1: (0.3984, 0.3819, 0.3798), 2: (0.3660, 0.3617, 0.3606)},
}
# Table 4 (SASRec): HR@10 at L and "L-j hit & L miss" for j = 1, 2, 3 (all test sequences).
PAPER_TABLE4: dict[str, tuple[float, float, float, float]] = {
    "Beauty": (0.0381, 0.0116, 0.0124, 0.0112),
    "Sports": (0.0342, 0.0157, 0.0125, 0.0115),
    "Toys": (0.0574, 0.0185, 0.0134, 0.0150),
    "Video": (0.0403, 0.0171, 0.0145, 0.0124),
    "Diginetica": (0.2900, 0.1153, 0.0782, 0.0914),
    "ML-1M": (0.1588, 0.0347, 0.0422, 0.0298),
    "Steam": (0.0639, 0.0235, 0.0241, 0.0236),
    "BeerAdvocate": (0.0389, 0.0150, 0.0141, 0.0139),
    "Zvuk": (0.2416, 0.0583, 0.0415, 0.0431),
}


def check_alphas(alphas: Sequence[float], name: str = "alphas") -> tuple[float, ...]:
    """The residual scales of a sweep, or a ValueError naming ``name`` and the bad values.

    The spec sweeps alpha over [0, 1]; the report's "alpha 1 -> smallest" lines, q(alpha) and the
    validation-selected alpha assume it. 1.0, the trained model, is the reference. A repeat
    would be evaluated twice and reported once.
    """
    outside = [a for a in alphas if not 0.0 <= a <= 1.0]  # NaN fails every comparison
    if outside:
        shown = ", ".join(str(a) for a in outside)
        raise ValueError(f"{name}: residual scales must be numbers in [0, 1], got {shown}")
    if 1.0 not in alphas:
        raise ValueError(f"{name} must include 1.0 (the trained model), got {tuple(alphas)}")
    check_once_each(alphas, name, "residual scale")
    return tuple(alphas)


def check_epsilons(epsilons: Sequence[float], name: str = "epsilons") -> tuple[float, ...]:
    """Relative HR tolerances for alpha selection: one or more, each finite and >= 0."""
    if not epsilons:
        raise ValueError(f"{name}: expected one or more relative HR tolerances")
    bad = [e for e in epsilons if not (math.isfinite(e) and e >= 0)]
    if bad:
        shown = ", ".join(str(e) for e in bad)
        raise ValueError(f"{name}: relative HR tolerances must be finite numbers >= 0, got {shown}")
    check_once_each(epsilons, name, "relative HR tolerance")
    return tuple(epsilons)


def check_once_each(values: Sequence[float], name: str, what: str) -> None:
    """A ValueError naming ``name`` for a value given more than once: it would be evaluated,
    and reported, twice."""
    repeated = sorted({v for v in values if list(values).count(v) > 1})
    if repeated:
        shown = ", ".join(f"{v:g}" for v in repeated)
        raise ValueError(f"{name}: each {what} once, got {shown} more than once")


@dataclass(frozen=True, kw_only=True)
class ResidualOptions:
    alphas: tuple[float, ...] = ALPHAS  # in [0, 1], must include 1.0 (the trained model)
    epsilons: tuple[float, ...] = EPSILONS  # relative HR tolerances for alpha selection
    shuffle_seeds: tuple[int, ...] = (0,)
    hit_ks: tuple[int, ...] = (1, 10)  # K of HRLI@K / HRL2I@K
    k: int = 10  # HR@k / NDCG@k of the sweep, Table 4, q(alpha) and alpha selection
    filter_seen: bool | None = None  # None: filter_seen_policy (with run_filter_seen)
    run_filter_seen: bool | None = None  # the run's eval.filter_seen (None: not known)
    batch_size: int = 256  # users per chunk; the mixing pass uses a quarter of it
    recent: int = 15  # heatmaps over the last `recent` positions (authors' RECENT_K)
    device: str = "cpu"

    def __post_init__(self) -> None:
        check_alphas(self.alphas)
        check_epsilons(self.epsilons)
        for name in ("k", "batch_size", "recent"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")


@dataclass
class ResidualResults:
    """Everything ``run_residual`` measured; ``tables`` are the rows written to files."""

    setting: dict[str, Any]
    last_items: LastItemHits
    mixing: MixingSummary
    tables: dict[str, list[dict[str, Any]]] = field(default_factory=dict)


def split_note(data: PreparedData) -> str:
    """How the diagnostics' split relates to the paper's (GTS with GTS-Last targets)."""
    if data.split.protocol == "global_temporal":
        return "global temporal split with GTS-Last targets (the paper's setting)"
    if data.timestamps is None:
        return (
            f"leave-one-out: {data.name} has no timestamps (order only), so the paper's global "
            "temporal split (GTS-Last) cannot be built; the run's leave-one-out split was used"
        )
    return (
        "leave-one-out, as the run was trained; the paper uses the global temporal split "
        "(retrain with data.split: global_temporal to match it)"
    )


Progress = Callable[[str], None]


def run_residual(
    model: SequentialRecommender,
    data: PreparedData,
    options: ResidualOptions | None = None,
    progress: Progress = logger.info,
) -> ResidualResults:
    """Diagnostics 1-7 of the spec on ``data``'s test split (validation for alpha*)."""
    options = options or ResidualOptions()
    analyzed: ResidualAnalyzable = analyzable(model)
    model.eval()
    k, device, bs = options.k, options.device, options.batch_size
    max_len = model.config.max_seq_len
    if options.filter_seen is None:
        filter_seen, filter_seen_reason = filter_seen_policy(data.name, options.run_filter_seen)
    else:
        filter_seen, filter_seen_reason = options.filter_seen, "as asked"
    config = EvalConfig(protocol="full", filter_seen=filter_seen, ks=(k,), batch_size=bs)
    test, valid = data.split.test, data.split.valid
    setting = {
        "dataset": data.name,
        "paper_dataset": PAPER_NAMES.get(data.name),
        "model": model.config.name,
        "split": data.split.protocol,
        "split_note": split_note(data),
        "timestamps": data.timestamps is not None,
        "filter_seen": filter_seen,
        "filter_seen_reason": filter_seen_reason,
        "protocol": "full ranking over all items, ties count against the model",
        "test_users": len(test),
        "valid_users": len(valid),
        "num_items": data.num_items,
        "max_seq_len": max_len,
        "num_layers": getattr(model.config, "num_layers", None),
        "num_heads": getattr(model.config, "num_heads", None),
        "layout": getattr(model.config, "layout", "pre_ln"),
        "alphas": list(options.alphas),
        "epsilons": list(options.epsilons),
        "k": k,
    }

    progress("1/6 last-item hits (HRLI/HRL2I, no filter-seen)")
    hits = last_item_hits(
        analyzed, test, options.hit_ks, max_len=max_len, batch_size=bs, device=device
    )

    progress("2/6 partial and full shuffles")
    shuffle_rows = shuffle_evaluation(
        model,
        test,
        config,
        all_sequences=data.sequences,
        num_items=data.num_items,
        seeds=options.shuffle_seeds,
        device=device,
    )

    progress("3/6 norm decomposition (mixing ratios) at alpha = 1")
    mix = mixing_summary(
        analyzed,
        test,
        max_len=max_len,
        batch_size=max(1, bs // 4),
        recent=options.recent,
        device=device,
    )

    progress("4/6 non-final positions L-1..L-3 at alpha = 1 (test and validation)")
    earlier = {
        name: position_ranks(
            analyzed,
            eval_set,
            (1, 2, 3),
            max_len=max_len,
            filter_seen=filter_seen,
            batch_size=bs,
            device=device,
        )
        for name, eval_set in (("test", test), ("valid", valid))
    }

    progress(f"5/6 residual scaling sweep over {len(options.alphas)} alphas")
    sweep: dict[float, dict[str, Any]] = {}
    for alpha in sorted(options.alphas, reverse=True):
        with residual_scale(analyzed, alpha):
            t = evaluate_model(model, data, config, split="test", device=device)
            v = evaluate_model(model, data, config, split="valid", device=device)
            h = last_item_hits(analyzed, test, (1,), max_len=max_len, batch_size=bs, device=device)
            m = (
                mix
                if alpha == 1.0
                else mixing_summary(
                    analyzed,
                    test,
                    max_len=max_len,
                    batch_size=max(1, bs // 4),
                    recent=options.recent,
                    device=device,
                )
            )
        sweep[alpha] = {"test": t, "valid": v, "hits": h, "mixing": m}
        progress(f"   alpha={alpha:.2f}: HR@{k}={t.metrics[f'HR@{k}']:.4f} HRLI@1={h.hrli[1]:.4f}")

    progress("6/6 recovery q(alpha) and validation-selected alpha")
    final = {name: {a: s[name].ranks - 1 for a, s in sweep.items()} for name in ("test", "valid")}
    subset = {name: recoverable(final[name][1.0], earlier[name], k) for name in ("test", "valid")}

    tables = _tables(options, hits, shuffle_rows, mix, sweep, final, earlier, subset, k)
    return ResidualResults(setting=setting, last_items=hits, mixing=mix, tables=tables)


def _tables(
    options: ResidualOptions,
    hits: LastItemHits,
    shuffle_rows: list[dict[str, Any]],
    mix: MixingSummary,
    sweep: dict[float, dict[str, Any]],
    final: dict[str, dict[float, npt.NDArray[np.int64]]],
    earlier: dict[str, npt.NDArray[np.int64]],
    subset: dict[str, npt.NDArray[np.bool_]],
    k: int,
) -> dict[str, list[dict[str, Any]]]:
    last_rows = [
        {"K": kk, "HRLI": hits.hrli[kk], "HRL2I": hits.hrl2i[kk], "sequences": hits.num_sequences}
        for kk in options.hit_ks
    ]
    shuffle = [
        {kk: v for kk, v in r.items() if kk in ("condition", "seed", f"HR@{k}", f"NDCG@{k}")}
        for r in shuffle_rows
    ]
    mixing = [
        {
            "stage": STAGE_LABELS[s],
            "kind": f"r_{kind}",
            "mean": mix.mean[(s, kind)],
            **{
                f"layer {layer + 1}": mix.by_layer[(layer, s, kind)]
                for layer in range(mix.num_layers)
            },
        }
        for kind in KINDS
        for s in STAGES
    ]
    by_position = [
        {
            "layer": layer + 1,
            "stage": STAGE_LABELS[s],
            "kind": f"r_{kind}",
            "L": mix.at_position[(layer, 0, s, kind)],
            "L-1": mix.at_position[(layer, 1, s, kind)],
            "L-2": mix.at_position[(layer, 2, s, kind)],
        }
        for kind in KINDS
        for s in STAGES
        for layer in range(mix.num_layers)
    ]
    positions = [position_table(final["test"][1.0], earlier["test"], k)]
    positions[0]["S size"] = int(subset["test"].sum())
    reference = sweep[1.0]["test"].metrics[f"HR@{k}"]
    alpha_rows = []
    for alpha in sorted(sweep):
        s = sweep[alpha]
        t = s["test"].metrics
        m: MixingSummary = s["mixing"]
        alpha_rows.append(
            {
                "alpha": alpha,
                **{f"mixing_{st}_{kind}": m.mean[(st, kind)] for st in STAGES for kind in KINDS},
                "HRLI@1": s["hits"].hrli[1],
                "HRL2I@1": s["hits"].hrl2i[1],
                f"HR@{k}": t[f"HR@{k}"],
                f"NDCG@{k}": t[f"NDCG@{k}"],
                f"HR@{k} rel": t[f"HR@{k}"] / reference if reference > 0 else float("nan"),
                f"valid HR@{k}": s["valid"].metrics[f"HR@{k}"],
                "q_test": recovery(final["test"][alpha], subset["test"], k),
                "q_valid": recovery(final["valid"][alpha], subset["valid"], k),
            }
        )
    alphas = [r["alpha"] for r in alpha_rows]
    selection = []
    for eps in options.epsilons:
        chosen = select_alpha(
            alphas,
            [r[f"valid HR@{k}"] for r in alpha_rows],
            [r["q_valid"] for r in alpha_rows],
            eps,
        )
        oracle = select_alpha(
            alphas, [r[f"HR@{k}"] for r in alpha_rows], [r["q_test"] for r in alpha_rows], eps
        )
        row = alpha_rows[alphas.index(chosen)]
        selection.append(
            {
                "epsilon": eps,
                "alpha_selected": chosen,
                "alpha_oracle": oracle,
                f"test HR@{k}": row[f"HR@{k}"],
                f"test HR@{k} change": row[f"HR@{k} rel"] - 1.0,
                "test recovery": row["q_test"],
                "valid recovery": row["q_valid"],
            }
        )
    return {
        "last_item_hits": last_rows,
        "shuffle": shuffle,
        "mixing": mixing,
        "mixing_by_position": by_position,
        "positions": positions,
        "alpha_sweep": alpha_rows,
        "alpha_selection": selection,
    }


# ----------------------------------------------------------------- writing
def _paper_rows(results: ResidualResults) -> dict[str, list[dict[str, Any]]]:
    """Our headline numbers beside the paper's Tables 2, 3 and 4 (where it has the dataset)."""
    name = results.setting["paper_dataset"]
    model = "duorec" if results.setting["model"] == "duorec" else "sasrec"
    mix = results.mixing
    ours2 = {kind: tuple(mix.mean[(s, kind)] for s in STAGES) for kind in KINDS}
    table2 = [
        {"source": f"ours r_{kind}", "Attn": v[0], "+Res": v[1], "+LN": v[2]}
        for kind, v in ours2.items()
    ]
    paper2 = PAPER_TABLE2[model].get(name or "")
    if paper2:
        table2.append(
            {
                "source": f"paper ({model}, {name})",
                "Attn": paper2[0],
                "+Res": paper2[1],
                "+LN": paper2[2],
            }
        )
    table3 = [
        {
            "source": "ours (+LN, r_agg)",
            "layer": layer + 1,
            **{
                c: mix.at_position[(layer, j, "ln", "agg")]
                for j, c in enumerate(("L", "L-1", "L-2"))
            },
        }
        for layer in range(mix.num_layers)
    ]
    for layer, values in PAPER_TABLE3.get(name or "", {}).items():
        table3.append(
            {
                "source": f"paper ({name})",
                "layer": layer,
                **dict(zip(("L", "L-1", "L-2"), values, strict=True)),
            }
        )
    k = results.setting["k"]
    ours4 = results.tables["positions"][0]
    cols4 = [f"HR@{k} at L", "L-1 hit & L miss", "L-2 hit & L miss", "L-3 hit & L miss"]
    table4 = [{"source": "ours", **{c: ours4[c] for c in cols4}}]
    if name in PAPER_TABLE4 and k == 10:
        table4.append(
            {"source": f"paper ({name})", **dict(zip(cols4, PAPER_TABLE4[name], strict=True))}
        )
    return {"table2": table2, "table3": table3, "table4": table4}


def write_residual_report(results: ResidualResults, out: Path) -> tuple[Path, list[str]]:
    """Write tables, figures and ``report.md`` into ``out``; returns the report path and
    notes for the user (skipped figures)."""
    out.mkdir(parents=True, exist_ok=True)
    for name, rows in results.tables.items():
        write_table(rows, out / name)
    paper = _paper_rows(results)
    for name, rows in paper.items():
        write_table(rows, out / f"paper_{name}")
    heat = [
        {"layer": layer + 1, "stage": STAGE_LABELS[stage], "i": i, "j": j, "share": float(v)}
        for (layer, stage), m in sorted(results.mixing.heatmaps.items())
        for i, row in enumerate(m)
        for j, v in enumerate(row)
    ]
    write_table(heat, out / "mixing_heatmaps")
    summary = {"setting": results.setting, **results.tables, "paper": paper}
    write_json(summary, out / "summary.json")

    notes: list[str] = []
    figs = _residual_figures(results, out, notes)
    report = out / "report.md"
    atomic_write_text(report, _residual_markdown(results, paper, figs, notes))
    return report, notes


def _residual_figures(results: ResidualResults, out: Path, notes: list[str]) -> dict[str, str]:
    missing = figures.matplotlib_missing()
    if missing:
        notes.append(missing)
        return {}
    s, k = results.setting, results.setting["k"]
    title = f"{s['model']} on {s['dataset']} ({s['split']})"
    t = results.tables
    made = {
        "fig1": figures.shuffle_bars(
            t["shuffle"], k, f"Fig. 1 analogue: {title}", out / "fig1_shuffle.png"
        ),
        "fig3": figures.mixing_heatmaps(
            results.mixing.heatmaps,
            results.mixing.num_layers,
            f"Fig. 3 analogue: {title}",
            out / "fig3_mixing_heatmaps.png",
        ),
        "fig4": figures.alpha_curves(
            t["alpha_sweep"], k, f"Fig. 4 analogue: {title}", out / "fig4_alpha.png"
        ),
        "fig5": figures.recovery_curve(
            t["alpha_sweep"], k, f"Fig. 5 analogue: {title}", out / "fig5_recovery.png"
        ),
        "fig6": figures.selection_curve(
            t["alpha_selection"], k, f"Fig. 6 analogue: {title}", out / "fig6_alpha_selection.png"
        ),
    }
    return {key: path.name for key, path in made.items()}


def _figure_line(figs: dict[str, str], key: str, caption: str) -> str:
    return f"![{caption}]({figs[key]})" if key in figs else f"_{caption}: figure not drawn._"


def _residual_markdown(
    results: ResidualResults,
    paper: dict[str, list[dict[str, Any]]],
    figs: dict[str, str],
    notes: list[str],
) -> str:
    s, t, k = results.setting, results.tables, results.setting["k"]
    hits = results.last_items
    sweep = t["alpha_sweep"]
    first, last = sweep[0], sweep[-1]
    q = [r["q_test"] for r in sweep]
    q_best = max(range(len(q)), key=lambda i: q[i] if q[i] == q[i] else -1.0)
    verdict = (
        "HRLI@1 > HRL2I@1, as the paper finds"
        if hits.hrli[1] > hits.hrl2i[1]
        else "HRLI@1 <= HRL2I@1, unlike the paper"
    )
    lines = [
        f"# Residual-dominance diagnostics: {s['model']} on {s['dataset']}",
        "",
        "Kozaki et al., *Residual Dominance Drives Last-Item Reliance in Causal "
        "Self-Attention for Sequential Recommendation* (RecSys 2026). Definitions: "
        "`shared/specs/residual_dominance.md`; code: `seqrec.analysis`.",
        "",
        f"- split: {s['split_note']}",
        f"- ranking: {s['protocol']}; filter-seen: {'on' if s['filter_seen'] else 'off'} "
        f"({s['filter_seen_reason']}; HRLI/HRL2I never filter)",
        f"- test users: {s['test_users']:,}; validation users: {s['valid_users']:,}; "
        f"items: {s['num_items']:,}; max_seq_len {s['max_seq_len']}, "
        f"layers {s['num_layers']}, heads {s['num_heads']}",
        *[f"- **note**: {n}" for n in notes],
        "",
        "## Headline",
        "",
        f"- HRLI@1 = {hits.hrli[1]:.4f} vs HRL2I@1 = {hits.hrl2i[1]:.4f} ({verdict})",
        "- mean mixing ratio Attn / +Res / +LN: "
        + "; ".join(
            f"r_{kind} {r['Attn']:.3f} / {r['+Res']:.3f} / {r['+LN']:.3f}"
            for kind, r in zip(KINDS, paper["table2"], strict=False)
        )
        + (
            f"; paper {paper['table2'][-1]['Attn']:.3f} / {paper['table2'][-1]['+Res']:.3f} / "
            f"{paper['table2'][-1]['+LN']:.3f}"
            if len(paper["table2"]) > 2
            else ""
        ),
        f"- alpha 1 -> {first['alpha']:g}: +LN mixing (r_agg) {last['mixing_ln_agg']:.3f} -> "
        f"{first['mixing_ln_agg']:.3f}, "
        f"HRLI@1 {last['HRLI@1']:.4f} -> {first['HRLI@1']:.4f}, HR@{k} {last[f'HR@{k}']:.4f} -> "
        f"{first[f'HR@{k}']:.4f}, NDCG@{k} {last[f'NDCG@{k}']:.4f} -> {first[f'NDCG@{k}']:.4f}",
        f"- q(alpha) on S ({t['positions'][0]['S size']:,} test sequences) peaks at alpha = "
        f"{sweep[q_best]['alpha']:g} (q = {q[q_best]:.4f}); q(1) = {last['q_test']:.4f}",
        "",
        "## 1. Last-item hits (HRLI@K, HRL2I@K; no filter-seen)",
        "",
        markdown_table(t["last_item_hits"]),
        "",
        "## 2. Order perturbations (Fig. 1)",
        "",
        "Partial: the last item stays, the items before it are shuffled; full: the whole "
        "input window is shuffled. The item multiset is unchanged.",
        "",
        markdown_table(t["shuffle"]),
        "",
        _figure_line(figs, "fig1", "Fig. 1 analogue: shuffles"),
        "",
        "## 3. Norm decomposition: mixing ratios (Table 2, Table 3, Fig. 3)",
        "",
        LAYOUT_TEXT[s["layout"]] + " r_sum = sum_{j!=i} ||F_i(x_j)|| / "
        "sum_j ||F_i(x_j)|| (paper p. 5); r_agg = ||sum_{j!=i} F_i(x_j)|| / "
        "(||sum_{j!=i} F_i(x_j)|| + ||F_i(x_i)||) (supplement Eq. 22, what the authors' code "
        "computes). Means pool every real position of every layer and test sequence.",
        "",
        "Table 2 analogue (ours beside the paper's):"
        if len(paper["table2"]) > len(KINDS)
        else "Table 2 analogue (ours; the paper has no row for this model and dataset):",
        "",
        markdown_table(paper["table2"]),
        "",
        "Per layer:",
        "",
        markdown_table(t["mixing"]),
        "",
        "Table 3 analogue (+LN, r_agg, positions L, L-1, L-2):",
        "",
        markdown_table(paper["table3"]),
        "",
        "All stages and kinds by position: `mixing_by_position.csv`.",
        "",
        _figure_line(figs, "fig3", "Fig. 3 analogue: contribution maps, Attn vs +Res+LN"),
        "",
        f"Maps: the last {results.mixing.recent} positions; cell (i, j) is the mean over test "
        "histories of source j's share of position i's total contribution norm (rows: the "
        "position being built, columns: the source; a row sums to 1 only when the history "
        "starts inside the window).",
        "",
        "## 4. Residual scaling sweep (Fig. 4)",
        "",
        "h = alpha x + Attn(x) in every attention block, FFN residual untouched, weights frozen. "
        f"HR@{k}/NDCG@{k} are the evaluator's (alpha = 1 gives exactly `seqrec evaluate`'s "
        "ranks under this protocol).",
        "",
        markdown_table(
            sweep,
            [
                "alpha",
                "mixing_attn_agg",
                "mixing_res_agg",
                "mixing_ln_agg",
                "mixing_ln_sum",
                "HRLI@1",
                "HRL2I@1",
                f"HR@{k}",
                f"NDCG@{k}",
            ],
        ),
        "",
        _figure_line(figs, "fig4", "Fig. 4 analogue: alpha curves"),
        "",
        "## 5. Non-final positions (Table 4)",
        "",
        "The final target scored from positions L-1, L-2, L-3 (same filter-seen); shares are of "
        "ALL test sequences.",
        "",
        markdown_table(paper["table4"]),
        "",
        "## 6. Conditional recovery q(alpha) (Fig. 5)",
        "",
        "S = sequences where L misses at alpha = 1 but one of L-1..L-3 hits (fixed at alpha = 1); "
        "q(alpha) = P(L hits at alpha | S).",
        "",
        markdown_table(
            sweep, ["alpha", "q_test", "q_valid", f"HR@{k}", f"HR@{k} rel", f"valid HR@{k}"]
        ),
        "",
        _figure_line(figs, "fig5", "Fig. 5 analogue: recovery"),
        "",
        "## 7. Validation-selected alpha (Fig. 6)",
        "",
        f"alpha* = argmax q_valid(alpha) s.t. valid HR@{k}(alpha) >= (1 - epsilon) valid "
        f"HR@{k}(1); the oracle applies the same rule to test. Ties go to the larger alpha.",
        "",
        markdown_table(t["alpha_selection"]),
        "",
        _figure_line(figs, "fig6", "Fig. 6 analogue: selected vs oracle alpha"),
        "",
        "Files: every table as `.csv` and `.json`; `summary.json` holds them all with the setting.",
        "",
    ]
    return "\n".join(lines)


def residual_summary_lines(results: ResidualResults) -> list[str]:
    """A few lines for the terminal."""
    s, t, k = results.setting, results.tables, results.setting["k"]
    hits = results.last_items
    mix = results.mixing.mean
    rows = t["alpha_sweep"]
    return [
        f"{s['model']} on {s['dataset']}: {s['split_note']}",
        f"filter-seen: {'on' if s['filter_seen'] else 'off'}; test users {s['test_users']:,}",
        f"HRLI@1 {hits.hrli[1]:.4f}  HRL2I@1 {hits.hrl2i[1]:.4f}",
        "mixing Attn/+Res/+LN: r_agg "
        + " / ".join(f"{mix[(st, 'agg')]:.3f}" for st in STAGES)
        + "; r_sum "
        + " / ".join(f"{mix[(st, 'sum')]:.3f}" for st in STAGES),
        "alpha sweep: "
        + ", ".join(
            f"{r['alpha']:g}: HR@{k} {r[f'HR@{k}']:.4f}" for r in rows[:: max(1, len(rows) // 5)]
        ),
    ]
