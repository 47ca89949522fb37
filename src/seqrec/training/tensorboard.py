"""Optional TensorBoard logging of the per-epoch rows (extra: ``seqrec[tensorboard]``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from seqrec.config import ConfigError
from seqrec.training.loop import EpochCallback


def check_tensorboard() -> None:
    """A ``ConfigError`` when the optional tensorboard package is missing."""
    try:
        from torch.utils.tensorboard import SummaryWriter  # noqa: F401
    except ImportError:  # torch imports tensorboard lazily; it is an optional extra
        raise ConfigError(
            "train.tensorboard: true needs the tensorboard package: "
            "pip install 'seqrec[tensorboard]'"
        ) from None


def tensorboard_callback(log_dir: Path, then: EpochCallback) -> EpochCallback:
    """An epoch callback that writes every numeric field as a scalar, then calls ``then``."""
    check_tensorboard()
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(log_dir=str(log_dir))

    def log(row: dict[str, Any]) -> None:
        for key, value in row.items():
            if key != "epoch" and isinstance(value, (int, float)):
                writer.add_scalar(key.replace("@", "_at_"), value, global_step=row["epoch"])
        writer.flush()
        then(row)

    return log
