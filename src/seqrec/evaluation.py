"""One evaluator for every model: full-catalogue ranking or the SASRec paper's sampled protocol.

Users are evaluated in chunks (memory stays bounded), sorted by history length so a chunk
pads only to its own longest history. Ranks are 0-based internally; ties count against the
model (see ``seqrec.metrics.rank_of_target``). Exports are 1-based. Several processes may
share the chunks (``EvalShare``: the ranks of a data-parallel training) and add up their
ranks, with the same result as one process.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import polars as pl
import torch
from torch import Tensor

from seqrec.batch import PAD_ID
from seqrec.config import ConfigError, EvalConfig, SplitChoice, warn_once
from seqrec.data.batches import left_padded
from seqrec.data.idmap import IdMap
from seqrec.data.sequences import EvalSet, PreparedData, Sequences
from seqrec.io import atomic_path, written_in_place
from seqrec.metrics import all_metrics, mean_and_ci, rank_in_topk, rank_of_target
from seqrec.models.base import (
    ScoringRecommender,
    SequentialRecommender,
    check_output_shape,
    top_items_of,
)

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class EvalShare:
    """This process ranks every ``count``-th chunk of users, from chunk ``index``; ``add_up``
    sums an array (int64 or float64, kept) over the processes (each holds zeros for the users
    it did not rank)."""

    index: int
    count: int
    add_up: Callable[[npt.NDArray[Any]], npt.NDArray[Any]]


@dataclass(frozen=True)
class EvalResult:
    """Mean metrics with 95% CI half-widths, and the per-user ranks behind them."""

    metrics: dict[str, float]
    ci95: dict[str, float]
    protocol: str  # a human-readable description, printed with every result
    split: str
    num_users: int
    ranks: npt.NDArray[np.int64] = field(repr=False)  # (U,) 1-based rank of each target
    users: npt.NDArray[np.int64] = field(repr=False)  # (U,) user row indices
    targets: npt.NDArray[np.int64] = field(repr=False)  # (U,) internal item ids
    # A model that returns only its top-K list (generative) ranks the targets within it: a
    # rank above ranked_within means "not in the list" (a miss at every k <= ranked_within).
    ranked_within: int | None = None

    @property
    def list_note(self) -> str | None:
        """What ``ranked_within`` means, for a reader of the results; None for a ranking."""
        if self.ranked_within is None:
            return None
        return (
            f"ranked within the model's own top-{self.ranked_within} list (a target outside it "
            f"is a miss at every k <= {self.ranked_within})"
        )

    def flat(self) -> dict[str, float | int | str | None]:
        """One flat dict: ``"NDCG@10"`` keys, their ``"NDCG@10_ci95"`` and the protocol; an
        undefined figure (the interval of one user, the mean of none) is None: JSON holds
        null, and no NaN."""
        figures = {**self.metrics, **{f"{k}_ci95": v for k, v in self.ci95.items()}}
        row: dict[str, float | int | str | None] = {
            key: value if math.isfinite(value) else None for key, value in figures.items()
        }
        row.update(protocol=self.protocol, split=self.split, num_users=self.num_users)
        if self.ranked_within is not None:
            row["ranked_within"] = self.ranked_within
        return row


def describe_protocol(config: EvalConfig, num_items: int, short_users: int = 0) -> str:
    """``short_users``: users of the sampled protocol with fewer unseen items than
    ``num_negatives``, ranked against all of theirs (see ``NegativeSampler.sample``)."""
    if config.protocol == "full":
        seen = "filter-seen" if config.filter_seen else "seen items kept"
        return f"full ranking over all {num_items} items, {seen}, ties count against the model"
    short = (
        f"; {short_users} users had fewer unseen items and were ranked against all of them"
        if short_users
        else ""
    )
    return (
        f"sampled: target + {config.num_negatives} {config.negative_sampling}-sampled items the "
        f"user never interacted with{short} (not comparable with full ranking), "
        "ties count against the model"
    )


def check_protocol_fits(config: EvalConfig, num_items: int) -> None:
    """Refuse a sampled protocol the catalogue cannot hold: a user has interacted with at least
    the target, so at most ``num_items - 1`` items are left to draw negatives from. Warn about
    a cut-off that every target makes."""
    candidates = config.num_negatives + 1 if config.protocol == "sampled" else num_items
    too_large = [k for k in config.ks if k >= candidates]
    if too_large and candidates <= num_items:
        ranked = (
            f"the {candidates} candidates (target + eval.num_negatives)"
            if config.protocol == "sampled"
            else f"the catalogue of {candidates} items"
        )
        ks, verb = ", ".join(map(str, too_large)), "is" if len(too_large) == 1 else "are"
        warn_once(
            f"eval.ks {ks} {verb} not below {ranked}: every target ranked is within "
            f"it, so HR@{too_large[0]} says nothing about the model"
        )
    if config.protocol != "sampled" or config.num_negatives <= num_items - 1:
        return
    if num_items < 2:
        raise ConfigError(
            f"eval.num_negatives={config.num_negatives}: the catalogue has {num_items} item, "
            "none left to sample besides the target; use eval.protocol: full"
        )
    raise ConfigError(
        f"eval.num_negatives={config.num_negatives} is more than the catalogue of {num_items} "
        f"items holds besides the target; the largest value that works is {num_items - 1}"
    )


class NegativeSampler:
    """Items a user never interacted with, without replacement, uniform or by popularity.

    Exact sampling without replacement by random keys: uniform keys (or Efraimidis-Spirakis
    keys log(u) / w for popularity weights w), seen items pushed out, the k best keys kept.
    """

    def __init__(
        self, all_sequences: Sequences, num_items: int, weights: Tensor | None, seed: int
    ) -> None:
        self._all = all_sequences
        self._num_items = num_items
        self._weights = None if weights is None else weights.double().clamp_min(1e-12)
        self._generator = torch.Generator().manual_seed(seed)

    def sample(self, users: npt.NDArray[np.int64], k: int) -> Tensor:
        """(U,) user rows -> (U, k) item ids (PAD_ID where a user has fewer unseen items: a
        heavy user gets every unseen item once, never a repeat; ``k`` <= N - 1)."""
        seen = self._all.take(users)
        keys = torch.rand(
            len(users), self._num_items + 1, generator=self._generator, dtype=torch.float64
        )
        if self._weights is not None:
            keys = keys.log() / self._weights  # Efraimidis-Spirakis: larger is likelier
        keys[:, PAD_ID] = float("-inf")
        keys[torch.from_numpy(seen.row_ids()), torch.from_numpy(seen.items.astype(np.int64))] = (
            float("-inf")
        )
        top = keys.topk(min(k, self._num_items), dim=1)
        return torch.where(top.values.isfinite(), top.indices, PAD_ID)

    def skip(self, num_users: int) -> None:
        """Advance the generator past the draws of ``num_users`` users (another process's
        chunk), so that the next chunk gets the negatives it gets in one process."""
        torch.rand(num_users, self._num_items + 1, generator=self._generator, dtype=torch.float64)


CPU_CHUNK_POSITIONS = 12800  # history positions per evaluation chunk on a CPU (see EvalConfig)


def chunk_users(config: EvalConfig, max_seq_len: int, device: torch.device | str) -> int:
    """Users per evaluation chunk: ``config.batch_size``, or the device's default."""
    if config.batch_size is not None:
        return config.batch_size
    if torch.device(device).type != "cpu":
        return 1024
    return max(16, CPU_CHUNK_POSITIONS // max(max_seq_len, 1))


def _chunks(lengths: npt.NDArray[np.int64], size: int) -> list[npt.NDArray[np.int64]]:
    order = np.argsort(lengths, kind="stable")
    return [order[i : i + size] for i in range(0, len(order), size)]


ScoreVariants = Callable[[Tensor, Tensor], Iterable[Tensor]]
"""(B, L) histories, (B,) users -> one (B, N + 1) score matrix per variant being compared;
a generator keeps only one of them in memory at a time."""


def _ranks_from_scores(
    scores: Tensor,
    targets: Tensor,
    history: tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]],
    candidates: Tensor | None,
    config: EvalConfig,
) -> Tensor:
    """(B, N + 1) scores -> (B,) 0-based rank of each target under the protocol."""
    scores = scores.float().cpu()
    if candidates is not None:  # sampled: column 0 is the target, then the negatives
        cand = torch.cat([targets.unsqueeze(1), candidates], dim=1)
        cand_scores = scores.gather(1, cand).masked_fill(cand == 0, float("-inf"))
        cand_scores[:, 0] = scores.gather(1, targets.unsqueeze(1)).squeeze(1)
        return rank_of_target(cand_scores, torch.zeros_like(targets))
    if config.filter_seen:
        rows, cols = history
        scores[torch.from_numpy(rows), torch.from_numpy(cols)] = float("-inf")
    return rank_of_target(scores[:, 1:], targets - 1)  # drop the padding column


