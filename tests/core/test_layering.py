"""Imports only go downward: models know tensors, serving never imports the training loop."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "seqrec"

FORBIDDEN = {
    "models": (
        "seqrec.training",
        "seqrec.data",
        "seqrec.serving",
        "seqrec.cli",
        "seqrec.evaluation",
    ),
    "nn": (
        "seqrec.models",
        "seqrec.training",
        "seqrec.data",
        "seqrec.serving",
        "seqrec.tokenizers",
    ),
    "tokenizers": (
        "seqrec.models",
        "seqrec.training",
        "seqrec.data.sequences",
        "seqrec.data.prepare",
        "seqrec.data.datasets",
        "seqrec.serving",
        "seqrec.cli",
        "seqrec.evaluation",
    ),
    "metrics.py": ("seqrec.models", "seqrec.training", "seqrec.data"),
    "losses.py": ("seqrec.models", "seqrec.training", "seqrec.data"),
    "data": ("seqrec.models", "seqrec.training", "seqrec.serving", "seqrec.evaluation"),
    "serving": ("seqrec.training.loop", "seqrec.training.run", "seqrec.cli"),
    "evaluation.py": ("seqrec.training", "seqrec.serving", "seqrec.cli"),
}


def imported_modules(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


@pytest.mark.parametrize("part", sorted(FORBIDDEN))
def test_layering(part: str) -> None:
    files = [SRC / part] if part.endswith(".py") else sorted((SRC / part).rglob("*.py"))
    assert files
    for file in files:
        bad = {m for m in imported_modules(file) if m.startswith(FORBIDDEN[part])}
        assert not bad, f"{file.relative_to(SRC)} imports {sorted(bad)}"
