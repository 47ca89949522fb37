"""A seeded synthetic interaction log with the structure sequence models are meant to exploit.

Generative story (all users advance one step at a time, vectorised across users):

* Items have a random popularity rank (Zipf-like weights ~ 1 / rank^a) and belong to one
  of ``num_items // ITEMS_PER_CLUSTER`` interest clusters.
* A cluster holds "chains": short fixed item sequences (length 4-8) whose slots are
  mostly items of that cluster, by popularity. Popular items sit in many chains, so the
  last item alone is ambiguous while the last two items usually identify the chain and
  hence the next item. This is what makes a second-order (or longer-context) model beat
  a first-order Markov model, and both beat popularity.
* Each user has ``INTERESTS_PER_USER`` interests; when a chain ends (or is abandoned) the
  user starts a new chain from the current interest (the least-consumed of a few
  candidates), now and then switching to another of their interests, and rarely
  replacing an interest by a new one (drift).
* Other steps re-consume an item seen 2-5 steps earlier (repeats) or pick a globally
  popular item (noise).
* Timestamps are integer seconds, strictly increasing per user; users start at different
  times and are active over overlapping windows, so a global time cut splits them.

Memory is O(users x longest sequence) plus a (users x min(items, 1024)) "seen" table,
so it is meant for demo and test sizes, not for millions of users.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import polars as pl

from seqrec.config import DataConfig
from seqrec.data.schema import ITEM_ID, TIMESTAMP, USER_ID, DataError

logger = logging.getLogger(__name__)

GENERATOR_VERSION = 1  # bump when the same seed would produce different data
ZIPF_EXPONENT = 1.0  # popularity of noise items and of interests
CHAIN_ITEM_ZIPF_EXPONENT = 0.7  # how unevenly items are placed into chains
CHAIN_ZIPF_EXPONENT = 0.5  # how unevenly chains are chosen
INTERESTS_PER_USER = 3
ITEMS_PER_CLUSTER = 100
P_IN_CLUSTER = 0.7  # a chain slot holds an item of the chain's own cluster
CHAINS_PER_ITEM = 2  # chains per cluster = this x items per cluster
CHAIN_LENGTHS = (4, 8)  # inclusive range
P_CONTINUE = 0.85  # follow the current chain
P_REPEAT = 0.04  # re-consume an item seen 2-5 steps ago
P_NOISE = 0.12  # a globally popular item
P_SWITCH = 0.15  # on a new chain: move to another of the user's interests
P_DRIFT = 0.03  # on a new chain: replace the current interest by a random cluster
CHAIN_CANDIDATES = 6  # a new chain is the least-seen of this many draws (fewer repeats)
SEEN_SLOTS = 1024  # width of the per-user "seen" table (items are hashed into it)
MIN_LENGTH, MAX_LENGTH = 5, 400
TIME_SPAN = 100_000_000  # seconds, about 3 years

Ints = npt.NDArray[np.int64]


def synthetic_interactions(config: DataConfig, mean_length: float = 50.0) -> pl.DataFrame:
    """``DataConfig.synthetic_*`` -> (user_id, item_id, timestamp), in global time order."""
    return generate(
        config.synthetic_users, config.synthetic_items, config.synthetic_seed, mean_length
    )


def _zipf(ranks: Ints, exponent: float) -> npt.NDArray[np.float64]:
    """Zipf-like weights ``1 / rank^exponent`` (ranks start at 1)."""
    return 1.0 / ranks.astype(np.float64) ** exponent


def _ranks(n: int, rng: np.random.Generator) -> Ints:
    """A random popularity rank 1..n per entry (entry 0 is not always the most popular)."""
    return rng.permutation(n).astype(np.int64) + 1


def _sample(
    cum: npt.NDArray[np.float64],
    low: npt.NDArray[np.float64],
    high: npt.NDArray[np.float64],
    rng: np.random.Generator,
) -> Ints:
    """Inverse-CDF draws from the segments [low, high) of a cumulative weight array."""
    pick = low + rng.random(low.shape) * (high - low)
    return np.minimum(np.searchsorted(cum, pick, side="right"), len(cum) - 1)


def _chains(
    item_rank: Ints, num_clusters: int, rng: np.random.Generator
) -> tuple[Ints, Ints, npt.NDArray[np.float64], Ints]:
    """Chains grouped by cluster: items (M, Lmax), lengths, cum weights, first chain per cluster.

    A chain slot holds an item of the chain's cluster with probability ``P_IN_CLUSTER``
    (by popularity inside the cluster), else any item by popularity: interests are item
    sets that leak into each other.
    """
    num_items = len(item_rank)
    popularity = _zipf(item_rank, CHAIN_ITEM_ZIPF_EXPONENT)
    cluster_of_item = rng.integers(num_clusters, size=num_items)
    cluster_of_item[:num_clusters] = np.arange(num_clusters)  # no cluster is empty
    by_cluster = np.argsort(cluster_of_item, kind="stable")
    cum_in = np.cumsum(popularity[by_cluster])
    bounds = np.concatenate([[0.0], cum_in])[
        np.searchsorted(cluster_of_item[by_cluster], np.arange(num_clusters + 1))
    ]
    cum_all = np.cumsum(popularity)

    num_chains = max(num_clusters, CHAINS_PER_ITEM * num_items)
    cluster_of_chain = np.sort(
        np.concatenate(
            [np.arange(num_clusters), rng.integers(num_clusters, size=num_chains - num_clusters)]
        )
    )
    lo, hi = CHAIN_LENGTHS
    shape = (num_chains, hi)
    c = np.broadcast_to(cluster_of_chain[:, None], shape)
    own = by_cluster[_sample(cum_in, bounds[c], bounds[c + 1], rng)]
    anywhere = _sample(cum_all, np.zeros(shape), np.full(shape, cum_all[-1]), rng)
    items = np.where(rng.random(shape) < P_IN_CLUSTER, own, anywhere)
    lengths = rng.integers(lo, hi + 1, size=num_chains)
    cum_weight = np.cumsum(_zipf(_ranks(num_chains, rng), CHAIN_ZIPF_EXPONENT))
    start = np.searchsorted(cluster_of_chain, np.arange(num_clusters + 1))
    return items, lengths, cum_weight, start


@dataclass(frozen=True)
class _World:
    """The fixed structure every user walks through."""

    chain_items: Ints  # (M, Lmax) items of each chain, grouped by cluster
    chain_len: Ints  # (M,)
    cum_weight: npt.NDArray[np.float64]  # (M,) cumulative chain weights
    base: npt.NDArray[np.float64]  # (K + 1,) cum_weight before each cluster's first chain
    global_p: npt.NDArray[np.float64]  # (N,) noise-item distribution
    num_clusters: int


def _world(num_items: int, rng: np.random.Generator) -> _World:
    num_clusters = max(2, num_items // ITEMS_PER_CLUSTER)
    item_rank = _ranks(num_items, rng)  # one ranking for chains and noise alike
    chain_items, chain_len, cum_weight, start = _chains(item_rank, num_clusters, rng)
    base = np.concatenate([[0.0], cum_weight])[start]
    global_p = _normalised(_zipf(item_rank, ZIPF_EXPONENT))
    return _World(chain_items, chain_len, cum_weight, base, global_p, num_clusters)


def _new_chains(
    world: _World, cluster: Ints, seen: npt.NDArray[np.bool_], rng: np.random.Generator
) -> Ints:
    """One chain per user from its cluster, the least-seen of ``CHAIN_CANDIDATES`` draws.

    ``seen``: (U, S) whether each user has consumed an item hashing to each slot (item % S).
    """
    U = len(cluster)
    shape = (CHAIN_CANDIDATES, U)
    low = np.broadcast_to(world.base[cluster], shape)
    high = np.broadcast_to(world.base[cluster + 1], shape)
    candidates = _sample(world.cum_weight, low, high, rng)  # (C, U)
    items = world.chain_items[candidates]  # (C, U, Lmax)
    overlap = seen[np.arange(U)[None, :, None], items % seen.shape[1]].sum(axis=2)  # (C, U)
    return candidates[overlap.argmin(axis=0), np.arange(U)]


def _walk(world: _World, lengths: Ints, rng: np.random.Generator) -> npt.NDArray[np.int32]:
    """(U, max length) item ids (0-based), zero past each user's length.

    Vectorised over users: users are processed longest first, so at step t the active
    ones are a prefix ``[:n]`` and the cost is proportional to the interactions.
    """
    num_users, steps = len(lengths), int(lengths.max())
    order = np.argsort(-lengths, kind="stable")
    active = np.searchsorted(-lengths[order], -np.arange(steps), side="right")  # n per step
    cluster_p = _normalised(_zipf(_ranks(world.num_clusters, rng), ZIPF_EXPONENT))
    interests = rng.choice(world.num_clusters, size=(num_users, INTERESTS_PER_USER), p=cluster_p)
    history = np.zeros((num_users, steps), dtype=np.int32)
    # Hashed to at most SEEN_SLOTS columns to bound memory; a collision only biases choices.
    width = min(len(world.global_p), SEEN_SLOTS)
    seen = np.zeros((num_users, width), dtype=bool)
    chain = np.full(num_users, -1, dtype=np.int64)
    pos = np.zeros(num_users, dtype=np.int64)
    slot = np.zeros(num_users, dtype=np.int64)
    for t in range(steps):  # one iteration per position, never per user
        n = int(active[t])
        rows = np.arange(n)
        draw = rng.random((5, n))
        has_next = (chain[:n] >= 0) & (pos[:n] + 1 < world.chain_len[np.maximum(chain[:n], 0)])
        cont = has_next & (draw[0] < P_CONTINUE)
        repeat = ~cont & (t >= 2) & (draw[1] < P_REPEAT)
        noise = ~cont & ~repeat & (draw[2] < P_NOISE)
        fresh = ~cont & ~repeat & ~noise

        switch = np.flatnonzero(fresh & (draw[3] < P_SWITCH))
        slot[switch] = rng.integers(INTERESTS_PER_USER, size=len(switch))
        drift = np.flatnonzero(fresh & (draw[4] < P_DRIFT))
        interests[drift, slot[drift]] = rng.integers(world.num_clusters, size=len(drift))
        new_chain = _new_chains(world, interests[rows, slot[:n]], seen[:n], rng)

        pos[:n] = np.where(cont, pos[:n] + 1, 0)
        chain[:n] = np.where(cont, chain[:n], np.where(fresh, new_chain, -1))
        item = world.chain_items[np.maximum(chain[:n], 0), pos[:n]]
        if t >= 2:
            lag = rng.integers(2, min(t, 5) + 1, size=n)
            item = np.where(repeat, history[rows, t - lag], item)
        noisy = rng.choice(len(world.global_p), size=(2, n), p=world.global_p)
        noisy = np.where(seen[rows, noisy[0] % width], noisy[1], noisy[0])  # prefer unseen
        item = np.where(noise, noisy, item)
        history[:n, t] = item
        seen[rows, item % width] = True
    out = np.empty_like(history)
    out[order] = history  # back to user order
    return out


def _timestamps(lengths: Ints, steps: int, rng: np.random.Generator) -> Ints:
    """(U, steps) strictly increasing per user; users start and stop at different times."""
    num_users = len(lengths)
    begin = rng.uniform(0, 0.7 * TIME_SPAN, size=num_users)
    duration = rng.uniform(0.05, 0.3, size=num_users) * TIME_SPAN
    gaps = rng.exponential(1.0, size=(num_users, steps)) * (duration / lengths)[:, None]
    return (begin[:, None] + np.cumsum(np.floor(gaps) + 1, axis=1)).astype(np.int64)


def generate(num_users: int, num_items: int, seed: int, mean_length: float = 50.0) -> pl.DataFrame:
    """(user_id, item_id, timestamp) with ids "0".."U-1" and "1".."N"; see the module docstring.

    Rows are in global time order, like a log.
    """
    if num_users < 1 or num_items < 2:
        raise DataError(
            f"synthetic data needs >= 1 user and >= 2 items, got {num_users} and {num_items}"
        )
    rng = np.random.default_rng(seed)
    world = _world(num_items, rng)
    sigma = 0.8  # lognormal lengths: a long tail of heavy users, mean ~= mean_length
    raw = rng.lognormal(np.log(mean_length) - sigma**2 / 2, sigma, size=num_users)
    lengths = np.clip(np.rint(raw), MIN_LENGTH, MAX_LENGTH).astype(np.int64)
    history = _walk(world, lengths, rng)
    steps = history.shape[1]
    times = _timestamps(lengths, steps, rng)

    mask = np.arange(steps)[None, :] < lengths[:, None]  # (U, steps)
    rows = np.broadcast_to(np.arange(num_users)[:, None], mask.shape)
    df = pl.DataFrame({USER_ID: rows[mask], ITEM_ID: history[mask] + 1, TIMESTAMP: times[mask]})
    df = df.sort(TIMESTAMP, maintain_order=True).with_columns(
        pl.col(USER_ID).cast(pl.String), pl.col(ITEM_ID).cast(pl.String)
    )
    logger.info(
        "synthetic: %d users, %d items, %d interactions (seed %d)",
        num_users,
        num_items,
        df.height,
        seed,
    )
    return df


def _normalised(weights: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    return weights / weights.sum()
