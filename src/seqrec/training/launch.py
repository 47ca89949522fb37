"""Where torchrun placed this process, read from its environment (no torch import: the CLI
asks before it knows whether it will need torch)."""

from __future__ import annotations

import os


def launched_rank() -> int:
    """This process's rank as torchrun set it (0 when not launched by torchrun)."""
    return int(os.environ.get("RANK", "0")) if launched_world_size() > 1 else 0


def launched_world_size() -> int:
    """How many processes torchrun launched (1 when not launched by torchrun)."""
    return int(os.environ.get("WORLD_SIZE", "1"))
