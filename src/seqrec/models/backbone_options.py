"""The backbone config of a wrapper model (RecRec, ReaRec): shared fields plus options.

A wrapper sets the backbone's size on itself (``SHARED_BACKBONE_FIELDS``) and anything else
under ``model.backbone_options``; every error about an option names it with that full key.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Any, TypeVar

from seqrec.config import ConfigError, from_dict
from seqrec.models.base import ModelConfig

SHARED_BACKBONE_FIELDS = ("hidden_size", "num_layers", "num_heads", "dropout", "max_seq_len")
OPTIONS_KEY = "model.backbone_options"
_FROM_DATA = ("num_items", "num_users")

C = TypeVar("C", bound=ModelConfig)


def backbone_config(cls: type[C], wrapper: ModelConfig, options: object) -> C:
    """``cls`` built from the wrapper's shared fields, its data sizes and ``options``. The
    backbone's loss defaults to CE; the wrapper computes its own loss from the hidden states."""
    if not isinstance(options, Mapping):
        raise ConfigError(f"{OPTIONS_KEY} must be a mapping, got {options!r}")
    clash = sorted(set(options) & {*SHARED_BACKBONE_FIELDS, *_FROM_DATA})
    if clash:
        raise ConfigError(
            f"{OPTIONS_KEY} may not set {', '.join(clash)}: set them on the model "
            "(num_items and num_users come from the data)"
        )
    objective = sorted(set(options) & set(cls.objective_fields))
    if objective:
        raise ConfigError(
            f"{OPTIONS_KEY} may not set {', '.join(objective)}: they shape {cls.name}'s own "
            f"training objective, and {wrapper.name} trains its backbone with its own loss"
        )
    valid = {f.name for f in dataclasses.fields(cls) if f.init}
    allowed = sorted(valid - {*SHARED_BACKBONE_FIELDS, *_FROM_DATA, *cls.objective_fields})
    unknown = sorted(set(options) - valid)
    if unknown:
        raise ConfigError(
            f"unknown key(s) {', '.join(f'{OPTIONS_KEY}.{key}' for key in unknown)}; "
            f"valid {OPTIONS_KEY} keys for {cls.name}: {', '.join(allowed)}"
        )
    values: dict[str, Any] = {name: getattr(wrapper, name) for name in SHARED_BACKBONE_FIELDS}
    values.update(loss="ce", **options)
    values.update(num_items=wrapper.num_items, num_users=wrapper.num_users)
    try:
        return from_dict(cls, values, OPTIONS_KEY)
    except ConfigError as err:  # the backbone's own checks name its fields model.<field>
        raise ConfigError(_under_options(str(err), options)) from None


def _under_options(message: str, options: Mapping[str, Any]) -> str:
    """``model.<option>`` -> ``model.backbone_options.<option>`` for the options given."""
    for key in options:
        message = re.sub(rf"\bmodel\.{re.escape(key)}\b", f"{OPTIONS_KEY}.{key}", message)
    return message
