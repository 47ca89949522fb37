"""A run directory: everything needed to resume training or to serve the model.

    config.json       fully resolved experiment config (model section includes num_items)
    id_map.json       original <-> internal ids
    model.pt          the best weights (a state dict; loaded with weights_only=True)
    checkpoint.pt     training state after the last completed epoch (resume)
    metrics.jsonl     one JSON row per completed epoch
    results.json      test metrics of the final model

Every file is written atomically, so a crash at any moment leaves the previous version.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from seqrec.config import ConfigError, ExperimentConfig, experiment_from_raw
from seqrec.data.idmap import IdMap
from seqrec.data.schema import DataError
from seqrec.io import atomic_path, atomic_write_text, standard_json
from seqrec.models.base import (
    MODELS,
    ModelConfig,
    SequentialRecommender,
    build_model,
    model_config_from_dict,
    with_inference_settings,
)

CONFIG = "config.json"
ID_MAP = "id_map.json"
WEIGHTS = "model.pt"
STATE = "checkpoint.pt"
METRICS = "metrics.jsonl"
RESULTS = "results.json"

logger = logging.getLogger(__name__)


class RunDirError(ValueError):
    """A run directory that is missing, incomplete or corrupt."""


def save_torch(obj: Any, path: Path) -> None:
    with atomic_path(path) as tmp:
        torch.save(obj, tmp)


def load_torch(path: Path) -> Any:
    if not path.exists():
        raise RunDirError(f"{path} is missing")
    if not path.is_file():
        raise RunDirError(f"{path} is not a file")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except PermissionError as err:  # other OSErrors come from a truncated file
        raise RunDirError(f"cannot read {path}: {err.strerror or _first_line(err)}") from None
    except Exception as err:  # torch raises many types for a truncated or foreign file
        raise RunDirError(
            f"{path} is corrupt or not a seqrec file ({_load_failure(err)})"
        ) from None


def _load_failure(err: BaseException) -> str:
    """The cause in torch.load's error. Its weights-only refusals open with advice to load
    with weights_only=False, which could run code in a file that is corrupt or foreign:
    their cause is the line after "WeightsUnpickler error:"."""
    text = str(err)
    marker = "WeightsUnpickler error:"
    if marker in text:
        cause = text.split(marker, 1)[1].strip().splitlines()
        return f"unpickling: {cause[0].strip()}" if cause else "not a weights file"
    return _first_line(err)


def _first_line(err: BaseException) -> str:
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    return lines[0] if lines else type(err).__name__


def save_json(obj: Any, path: Path) -> None:
    atomic_write_text(path, json.dumps(standard_json(obj), indent=2, sort_keys=True) + "\n")


def write_metrics(rows: list[dict[str, Any]], run_dir: Path) -> None:
    atomic_write_text(run_dir / METRICS, "".join(json.dumps(standard_json(r)) + "\n" for r in rows))


@dataclass(frozen=True)
class LoadedRun:
    config: ExperimentConfig
    resolved: dict[str, Any]  # config.json as written (includes data facts)
    model: SequentialRecommender
    id_map: IdMap


def is_run_dir(folder: Path) -> bool:
    """Whether ``folder`` holds a run: its config, or a checkpoint of one."""
    return (folder / CONFIG).is_file() or (folder / STATE).exists()


def read_config(run_dir: Path) -> dict[str, Any]:
    if run_dir.is_file():
        hint = f"; did you mean {run_dir.parent}?" if (run_dir.parent / CONFIG).is_file() else ""
        raise RunDirError(f"{run_dir} is a file, not a run directory{hint}")
    if not run_dir.is_dir():
        raise RunDirError(f"run directory {run_dir} does not exist")
    path = run_dir / CONFIG
    if not path.is_file():
        raise RunDirError(f"{run_dir} is not a seqrec run directory (no {CONFIG})")
    try:
        raw = json.loads(path.read_text())
    except ValueError as err:
        raise RunDirError(f"{path} is corrupt: {err}") from None
    if not isinstance(raw, dict) or "model" not in raw:
        raise RunDirError(f"{path} is not a seqrec config")
    return _without_unread_fields(raw, path)


def _without_unread_fields(raw: dict[str, Any], path: Path) -> dict[str, Any]:
    """The saved config without the fields that seqrec versions before 2026-12-07 accepted,
    recorded and never read, and that the config checks refuse since: the run loads, and
    resumes, as it was trained. Dropped: ``data.path`` beside a registry dataset (the registry
    dataset was read) and, in a wrapper's ``model.backbone_options``, fields of the
    backbone's own training objective (the wrapper trains it with its own loss)."""
    dropped = []
    data = raw.get("data")
    registry = isinstance(data, dict) and data.get("dataset", "ml-1m") != "file"
    if isinstance(data, dict) and registry and data.get("path") is not None:
        raw = {**raw, "data": {k: v for k, v in data.items() if k != "path"}}
        dropped.append("data.path")
    model = raw["model"]
    options = model.get("backbone_options") if isinstance(model, dict) else None
    backbone = model.get("backbone") if isinstance(model, dict) else None
    if isinstance(options, dict) and isinstance(backbone, str) and backbone in MODELS:
        unread = set(options) & set(MODELS.get(backbone).config_class.objective_fields)
        if unread:
            kept = {k: v for k, v in options.items() if k not in unread}
            raw = {**raw, "model": {**model, "backbone_options": kept}}
            dropped += [f"model.backbone_options.{name}" for name in sorted(unread)]
    if dropped:
        logger.warning(
            "%s: ignoring %s, which the run was trained without reading", path, ", ".join(dropped)
        )
    return raw


