"""One model-agnostic training loop: epochs, validation, early stopping, crash-safe resume.

The loop calls ``model(batch).loss`` (or, for a model that steps several times a batch, the
losses of ``model.training_updates(batch)``) and the evaluator; it knows nothing about any model.
Every epoch draws its randomness (batch order, negatives, dropout) from seeds derived from
(train.seed, epoch), and the checkpoint written after each epoch holds the optimizer state,
so a resumed run continues exactly where an uninterrupted one would be. Under ``torchrun``
the same loop trains data-parallel (``seqrec.training.distributed``).
"""

from __future__ import annotations

import copy
import logging
import math
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from tqdm import tqdm

from seqrec.batch import ModelOutput, SeqBatch
from seqrec.config import ConfigError, ExperimentConfig, TokenizerConfig, TrainConfig, warn_once
from seqrec.data.batches import TrainBatches
from seqrec.data.schema import DataError
from seqrec.data.sequences import PreparedData
from seqrec.evaluation import evaluate_model
from seqrec.metrics import METRICS
from seqrec.models.base import (
    MODELS,
    ModelConfig,
    ScoringRecommender,
    SequentialRecommender,
    build_model_config,
)
from seqrec.models.objective import ItemLossConfig
from seqrec.nn.row_gather import rows_gathered_over_ranks
from seqrec.training.checkpoint import STATE, WEIGHTS, load_torch, save_torch, write_metrics
from seqrec.training.cpu_allocator import keep_freed_memory
from seqrec.training.distributed import SINGLE_PROCESS, DataParallel

logger = logging.getLogger(__name__)

EpochCallback = Callable[[dict[str, Any]], None]


def resolve_device(name: str, setting: str = "train.device") -> torch.device:
    """``name`` ("auto", "cpu", "cuda") as a device; ``setting`` is what an error names."""
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"{setting}: cuda was asked for but no CUDA device is available")
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def seed_everything(seed: int) -> None:
    torch.manual_seed(seed)
    np.random.seed(seed % 2**32)


def epoch_seeds(seed: int, epoch: int, rank: int | None = None) -> tuple[np.random.Generator, int]:
    """Independent, reproducible randomness for one epoch: a NumPy generator and a torch seed
    (with ``rank``, a stream of that data-parallel rank's own)."""
    sequence = np.random.SeedSequence([seed, epoch] if rank is None else [seed, epoch, rank])
    return np.random.default_rng(sequence), int(sequence.generate_state(1, np.uint64)[0] >> 1)


def epoch_randomness(
    seed: int, epoch: int, group: DataParallel = SINGLE_PROCESS
) -> tuple[np.random.Generator, np.random.Generator, int]:
    """An epoch's generators of the batch order (the same on every data-parallel rank) and of
    what batches sample (negatives), and its torch seed (dropout); the last two are each
    rank's own, and in one process the order's."""
    order_rng, torch_seed = epoch_seeds(seed, epoch)
    if group.world_size == 1:
        return order_rng, order_rng, torch_seed
    sample_rng, torch_seed = epoch_seeds(seed, epoch, group.rank)
    return order_rng, sample_rng, torch_seed


def check_train_config(config: ExperimentConfig, world_size: int = 1) -> None:
    """Settings that can only be checked against each other, the machine or the number of
    data-parallel processes."""
    names = [f"{m}@{k}" for k in config.eval.ks for m in METRICS]
    if config.train.monitor not in names:
        raise ConfigError(
            f"train.monitor {config.train.monitor!r} is not a computed metric; "
            f"valid: {', '.join(names)}"
        )
    device = resolve_device(config.train.device)
    # The model section too, before any data is read or downloaded: a typo in it should not
    # wait for (or be hidden by) the data. The counts that come from the data are stand-ins
    # here; no model's config check depends on them.
    model_config = build_model_config(config.model, num_items=1, num_users=1)
    model_config.check_runnable(device.type)
    reason = model_config.needs_init_from
    if reason is not None and config.train.init_from is None:
        raise ConfigError(f"train.init_from is not set: {reason}; set it to that run")
    check_data_parallel(model_config, world_size)
    if world_size > config.train.batch_size and model_config.loss_gathers_rows:
        # a step every rank cannot join is skipped by all of them: no step would train
        raise ConfigError(
            f"train.batch_size {config.train.batch_size} is below the {world_size} processes: "
            f"{model_config.name}'s loss needs rows on every process in every step, so every "
            f"batch would be skipped; use train.batch_size >= {world_size}"
        )
    if (
        isinstance(model_config, ItemLossConfig)
        and model_config.in_batch_negatives
        and config.train.batch_size == 1
    ):
        warn_once(
            "in-batch negatives are the batch's own targets: with train.batch_size 1 they come "
            "from one sequence, and a row that trains one target has none (its loss is 0)"
        )
    _check_window_stride(config, model_config)
    _check_validation_protocol(config, model_config)
    if not model_config.uses_semantic_ids and config.tokenizer != TokenizerConfig():
        warn_once(
            f"the tokenizer section makes semantic IDs for generative models; "
            f"{model_config.name} does not use them: ignored"
        )


