"""The model contract shared by every recommender, the model registry and config building."""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from seqrec.batch import PAD_ID, BatchNeeds, ModelOutput, SeqBatch
from seqrec.config import (
    ConfigError,
    changed_from_default,
    from_dict,
    replace_checked,
    warn_once,
)
from seqrec.registry import Registry


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """Fields every model has. ``num_items``/``num_users`` come from the data, never from YAML."""

    name: ClassVar[str] = ""
    # Fields that evaluate/recommend may change on a trained model without retraining
    # (RecRec's reasoning depth); ``with_inference_settings`` accepts only these.
    inference_settings: ClassVar[tuple[str, ...]] = ()
    # The largest value of an integer inference setting that one served request may ask for:
    # the server answers one model call at a time, so an unbounded depth or beam would stall
    # every other request (evaluate and recommend, run by their user, are not limited).
    served_limits: ClassVar[Mapping[str, int]] = {}
    # A model fitted by counting in one pass over the data, not by gradient steps (PopRec):
    # nothing to split between data-parallel processes.
    learns_by_counting: ClassVar[bool] = False
    # Fields that may differ from the config of the run a model is warm-started from
    # (``train.init_from``); every other field must be equal (``warm_start_conflicts``).
    warm_start_free: ClassVar[tuple[str, ...]] = ()
    # Inference settings that choose how, not what, the model computes (a kernel): a run
    # trained elsewhere is rebuilt with this machine's choice as a warm start's source too.
    kernel_settings: ClassVar[tuple[str, ...]] = ()
    # Generative models whose items are semantic IDs: training fits (or loads) them from the
    # experiment's tokenizer section and hands them to ``set_semantic_ids``.
    uses_semantic_ids: ClassVar[bool] = False
    # Every target the loss trains is a non-PAD label of ``SeqBatch.labels``; none comes from
    # the inputs. False for BERT4Rec's cloze and BPR-MF's positives, which strided training
    # windows (``train.window_stride``, older labels PAD_ID) would train again.
    targets_from_labels: ClassVar[bool] = True
    # Fields that only shape the model's own training objective (its loss and negatives,
    # BERT4Rec's masking): a wrapper that trains it as a backbone with a loss of its own
    # (RecRec, ReaRec) refuses them in model.backbone_options, where they would do nothing.
    objective_fields: ClassVar[tuple[str, ...]] = ()
    # Integer fields that must be at least 1 besides the widths (``*_size``), which always
    # must: the others may be 0 (a SASRec of 0 blocks is the embedding-only ablation).
    at_least_one: ClassVar[tuple[str, ...]] = ()
    num_items: int  # catalogue size N; item ids are 1..N, 0 is padding
    num_users: int = 0  # users in the training data (models with a user embedding)
    max_seq_len: int = 50  # histories are truncated to their most recent max_seq_len items

    def __post_init__(self) -> None:
        if self.num_items < 1:
            raise ConfigError(f"model.num_items must be >= 1, got {self.num_items}")
        if self.max_seq_len < 1:
            raise ConfigError(f"model.max_seq_len must be >= 1, got {self.max_seq_len}")
        # Every model's integer fields are counts, sizes or depths: a width of 0, or any
        # negative value, would only fail later, deep inside a layer's constructor.
        for spec in dataclasses.fields(self):
            value = getattr(self, spec.name)
            if isinstance(value, bool) or not isinstance(value, int):
                continue
            least = 1 if spec.name.endswith("_size") or spec.name in self.at_least_one else 0
            if value < least:
                raise ConfigError(f"model.{spec.name} must be >= {least}, got {value}")

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, **dataclasses.asdict(self)}

    def warn_unread(self, names: Iterable[str], reason: str) -> None:
        """Those of ``names`` set away from their defaults, which this config never reads
        (``reason`` says why), change nothing: ``warn_once`` says so."""
        changed = [f"model.{name}" for name in changed_from_default(self, names)]
        if changed:
            verb = "does" if len(changed) == 1 else "do"
            warn_once(f"{', '.join(changed)} {verb} nothing {reason}")

    @property
    def needs_init_from(self) -> str | None:
        """Why training this model must start from another run's weights
        (``train.init_from``), or None when it trains from scratch."""
        return None

    def check_runnable(self, device: str | None = None) -> None:
        """Raise ``ConfigError`` when this machine cannot run the model as configured (an
        optional kernel it names is not installed), or not on ``device`` ("cpu", "cuda")
        when given; training checks it before reading data."""

    @property
    def batch_needs(self) -> BatchNeeds:
        """What training batches must carry besides inputs and labels (negatives, ...)."""
        return BatchNeeds()

    @property
    def loss_splits_by_rows(self) -> bool:
        """True when the loss is a mean over positions (the batch's labelled ones, or those
        ``ModelOutput.num_targets`` counts) of terms that each depend on their own row only:
        a batch can then be trained in parts, each part's loss weighted by its share of the
        positions (``train.batch_parts``, data-parallel ranks), with the whole batch's
        gradient. Random draws per row (dropout, BERT4Rec's masks) are drawn per part, so
        only the draws differ. False for anything that couples rows (in-batch negatives,
        contrastive terms)."""
        return False

    @property
    def loss_gathers_rows(self) -> bool:
        """True when the rows a loss couples (``loss_splits_by_rows`` false) meet only through
        ``seqrec.nn.row_gather.gather_rows``: data-parallel ranks can then share a batch, each
        gathering the others' rows. The parts of a batch in one process (``train.batch_parts``)
        cannot: they run one after another."""
        return False

    @property
    def updates_per_batch(self) -> int:
        """Optimizer steps the training loop takes on each batch (``training_updates``)."""
        return 1