def _whole_histories(
    histories: Sequences, rows: npt.NDArray[np.int64], device: torch.device | str
) -> Tensor:
    """(B, longest) left-padded histories, uncut: a top-k model reads its last max_seq_len
    items and excludes every item it is given."""
    longest = int(histories.lengths[rows].max(initial=1))
    return torch.from_numpy(left_padded(histories, rows, longest)).to(device)


def _generative_ranks(
    model: SequentialRecommender,
    input_ids: Tensor,
    users: Tensor,
    targets: Tensor,
    config: EvalConfig,
) -> Tensor:
    """(B,) 0-based rank of each target inside the model's top max(ks); max(ks) if absent."""
    K = max(config.ks)
    topk = top_items_of(model, input_ids, K, config.filter_seen, users)
    return rank_in_topk(topk.cpu(), targets, missing=K)


def _model_scores(model: SequentialRecommender) -> ScoreVariants | None:
    """The single-variant scorer of a scoring model; None for a generative model."""
    if not isinstance(model, ScoringRecommender):
        return None
    return lambda input_ids, users: [model.score(input_ids, users)]


def evaluate(
    model: SequentialRecommender,
    eval_set: EvalSet,
    config: EvalConfig,
    *,
    all_sequences: Sequences,
    num_items: int,
    item_counts: npt.NDArray[np.int64] | None = None,
    device: torch.device | str = "cpu",
    split: str = "test",
    share: EvalShare | None = None,
) -> EvalResult:
    """Rank every target of ``eval_set`` and compute every metric at every k.

    Models that only return a top-k list (no ``score``) are ranked inside their top
    max(ks): a target outside it gets rank max(ks) + 1, which no metric at any k counts.

    all_sequences: every user's full sequence; sampled negatives avoid all of it.
    item_counts: (N + 1,) training popularity, needed for popularity-sampled negatives.
    """
    (result,) = evaluate_variants(
        model,
        eval_set,
        config,
        _model_scores(model),
        all_sequences=all_sequences,
        num_items=num_items,
        item_counts=item_counts,
        device=device,
        split=split,
        share=share,
    )
    return result


