"""The registry datasets in <repo>/../shared/data prepare to the statistics their READMEs state."""

from __future__ import annotations

from pathlib import Path

import pytest

from seqrec.config import DataConfig
from seqrec.data.datasets import DATASETS
from seqrec.data.prepare import prepare
from seqrec.data.readers import read_interactions

# (dataset, k for the user and item k-core, users, items, interactions), from the READMEs.
README_STATS = [
    ("ml-1m", 1, 6040, 3706, 1000209),
    ("ml-1m", 5, 6040, 3416, 999611),  # = SASRec's ml-1m.txt
    ("ml-100k", 1, 943, 1682, 100000),
    ("amazon-beauty", 5, 22363, 12101, 198502),
    ("amazon-sports", 5, 35598, 18357, 296337),
    ("amazon-toys", 5, 19412, 11924, 167597),
    ("amazon-video-games", 1, 31013, 23715, 287107),
    ("amazon-video-games", 5, 24303, 10672, 231780),  # iterative 5-core of SASRec's file
    ("yelp", 5, 30431, 20033, 316354),
    ("lastfm", 5, 1090, 3646, 52551),
]


def test_every_shared_registry_dataset_is_covered(shared_data: Path) -> None:
    present = {name for name in DATASETS if (shared_data / name).is_dir()}
    assert present == {name for name, *_ in README_STATS}


@pytest.mark.parametrize(("name", "k", "users", "items", "interactions"), README_STATS)
def test_shared_dataset_prepares_with_readme_stats(
    shared_data: Path, name: str, k: int, users: int, items: int, interactions: int
) -> None:
    config = DataConfig(dataset=name, min_user_interactions=k, min_item_interactions=k)
    prepared = prepare(config, shared_data, use_cache=False)
    assert (prepared.num_users, prepared.num_items, len(prepared.sequences.items)) == (
        users,
        items,
        interactions,
    )
    assert prepared.source.startswith(str(shared_data))
    spec = DATASETS[name]
    if k == 1:
        assert spec.stats == (users, items, interactions)


def test_ml_1m_default_config_and_cache_round_trip(shared_data: Path, tmp_path: Path) -> None:
    # Preparation and cache-load times are figures of benchmarks/data_prep.py, not tests.
    prepared = prepare(DataConfig(), shared_data, cache_dir=tmp_path)
    assert (prepared.num_users, prepared.num_items, len(prepared.sequences.items)) == (
        6040,
        3416,
        999611,
    )
    assert len(prepared.split.test) == len(prepared.split.valid) == 6040
    cached = prepare(DataConfig(), shared_data, cache_dir=tmp_path)
    assert cached.id_map == prepared.id_map
    assert (cached.sequences.items == prepared.sequences.items).all()
    assert (cached.split.test.targets == prepared.split.test.targets).all()


def test_reading_ml_1m_sequences(shared_data: Path) -> None:
    df = read_interactions(shared_data / "ml-1m" / "ml-1m.sequences.txt.gz")
    assert df.height == 1000209


def test_s3rec_files_keep_their_ids(shared_data: Path) -> None:
    prepared = prepare(DataConfig(dataset="lastfm"), shared_data, use_cache=False)
    assert prepared.id_map.items == [str(i) for i in range(1, 3647)]
    assert prepared.id_map.users == [str(u) for u in range(1, 1091)]


def test_ml_100k_global_temporal(shared_data: Path) -> None:
    config = DataConfig(dataset="ml-100k", split="global_temporal")
    prepared = prepare(config, shared_data, use_cache=False)
    split = prepared.split
    assert prepared.timestamps is not None
    assert 0 < len(split.test) < prepared.num_users
    assert 0 < len(split.valid) < prepared.num_users
    assert len(split.train.items) < 0.9 * len(prepared.sequences.items)
