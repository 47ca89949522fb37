"""Tables as CSV + JSON files and Markdown; the shared output format of ``seqrec analyze``."""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from seqrec.io import atomic_write_text

Row = Mapping[str, Any]


def _clean(value: Any) -> Any:
    """JSON has no NaN or infinity: write null (recursively through lists and dicts)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


def write_table(rows: Sequence[Row], path: Path) -> list[Path]:
    """``path``.csv and ``path``.json (a list of objects); the columns are the first row's
    keys, then any other key in order of appearance."""
    columns: list[str] = []
    for row in rows:
        columns += [key for key in row if key not in columns]
    text = io.StringIO()
    writer = csv.DictWriter(text, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    csv_path, json_path = path.with_suffix(".csv"), path.with_suffix(".json")
    atomic_write_text(csv_path, text.getvalue())
    write_json(list(rows), json_path)
    return [csv_path, json_path]


def write_json(obj: Any, path: Path) -> Path:
    atomic_write_text(path, json.dumps(_clean(obj), indent=2, allow_nan=False) + "\n")
    return path


# Settings rather than measurements: shown as written (0.1, not 0.1000).
PLAIN = frozenset({"alpha", "epsilon", "alpha_selected", "alpha_oracle"})


def fmt(value: Any, digits: int = 4, plain: bool = False) -> str:
    if isinstance(value, float):
        if not math.isfinite(value):
            return "–"
        return f"{value:g}" if plain else f"{value:.{digits}f}"
    return "–" if value is None else str(value)


def markdown_table(rows: Sequence[Row], columns: Sequence[str] | None = None) -> str:
    """A Markdown table; floats with 4 decimals, NaN / None as an en dash."""
    if not rows:
        return "_(no rows)_"
    columns = list(columns or rows[0].keys())
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += [
        "| " + " | ".join(fmt(row.get(c), plain=c in PLAIN) for c in columns) + " |" for row in rows
    ]
    return "\n".join(lines)