@torch.inference_mode()
def evaluate_variants(
    model: SequentialRecommender,
    eval_set: EvalSet,
    config: EvalConfig,
    variants: ScoreVariants | None,
    *,
    all_sequences: Sequences,
    num_items: int,
    item_counts: npt.NDArray[np.int64] | None = None,
    device: torch.device | str = "cpu",
    split: str = "test",
    share: EvalShare | None = None,
) -> list[EvalResult]:
    """``evaluate`` for several scorings of one model in one pass over the users, e.g. every
    inference depth of a reasoning model, sharing the encoder's work: one result per score
    matrix ``variants`` returns, each ranked against the same sampled negatives.
    ``variants`` None ranks a generative model inside its top max(ks). With ``share``, this
    process ranks its share of the chunks and every process returns the whole result."""
    check_protocol_fits(config, num_items)
    model.eval()
    max_len = model.config.max_seq_len
    short_users = 0
    sampler = None
    if config.protocol == "sampled":
        if variants is None:
            raise ValueError(
                f"the sampled protocol ranks candidates by score; {model.config.name} only "
                "returns a top-k list, so evaluate it with protocol: full"
            )
        sampler = _negative_sampler(config, all_sequences, num_items, item_counts)
    ranks: list[npt.NDArray[np.int64]] = []
    histories = eval_set.histories
    for number, chunk in enumerate(
        _chunks(histories.lengths, chunk_users(config, max_len, device))
    ):
        if share is not None and number % share.count != share.index:
            if sampler is not None:
                sampler.skip(len(chunk))
            continue
        input_ids = torch.from_numpy(left_padded(histories, chunk, max_len)).to(device)
        users = torch.from_numpy(eval_set.users[chunk]).to(device)
        targets = torch.from_numpy(eval_set.targets[chunk].astype(np.int64))
        if variants is None:  # generative models: rank inside their top-K
            # filter-seen excludes the whole history, as for scoring models
            given = _whole_histories(histories, chunk, device) if config.filter_seen else input_ids
            chunk_ranks = [_generative_ranks(model, given, users, targets, config)]
        else:
            sub = histories.take(chunk)
            history = (sub.row_ids(), sub.items.astype(np.int64))
            candidates = None
            if sampler is not None:
                candidates = sampler.sample(eval_set.users[chunk], config.num_negatives)
                short_users += int((candidates == PAD_ID).any(dim=1).sum())
            chunk_ranks = [
                _ranks_from_scores(
                    check_output_shape(
                        model, "score", scores, (len(chunk), num_items + 1), "(B, N + 1)"
                    ),
                    targets,
                    history,
                    candidates,
                    config,
                )
                for scores in variants(input_ids, users)
            ]
        if not ranks:
            ranks = [np.zeros(len(eval_set), dtype=np.int64) for _ in chunk_ranks]
        if len(chunk_ranks) != len(ranks):
            raise ValueError(
                f"the scorer returned {len(chunk_ranks)} variants for one chunk and "
                f"{len(ranks)} for another"
            )
        for variant_ranks, chunk_rank in zip(ranks, chunk_ranks, strict=True):
            variant_ranks[chunk] = chunk_rank.numpy()
    if share is not None:
        ranks, short_users = _added_up(ranks, short_users, share, len(eval_set))
    # a top-K list holds at most the catalogue
    ranked_within = min(max(config.ks), num_items) if variants is None else None
    return [
        _result(variant_ranks, eval_set, config, num_items, split, short_users, ranked_within)
        for variant_ranks in ranks or [np.zeros(0, dtype=np.int64)]
    ]