def _check_validation_protocol(config: ExperimentConfig, model_config: ModelConfig) -> None:
    if config.eval.protocol == "sampled" and not issubclass(
        MODELS.get(model_config.name), ScoringRecommender
    ):
        raise ConfigError(
            f"eval.protocol: sampled ranks candidates by score; {model_config.name} only "
            "returns a top-k list, so validate it with eval.protocol: full"
        )


def _check_window_stride(config: ExperimentConfig, model_config: ModelConfig) -> None:
    stride = config.train.window_stride
    if stride is None:
        return
    if stride > model_config.max_seq_len:
        raise ConfigError(
            f"train.window_stride {stride} is above model.max_seq_len "
            f"{model_config.max_seq_len}, the most targets a window holds"
        )
    if not model_config.targets_from_labels:
        raise ConfigError(
            f"train.window_stride trains each window's older targets elsewhere; "
            f"{model_config.name} makes targets of its inputs and would train them "
            "again: leave train.window_stride unset"
        )


def check_trainer_config(
    model: SequentialRecommender, config: ExperimentConfig, world_size: int = 1
) -> None:
    """Settings that can only be checked against the built model (and the number of
    data-parallel ranks); ``Trainer`` runs this before it changes anything (threads, device,
    optimizer)."""
    check_train_config(config, world_size)
    if config.train.windows != "last" and model.batch_needs.prefix_examples:
        raise ConfigError(
            f"train.windows: {config.train.windows} cuts users' sequences into windows; "
            f"{model.config.name} with these settings trains on one example per target, "
            "which uses every target already: use train.windows: last"
        )
    if config.train.batch_parts > 1 and not model.config.loss_splits_by_rows:
        raise ConfigError(
            f"train.batch_parts needs a loss that splits by rows, which {model.config.name} "
            "with these settings does not declare (ModelConfig.loss_splits_by_rows; in-batch "
            "negatives or a contrastive term couple a batch's rows): use train.batch_parts=1"
        )
    if world_size > 1 and not any(p.requires_grad for p in model.parameters()):
        raise ConfigError(
            f"{model.config.name} has nothing to optimise (it learns by counting in one pass "
            "over the data): train it in one process"
        )
    check_data_parallel(model.config, world_size)


def _nothing_to_train_on(config: ExperimentConfig) -> str:
    held_out = (
        "leave_one_out holds out each user's last 2 items, so a user needs 4 or more to train on"
        if config.data.split == "leave_one_out"
        else f"the {config.data.split} split left none that long"
    )
    return (
        "nothing to train on: no training sequence has 2 items (a target and an item before "
        f"it); {held_out}"
    )


def check_data_parallel(model: ModelConfig, world_size: int) -> None:
    """Several data-parallel ranks split every batch, which needs a model trained by gradient
    steps, and a loss that splits by rows or gathers the rows it couples over the ranks."""
    if world_size > 1 and model.learns_by_counting:
        raise ConfigError(
            f"{model.name} learns by counting in one pass over the data, with nothing to split "
            "between processes: train it in one process (without torchrun)"
        )
    if world_size > 1 and not (model.loss_splits_by_rows or model.loss_gathers_rows):
        raise ConfigError(
            f"data-parallel training splits every batch between the ranks, which needs a loss "
            f"that splits by rows or gathers them from every rank; {model.name} with these "
            "settings declares neither (ModelConfig.loss_splits_by_rows, loss_gathers_rows): "
            "train it in one process"
        )


