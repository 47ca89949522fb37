"""A run remembers where its data came from: evaluate works without repeating --data-dir."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from seqrec.cli import main
from seqrec.data import datasets
from seqrec.data.synthetic import generate
from tests.cli.helpers import tiny_raw, write_yaml


def test_evaluate_finds_the_data_folder_the_run_was_trained_from(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A registry dataset (lastfm, seq-per-line) laid out as <dir>/<name>/<file>.
    frame = generate(150, 80, seed=3)
    lines = [
        " ".join([str(user), *map(str, group["item_id"].to_list())])
        for (user,), group in frame.group_by("user_id", maintain_order=True)
    ]
    data_dir = tmp_path / "data"
    (data_dir / "lastfm").mkdir(parents=True)
    (data_dir / "lastfm" / "LastFM.txt").write_text("\n".join(lines) + "\n")
    config = write_yaml(tmp_path / "c.yaml", tiny_raw(data={"dataset": "lastfm"}))
    run = tmp_path / "run"
    assert (
        main(
            ["-q", "train", "--config", str(config), "--out", str(run), "--data-dir", str(data_dir)]
        )
        == 0
    )
    capsys.readouterr()

    def no_download(*args: object, **kwargs: object) -> None:
        raise AssertionError("the file the run was trained on is there: nothing to download")

    monkeypatch.setenv("SEQREC_OFFLINE", "0")  # a download would be tried, and fail the test
    monkeypatch.setattr(datasets, "download_file", no_download)
    assert main(["-q", "evaluate", str(run), "--json"]) == 0  # no --data-dir, no env var
    result = json.loads(capsys.readouterr().out)
    saved = json.loads((run / "results.json").read_text())
    assert result["NDCG@10"] == pytest.approx(saved["NDCG@10"], abs=1e-9)
