"""The dataset registry (``seqrec data list``) and where each dataset's file is found.

Each real dataset is the *published* preprocessed version that papers use; provenance,
statistics and checksums are in ``shared/data/<name>/README.md``. A data directory holds
``<data_dir>/<name>/<file>`` (``shared/data`` is one as is); gzipped and plain names are
both accepted. Resolution order for a real dataset:

1. the explicit data directory (argument, CLI ``--data-dir``);
2. ``$SEQREC_DATA_DIR``;
3. the user cache, ``<cache>/downloads/<name>/`` (cache = ``$SEQREC_CACHE_DIR``, else
   ``$XDG_CACHE_HOME/seqrec``, else ``~/.cache/seqrec``);
4. a download from the public URL into that cache folder (not when ``SEQREC_OFFLINE=1``
   or ``download=False``);
5. otherwise a ``DataError`` that says which file to put in which folder.

Within one folder the first listed file that exists wins (for ml-1m, ``ratings.dat`` with
timestamps before the order-only sequences file), and the first folder with any file wins.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from seqrec.data.download import Extract, download_file
from seqrec.data.readers import ReadFormat
from seqrec.data.schema import DataError

DATA_DIR_ENV = "SEQREC_DATA_DIR"
CACHE_DIR_ENV = "SEQREC_CACHE_DIR"
OFFLINE_ENV = "SEQREC_OFFLINE"

# Raw GitHub files at the commits named in shared/data/*/README.md.
_RAW = "https://raw.githubusercontent.com"
_S3REC = f"{_RAW}/RUCAIBox/CIKM2020-S3Rec/2a81540ae18615d88ef88227b0c066e5b74781e5/data"
_SASREC = f"{_RAW}/kang205/SASRec/e3738967fddab206d6eeb4fda433e7a7034dd8b1/data"
_BERT4REC = f"{_RAW}/FeiSun/BERT4Rec/615eaf2004abecda487a38d5b0c72f3dcfcae5b3/data"
_ML100K = (
    f"{_RAW}/deipss/BERT4Rec-VAE-Pytorch/a0246b6f3adf0781637e50a0464ace25d0174b26/Data/ml-100k"
)
_AMAZON_TERMS = (
    "Amazon review data (J. McAuley, UCSD), research use only; cite McAuley et al., SIGIR 2015 "
    "and He & McAuley, WWW 2016"
)


@dataclass(frozen=True)
class LocalFile:
    """A file name looked for in ``<dir>/<dataset>/``; ``x.gz`` also matches ``x`` and back."""

    name: str
    format: ReadFormat
    timestamps: bool

    def candidates(self) -> tuple[str, str]:
        other = self.name[:-3] if self.name.endswith(".gz") else self.name + ".gz"
        return self.name, other


@dataclass(frozen=True)
class Download:
    """Where to fetch a dataset; ``sha256`` is of the bytes as downloaded (see download.py)."""

    url: str
    filename: str  # the file it produces in <cache>/downloads/<dataset>/
    sha256: str | None  # None: no published checksum was found (the download is recorded)
    extract: Extract = "none"
    member: str | None = None  # for extract="zip"


@dataclass(frozen=True)
class DatasetSpec:
    name: str
    description: str
    files: tuple[LocalFile, ...]  # preferred first; empty for generated data
    download: Download | None
    citation: str  # citation and licence/terms line
    stats: tuple[int, int, int] | None = None  # users, items, interactions as published
    generated: bool = False

    @property
    def has_timestamps(self) -> bool:
        return self.generated or any(f.timestamps for f in self.files)


@dataclass(frozen=True)
class LocatedFile:
    """A dataset file found (or fetched) on disk."""

    path: Path
    file: LocalFile
    origin: str  # "data dir", "$SEQREC_DATA_DIR", "cache" or "downloaded"


def _s3rec(
    name: str, title: str, file: str, sha256: str, stats: tuple[int, int, int], terms: str
) -> DatasetSpec:
    users, items, actions = stats
    return DatasetSpec(
        name=name,
        description=(
            f"{title}, the S3-Rec/P5/TIGER version (5-core, order only, no timestamps): "
            f"{users:,} users / {items:,} items / {actions:,} interactions"
        ),
        files=(LocalFile(f"{file}.gz", "sequences", timestamps=False),),
        download=Download(f"{_S3REC}/{file}", file, sha256),
        citation=f"Zhou et al., S3-Rec, CIKM 2020 (RUCAIBox/CIKM2020-S3Rec); {terms}",
        stats=stats,
    )


DATASETS: dict[str, DatasetSpec] = {
    spec.name: spec
    for spec in (
        DatasetSpec(
            name="ml-1m",
            description=(
                "MovieLens-1M, all 1,000,209 ratings as time-ordered sequences "
                "(6,040 users / 3,706 items; 5-core: 3,416 items / 999,611 = SASRec's ml-1m); "
                "timestamps only when read from GroupLens ratings.dat"
            ),
            files=(
                LocalFile("ratings.dat", "movielens", timestamps=True),
                LocalFile("ml-1m.sequences.txt.gz", "sequences", timestamps=False),
            ),
            # sha256 of ml-1m.zip as published in tensorflow/examples
            # (lite/examples/recommendation/ml/data/example_generation_movielens.py,
            # MOVIELENS_ZIP_HASH) and secretflow; GroupLens' own md5 is c4d9eecf...2590906.
            download=Download(
                "https://files.grouplens.org/datasets/movielens/ml-1m.zip",
                "ratings.dat",
                "a6898adb50b9ca05aa231689da44c217cb524e7ebd39d264c56e2832f2c54e20",
                extract="zip",
                member="ml-1m/ratings.dat",
            ),
            citation=(
                "Harper & Konstan, The MovieLens Datasets, ACM TiiS 5(4) 2015; GroupLens "
                "licence: research use, no redistribution"
            ),
            stats=(6040, 3706, 1000209),
        ),
        DatasetSpec(
            name="ml-100k",
            description=(
                "MovieLens-100K raw ratings with unix timestamps: "
                "943 users / 1,682 items / 100,000 ratings"
            ),
            files=(LocalFile("u.data.gz", "movielens", timestamps=True),),
            download=Download(
                f"{_ML100K}/u.data",
                "u.data",
                "06416e597f82b7342361e41163890c81036900f418ad91315590814211dca490",
            ),
            citation=(
                "Harper & Konstan, The MovieLens Datasets, ACM TiiS 5(4) 2015; GroupLens "
                "licence: research use, no redistribution"
            ),
            stats=(943, 1682, 100000),
        ),
        _s3rec(
            "amazon-beauty",
            "Amazon Beauty 2014",
            "Beauty.txt",
            "226cce9c3105299ca0db9615d7d3fb32b3175e90da43100ae352599f0f0107b8",
            (22363, 12101, 198502),
            _AMAZON_TERMS,
        ),
        _s3rec(
            "amazon-sports",
            "Amazon Sports_and_Outdoors 2014",
            "Sports_and_Outdoors.txt",
            "2a095e0648872beb9982408958290f5d655db5be2911c3756b5446de9f0b8de2",
            (35598, 18357, 296337),
            _AMAZON_TERMS,
        ),
        _s3rec(
            "amazon-toys",
            "Amazon Toys_and_Games 2014",
            "Toys_and_Games.txt",
            "176c680c688d497598c4a89a03b402c0fe78d795e5db335c2e78dd5f2d778a3f",
            (19412, 11924, 167597),
            _AMAZON_TERMS,
        ),
        DatasetSpec(
            name="amazon-video-games",
            description=(
                "Amazon Video Games 2014, SASRec's Video.txt (single-pass >=5 filter, not an "
                "iterative 5-core; order only): 31,013 users / 23,715 items / 287,107; "
                "iterative 5-core gives 24,303 / 10,672 / 231,780"
            ),
            files=(LocalFile("Video.txt.gz", "pairs", timestamps=False),),
            download=Download(
                f"{_SASREC}/Video.txt",
                "Video.txt",
                "b7376fe24430743f411dc7f567285657b2adb3f74361cc7ba0aee94f3024b651",
            ),
            citation=f"Kang & McAuley, SASRec, ICDM 2018 (kang205/SASRec); {_AMAZON_TERMS}",
            stats=(31013, 23715, 287107),
        ),
        _s3rec(
            "yelp",
            "Yelp 2019 reviews (repeat visits kept)",
            "Yelp.txt",
            "724b219106b81dd2349027da997334ddb6da9fe2f152ad6e0d97a93170f7caed",
            (30431, 20033, 316354),
            "Yelp Dataset Terms of Use: academic, non-commercial use, no redistribution",
        ),
        _s3rec(
            "lastfm",
            "HetRec-2011 Last.fm artists (de-duplicated)",
            "LastFM.txt",
            "9ded486adb5b0fe9dc761950afa0a9a05e93ff018992e0c52bf11afec529f802",
            (1090, 3646, 52551),
            "HetRec 2011 Last.fm (Cantador et al.): non-commercial research use",
        ),
        DatasetSpec(
            name="steam",
            description=(
                "Steam reviews as BERT4Rec's steam.txt (`user item` per line, order only, "
                "about 3.7M interactions); download only, not in shared/data"
            ),
            files=(LocalFile("steam.txt", "pairs", timestamps=False),),
            # No published sha256 of BERT4Rec's data/steam.txt was found (one third-party
            # loader states 38,226,650 bytes), so the download is unverified and its digest
            # is recorded next to it (see download.py).
            download=Download(f"{_BERT4REC}/steam.txt", "steam.txt", None),
            citation=(
                "Kang & McAuley, SASRec, ICDM 2018; Sun et al., BERT4Rec, CIKM 2019 "
                "(FeiSun/BERT4Rec); Steam data by J. McAuley (UCSD), research use"
            ),
        ),
        DatasetSpec(
            name="synthetic",
            description=(
                "generated on the fly (data.synthetic_*): Zipf item popularity, drifting user "
                "interests, second-order item chains, repeats, interleaved integer timestamps"
            ),
            files=(),
            download=None,
            citation="seqrec.data.synthetic; no licence restrictions",
            generated=True,
        ),
    )
}


def get_dataset(name: str) -> DatasetSpec:
    """The registry entry, or a ``DataError`` listing the known names."""
    try:
        return DATASETS[name]
    except KeyError:
        raise DataError(
            f"unknown dataset {name!r}; known: {', '.join(DATASETS)} "
            "(or dataset: file with data.path)"
        ) from None


def datasets_with_timestamps() -> list[str]:
    """Names of the datasets that can be read with timestamps (for global_temporal)."""
    return [spec.name for spec in DATASETS.values() if spec.has_timestamps]


def user_cache_dir() -> Path:
    """``$SEQREC_CACHE_DIR``, else ``$XDG_CACHE_HOME/seqrec``, else ``~/.cache/seqrec``."""
    if os.environ.get(CACHE_DIR_ENV):
        return Path(os.environ[CACHE_DIR_ENV]).expanduser()
    if os.environ.get("XDG_CACHE_HOME"):
        return Path(os.environ["XDG_CACHE_HOME"]).expanduser() / "seqrec"
    return Path.home() / ".cache" / "seqrec"


def is_offline() -> bool:
    """True when ``$SEQREC_OFFLINE`` is set to anything but empty/0/false/no."""
    return os.environ.get(OFFLINE_ENV, "").strip().lower() not in ("", "0", "false", "no")


def find_in(spec: DatasetSpec, root: Path) -> tuple[Path, LocalFile] | None:
    """The preferred file of ``spec`` present under ``root/<name>/``, if any."""
    for file in spec.files:
        for name in file.candidates():
            path = root / spec.name / name
            if path.is_file():
                return path, file
    return None


def locate_dataset(
    name: str,
    data_dir: str | Path | None = None,
    *,
    cache_dir: str | Path | None = None,
    download: bool = True,
    timeout: float = 60.0,
) -> LocatedFile:
    """Find (or fetch) the file of a registry dataset, in the order of the module docstring."""
    spec = get_dataset(name)
    if spec.generated:
        raise DataError(f"dataset {name!r} is generated, it has no file")
    cache = Path(cache_dir) if cache_dir is not None else user_cache_dir()
    roots: list[tuple[Path, str]] = []
    if data_dir is not None:
        roots.append((Path(data_dir).expanduser(), "data dir"))
    if os.environ.get(DATA_DIR_ENV):
        roots.append((Path(os.environ[DATA_DIR_ENV]).expanduser(), f"${DATA_DIR_ENV}"))
    roots.append((cache / "downloads", "cache"))
    for root, origin in roots:
        found = find_in(spec, root)
        if found is not None:
            return LocatedFile(found[0], found[1], origin)
    problem = _try_download(spec, cache / "downloads", download, timeout)
    if problem is None:
        found = find_in(spec, cache / "downloads")
        assert found is not None, "a successful download must produce a listed file"
        return LocatedFile(found[0], found[1], "downloaded")
    raise DataError(_missing_message(spec, [r for r, _ in roots], cache, problem))


def _try_download(spec: DatasetSpec, root: Path, allowed: bool, timeout: float) -> str | None:
    """None on success, else why there is no download."""
    if spec.download is None:
        return "it has no public download"
    if not allowed:
        return "downloading was turned off (download=False)"
    if is_offline():
        return f"downloading is off because {OFFLINE_ENV}={os.environ[OFFLINE_ENV]}"
    d = spec.download
    try:
        download_file(
            d.url,
            root / spec.name / d.filename,
            sha256=d.sha256,
            extract=d.extract,
            member=d.member,
            timeout=timeout,
        )
    except DataError as err:
        return str(err)
    return None


def _missing_message(spec: DatasetSpec, searched: list[Path], cache: Path, problem: str) -> str:
    names = " or ".join(name for file in spec.files for name in file.candidates())
    where = ", ".join(
        f"{root / spec.name}{'' if root.is_dir() else f' ({root} does not exist)'}"
        for root in searched
    )
    hint = ""
    for root in searched:  # the dataset's own folder given for <DIR>
        if root.name == spec.name and find_in(spec, root.parent) is not None:
            hint = f"; {root} is the dataset's folder: pass its parent, --data-dir {root.parent}"
    return (
        f"dataset {spec.name!r} not found: put {names} into <DIR>/{spec.name}/ and pass "
        f"--data-dir <DIR> (or set {DATA_DIR_ENV}=<DIR>), or into "
        f"{cache / 'downloads' / spec.name}/; searched {where}{hint}; not downloaded: {problem}"
    )


def resolve_default_dataset(
    data_dir: str | Path | None = None,
    *,
    cache_dir: str | Path | None = None,
    timeout: float = 10.0,
) -> tuple[str, str]:
    """("ml-1m", where it is) when ML-1M is local, cached or downloads; else ("synthetic", why)."""
    try:
        located = locate_dataset("ml-1m", data_dir, cache_dir=cache_dir, timeout=timeout)
    except DataError as err:  # the caller reports the reason (the demo: twice was enough)
        return "synthetic", f"ML-1M is not available ({err})"
    return "ml-1m", f"{located.path} ({located.origin})"