@dataclass
class EpochStats:
    loss: float
    seconds: float
    targets: int  # positions with a loss
    terms: dict[str, float] = field(default_factory=dict)  # ModelOutput.terms, epoch means

    @property
    def targets_per_second(self) -> float:
        return self.targets / self.seconds if self.seconds > 0 else float("nan")


@dataclass
class _EpochTotals:
    loss: float = 0.0  # summed over the loss's positions
    positions: float = 0.0  # the positions the losses average over (ModelOutput.num_targets)
    targets: int = 0  # labelled positions, the unit of throughput
    terms: dict[str, float] = field(default_factory=dict)

    def add_terms(self, output: ModelOutput, n: int) -> None:
        for name, term in output.terms.items():
            self.terms[name] = self.terms.get(name, 0.0) + float(term.detach()) * n


def train_one_epoch(
    model: SequentialRecommender,
    batches: Iterable[SeqBatch | list[SeqBatch]],
    optimizer: torch.optim.Optimizer | None,
    *,
    device: torch.device,
    grad_clip: float | None = None,
    bf16: bool = False,
    progress: tqdm[Any] | None = None,
    group: DataParallel = SINGLE_PROCESS,
) -> EpochStats:
    """One pass over ``batches``; returns the mean loss over positions.

    An item that is a list is one optimizer step over its parts (``TrainBatches.steps``): the
    step takes the gradient of the mean loss over all the parts' positions (each part's mean
    loss weighted by its positions, ``ModelOutput.num_targets``). A model that steps several
    times a batch (``updates_per_batch``) gets one step per loss of ``training_updates``
    (accumulated over the parts alike); a batch's loss is then the mean of those.

    With several data-parallel ranks (``group``), ``batches`` are this rank's shares of the
    steps: the gradients and positions are summed over the ranks before each optimizer step,
    so a step is that of the whole batch; the returned figures are those of all ranks
    together. A loss that couples rows gathers the other ranks' (``loss_gathers_rows``).
    """
    model.train()
    start = time.perf_counter()
    totals = _EpochTotals()
    autocast = torch.autocast(device.type, dtype=torch.bfloat16) if bf16 else nullcontext()
    trained = [p for p in model.parameters() if p.requires_grad]

    def update(positions: int | None) -> None:
        """The optimizer step; ``positions`` (this rank's) when the accumulated gradient is
        of the summed loss rather than of a mean, so that it is divided by all ranks'."""
        if optimizer is None:
            return
        if positions is not None:
            total = group.sum_floats([positions])[0] if group.world_size > 1 else positions
        group.sum_gradients(trained)
        if positions is not None:
            grads = [p.grad for p in trained if p.grad is not None]
            if grads:
                torch._foreach_mul_(grads, 1.0 / max(total, 1.0))
        if grad_clip is not None:
            nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    if optimizer is not None:
        optimizer.zero_grad(set_to_none=True)
    for step in batches:
        parts = step if isinstance(step, list) else [step]
        with rows_gathered_over_ranks(group.world_size > 1):
            _train_batch(
                model, parts, totals, autocast, device, update, optimizer is not None, group
            )
        totals.targets += sum(part.num_targets for part in parts)
        if progress is not None:
            progress.update(1)
            elapsed = time.perf_counter() - start
            progress.set_postfix(
                loss=f"{totals.loss / max(totals.positions, 1):.4f}",
                targets_per_s=f"{totals.targets / max(elapsed, 1e-9):,.0f}",
            )
    if group.world_size > 1:
        totals.loss, totals.positions, targets = group.sum_floats(
            [totals.loss, totals.positions, totals.targets]
        )
        totals.targets = round(targets)
        totals.terms = group.sum_dicts(totals.terms)
    if not math.isfinite(totals.loss):
        raise FloatingPointError("training loss is not finite; lower train.lr or check the data")
    positions = max(totals.positions, 1)
    return EpochStats(
        totals.loss / positions,
        time.perf_counter() - start,
        totals.targets,
        {name: total / positions for name, total in totals.terms.items()},
    )


