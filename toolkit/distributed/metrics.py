"""Error counts summed across ranks: each rank scores a disjoint set of utterances with
:func:`toolkit.utils.metrics.utterance_counts`, and one ``all_reduce`` adds the integer counts. Rates are computed
from the sums afterwards, so the result is exact and independent of the number of ranks (an average of per-rank
rates would weight ranks, not words).
"""

from __future__ import annotations

from typing import Mapping, Sequence

import torch
import torch.distributed as dist

from toolkit.distributed.collectives import all_reduce_sum
from toolkit.distributed.main_only import check_collective
from toolkit.utils.metrics import UNITS, ErrorCounts, sum_counts, utterance_counts


def all_reduce_counts(counts: Sequence[ErrorCounts]) -> list[ErrorCounts]:
    """Element-wise sum over ranks of a list of counts (same length and meaning on every rank), as one int64
    ``all_reduce``; the identity without a process group.

    Raises:
        CollectiveInMainOnlySection: called inside a main-only section.
    """
    if not counts:
        check_collective("all_reduce_counts")
        return []
    table = torch.tensor([c.as_tuple() for c in counts], dtype=torch.int64)  # (len, 5)
    return [ErrorCounts(*row) for row in all_reduce_sum(table, "all_reduce_counts").tolist()]


def score_across_ranks(references: Mapping[str, str], hyps: Mapping[str, Mapping[str, str]],
                       owner: Mapping[str, int], units: Sequence[str] = UNITS) -> dict[str, dict[str, ErrorCounts]]:
    """Corpus counts of every mode and unit, each utterance counted on exactly one rank.

    Every rank must call it with the same arguments (those of :func:`toolkit.distributed.gather.gather_results`).
    A reference is counted by the rank in ``owner`` (the one that decoded the kept hypothesis); a reference nobody
    decoded scores as all deletions and is counted by rank ``i % world_size``, ``i`` its position in
    ``references``. Hypotheses without a reference are ignored.

    Args:
        references: ``{key: reference text}``.
        hyps: ``{mode: {key: hypothesis text}}``.
        owner: ``{key: rank}``.
        units: ``"word"`` and/or ``"char"``.

    Returns:
        ``{mode: {unit: ErrorCounts}}``, the same on every rank.
    """
    rank, world_size = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
    mine = [key for i, key in enumerate(references) if owner.get(key, i % world_size) == rank]
    refs = [references[key] for key in mine]
    local = [sum_counts(utterance_counts(refs, [hyps[mode].get(key, "") for key in mine], unit))
             for mode in hyps for unit in units]
    summed = iter(all_reduce_counts(local))
    return {mode: {unit: next(summed) for unit in units} for mode in hyps}

