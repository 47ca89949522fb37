"""The SASRec paper's attention analyses (Kang & McAuley, ICDM 2018, Sec. IV-G).

- ``average_attention``: Fig. 4, average attention weights over the last 15 positions, per
  layer (heads averaged). Compare runs, e.g. with and without positional embedding, by
  passing several run directories to ``seqrec analyze attention``.
- ``genre_attention``: Fig. 5, ML-1M movies of four genres (Sci-Fi, Romance, Animation,
  Horror; 200 each), the average attention weight from a movie of genre A (query) to an
  earlier movie of genre B (key) in the test histories. The paper does not spell out its
  averaging; ours: over every (history, query position i, key position j < i) pair whose
  items are among the selected movies. The self pair (j = i) is excluded: it is always the
  same genre and would fill the diagonal by construction.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt
import torch

from seqrec.analysis.hooks import analyzable, padded_batches
from seqrec.batch import PAD_ID
from seqrec.data.idmap import IdMap
from seqrec.data.sequences import EvalSet
from seqrec.io import atomic_write_text
from seqrec.models.base import SequentialRecommender

logger = logging.getLogger(__name__)

GENRES = ("Sci-Fi", "Romance", "Animation", "Horror")
RECENT = 15  # the paper's Fig. 4 shows the last 15 positions


def _attention_weights(model: SequentialRecommender, input_ids: torch.Tensor) -> list[torch.Tensor]:
    """Per layer (B, L, L) head-averaged attention weights."""
    with torch.no_grad():
        _, weights = analyzable(model, users=True).encode(input_ids, need_weights=True)
    return [w.mean(dim=1).float().cpu() for w in weights]


@torch.no_grad()
def average_attention(
    model: SequentialRecommender,
    eval_set: EvalSet,
    *,
    recent: int = RECENT,
    batch_size: int = 256,
    device: torch.device | str = "cpu",
) -> list[npt.NDArray[np.float64]]:
    """Per layer, (recent, recent) mean attention weight of query i on key j over the test
    histories, right-aligned (last row: the newest position); NaN where no history reaches.
    Each cell averages the histories that have both positions."""
    model.eval()
    sums: list[torch.Tensor] = []
    counts: list[torch.Tensor] = []
    for _, input_ids in padded_batches(eval_set.histories, model.config.max_seq_len, batch_size):
        layers = _attention_weights(model, input_ids.to(device))
        ids = input_ids[:, -layers[0].size(-1) :] if layers else input_ids
        real = (ids != PAD_ID).cpu()
        L = real.size(1)
        valid = real[:, :, None] & real[:, None, :] & torch.ones(L, L, dtype=torch.bool).tril()
        pad = max(recent - L, 0)
        valid = torch.nn.functional.pad(valid[:, -recent:, -recent:], (pad, 0, pad, 0))
        for index, w in enumerate(layers):
            block = torch.nn.functional.pad(w[:, -recent:, -recent:].double(), (pad, 0, pad, 0))
            total = torch.where(valid, block, 0.0).sum(0)
            if index == len(sums):
                sums.append(total)
                counts.append(valid.sum(0))
            else:
                sums[index] += total
                counts[index] += valid.sum(0)
    return [
        torch.where(c > 0, s / c.clamp_min(1), float("nan")).numpy()
        for s, c in zip(sums, counts, strict=True)
    ]


# ----------------------------------------------------------------- genres (ML-1M)
def read_movie_genres(path: Path) -> dict[str, list[str]]:
    """GroupLens movies.dat (``MovieID::Title::Genre|Genre``, Latin-1) -> id -> genres."""
    genres: dict[str, list[str]] = {}
    for line in path.read_text(encoding="latin-1").splitlines():
        parts = line.split("::")
        if len(parts) == 3:
            genres[parts[0].strip()] = parts[2].strip().split("|")
    if not genres:
        raise ValueError(f"{path} has no 'MovieID::Title::Genres' lines")
    return genres


@dataclass(frozen=True)
class GenreSelection:
    """``group[item]`` = index into ``genres`` of each selected internal item id, else -1."""

    genres: tuple[str, ...]
    group: npt.NDArray[np.int64]  # (N + 1,)
    counts: tuple[int, ...]  # movies selected per genre


def select_genre_items(
    movie_genres: Mapping[str, Sequence[str]],
    id_map: IdMap,
    genres: Sequence[str] = GENRES,
    per_genre: int = 200,
    seed: int = 0,
) -> GenreSelection:
    """``per_genre`` movies of each genre, drawn (seeded) from the run's catalogue among the
    movies carrying exactly one of ``genres`` (so the groups are disjoint)."""
    wanted = {g: i for i, g in enumerate(genres)}
    pools: list[list[int]] = [[] for _ in genres]
    for internal, original in enumerate(id_map.items, start=1):
        hits = [wanted[g] for g in movie_genres.get(str(original), []) if g in wanted]
        if len(hits) == 1:
            pools[hits[0]].append(internal)
    rng = np.random.default_rng(seed)
    group = np.full(len(id_map.items) + 1, -1, dtype=np.int64)
    counts = []
    for index, pool in enumerate(pools):
        chosen = rng.permutation(np.asarray(pool, dtype=np.int64))[:per_genre]
        group[chosen] = index
        counts.append(len(chosen))
    return GenreSelection(tuple(genres), group, tuple(counts))


@torch.no_grad()
def genre_attention(
    model: SequentialRecommender,
    eval_set: EvalSet,
    selection: GenreSelection,
    *,
    batch_size: int = 256,
    device: torch.device | str = "cpu",
) -> tuple[list[npt.NDArray[np.float64]], list[npt.NDArray[np.int64]]]:
    """Per layer, (G, G) mean attention weight from a query item of genre A to an earlier
    key item of genre B (see the module docstring), and the number of pairs per cell."""
    model.eval()
    G = len(selection.genres)
    group = torch.from_numpy(selection.group)
    sums: list[torch.Tensor] = []
    counts: list[torch.Tensor] = []
    for _, input_ids in padded_batches(eval_set.histories, model.config.max_seq_len, batch_size):
        layers = _attention_weights(model, input_ids.to(device))
        ids = input_ids[:, -layers[0].size(-1) :].cpu() if layers else input_ids
        onehot = torch.nn.functional.one_hot(group[ids] + 1, G + 1)[..., 1:].double()  # (B, L, G)
        L = ids.size(1)
        earlier = torch.ones(L, L, dtype=torch.bool).tril(diagonal=-1).double()  # j < i
        pairs = torch.einsum("bia,ij,bjc->ac", onehot, earlier, onehot)
        for index, w in enumerate(layers):
            total = torch.einsum("bia,bij,bjc->ac", onehot, w.double() * earlier, onehot)
            if index == len(sums):
                sums.append(total)
                counts.append(pairs.clone())
            else:
                sums[index] += total
                counts[index] += pairs
    means = [
        torch.where(c > 0, s / c.clamp_min(1), float("nan")).numpy()
        for s, c in zip(sums, counts, strict=True)
    ]
    return means, [c.numpy().astype(np.int64) for c in counts]


def check_movies_file(path: str | Path) -> Path:
    """A movies.dat the user named (``--movies``): an existing file that reads as GroupLens
    movies.dat, else a ValueError saying what is wrong with it."""
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"--movies {path} is a directory, not a movies.dat file")
    if not path.exists():
        raise ValueError(f"--movies {path} does not exist")
    try:
        read_movie_genres(path)
    except OSError as err:
        raise ValueError(f"--movies {path} cannot be read: {err.strerror}") from None
    except ValueError:
        raise ValueError(
            f"--movies {path} is not a MovieLens movies.dat "
            "(no 'MovieID::Title::Genre|Genre' lines)"
        ) from None
    return path


def find_movies_file(
    dataset: str,
    source: str,
    data_dirs: Sequence[str | Path | None],
    explicit: str | Path | None,
    from_file: bool = False,
) -> tuple[Path | None, str]:
    """Where movies.dat is for a run, and a message saying where it was looked for.

    A file given explicitly must be a movies.dat (``check_movies_file``) and is used; when
    the run's items cannot be its movies (neither ML-1M nor a file of one's own, whose ids
    are the user's to vouch for) the message says their ids are read as MovieIDs. Only the
    search beside the data may come back empty-handed.
    """
    if explicit is not None:
        path = check_movies_file(explicit)
        if dataset != "ml-1m" and not from_file:
            return path, (
                f"genres from {path}, although this run's items are {dataset}'s, not ML-1M "
                "movies: their ids are read as MovieIDs"
            )
        return path, f"genres from {path}"
    if dataset != "ml-1m":
        return (
            None,
            f"genre attention is for ML-1M (movies.dat genres); this run's dataset is {dataset}",
        )
    places = [Path(d) / dataset / "movies.dat" for d in data_dirs if d]
    if source:
        places.append(Path(source).parent / "movies.dat")
    for place in places:
        if place.is_file():
            return place, f"genres from {place}"
    looked = ", ".join(str(p) for p in places) or "nowhere (no data directory known)"
    return (
        None,
        f"genre attention skipped: movies.dat not found (looked in {looked}; pass --movies FILE)",
    )


# ----------------------------------------------------------------- report
def run_labels(run_dirs: Sequence[str]) -> list[str]:
    """A distinct label per run directory: its folder name, or the path as given when names
    repeat.

    >>> run_labels(["runs/a/sasrec", "runs/b/sasrec", "runs/nope"])
    ['runs/a/sasrec', 'runs/b/sasrec', 'nope']
    """
    names = [Path(d).name or str(d) for d in run_dirs]
    labels = [n if names.count(n) == 1 else str(d) for n, d in zip(names, run_dirs, strict=True)]
    seen: dict[str, int] = {}
    unique = []
    for label in labels:  # the same directory twice: number the repeats
        seen[label] = seen.get(label, 0) + 1
        unique.append(label if seen[label] == 1 else f"{label} ({seen[label]})")
    return unique


@dataclass(frozen=True)
class AttentionRun:
    """One trained model to analyse: a label (its run directory), the model and its test set."""

    label: str
    model: SequentialRecommender
    test: EvalSet
    dataset: str
    id_map: IdMap
    movies: Path | None  # movies.dat for the genre analysis, when found
    movies_note: str  # where genres came from, or why they are unavailable


def _heatmap_rows(
    label: str, layers: Sequence[npt.NDArray[np.float64]], recent: int
) -> list[dict[str, object]]:
    """One row per cell; positions relative to the newest (0 = L, -1 = L-1, ...)."""
    return [
        {
            "run": label,
            "layer": layer + 1,
            "query": i - recent + 1,
            "key": j - recent + 1,
            "weight": float(value),
        }
        for layer, matrix in enumerate(layers)
        for (i, j), value in np.ndenumerate(matrix)
    ]


@dataclass
class _GenreResult:
    rows: list[dict[str, object]]  # long format: run, layer, query_genre, key_genre, ...
    maps: list[tuple[str, npt.NDArray[np.float64]]]  # (title, G x G) per layer
    section: list[str]  # Markdown lines


def _genre_result(
    run: AttentionRun, selection: GenreSelection, batch_size: int, device: torch.device | str
) -> _GenreResult:
    from seqrec.analysis.tables import markdown_table

    means, pairs = genre_attention(
        run.model, run.test, selection, batch_size=batch_size, device=device
    )
    genres = selection.genres
    result = _GenreResult([], [], [])
    for layer, (matrix, count) in enumerate(zip(means, pairs, strict=True)):
        result.maps.append((f"{run.label}: layer {layer + 1}", matrix))
        result.rows += [
            {
                "run": run.label,
                "layer": layer + 1,
                "query_genre": genres[a],
                "key_genre": genres[b],
                "weight": float(matrix[a, b]),
                "pairs": int(count[a, b]),
            }
            for a in range(len(genres))
            for b in range(len(genres))
        ]
        wide = [
            {"query genre": ga, **{gb: float(matrix[a, b]) for b, gb in enumerate(genres)}}
            for a, ga in enumerate(genres)
        ]
        same = float(np.nanmean(np.diag(matrix)))
        cross = float(np.nanmean(matrix[~np.eye(len(genres), dtype=bool)]))
        # The paper's block-diagonal pattern, genre by genre: a query genre attends most to
        # its own (a row's largest weight on the diagonal).
        own_first = int((np.diag(matrix) >= np.nanmax(matrix, axis=1)).sum())
        result.section += [
            f"### {run.label}, layer {layer + 1}",
            "",
            f"{run.movies_note}; movies per genre: "
            f"{dict(zip(genres, selection.counts, strict=True))}. A genre's largest weight is "
            f"on itself for {own_first} of {len(genres)} genres (the paper: all 4); mean "
            f"same-genre weight {same:.4g} vs cross-genre {cross:.4g} "
            f"({same / cross if cross > 0 else float('nan'):.3g}x).",
            "",
            markdown_table(wide),
            "",
        ]
    return result


def write_attention_report(
    runs: Sequence[AttentionRun],
    out: Path,
    *,
    recent: int = RECENT,
    per_genre: int = 200,
    seed: int = 0,
    batch_size: int = 256,
    device: torch.device | str = "cpu",
) -> tuple[Path, list[str]]:
    """Heatmaps for every run and genre matrices where genres are known; tables, figures and
    ``report.md`` into ``out``. Returns the report path and notes for the user."""
    from seqrec.analysis import figures
    from seqrec.analysis.tables import write_json, write_table

    out.mkdir(parents=True, exist_ok=True)
    notes: list[str] = []
    maps = [
        (
            run.label,
            average_attention(
                run.model, run.test, recent=recent, batch_size=batch_size, device=device
            ),
        )
        for run in runs
    ]
    write_table(
        [r for label, layers in maps for r in _heatmap_rows(label, layers, recent)],
        out / "attention_heatmaps",
    )

    genre = _GenreResult([], [], [])
    for run in runs:
        if run.movies is None:
            notes.append(f"{run.label}: {run.movies_note}")
            continue
        selection = select_genre_items(
            read_movie_genres(run.movies), run.id_map, GENRES, per_genre, seed
        )
        if min(selection.counts) < per_genre:
            counts = dict(zip(selection.genres, selection.counts, strict=True))
            notes.append(f"{run.label}: fewer than {per_genre} movies for some genres ({counts})")
        one = _genre_result(run, selection, batch_size, device)
        genre.rows += one.rows
        genre.maps += one.maps
        genre.section += one.section
    if genre.rows:
        write_table(genre.rows, out / "genre_attention")

    figs: dict[str, str] = {}
    missing = figures.matplotlib_missing()
    if missing:
        notes.append(missing)
    else:
        figs["heat"] = figures.attention_heatmaps(
            maps,
            f"Average attention weights, last {recent} positions (SASRec Fig. 4)",
            out / "fig_attention_heatmaps.png",
        ).name
        if genre.maps:
            figs["genre"] = figures.genre_heatmaps(
                genre.maps,
                GENRES,
                "Average attention between genres (SASRec Fig. 5)",
                out / "fig_genre_attention.png",
            ).name
    write_json({"runs": [r.label for r in runs], "notes": notes}, out / "summary.json")
    report = out / "report.md"
    atomic_write_text(
        report, _attention_markdown(notes, figs, genre.section, recent, per_genre, seed)
    )
    return report, notes


def _attention_markdown(
    notes: Sequence[str],
    figs: Mapping[str, str],
    genre_section: Sequence[str],
    recent: int,
    per_genre: int,
    seed: int,
) -> str:
    lines = [
        "# Attention analyses (SASRec paper, Sec. IV-G)",
        "",
        *[f"- **note**: {n}" for n in notes],
        "",
        f"## Average attention weights over the last {recent} positions (Fig. 4)",
        "",
        "Rows: query position i, columns: key position j (L = the newest item), heads averaged; "
        "each cell is the mean over the test histories that have both positions (a weight is a "
        "share of the row's attention over all keys, so a row of the window sums to at most 1). "
        "Compare a run with and without positional embedding by passing both run directories. "
        "Table: `attention_heatmaps.csv`.",
        "",
        f"![attention heatmaps]({figs['heat']})" if "heat" in figs else "_figure not drawn_",
        "",
        "## Genre x genre attention (Fig. 5, ML-1M)",
        "",
        "Mean attention weight from a query movie of the row's genre to an earlier movie (key, "
        "j < i) of the column's genre in the test histories; movies carrying exactly one of the "
        f"four genres, {per_genre} per genre drawn with seed {seed}."
        + (" Table: `genre_attention.csv`." if genre_section else ""),
        "",
        *(genre_section or ["_no run with genres (see the notes above)_", ""]),
        f"![genre attention]({figs['genre']})" if "genre" in figs else "",
        "",
    ]
    return "\n".join(lines)