def _train_batch(
    model: SequentialRecommender,
    parts: list[SeqBatch],
    totals: _EpochTotals,
    autocast: AbstractContextManager[Any],
    device: torch.device,
    update: Callable[[int | None], None],
    backward: bool,
    group: DataParallel,
) -> None:
    """The ``updates_per_batch`` optimizer steps of one batch (one for most models): step k
    accumulates the k-th loss of every part's ``training_updates``; each part's updates
    carry their own state from step to step.

    A step of one part in one process backpropagates that part's mean loss. Otherwise each
    part backpropagates its mean loss times its positions, which are known only once its
    loss is (BERT4Rec draws its masks in ``forward``), and ``update`` divides the summed
    gradient by the step's positions over every rank."""
    alone = len(parts) == 1 and group.world_size == 1
    updates: list[Iterator[ModelOutput]] = []
    step_losses, step_positions = [], []
    for k in range(model.config.updates_per_batch):
        step_loss, positions = 0.0, 0
        for i, part in enumerate(parts):
            if k == 0:  # a part goes to the device when it is first needed
                updates.append(model.training_updates(part.to(device)))
            with autocast:
                output = next(updates[i], None)
            if output is None:
                raise RuntimeError(
                    f"{model.config.name}.training_updates yielded fewer losses than "
                    f"updates_per_batch = {model.config.updates_per_batch}"
                )
            _check_output(model, output)
            n = part.num_targets if output.num_targets is None else output.num_targets
            if backward:
                torch.autograd.backward(output.loss if alone else output.loss * n)
            step_loss += float(output.loss.detach()) * n
            positions += n
            totals.add_terms(output, n)
            del output  # the next part's activations need the memory
        update(None if alone else positions)  # before the next losses, with the new weights
        step_losses.append(step_loss)
        step_positions.append(positions)
    totals.loss += sum(step_losses) / len(step_losses)
    totals.positions += sum(step_positions) / len(step_positions)


def _check_output(model: SequentialRecommender, output: object) -> None:
    """What ``forward`` must return, said when it does not (a model of one's own)."""
    name = model.config.name
    if not isinstance(output, ModelOutput):
        raise TypeError(
            f"{name}.forward returned a {type(output).__name__}; it must return a "
            "seqrec.batch.ModelOutput whose loss is the training loss"
        )
    if not isinstance(output.loss, torch.Tensor) or output.loss.ndim != 0:
        shape = tuple(output.loss.shape) if isinstance(output.loss, torch.Tensor) else None
        raise ValueError(
            f"{name}.forward returned a loss of shape {shape}; it must be a scalar tensor "
            "(the mean over the positions it trains)"
        )


def log_epoch(row: dict[str, Any]) -> None:
    """The default epoch callback: one readable log line."""
    terms = [f"{k[5:]} {v:.4f}" for k, v in row.items() if k.startswith("loss_")]
    loss = f"loss {row['loss']:.4f}" + (f" ({', '.join(terms)})" if terms else "")
    parts = [f"epoch {row['epoch']}", loss, f"{row['epoch_seconds']:.1f} s"]
    parts += [f"{k} {v:.4f}" for k, v in row.items() if k in ("valid_NDCG@10", "valid_HR@10")]
    logger.info("%s", "  ".join(parts))


def build_optimizer(model: nn.Module, config: TrainConfig) -> torch.optim.Optimizer | None:
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:  # e.g. PopRec, which learns by counting
        return None
    optimizer = torch.optim.AdamW if config.optimizer == "adamw" else torch.optim.Adam
    return optimizer(params, lr=config.lr, betas=config.betas, weight_decay=config.weight_decay)


@dataclass
class TrainingState:
    """What a checkpoint holds besides the weights; restored on resume."""

    epoch: int = 0  # completed epochs
    best_metric: float = -math.inf
    best_epoch: int = 0
    epochs_without_improvement: int = 0
    finished: bool = False
    elapsed_seconds: float = 0.0  # wall time of completed epochs, across resumes
    history: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class FitResult:
    best_epoch: int
    best_metric: float
    epochs: int
    history: list[dict[str, Any]]
    train_seconds: float
    stop_reason: str | None = None  # why training ended (early stop, max_epochs, budget)


def check_has_validation_users(data: PreparedData) -> None:
    """Early stopping and the choice of the best weights need validation users: without any,
    every metric is NaN, no epoch is ever the best, and the initial weights were saved."""
    if len(data.split.valid) > 0:
        return
    if data.split.protocol == "global_temporal":
        why = (
            "no user has an interaction between the validation and the test cut with an "
            "earlier one; change data.temporal_quantile or add data"
        )
    else:
        why = "a user needs 3 interactions for a validation target; add data"
    raise DataError(
        f"{data.name}: the {data.split.protocol} split leaves no validation user: {why}"
    )


