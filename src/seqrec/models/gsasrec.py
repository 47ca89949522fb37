"""gSASRec: SASRec trained with many negatives and gBCE (Petrov & Macdonald, RecSys 2023).

Paper: "gSASRec: Reducing Overconfidence in Sequential Recommendation Trained with Negative
Sampling", https://arxiv.org/abs/2308.07192 - reference code: github.com/asash/gSASRec-pytorch
(the authors' port of their TensorFlow original, github.com/asash/gsasrec).

gSASRec is SASRec's network with another objective: k sampled negatives per positive and the
generalised BCE, whose positive term is log sigma(s+)^beta with beta = alpha (t (1 - 1/alpha)
+ 1/alpha) and alpha = k / (N - 1) (``seqrec.losses.gbce``; t = 0 is SASRec's BCE). This class
is SASRec with the defaults of the authors' ML-1M config (``config_ml1m.py`` and its README):
d = 128, 2 blocks, 1 head, dropout 0.5, n = 200, k = 256, t = 0.75, and the reference's
architectural choices, each a SASRec switch: a separate output item embedding
(``reuse_item_embeddings=False``), no sqrt(d) scaling of the input embeddings, kang205's block
(``layout: reference``: only the queries are normalised, keys and values come from the
un-normalised input, and the residual is added to the normalised queries) and dropout on the
attention weights and inside the FFN (``dropout_placement: reference``).

Differences from the reference code, all deliberate:
- One set of k negatives per sequence, shared by its positions ((B, S)); the reference draws
  a set per position ((B, L, S)). Per-position sets cost a (B, L, k, d) gather, 3.4 GB at
  128 x 200 x 256 x 128; shared sets cost one (B, L, d) x (B, d, k) product and still give
  every batch 128 x 256 negatives. ``shared_negatives: false`` restores per-position sets.
- Negatives are drawn uniformly from the items the user never interacted with (the library's
  sampler). The reference draws from the whole catalogue, so a negative can be the target or
  another item of the history; a negative equal to the target is ignored here in any case.
- The loss is the mean over positions of beta * softplus(-s+) + sum_j softplus(s_j); the
  reference divides the same sum by positions * (k + 1), a constant factor Adam is all but
  invariant to, and computes it in float64 with sigma(s+) clamped to [1e-10, 1 - 1e-10] (no
  gradient for |s+| > 23); the softplus form is stable in float32 without either.
  alpha = k / (N - 1), as the port's README and the later versions of its training script;
  its first version had k / (N - 2).
- Padded keys are masked out of attention, as in every SASRec of the library (the reference
  masks keys whose vector is all zeros, which padding is: the same).
- The attention keeps SASRec's output projection W^O by default; the port has none, as
  kang205 (``attention_projection: false``). Its FFN has ReLU, as SASRec's (the port's first
  version had no activation there; ``activation: identity`` gives that network).
- Weights start from SASRec's Xavier-normal initialisation by default. The port calls no
  initialiser, so PyTorch's defaults hold there: embeddings N(0, 1) (40x SASRec's scale at
  d = 128) and linear layers uniform in +-1/sqrt(d), biases included (``init: torch``).
- An epoch is one pass over the users, as in the reference on ML-1M (its epoch is 100
  batches or one pass, whichever is shorter: 48 batches of 128 users). It validates on 512
  users after each and stops after 200 epochs without improvement.
- The split (the data pipeline's, not this model's): leave-one-out trains every user's items
  but the last two and validates on every user's second-to-last item. The reference trains
  the same items except for its 512 validation users, whose third-to-last item it holds out
  too, and validates on those 512 only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from seqrec.models.base import register_model
from seqrec.models.objective import LossName
from seqrec.models.sasrec import BlockLayout, DropoutPlacement, SASRec, SASRecConfig


@dataclass(frozen=True, kw_only=True)
class GSASRecConfig(SASRecConfig):
    name: ClassVar[str] = "gsasrec"
    # gBCE defines the model; t = 0 is BCE. Other losses: use ``sasrec``.
    supported_losses: ClassVar[tuple[LossName, ...]] = ("gbce",)
    max_seq_len: int = 200  # sequence_length
    hidden_size: int = 128  # embedding_dim of config_ml1m.py
    num_layers: int = 2  # num_blocks
    num_heads: int = 1
    dropout: float = 0.5  # dropout_rate of the README's ML-1M config and checkpoints
    # The reference drops the embeddings, the attention weights and after each FFN layer.
    dropout_placement: DropoutPlacement = "reference"
    layout: BlockLayout = "reference"  # kang205's block, as the reference
    shared_embedding: bool = False  # reuse_item_embeddings=False: a separate output table
    scale_embedding: bool = False  # the reference does not multiply embeddings by sqrt(d)
    loss: LossName = "gbce"
    num_negatives: int = 256  # negs_per_pos, k
    shared_negatives: bool = True  # one set per sequence; the reference draws per position
    gbce_t: float = 0.75  # calibration t; 1 = fully calibrated, 0 = BCE


@register_model
class GSASRec(SASRec):
    """SASRec's network trained with gBCE; everything but the defaults is inherited."""

    config_class = GSASRecConfig
    config: GSASRecConfig
