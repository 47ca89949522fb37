"""Analyses of trained models: residual dominance (Kozaki et al., RecSys 2026) and the SASRec
paper's attention maps. ``seqrec analyze residual|attention`` runs them from a run directory.

    from seqrec.analysis import residual_scale, run_residual, write_residual_report
    with residual_scale(model, 0.3):          # h = 0.3 x + Attn(x) in every attention block
        scores = model.score(input_ids)
"""

from seqrec.analysis.decomposition import contribution_norms, decompose, mixing_ratios
from seqrec.analysis.hooks import ResidualAnalyzable, analyzable, residual_scale, trace_encode
from seqrec.analysis.report import (
    ResidualOptions,
    ResidualResults,
    run_residual,
    write_residual_report,
)
from seqrec.analysis.residual import (
    last_item_hits,
    mixing_summary,
    position_ranks,
    recoverable,
    recovery,
    select_alpha,
    shuffle_histories,
)

__all__ = [
    "ResidualAnalyzable",
    "ResidualOptions",
    "ResidualResults",
    "analyzable",
    "contribution_norms",
    "decompose",
    "last_item_hits",
    "mixing_ratios",
    "mixing_summary",
    "position_ranks",
    "recoverable",
    "recovery",
    "residual_scale",
    "run_residual",
    "select_alpha",
    "shuffle_histories",
    "trace_encode",
    "write_residual_report",
]