def read_id_map(run_dir: Path, model: ModelConfig) -> IdMap:
    """The run's id map; one ``RunDirError`` naming the file when it is missing, unreadable,
    corrupt or counts other items or users than the model in ``config.json``."""
    path = run_dir / ID_MAP
    if not path.exists():
        raise RunDirError(f"{path} is missing: re-train or restore it")
    if not path.is_file():
        raise RunDirError(f"{path} is not a file")
    try:
        id_map = IdMap.load(path)
    except OSError as err:
        raise RunDirError(f"cannot read {path}: {err.strerror or _first_line(err)}") from None
    except DataError as err:
        raise RunDirError(f"{err}: re-train or restore it") from None
    for what, found, expected in (
        ("items", id_map.num_items, model.num_items),
        ("users", len(id_map.users), model.num_users),
    ):
        if expected and found != expected:  # num_users 0: a config that does not record it
            raise RunDirError(
                f"{path} is corrupt ({found} {what}, the model in {CONFIG} has {expected}): "
                "re-train or restore it"
            )
    return id_map


def _interrupted(run_dir: Path) -> bool:
    """Whether the run's checkpoint is of a training that has not finished."""
    if not (run_dir / STATE).is_file():
        return False
    try:
        return not load_torch(run_dir / STATE)["state"]["finished"]
    except (RunDirError, KeyError, TypeError):
        return False  # a damaged checkpoint: the missing weights are the error to report


def load_run(
    run_dir: str | Path, weights: str = WEIGHTS, settings: Mapping[str, Any] | None = None
) -> LoadedRun:
    """Rebuild the trained model of a run directory (on CPU) with its config and id map.

    ``settings`` replace inference settings of the model config (``model.depth`` of RecRec);
    any other model field is a ``ConfigError``.
    """
    run_dir = Path(run_dir)
    raw = read_config(run_dir)
    try:
        config = experiment_from_raw(
            {k: raw[k] for k in ("data", "train", "eval", "tokenizer") if k in raw}
        )
        model_config = model_config_from_dict(raw["model"])
    except (ConfigError, KeyError) as err:
        reason = err.args[0] if isinstance(err, KeyError) and err.args else err
        raise RunDirError(f"{run_dir / CONFIG}: {reason}") from None
    model_config = with_inference_settings(model_config, settings or {})
    model = build_model(model_config)
    if not (run_dir / weights).exists() and _interrupted(run_dir):
        raise RunDirError(
            f"{run_dir} has not finished training (no {weights} yet, a checkpoint from an "
            f"interrupted run): seqrec train --out {run_dir} --resume finishes it"
        )
    if not (run_dir / weights).exists() and not (run_dir / STATE).exists():
        raise RunDirError(
            f"{run_dir} never completed an epoch (no {weights}, no {STATE}: stopped before "
            f"its first epoch ended): seqrec train --out {run_dir} --resume trains it"
        )
    state = load_torch(run_dir / weights)
    try:
        model.load_state_dict(state)
    except (RuntimeError, TypeError, AttributeError) as err:
        detail = " ".join(line.strip() for line in str(err).splitlines()[1:3])
        raise RunDirError(
            f"{run_dir / weights} does not fit the model in {CONFIG} ({detail or _first_line(err)})"
        ) from None
    id_map = read_id_map(run_dir, model_config)
    model.eval()
    config = ExperimentConfig(
        data=config.data,
        model=model_config.to_dict(),
        train=config.train,
        eval=config.eval,
        tokenizer=config.tokenizer,
    )
    return LoadedRun(config=config, resolved=raw, model=model, id_map=id_map)