class SequentialRecommender(nn.Module, ABC):
    """``forward(batch).loss`` trains; ``recommend(input_ids, k)`` serves and evaluates."""

    config_class: ClassVar[type[ModelConfig]]
    config: ModelConfig

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config

    @abstractmethod
    def forward(self, batch: SeqBatch) -> ModelOutput:
        """Training loss for a batch whose ``labels`` hold the next item at every position."""

    def training_updates(self, batch: SeqBatch) -> Iterator[ModelOutput]:
        """The losses of one batch's optimizer steps, in order (``config.updates_per_batch``
        of them): the training loop steps the optimizer on each before asking for the next,
        which is computed with the updated weights. By default one, ``forward``'s."""
        yield self(batch)

    @abstractmethod
    def recommend(
        self, input_ids: Tensor, k: int, exclude_seen: bool = True, users: Tensor | None = None
    ) -> Tensor:
        """(B, L) left-padded histories -> (B, k) item ids, best first.

        L may exceed max_seq_len (evaluation with filter-seen, serving): a model reads the last
        max_seq_len items, and ``exclude_seen`` excludes every item it is given. k is at most
        the catalogue (``top_items_of`` asks for no more); a row with fewer than k items to
        recommend (every other one seen, or no valid path) ends in PAD_ID."""

    @property
    def batch_needs(self) -> BatchNeeds:
        return self.config.batch_needs

    @property
    def uses_users(self) -> bool:
        """True when the model needs ``users`` (a user embedding) at train and inference time."""
        return False

    def set_semantic_ids(self, codes: Tensor) -> None:
        """(N + 1, M) item code paths, for models whose config ``uses_semantic_ids``."""
        raise TypeError(f"{self.config.name} does not use semantic IDs")


class ScoringRecommender(SequentialRecommender):
    """Models that score the whole catalogue; ``recommend`` is top-k over ``score``."""

    @abstractmethod
    def score(self, input_ids: Tensor, users: Tensor | None = None) -> Tensor:
        """(B, L) -> (B, N + 1) scores for the next item; column PAD_ID is ignored."""

    @torch.no_grad()
    def recommend(
        self, input_ids: Tensor, k: int, exclude_seen: bool = True, users: Tensor | None = None
    ) -> Tensor:
        scores = self.score(input_ids, users).float()  # (B, N + 1)
        scores[:, PAD_ID] = float("-inf")
        if exclude_seen:
            scores = scores.scatter(1, input_ids.long(), float("-inf"))
        k = min(k, scores.size(1) - 1)
        return scores.topk(k, dim=1).indices


MODELS: Registry[type[SequentialRecommender]] = Registry(
    "model",
    unknown_hint="a model of your own: register it with @register_model in a module, and "
    "load that with seqrec --import MODULE_OR_FILE or SEQREC_IMPORT",
)
M = TypeVar("M", bound=type[SequentialRecommender])
C = TypeVar("C", bound=ModelConfig)


