"""Decoding results of every rank, gathered once at the end of the job and de-duplicated by utterance key.

Each rank decodes its own share of a test set (the data partition of :mod:`toolkit.dataset.pipeline`) without
talking to the others; :func:`gather_results` is then the single collective that brings every rank's
:class:`RankResults` to every rank. The merge keeps one hypothesis per key, the first in rank order (then decoding
order), and counts the others: a correct partition repeats nothing, so a repeat means a sampler padded its share
(as ``DistributedSampler`` does to even out ranks) or the data.list lists a key twice, and the caller reports it.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from toolkit.distributed.collectives import all_gather_objects


@dataclass
class RankResults:
    """What one rank decoded.

    Attributes:
        keys: utterance keys in decoding order.
        hyps: ``{mode: [hypothesis text per key]}``, each list aligned with ``keys``.
        skipped: utterances the data pipeline dropped on this rank, by reason.
        num_frames: fbank frames decoded (sum of the feature lengths; frames of 10 ms at the default shift).
        padding_s: seconds of those frames that ``dataset_conf.pad_conf`` added (not audio).
        no_encoder_frame: decoded utterances too short for a single encoder frame (empty hypotheses).
    """

    keys: list[str] = field(default_factory=list)
    hyps: dict[str, list[str]] = field(default_factory=dict)
    skipped: dict[str, int] = field(default_factory=dict)
    num_frames: int = 0
    padding_s: float = 0.0
    no_encoder_frame: int = 0


@dataclass
class JobResults:
    """Every rank's results merged.

    Attributes:
        hyps: ``{mode: {key: hypothesis}}``, one entry per key.
        owner: ``{key: rank}`` of the rank whose hypothesis was kept.
        decoded_per_rank: utterances each rank decoded, repeats included.
        repeated: ``{key: extra times decoded}`` for every key decoded more than once (empty when each
            utterance was decoded exactly once).
        skipped: pipeline skips summed over ranks, by reason.
        num_frames: frames decoded by all ranks, repeats included (the work done).
        padding_s: seconds of padding in them, summed over ranks.
        no_encoder_frame: utterances too short for a single encoder frame, summed over ranks.
    """

    hyps: dict[str, dict[str, str]]
    owner: dict[str, int]
    decoded_per_rank: list[int]
    repeated: dict[str, int]
    skipped: dict[str, int]
    num_frames: int
    padding_s: float
    no_encoder_frame: int


def merge_results(per_rank: list[RankResults]) -> JobResults:
    """Merge the results of ranks ``0..len(per_rank)-1`` (see the module docstring for which copy is kept)."""
    modes = sorted({mode for r in per_rank for mode in r.hyps})
    hyps: dict[str, dict[str, str]] = {mode: {} for mode in modes}
    owner: dict[str, int] = {}
    repeated: Counter = Counter()
    skipped: Counter = Counter()
    for rank, results in enumerate(per_rank):
        skipped.update(results.skipped)
        for i, key in enumerate(results.keys):
            if key in owner:
                repeated[key] += 1
                continue
            owner[key] = rank
            for mode in modes:
                hyps[mode][key] = results.hyps[mode][i]
    return JobResults(hyps=hyps, owner=owner, decoded_per_rank=[len(r.keys) for r in per_rank],
                      repeated=dict(repeated), skipped=dict(skipped),
                      num_frames=sum(r.num_frames for r in per_rank),
                      padding_s=sum(r.padding_s for r in per_rank),
                      no_encoder_frame=sum(r.no_encoder_frame for r in per_rank))


def gather_results(local: RankResults) -> JobResults:
    """All-gather every rank's results (one ``all_gather_object``) and merge them; every rank gets the same
    :class:`JobResults`. Works without a process group (one rank).

    Raises:
        CollectiveInMainOnlySection: called inside a main-only section.
    """
    return merge_results(all_gather_objects(local, "gather_results"))
