"""PNG figures in the papers' layouts. matplotlib is optional (``pip install 'seqrec[plot]'``):
without it every figure is skipped with that message and the tables are still written."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from seqrec.io import atomic_write

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

logger = logging.getLogger(__name__)

NO_MATPLOTLIB = "matplotlib is not installed (pip install 'seqrec[plot]'): figures were skipped"

Array = npt.NDArray[np.float64]


def matplotlib_missing() -> str | None:
    """None when figures can be drawn, else the reason they cannot."""
    try:
        import matplotlib
    except ImportError:
        return NO_MATPLOTLIB
    matplotlib.use("Agg")  # files only, never a window
    return None


def _figure(rows: int, cols: int, size: tuple[float, float]) -> tuple[Figure, Any]:
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(rows, cols, figsize=size, squeeze=False)
    return fig, axes


def _save(fig: Figure, path: Path) -> Path:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    atomic_write(path, lambda tmp: fig.savefig(tmp, dpi=150, format="png"))
    plt.close(fig)
    return path


def _recent_labels(k: int) -> list[str]:
    return [f"L-{k - 1 - i}" if i < k - 1 else "L" for i in range(k)]


def _heatmap(ax: Axes, matrix: Array, title: str, *, cmap: str = "viridis") -> None:
    k = matrix.shape[0]
    image = ax.imshow(np.ma.masked_invalid(matrix), cmap=cmap, origin="upper")
    labels = _recent_labels(k)
    ticks = list(range(0, k, max(1, k // 5))) + ([k - 1] if (k - 1) % max(1, k // 5) else [])
    ax.set_xticks(ticks, [labels[t] for t in ticks], fontsize=7)
    ax.set_yticks(ticks, [labels[t] for t in ticks], fontsize=7)
    ax.set_xlabel("source position j")
    ax.set_ylabel("query position i")
    ax.set_title(title, fontsize=9)
    ax.figure.colorbar(image, ax=ax, fraction=0.046, pad=0.04)


def shuffle_bars(rows: Sequence[Mapping[str, Any]], k: int, title: str, path: Path) -> Path:
    """Fig. 1: HR@k and NDCG@k of original, partial-shuffle and full-shuffle inputs."""
    fig, axes = _figure(1, 2, (8, 3.2))
    conditions = ["original", "partial", "full"]
    for ax, metric in zip(axes[0], (f"HR@{k}", f"NDCG@{k}"), strict=True):
        values = [[float(r[metric]) for r in rows if r["condition"] == c] for c in conditions]
        means = [float(np.mean(v)) for v in values]
        spread = [
            [m - min(v) for m, v in zip(means, values, strict=True)],
            [max(v) - m for m, v in zip(means, values, strict=True)],
        ]
        ax.bar(conditions, means, yerr=spread, color=["#4c72b0", "#dd8452", "#c44e52"])
        for x, m in enumerate(means):
            ax.text(x, m, f"{m:.4f}", ha="center", va="bottom", fontsize=8)
        ax.set_ylabel(metric)
    fig.suptitle(title, fontsize=10)
    return _save(fig, path)


def mixing_heatmaps(
    heatmaps: Mapping[tuple[int, Any], Array], num_layers: int, title: str, path: Path
) -> Path:
    """Fig. 3: per layer, the Attn-stage and +Res+LN-stage contribution maps (row shares)."""
    fig, axes = _figure(num_layers, 2, (8, 3.6 * num_layers))
    for layer in range(num_layers):
        _heatmap(axes[layer][0], heatmaps[(layer, "attn")], f"layer {layer + 1}: Attn")
        _heatmap(axes[layer][1], heatmaps[(layer, "ln")], f"layer {layer + 1}: +Res+LN")
    fig.suptitle(title, fontsize=10)
    return _save(fig, path)


def alpha_curves(rows: Sequence[Mapping[str, Any]], k: int, title: str, path: Path) -> Path:
    """Fig. 4: mixing ratio, HRLI@1, HR@k and NDCG@k against alpha."""
    alphas = [float(r["alpha"]) for r in rows]
    fig, axes = _figure(1, 4, (14, 3.2))
    panels: list[tuple[str, list[tuple[str, str]]]] = [
        ("mixing ratio (+LN)", [("mixing_ln_agg", "r_agg"), ("mixing_ln_sum", "r_sum")]),
        ("last-item hits", [("HRLI@1", "HRLI@1"), ("HRL2I@1", "HRL2I@1")]),
        (f"HR@{k}", [(f"HR@{k}", f"HR@{k}")]),
        (f"NDCG@{k}", [(f"NDCG@{k}", f"NDCG@{k}")]),
    ]
    for ax, (label, series) in zip(axes[0], panels, strict=True):
        for key, name in series:
            ax.plot(alphas, [float(r[key]) for r in rows], marker="o", markersize=3, label=name)
        ax.set_xlabel("alpha")
        ax.set_ylabel(label)
        if len(series) > 1:
            ax.legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    return _save(fig, path)


def recovery_curve(rows: Sequence[Mapping[str, Any]], k: int, title: str, path: Path) -> Path:
    """Fig. 5: q(alpha) on S (test and validation) with HR@k relative to alpha = 1."""
    alphas = [float(r["alpha"]) for r in rows]
    fig, axes = _figure(1, 1, (5.5, 3.4))
    ax = axes[0][0]
    ax.plot(alphas, [_num(r["q_test"]) for r in rows], marker="o", label="q(alpha), test S")
    ax.plot(alphas, [_num(r["q_valid"]) for r in rows], marker="s", label="q(alpha), valid S")
    ax.set_xlabel("alpha")
    ax.set_ylabel("q(alpha) = P(L hits | S)")
    twin = ax.twinx()
    twin.plot(alphas, [_num(r[f"HR@{k} rel"]) for r in rows], "k--", label=f"HR@{k} / HR@{k}(1)")
    twin.set_ylabel(f"test HR@{k} relative to alpha = 1")
    lines = ax.get_legend_handles_labels()
    more = twin.get_legend_handles_labels()
    ax.legend(lines[0] + more[0], lines[1] + more[1], fontsize=7, loc="best")
    ax.set_title(title, fontsize=10)
    return _save(fig, path)


def selection_curve(rows: Sequence[Mapping[str, Any]], k: int, title: str, path: Path) -> Path:
    """Fig. 6: validation-selected and oracle alpha over epsilon; test HR change, recovery."""
    eps = [float(r["epsilon"]) for r in rows]
    fig, axes = _figure(1, 2, (10, 3.4))
    ax = axes[0][0]
    ax.plot(eps, [float(r["alpha_selected"]) for r in rows], marker="o", label="selected (valid)")
    ax.plot(
        eps, [float(r["alpha_oracle"]) for r in rows], marker="x", ls="--", label="oracle (test)"
    )
    ax.set_xlabel("epsilon (relative HR tolerance)")
    ax.set_ylabel("alpha")
    ax.set_ylim(-0.05, 1.05)
    ax.legend(fontsize=7)
    ax = axes[0][1]
    ax.plot(
        eps, [_num(r[f"test HR@{k} change"]) for r in rows], marker="o", label=f"test HR@{k} change"
    )
    ax.plot(eps, [_num(r["test recovery"]) for r in rows], marker="s", label="test recovery q")
    ax.axhline(0.0, color="grey", lw=0.5)
    ax.set_xlabel("epsilon")
    ax.legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    return _save(fig, path)


def attention_heatmaps(maps: Sequence[tuple[str, Sequence[Array]]], title: str, path: Path) -> Path:
    """SASRec Fig. 4: average attention weights over the last positions, runs x layers."""
    cols = max(len(layers) for _, layers in maps)
    fig, axes = _figure(len(maps), cols, (4.2 * cols, 3.8 * len(maps)))
    for r, (label, layers) in enumerate(maps):
        for c in range(cols):
            ax = axes[r][c]
            if c < len(layers):
                _heatmap(ax, layers[c], f"{label}: layer {c + 1}", cmap="magma")
            else:
                ax.axis("off")
    fig.suptitle(title, fontsize=10)
    return _save(fig, path)


def genre_heatmaps(
    maps: Sequence[tuple[str, Array]], genres: Sequence[str], title: str, path: Path
) -> Path:
    """SASRec Fig. 5: genre x genre average attention (rows: query genre, columns: key)."""
    fig, axes = _figure(1, len(maps), (4.2 * len(maps), 3.8))
    for ax, (label, matrix) in zip(axes[0], maps, strict=True):
        image = ax.imshow(matrix, cmap="magma")
        low, high = np.nanmin(matrix), np.nanmax(matrix)
        dark = (matrix - low) < 0.6 * (high - low)  # magma is dark at the low end
        ax.set_xticks(range(len(genres)), genres, rotation=45, fontsize=8)
        ax.set_yticks(range(len(genres)), genres, fontsize=8)
        for i in range(len(genres)):
            for j in range(len(genres)):
                ax.text(
                    j,
                    i,
                    f"{matrix[i, j]:.3g}",
                    ha="center",
                    va="center",
                    fontsize=6,
                    color="white" if dark[i, j] else "black",
                )
        ax.set_title(label, fontsize=9)
        fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04)
    fig.suptitle(title, fontsize=10)
    return _save(fig, path)


def sweep_lines(
    series: Mapping[str, tuple[Sequence[float], Sequence[float]]],
    xlabel: str,
    ylabel: str,
    title: str,
    path: Path,
) -> Path:
    """A few named (x, y) lines on one axis (the benchmark sweeps)."""
    fig, axes = _figure(1, 1, (5, 3.4))
    ax = axes[0][0]
    for name, (x, y) in series.items():
        ax.plot(x, y, marker="o", label=name)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    if len(series) > 1:
        ax.legend(fontsize=7)
    return _save(fig, path)


def _num(value: Any) -> float:
    return float("nan") if value is None else float(value)