def _negative_sampler(
    config: EvalConfig,
    all_sequences: Sequences,
    num_items: int,
    item_counts: npt.NDArray[np.int64] | None,
) -> NegativeSampler:
    weights = None
    if config.negative_sampling == "popularity":
        if item_counts is None:
            raise ValueError("popularity-sampled negatives need item_counts")
        weights = torch.from_numpy(item_counts.astype(np.float64))
    return NegativeSampler(all_sequences, num_items, weights, config.seed)


def _added_up(
    ranks: list[npt.NDArray[np.int64]], short_users: int, share: EvalShare, num_users: int
) -> tuple[list[npt.NDArray[np.int64]], int]:
    """Every process's ranks (and short users) summed. A process that ranked no chunk (more
    processes than chunks) learns the number of variants from those that did."""
    variant_total, rankers = share.add_up(np.array([len(ranks), int(bool(ranks))], np.int64))
    variants = int(variant_total // rankers) if rankers else 0
    mine = ranks or [np.zeros(num_users, dtype=np.int64) for _ in range(variants)]
    flat = share.add_up(np.concatenate([*mine, [short_users]]).astype(np.int64))
    return [flat[v * num_users : (v + 1) * num_users] for v in range(len(mine))], int(flat[-1])


def _result(
    ranks: npt.NDArray[np.int64],
    eval_set: EvalSet,
    config: EvalConfig,
    num_items: int,
    split: str,
    short_users: int = 0,
    ranked_within: int | None = None,
) -> EvalResult:
    per_user = all_metrics(torch.from_numpy(ranks), config.ks)
    means = {name: mean_and_ci(values) for name, values in per_user.items()}
    return EvalResult(
        metrics={name: m for name, (m, _) in means.items()},
        ci95={name: ci for name, (_, ci) in means.items()},
        protocol=describe_protocol(config, num_items, short_users),
        split=split,
        num_users=len(eval_set),
        ranks=ranks + 1,
        users=eval_set.users.astype(np.int64),
        targets=eval_set.targets.astype(np.int64),
        ranked_within=ranked_within,
    )


def evaluate_model(
    model: SequentialRecommender,
    data: PreparedData,
    config: EvalConfig,
    *,
    split: SplitChoice = "test",
    device: torch.device | str = "cpu",
    share: EvalShare | None = None,
) -> EvalResult:
    """Evaluate ``model`` on the test (or validation) users of ``data``."""
    (result,) = evaluate_model_variants(
        model, data, config, _model_scores(model), split=split, device=device, share=share
    )
    return result


def evaluate_model_variants(
    model: SequentialRecommender,
    data: PreparedData,
    config: EvalConfig,
    variants: ScoreVariants | None,
    *,
    split: SplitChoice = "test",
    device: torch.device | str = "cpu",
    share: EvalShare | None = None,
) -> list[EvalResult]:
    """``evaluate_variants`` on the test (or validation) users of ``data``."""
    return evaluate_variants(
        model,
        data.eval_set(split),
        config,
        variants,
        all_sequences=data.sequences,
        num_items=data.num_items,
        item_counts=data.item_counts(),
        device=device,
        split=split,
        share=share,
    )


RANK_COLUMNS = ("user_id", "target", "rank")  # what a rank file must hold
# What export_ranks writes: also the protocol, so that files of two protocols are not compared
# (files written before it have the three columns only).
RANK_FILE_COLUMNS = (*RANK_COLUMNS, "protocol")
_CSV_HEADERS = tuple(",".join(columns).encode() for columns in (RANK_COLUMNS, RANK_FILE_COLUMNS))


def is_rank_file(path: Path) -> bool:
    """Whether the existing file ``path`` is a rank file ``export_ranks`` wrote: exactly its CSV
    header line, or exactly its parquet columns. Only the header line or the schema is read."""
    with path.open("rb") as handle:  # unreadable: the OSError says so, rather than a guess
        if path.suffix.lower() != ".parquet":
            line = handle.readline(max(map(len, _CSV_HEADERS)) + 2).rstrip(b"\r\n")
            return line in _CSV_HEADERS
    try:
        return tuple(pl.read_parquet_schema(path)) in (RANK_COLUMNS, RANK_FILE_COLUMNS)
    except (pl.exceptions.PolarsError, OSError):  # not parquet at all
        return False


def check_rank_export(path: str | Path) -> None:
    """Refuse a path ``export_ranks`` must not write: another suffix than .csv or .parquet, or
    an existing file it did not write (someone's data, the run's own files). A FIFO or
    ``/dev/stdout`` is written in place and is not read."""
    path = Path(path)
    if path.suffix.lower() not in (".csv", ".parquet"):
        raise ValueError(f"--export-ranks: use a .csv or .parquet file name, got {path.name}")
    if path.is_file() and not written_in_place(path) and not is_rank_file(path):
        raise ValueError(
            f"--export-ranks: {path} exists and is not a rank file written by seqrec evaluate; "
            "remove it or choose another path"
        )


def export_ranks(result: EvalResult, id_map: IdMap, path: str | Path) -> None:
    """One row per evaluated user: ``user_id``, ``target`` (original ids), 1-based ``rank``
    (empty for a target outside a generative model's list, ``EvalResult.ranked_within``), and
    the ``protocol``.

    An existing file is only replaced when it is an earlier rank export (``check_rank_export``).
    """
    path = Path(path)
    check_rank_export(path)
    ranks = pl.Series("rank", result.ranks, dtype=pl.Int64)
    if result.ranked_within is not None:
        ranks = pl.select(
            pl.when(ranks <= result.ranked_within).then(ranks).otherwise(None)
        ).to_series()
    frame = pl.DataFrame(
        {
            "user_id": [id_map.users[u] for u in result.users],
            "target": id_map.item_to_original(result.targets),
            "rank": ranks,
            "protocol": [result.protocol] * len(ranks),
        }
    )
    with atomic_path(path) as tmp:
        if path.suffix.lower() == ".csv":
            frame.write_csv(tmp)
        else:
            frame.write_parquet(tmp)