def check_output_shape(
    model: SequentialRecommender, method: str, out: Tensor, shape: tuple[int, int], rule: str
) -> Tensor:
    """``out`` of ``model.method`` if it has the shape of the contract (``rule``, e.g.
    "(B, N + 1)"), else an error that says so, rather than an index error deep in the
    ranking or the metrics of a list shorter than k."""
    if tuple(out.shape) != shape:
        raise ValueError(
            f"{model.config.name}.{method} returned shape {tuple(out.shape)} for {shape[0]} "
            f"users; it must return {rule} = {shape}"
        )
    return out


def top_items_of(
    model: SequentialRecommender,
    input_ids: Tensor,
    k: int,
    exclude_seen: bool,
    users: Tensor | None = None,
) -> Tensor:
    """``model.recommend``, (B, k) padded with PAD_ID: it is asked for at most the catalogue
    (a k beyond it, from a user or eval.ks, would otherwise reach a model's own top-k)."""
    asked = min(k, model.config.num_items)
    top = model.recommend(input_ids, asked, exclude_seen, users)
    rule = "(B, k), padded with 0"
    check_output_shape(model, "recommend", top, (input_ids.size(0), asked), rule)
    return F.pad(top, (0, k - asked), value=PAD_ID)


def register_model(cls: M) -> M:
    """Class decorator: register under ``cls.config_class.name`` (the name is written once)."""
    if not (isinstance(cls, type) and issubclass(cls, SequentialRecommender)):
        raise TypeError(f"register_model: {cls!r} is not a SequentialRecommender subclass")
    name = getattr(cls.config_class, "name", "")
    if not isinstance(name, str) or not name:
        raise TypeError(
            f"register_model: {cls.__name__}.config_class has no name; give it "
            'name: ClassVar[str] = "..." (the model.name of configs)'
        )
    MODELS.register(name)(cls)
    return cls


_FROM_THE_DATA = frozenset({"num_items", "num_users"})  # model fields no config sets


def build_model_config(
    section: Mapping[str, Any], *, num_items: int, num_users: int = 0
) -> ModelConfig:
    """The ``model`` YAML section plus data facts -> the model's own strict config."""
    values = dict(section)
    name = values.pop("name", "sasrec")
    try:
        cls = MODELS.get(str(name)).config_class
    except KeyError as err:
        raise ConfigError(str(err.args[0])) from None
    for derived in _FROM_THE_DATA:
        if derived in values:
            raise ConfigError(f"model.{derived} comes from the data; remove it from the config")
    values.update(num_items=num_items, num_users=num_users)
    return from_dict(cls, values, "model", unlisted=_FROM_THE_DATA)


def build_model(config: ModelConfig) -> SequentialRecommender:
    return MODELS.get(config.name)(config)


def with_inference_settings(config: C, settings: Mapping[str, Any], device: str | None = None) -> C:
    """``config`` with some of its declared inference settings replaced, validated as when
    it was built and runnable (on ``device``, "cpu" or "cuda", when given); any other field
    is an error (changing it would need retraining)."""
    if not isinstance(settings, Mapping):
        raise ConfigError(
            f"inference settings must be a mapping of name to value (e.g. {{'depth': 2}}), "
            f"got {settings!r}"
        )
    if not settings:
        return config
    allowed = type(config).inference_settings
    fixed = sorted(set(settings) - set(allowed))
    if fixed:
        valid = ", ".join(f"model.{name}" for name in allowed) or "none"
        raise ConfigError(
            f"{', '.join(f'model.{name}' for name in fixed)} cannot change after training; "
            f"inference settings of {config.name!r}: {valid}"
        )
    changed = replace_checked(config, settings, "model")
    changed.check_runnable(device)
    return changed


def warm_start_conflicts(config: ModelConfig, source: ModelConfig) -> list[str]:
    """Fields of ``config`` that differ from ``source`` and are not declared warm-start free
    (``train.init_from`` refuses to load weights across them)."""
    if config.name != source.name:
        return ["name"]
    ours, theirs = dataclasses.asdict(config), dataclasses.asdict(source)
    free = set(type(config).warm_start_free)
    return sorted(key for key in ours if key not in free and ours[key] != theirs.get(key))


def model_config_from_dict(raw: Mapping[str, Any]) -> ModelConfig:
    """Rebuild a saved, fully resolved model config (``config.json``'s ``model`` section)."""
    values = dict(raw)
    name = str(values.pop("name"))
    return from_dict(MODELS.get(name).config_class, values, "model")
