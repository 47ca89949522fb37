"""The main job offline: synthetic data, resumable runs, a changed schedule trains anew."""

from __future__ import annotations

from pathlib import Path

import pytest

from seqrec.cli import main
from tests.env import isolate


def test_demo_offline_uses_synthetic_data_and_resumes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    isolate(monkeypatch, tmp_path / "cache")
    empty = tmp_path / "no-data"
    empty.mkdir()
    out = tmp_path / "demo"
    args = ["demo", "--data-dir", str(empty), "--out", str(out), "--epochs", "1"]
    assert main(args) == 0
    first = capsys.readouterr().out
    assert first.startswith("dataset: synthetic")
    assert "SASRec+CE: 1 epoch in" in first
    assert "stopped: train.max_epochs 1 reached)" in first  # the demo says why it ended
    runs = sorted(p.name for p in out.iterdir())
    assert [name.split("-")[0] for name in runs] == ["pop", "sasrec"]
    shown = first.splitlines()[-1].removeprefix("run directories: ").split(", ")
    assert sorted(Path(d).name for d in shown) == runs

    assert main(args) == 0  # resumes the finished runs: same table, nothing retrained
    again = capsys.readouterr().out
    assert again.splitlines()[3:] == first.splitlines()[3:]
    assert sorted(p.name for p in out.iterdir()) == runs

    # Another schedule is another config: a new run beside the old one, not a refusal.
    assert main([*args[:-1], "2"]) == 0
    assert "SASRec+CE: 2 epochs" in capsys.readouterr().out
    assert len([p for p in out.iterdir() if p.name.startswith("sasrec-")]) == 2
