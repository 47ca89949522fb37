"""Importing a model module registers it. Add new models here, nothing else."""

from seqrec.models import pop, sasrec
from seqrec.models.base import (
    MODELS,
    ModelConfig,
    ScoringRecommender,
    SequentialRecommender,
    build_model,
    build_model_config,
)

__all__ = [
    "MODELS",
    "ModelConfig",
    "ScoringRecommender",
    "SequentialRecommender",
    "build_model",
    "build_model_config",
    "pop",
    "sasrec",
]
