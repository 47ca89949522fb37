"""Experiments end to end: prepare data, build the model, fit, evaluate on test, save.

This is what ``seqrec train`` and ``seqrec evaluate`` call; the CLI only parses arguments.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import shutil
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch

from seqrec import __version__
from seqrec.config import (
    ConfigError,
    DataConfig,
    EvalConfig,
    ExperimentConfig,
    SplitChoice,
    experiment_from_raw,
    replace_checked,
    set_dotted,
)
from seqrec.data.idmap import IdMap
from seqrec.data.prepare import prepare
from seqrec.data.schema import DataError
from seqrec.data.sequences import PreparedData
from seqrec.evaluation import EvalResult, check_protocol_fits, evaluate_model
from seqrec.models.base import (
    MODELS,
    ModelConfig,
    SequentialRecommender,
    build_model,
    build_model_config,
    warm_start_conflicts,
)
from seqrec.tokenizers.semantic_ids import CODES_FILE, META_FILE
from seqrec.training.checkpoint import (
    CONFIG,
    ID_MAP,
    METRICS,
    RESULTS,
    STATE,
    WEIGHTS,
    LoadedRun,
    RunDirError,
    is_run_dir,
    load_run,
    read_config,
    save_json,
)
from seqrec.training.distributed import SINGLE_PROCESS, DataParallel, data_parallel
from seqrec.training.loop import (
    EpochCallback,
    FitResult,
    Trainer,
    check_data_parallel,
    check_has_validation_users,
    check_train_config,
    resolve_device,
    seed_everything,
)
from seqrec.training.semantic_ids import RunSemanticIds, semantic_ids_for_run
from seqrec.training.tensorboard import check_tensorboard, tensorboard_callback

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class TrainOutcome:
    fit: FitResult
    test: EvalResult
    data: PreparedData
    model: SequentialRecommender


def _resolved(
    config: ExperimentConfig, model: SequentialRecommender, data: PreparedData
) -> dict[str, Any]:
    resolved = config.to_dict()
    resolved["model"] = model.config.to_dict()
    resolved["dataset"] = {
        "name": data.name,
        "source": data.source,
        "fingerprint": data.fingerprint,
    }
    resolved["seqrec_version"] = __version__
    # As config.json will read back: tuples become lists, so a resume compares like with like.
    loaded: dict[str, Any] = json.loads(json.dumps(resolved))
    return loaded


# Settings a resumed run may change: they decide how long and where it trains and how much
# memory evaluation takes, not what it learns or measures (``--resume --set
# train.max_epochs=400`` trains a finished run further; eval.batch_size only chunks the users).
RESUME_FREE_FIELDS = {
    "train": frozenset(
        {
            "max_epochs",
            "patience",
            "time_budget_minutes",
            "num_threads",
            "progress",
            "device",
            "collective_timeout_minutes",
        }
    ),
    "eval": frozenset({"batch_size"}),
}


def _absolute_data_path(config: ExperimentConfig) -> ExperimentConfig:
    """``config`` with ``data.path`` made absolute, so that the run's config.json names the
    same file from any working directory."""
    if config.data.path is None:
        return config
    path = _absolute(config.data.path)
    return dataclasses.replace(config, data=dataclasses.replace(config.data, path=path))


def _absolute(path: str) -> str:
    # Not resolve(): a symlink in the path the user gave stays as written.
    return str(Path(path).expanduser().absolute())


def _check_resume(run_dir: Path, config: ExperimentConfig, resolved: dict[str, Any]) -> None:
    saved = read_config(run_dir)
    for section in ("data", "model", "train", "eval", "tokenizer"):
        theirs, ours = dict(saved.get(section) or {}), resolved[section]
        if section == "data" and isinstance(theirs.get("path"), str):
            theirs["path"] = _absolute(theirs["path"])  # a run saved before paths were absolute
        # A field added to seqrec after the run started is absent from its config.json; at its
        # default it changes nothing, so it is no reason to refuse the resume.
        defaults = _field_defaults(config, section)
        free = RESUME_FREE_FIELDS.get(section, frozenset())
        keys = sorted(
            k
            for k in set(theirs) | set(ours)
            if k not in free and theirs.get(k, defaults.get(k, _MISSING)) != ours.get(k)
        )
        if keys:
            hint = ""
            if _never_trained(run_dir):
                hint = f" ({run_dir} never completed an epoch: removing it loses nothing)"
            raise ConfigError(
                f"--resume: the config differs from the one {run_dir} was started with "
                f"({', '.join(f'{section}.{k}' for k in keys)}); resume without --config, with "
                f"--set only for {_free_fields()}, or start a new --out{hint}"
            )


def _free_fields() -> str:
    return ", ".join(
        f"{section}.{name}"
        for section, names in RESUME_FREE_FIELDS.items()
        for name in sorted(names)
    )


def _never_trained(run_dir: Path) -> bool:
    """A run directory with a config but no checkpoint, weights or results: a run stopped
    before its first epoch ended, or what a failed start left behind in the seqrec versions
    that did not yet clean up after one."""
    return not any((run_dir / name).exists() for name in (STATE, WEIGHTS, RESULTS))


_MISSING = object()


def _field_defaults(config: ExperimentConfig, section: str) -> dict[str, Any]:
    """Default values of a config section's fields (the model's own config class for
    ``model``), as they read back from JSON."""
    if section == "model":
        cls: Any = MODELS.get(str(config.model.get("name", "sasrec"))).config_class
    else:
        cls = type(getattr(config, section))
    defaults = {
        f.name: f.default for f in dataclasses.fields(cls) if f.default is not dataclasses.MISSING
    }
    loaded: dict[str, Any] = json.loads(json.dumps(defaults))
    return loaded


def config_for_resume(run_dir: Path, overrides: Sequence[str] = ()) -> ExperimentConfig:
    """The experiment config a run directory was started with, with ``--set`` overrides
    (only ``RESUME_FREE_FIELDS`` may differ when the run is resumed)."""
    raw = read_config(run_dir)
    raw = {k: raw[k] for k in ("data", "model", "train", "eval", "tokenizer") if k in raw}
    raw["model"] = {k: v for k, v in raw["model"].items() if k not in ("num_items", "num_users")}
    for override in overrides:
        set_dotted(raw, override)
    return experiment_from_raw(raw)


def warm_start(model: SequentialRecommender, init_from: str | Path, data: PreparedData) -> None:
    """Load the best weights of run ``init_from`` into ``model`` (``train.init_from``).

    The source must be a run of the same model on the same data whose config differs only
    in fields the model declares warm-start free. Every source tensor must fit a tensor of
    the same name and shape; tensors the source lacks (RecRec's reasoner, new in stage 2)
    keep their initialisation and are logged.
    """
    try:
        # Its weights whatever kernel it was trained with: this model's (a run trained with
        # the CUDA scan warm-starts one here without it)
        saved_model = read_config(Path(init_from)).get("model")
        same_model = isinstance(saved_model, dict) and saved_model.get("name") == model.config.name
        kernels = type(model.config).kernel_settings if same_model else ()
        source = load_run(init_from, settings={k: getattr(model.config, k) for k in kernels})
    except (RunDirError, ConfigError) as err:
        raise ConfigError(f"train.init_from: {err}") from None
    conflicts = warm_start_conflicts(model.config, source.model.config)
    if conflicts:
        theirs, ours = source.model.config.to_dict(), model.config.to_dict()
        diffs = "; ".join(
            f"model.{k}: {theirs.get(k)!r} there, {ours.get(k)!r} here" for k in conflicts
        )
        raise ConfigError(
            f"train.init_from: {init_from} has an incompatible model config ({diffs})"
        )
    if source.id_map != data.id_map:  # the same users and items, in the same order
        raise ConfigError(
            f"train.init_from: {init_from} was trained on other data (its id map differs)"
        )
    if _data_changed(source.resolved, data):  # its training targets may be our test targets
        raise ConfigError(
            f"train.init_from: {init_from} was trained on other interactions of these users "
            "and items (the data changed since)"
        )
    try:
        result = model.load_state_dict(source.model.state_dict(), strict=False)
    except RuntimeError as err:  # a shape mismatch
        raise ConfigError(
            f"train.init_from: {init_from}: {str(err).splitlines()[-1].strip()}"
        ) from None
    if result.unexpected_keys:
        raise ConfigError(
            f"train.init_from: {init_from} has weights this model lacks: "
            f"{', '.join(result.unexpected_keys)}"
        )
    logger.info(
        "initialised from %s%s",
        init_from,
        f"; new, not loaded: {', '.join(result.missing_keys)}" if result.missing_keys else "",
    )


def _with_codebook_sizes(config: ModelConfig, sizes: tuple[int, ...]) -> ModelConfig:
    """The model config with the semantic IDs' codebook sizes (they come from the tokenizer,
    as ``num_items`` comes from the data)."""
    given = getattr(config, "codebook_sizes", ())
    if given and tuple(given) != tuple(sizes):
        raise ConfigError(
            f"model.codebook_sizes {tuple(given)} differs from the semantic IDs' {tuple(sizes)}; "
            "remove it from the config (the tokenizer section decides it)"
        )
    return dataclasses.replace(config, codebook_sizes=tuple(sizes))  # type: ignore[call-arg]


def model_for_data(
    config: ExperimentConfig,
    data: PreparedData,
    data_dir: str | Path | None,
    run_dir: Path,
    resume: bool,
    group: DataParallel = SINGLE_PROCESS,
) -> tuple[SequentialRecommender, RunSemanticIds | None]:
    """The untrained model of ``config`` for ``data``, and its semantic IDs when it uses them
    (the run's own when it resumes, else another run's or fitted here; on rank 0 of a
    data-parallel run, which sends them to the others)."""
    model_config = build_model_config(
        config.model, num_items=data.num_items, num_users=data.num_users
    )
    check_data_parallel(model_config, group.world_size)  # before semantic IDs are fitted
    semantic_ids: RunSemanticIds | None = None
    if model_config.uses_semantic_ids:
        semantic_ids = group.from_main(
            lambda: semantic_ids_for_run(config.tokenizer, data, data_dir, run_dir, resume)
        )
        model_config = _with_codebook_sizes(model_config, semantic_ids.ids.codebook_sizes)
    model = build_model(model_config)
    if semantic_ids is not None:
        model.set_semantic_ids(torch.from_numpy(semantic_ids.ids.codes))
    return model, semantic_ids


def _check_resumable(run_dir: Path) -> None:
    """Refuse a resume that would train from scratch over a run's finished weights (a
    checkpoint that is not a file is refused where it is loaded, ``Trainer.resume``)."""
    state = run_dir / STATE
    finished = [name for name in (WEIGHTS, RESULTS) if (run_dir / name).exists()]
    if finished and not state.exists():
        raise RunDirError(
            f"--resume: {run_dir} holds a trained run ({', '.join(finished)}) but no {STATE} "
            "to resume from; resuming would train again from epoch 1 over its weights: "
            "choose a new --out"
        )


@contextmanager
def _removed_unless_checkpointed(run_dir: Path) -> Iterator[None]:
    """Remove what the block adds to ``run_dir`` (and the directories it creates) when it
    fails before a checkpoint exists: such a stub would refuse every retry ("already holds a
    run"; "--resume: the config differs"). What was there before is left alone."""
    created = [d for d in (run_dir, *run_dir.parents) if not d.exists()]  # deepest first
    before = set(run_dir.iterdir()) if run_dir.is_dir() else set()
    try:
        yield
    except Exception:  # not KeyboardInterrupt: an interrupted run keeps its stub for --resume
        if not (run_dir / STATE).exists():
            new = set(run_dir.iterdir()) - before if run_dir.is_dir() else set()
            for path in new:
                if path.is_dir() and not path.is_symlink():
                    shutil.rmtree(path, ignore_errors=True)
                else:
                    path.unlink(missing_ok=True)
            for folder in created:
                try:
                    folder.rmdir()  # only when empty
                except OSError:
                    break
        raise


def train_experiment(
    config: ExperimentConfig,
    run_dir: str | Path,
    *,
    data_dir: str | Path | None = None,
    resume: bool = False,
    on_epoch_end: EpochCallback | None = None,
) -> TrainOutcome:
    """Train ``config`` into ``run_dir`` (or continue it, ``resume``); test the best model.

    Every check, the Trainer's included, runs before anything is written to ``run_dir``.
    In a process launched by ``torchrun`` it trains data-parallel with the other launched
    processes (``seqrec.training.distributed``); every rank returns the same outcome.
    """
    timeout = timedelta(minutes=config.train.collective_timeout_minutes)
    with data_parallel(config.train.device, timeout) as group:
        return _train_experiment(config, Path(run_dir), group, data_dir, resume, on_epoch_end)


def _holds_a_run(run_dir: Path, resume: bool) -> bool:
    """Whether ``run_dir`` holds a run already; refuses what cannot be trained there."""
    started = is_run_dir(run_dir)
    if started and not resume:
        if _never_trained(run_dir):
            raise RunDirError(
                f"{run_dir} holds a run that never completed an epoch ({CONFIG}, no {STATE}): "
                "pass --resume to start it from epoch 1 with its config, or remove it "
                "(nothing trained is lost) or choose a new --out"
            )
        raise RunDirError(
            f"{run_dir} already holds a run; pass --resume to continue it or choose a new --out"
        )
    if not started and run_dir.is_dir():
        # Files a run writes, in a folder that holds no run: training would replace them.
        clobbered = [
            name
            for name in (WEIGHTS, RESULTS, METRICS, ID_MAP, CODES_FILE, META_FILE)
            if (run_dir / name).exists()
        ]
        if clobbered:
            raise RunDirError(
                f"{run_dir} holds {', '.join(clobbered)} but no run ({CONFIG}): training there "
                "would replace them; choose a new --out, or move them away"
            )
    if resume:
        _check_resumable(run_dir)
    return started


def _check_same_ids(run_dir: Path, data: PreparedData) -> None:
    """Refuse to resume on data whose ids differ from the run's id map: its weights belong to
    the items and users it was started with (the file changed, or its preprocessing); or on
    other interactions of the same ids, which would train and validate on another split."""
    if data.id_map != IdMap.load(run_dir / ID_MAP):
        raise RunDirError(
            f"--resume: the data no longer matches {run_dir / ID_MAP} (the file or its "
            "preprocessing changed since the run started); resume with the data it was started "
            "on, or start a new --out"
        )
    if _data_changed(read_config(run_dir), data):
        raise RunDirError(
            f"--resume: the data has the users and items {run_dir} was started with but other "
            "interactions (the file changed since); resume with the data it was started on, "
            "or start a new --out"
        )


def _data_changed(resolved: dict[str, Any], data: PreparedData) -> bool:
    """Whether ``data`` differs from what the run's config.json fingerprinted (runs from
    before fingerprints were recorded cannot tell: False)."""
    recorded = (resolved.get("dataset") or {}).get("fingerprint")
    return recorded is not None and recorded != data.fingerprint


def _train_experiment(
    config: ExperimentConfig,
    run_dir: Path,
    group: DataParallel,
    data_dir: str | Path | None,
    resume: bool,
    on_epoch_end: EpochCallback | None,
) -> TrainOutcome:
    # Every rank decides whether run_dir holds a run before the first collective below (data
    # preparation), and rank 0 writes to it only after that.
    started = _holds_a_run(run_dir, resume)
    config = _absolute_data_path(config)
    check_train_config(config, group.world_size)  # before the data is read or downloaded
    data = group.local_main_first(lambda: prepare(config.data, data_dir))
    check_has_validation_users(data)  # before the model is built (semantic IDs: fitted)
    check_protocol_fits(config.eval, data.num_items)  # validation uses it: before epoch 1
    seed_everything(config.train.seed)
    model, semantic_ids = model_for_data(config, data, data_dir, run_dir, started, group)
    resolved = _resolved(config, model, data)
    if started:
        _check_resume(run_dir, config, resolved)
        if (run_dir / ID_MAP).exists():  # else a stub: id_map.json is written below
            _check_same_ids(run_dir, data)
    if config.train.init_from is not None and not (resume and (run_dir / STATE).exists()):
        warm_start(model, config.train.init_from, data)  # a resumed run has its own weights
    trainer = Trainer(model, data, config, run_dir, on_epoch_end, group)
    if resume and not trainer.resume() and started and group.is_main:  # a new folder is no news
        logger.info("--resume: %s has no completed epoch yet; starting from epoch 1", run_dir)
    if config.train.tensorboard:  # on every rank: fails here, before any write, without it
        check_tensorboard()
    cleanup: AbstractContextManager[None] = (
        _removed_unless_checkpointed(run_dir) if group.is_main else nullcontext()
    )
    with cleanup:
        if group.is_main:
            if config.train.tensorboard:
                trainer.on_epoch_end = tensorboard_callback(
                    run_dir / "tensorboard", trainer.on_epoch_end
                )
            if not started:
                run_dir.mkdir(parents=True, exist_ok=True)
                data.id_map.save(run_dir / ID_MAP)
            save_json(resolved, run_dir / CONFIG)  # a resume may have changed a free train field
            if semantic_ids is not None:
                semantic_ids.save(run_dir)
        fit = trainer.fit()
    test = evaluate_model(
        model,
        data,
        config.eval,
        split="test",
        device=str(trainer.device),
        share=group.evaluation_share(),
    )
    if group.is_main:
        save_json(
            {
                "best_epoch": fit.best_epoch,
                "epochs": fit.epochs,
                f"valid_{config.train.monitor}": fit.best_metric,
                **test.flat(),
            },
            run_dir / RESULTS,
        )
    return TrainOutcome(fit=fit, test=test, data=data, model=model)


def data_for_run(run: LoadedRun, data_dir: str | Path | None = None) -> PreparedData:
    """The prepared data a run was trained on; refuses data whose ids differ from the run's.

    Without ``data_dir``, the folder the run was trained from is used while the file it was
    trained on is still there (no search of the usual places, no download of another file of
    the dataset); else the usual places (``$SEQREC_DATA_DIR``, the cache, a download). A run
    trained on a file of one's own (``dataset: file``) reads that file while it exists, else
    the file of that name in ``data_dir`` (the log moved).
    """
    if run.config.data.dataset == "file":
        data = prepare(_own_file(run.config.data, data_dir))
    else:
        trained_from = Path(str(run.resolved.get("dataset", {}).get("source", "")))
        if data_dir is None and trained_from.is_file():
            data_dir = trained_from.parent.parent
        data = prepare(run.config.data, data_dir)
    if data.id_map != run.id_map:
        raise RunDirError(
            "the prepared data does not match the run's id map (the dataset or its "
            "preprocessing changed since training); evaluate with the data it was trained on"
        )
    if _data_changed(run.resolved, data):
        raise RunDirError(
            "the data has the run's users and items but other interactions (the file changed "
            "since training), so its split would not be the one the run held out: evaluate "
            "with the data it was trained on"
        )
    return data


def _own_file(config: DataConfig, data_dir: str | Path | None) -> DataConfig:
    """The data section of a run trained on a file of one's own: its file, or once it has
    moved, the file of the same name in ``data_dir``."""
    trained_on = Path(str(config.path))
    if trained_on.exists():
        return config
    if data_dir is None:
        raise DataError(
            f"{trained_on}, the file this run was trained on, does not exist; if it moved, "
            f"pass --data-dir with the folder that now holds {trained_on.name}"
        )
    moved = Path(data_dir) / trained_on.name
    if not moved.exists():
        raise DataError(
            f"{trained_on}, the file this run was trained on, does not exist, nor does "
            f"{moved} (--data-dir)"
        )
    return dataclasses.replace(config, path=str(moved))


# Eval settings that the full protocol does not read: given explicitly for it, they would
# change nothing, silently.
_SAMPLED_ONLY = ("num_negatives", "negative_sampling", "seed")


def _check_overrides_apply(config: EvalConfig, overrides: Mapping[str, Any]) -> None:
    """The sampled protocol always draws its negatives among unseen items: filter_seen false
    changes nothing there (true is what it does)."""
    if config.protocol == "sampled":
        given = ["filter_seen"] if overrides.get("filter_seen") is False else []
    else:
        given = [key for key in _SAMPLED_ONLY if key in overrides]
    if given:
        keys = ", ".join(f"eval.{key}" for key in given)
        other = "full" if config.protocol == "sampled" else "sampled"
        raise ConfigError(
            f"{keys} only {'applies' if len(given) == 1 else 'apply'} to the {other} protocol, "
            f"and this evaluation uses the {config.protocol} one (--protocol)"
        )


def evaluate_run(
    run_dir: str | Path,
    *,
    split: SplitChoice = "test",
    overrides: dict[str, Any] | None = None,
    data_dir: str | Path | None = None,
    device: str = "auto",
    settings: Mapping[str, Any] | None = None,
) -> tuple[EvalResult, LoadedRun]:
    """Evaluate a trained run directory; ``overrides`` replace fields of its eval config
    (checked as the config file's are: unknown keys and bad values are ``ConfigError``s),
    ``settings`` inference settings of its model config (``{"depth": 4}`` for RecRec).

    In processes launched by ``torchrun`` the users are shared among them (each on its own
    GPU when on CUDA) and every process returns the whole result."""
    run = load_run(run_dir, settings=settings)
    eval_config = replace_checked(run.config.eval, overrides or {}, "eval")
    _check_overrides_apply(eval_config, overrides or {})
    check_protocol_fits(eval_config, run.model.config.num_items)  # before the data is read
    with data_parallel(device) as group:
        target = group.device(resolve_device(device, "device"))
        run.model.config.check_runnable(target.type)  # a kernel for another device
        data = group.local_main_first(lambda: data_for_run(run, data_dir))
        run.model.to(target)
        result = evaluate_model(
            run.model,
            data,
            eval_config,
            split=split,
            device=str(target),
            share=group.evaluation_share(),
        )
    return result, run