class Trainer:
    """Fits a model on prepared data; with a run directory it checkpoints every epoch.

    With a ``group`` of several data-parallel ranks, each rank runs its own ``Trainer`` on
    its share of every batch and of the validation users; rank 0 calls ``on_epoch_end`` and
    writes the run directory.
    """

    def __init__(
        self,
        model: SequentialRecommender,
        data: PreparedData,
        config: ExperimentConfig,
        run_dir: Path | None = None,
        on_epoch_end: EpochCallback | None = None,
        group: DataParallel = SINGLE_PROCESS,
    ) -> None:
        check_trainer_config(model, config, group.world_size)
        check_has_validation_users(data)
        self.model = model
        self.data = data
        self.config = config
        self.run_dir = run_dir
        self.on_epoch_end = on_epoch_end or log_epoch
        self.group = group
        self.device = group.device(resolve_device(config.train.device))
        if self.device.type == "cpu":
            keep_freed_memory()
        if config.train.num_threads is not None:
            torch.set_num_threads(config.train.num_threads)
        self.model.to(self.device)
        group.broadcast_module(self.model)
        self.optimizer = build_optimizer(model, config.train)
        self.batches = TrainBatches(
            sequences=data.split.train,
            users=data.split.train_users,
            num_items=data.num_items,
            max_seq_len=model.config.max_seq_len,
            batch_size=config.train.batch_size,
            needs=model.batch_needs,
            batching=config.train.batching,
            parts=config.train.batch_parts,
            # A model fitted by counting counts every training target once, not only those
            # of each user's newest max_seq_len items (PopRec counted 27% of ML-1M's).
            windows="all" if model.config.learns_by_counting else config.train.windows,
            window_stride=None if model.config.learns_by_counting else config.train.window_stride,
            rank=group.rank,
            world_size=group.world_size,
            rows_on_every_rank=model.config.loss_gathers_rows,
        )
        if self.batches.num_targets == 0:
            raise DataError(_nothing_to_train_on(config))
        self.state = TrainingState()
        self.best_weights: dict[str, torch.Tensor] = copy.deepcopy(model.state_dict())

    def validate(self) -> dict[str, float]:
        """Validation metrics (with several ranks, each ranks its share of the users)."""
        result = evaluate_model(
            self.model,
            self.data,
            self.config.eval,
            split="valid",
            device=self.device,
            share=self.group.evaluation_share(),
        )
        return result.metrics

    def resume(self) -> bool:
        """Load the last completed epoch from the run directory; False when there is none.
        Every data-parallel rank must find the same one."""
        resumed = self._load_checkpoint()
        self.group.agree(self.state.epoch, "the epoch they resume after")
        return resumed

    def _load_checkpoint(self) -> bool:
        if self.run_dir is None or not (self.run_dir / STATE).exists():
            return False
        saved = load_torch(self.run_dir / STATE)
        self.model.load_state_dict(saved["model"])
        self.best_weights = saved["best_model"]
        if self.optimizer is not None and saved["optimizer"] is not None:
            self.optimizer.load_state_dict(saved["optimizer"])
        self.state = TrainingState(**saved["state"])
        if self.config.train.max_epochs < self.state.epoch:
            # It would stop at once and rewrite config.json with a max_epochs below the epochs
            # results.json reports.
            raise ConfigError(
                f"train.max_epochs {self.config.train.max_epochs} is below the "
                f"{self.state.epoch} epochs {self.run_dir} has trained; resume with "
                f"train.max_epochs >= {self.state.epoch}"
            )
        # The stopping settings may have changed since (a finished run resumed with a larger
        # train.max_epochs or patience trains on); unchanged settings give the saved verdict.
        self.state.finished = self._stop_reason() is not None
        torch.set_rng_state(saved["rng"]["torch"])
        logger.info("resumed from %s after epoch %d", self.run_dir, self.state.epoch)
        return True

    def _checkpoint(self, numpy_rng: np.random.Generator) -> None:
        if self.run_dir is None or not self.group.is_main:
            return
        save_torch(
            {
                "model": self.model.state_dict(),
                "best_model": self.best_weights,
                "optimizer": None if self.optimizer is None else self.optimizer.state_dict(),
                "state": self.state.to_dict(),
                "rng": {"torch": torch.get_rng_state(), "numpy": numpy_rng.bit_generator.state},
            },
            self.run_dir / STATE,
        )
        write_metrics(self.state.history, self.run_dir)

    def _record(self, epoch: int, stats: EpochStats, metrics: dict[str, float] | None) -> None:
        row: dict[str, Any] = {
            "epoch": epoch,
            "loss": stats.loss,
            **{f"loss_{name}": value for name, value in stats.terms.items()},
            "epoch_seconds": round(stats.seconds, 3),
            "targets_per_second": round(stats.targets_per_second, 1),
            "elapsed_seconds": round(self.state.elapsed_seconds, 2),  # training + validation
        }
        if metrics is not None:
            row.update({f"valid_{k}": v for k, v in metrics.items()})
            value = metrics[self.config.train.monitor]
            if value > self.state.best_metric:
                self.state.best_metric, self.state.best_epoch = value, epoch
                self.state.epochs_without_improvement = 0
                self.best_weights = copy.deepcopy(self.model.state_dict())
            else:  # epochs since the best, not validations: the last epoch is always validated
                self.state.epochs_without_improvement = epoch - self.state.best_epoch
        self.state.epoch = epoch
        self.state.history.append(row)
        if self.group.is_main:
            self.on_epoch_end(row)

    def _stop_reason(self) -> str | None:
        """Why training is over after the epochs completed so far, or None."""
        train, state = self.config.train, self.state
        if state.epochs_without_improvement >= train.patience:
            return f"{train.monitor} did not improve for {train.patience} epochs (early stop)"
        if state.epoch >= train.max_epochs:
            return f"train.max_epochs {train.max_epochs} reached"
        if self._over_budget(state.elapsed_seconds):
            return f"time budget of {train.time_budget_minutes:g} minutes reached"
        return None

    def _over_budget(self, elapsed_seconds: float) -> bool:
        budget = self.config.train.time_budget_minutes
        return budget is not None and elapsed_seconds >= 60.0 * budget

    def train_steps(
        self, steps: Iterable[SeqBatch | list[SeqBatch]], progress: tqdm[Any] | None = None
    ) -> EpochStats:
        """``train_one_epoch`` over ``steps`` with this run's model, optimizer, device,
        gradient clipping and precision."""
        train = self.config.train
        return train_one_epoch(
            self.model,
            steps,
            self.optimizer,
            device=self.device,
            grad_clip=train.grad_clip,
            bf16=train.precision == "bf16",
            progress=progress,
            group=self.group,
        )

    def fit(self) -> FitResult:
        train = self.config.train
        started = time.perf_counter()
        while not self.state.finished and self.state.epoch < train.max_epochs:
            epoch = self.state.epoch + 1
            epoch_started = time.perf_counter()
            numpy_rng, sample_rng, torch_seed = epoch_randomness(train.seed, epoch, self.group)
            torch.manual_seed(torch_seed)
            with tqdm(
                total=len(self.batches),
                desc=f"epoch {epoch}",
                # None: only on a terminal
                disable=True if not train.progress or not self.group.is_main else None,
                leave=False,
                mininterval=1.0,
            ) as bar:
                stats = self.train_steps(self.batches.steps(numpy_rng, sample_rng), progress=bar)
            self.group.check_replicas(self.model)
            # Rank 0's clock decides the time budget on every rank. An epoch after which
            # training stops is validated whatever eval_every says: the last weights can be
            # the best, and a budget reached before any validation kept the initial weights.
            trained = self.state.elapsed_seconds + self.group.broadcast(
                time.perf_counter() - epoch_started
            )
            validate = (
                epoch % train.eval_every == 0
                or epoch == train.max_epochs
                or self._over_budget(trained)
            )
            metrics = self.validate() if validate else None
            self.state.elapsed_seconds += self.group.broadcast(time.perf_counter() - epoch_started)
            self._record(epoch, stats, metrics)
            reason = self._stop_reason()
            if reason is not None:
                logger.info("training stops after epoch %d: %s", epoch, reason)
                self.state.finished = True
            self._checkpoint(numpy_rng)
        self.model.load_state_dict(self.best_weights)
        if self.run_dir is not None and self.group.is_main:
            save_torch(self.best_weights, self.run_dir / WEIGHTS)
        return FitResult(
            best_epoch=self.state.best_epoch,
            best_metric=self.state.best_metric,
            epochs=self.state.epoch,
            history=self.state.history,
            train_seconds=time.perf_counter() - started,
            stop_reason=self._stop_reason(),
        )
