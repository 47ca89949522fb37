"""Tiny, distinct, non-power-of-two sizes: a swapped dimension fails loudly."""

from __future__ import annotations

B, L, S, NUM_ITEMS, NUM_USERS = 3, 7, 5, 37, 4

BASE = {"num_items": NUM_ITEMS, "num_users": NUM_USERS, "max_seq_len": L}

TINY_CONFIGS: dict[str, dict[str, object]] = {  # one line per registered model
    "pop": {**BASE},
    "sasrec": {**BASE, "hidden_size": 18, "num_heads": 2, "num_negatives": S, "dropout": 0.1},
}

# The dataset registry the foundation issue asks for (`seqrec data list`).
REQUIRED_DATASETS = [
    "ml-1m",
    "ml-100k",
    "amazon-beauty",
    "amazon-sports",
    "amazon-toys",
    "amazon-video-games",
    "yelp",
    "lastfm",
    "steam",
    "synthetic",
]
