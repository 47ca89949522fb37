"""Summaries for ``seqrec data info NAME`` and ``seqrec data list``: plain dicts, no printing."""

from __future__ import annotations

import numpy as np

from seqrec.data.datasets import DATASETS, DatasetSpec
from seqrec.data.sequences import PreparedData

Value = int | float | str | bool


def describe(prepared: PreparedData) -> dict[str, Value]:
    """Counts, length statistics, density and split sizes of prepared data."""
    lengths = prepared.sequences.lengths
    interactions = int(lengths.sum())
    users, items = prepared.num_users, prepared.num_items
    split = prepared.split
    return {
        "dataset": prepared.name,
        "source": prepared.source,
        "users": users,
        "items": items,
        "interactions": interactions,
        "mean_length": round(float(lengths.mean()), 2) if users else 0.0,
        "median_length": float(np.median(lengths)) if users else 0.0,
        # distinct (user, item) pairs: repeats would push it above 1
        "density": _distinct_pairs(prepared) / (users * items) if users and items else 0.0,
        "timestamps": prepared.timestamps is not None,
        "split": split.protocol,
        "train_users": len(split.train),
        "train_interactions": len(split.train.items),
        "valid_users": len(split.valid),
        "test_users": len(split.test),
    }


def _distinct_pairs(prepared: PreparedData) -> int:
    sequences = prepared.sequences
    pairs = sequences.row_ids().astype(np.int64) * (prepared.num_items + 1) + sequences.items
    return len(np.unique(pairs))


def format_info(info: dict[str, Value]) -> str:
    """``key: value`` lines, numbers with thousands separators."""
    width = max(len(key) for key in info)
    lines = []
    for key, value in info.items():
        if isinstance(value, bool):
            text = "yes" if value else "no"
        elif isinstance(value, str):
            text = value
        elif isinstance(value, int):
            text = f"{value:,}"
        else:
            text = f"{value:.6g}"
        lines.append(f"{key:<{width}}  {text}")
    return "\n".join(lines)


def _timestamps(spec: DatasetSpec) -> str:
    with_times = [f.name for f in spec.files if f.timestamps]
    if spec.generated or (with_times and len(with_times) == len(spec.files)):
        return "yes"
    return f"only from {', '.join(with_times)}" if with_times else "no"


def dataset_table() -> list[dict[str, str]]:
    """One row per registry dataset, for ``seqrec data list``."""
    rows = []
    for spec in DATASETS.values():
        files = " | ".join(f.name for f in spec.files) or "(generated)"
        rows.append(
            {
                "name": spec.name,
                "timestamps": _timestamps(spec),
                "files": files,
                "download": spec.download.url if spec.download else "-",
                "description": spec.description,
                "citation": spec.citation,
            }
        )
    return rows
