"""An epoch's partition: which lines each loader worker of each rank reads, in which order.

The epoch's lines are cut into *parts*, each read whole by one loader worker of one rank (its global worker
``rank * num_workers + worker_id``), which numbers the part's batches for a mid-epoch resume (the ``position`` of a
batch, see :mod:`toolkit.dataset.pipeline`):

* With *planned batching* (:func:`planned_batching`: training on raw lines with static or bucket batching) each part
  is one *planned batch*: :func:`plan_batches` plans the epoch's batches from the lines' lengths in their audio
  headers (:func:`header_frames`) before any audio is read, :func:`deal_batches` deals them to the ranks, and each
  rank hands its batches to its workers in turn. The batches are then the same for every world size.
* Otherwise each part is one global worker's *share*: the lines at positions ``i`` of the epoch's order with
  ``i % (world_size * num_workers) == g`` for global worker ``g``, batched as they are read.
"""
import heapq
from collections import Counter
from typing import List, Tuple

import torch

from toolkit.dataset import processor
from toolkit.dataset.conf import DatasetConf


def planned_batching(conf: DatasetConf) -> bool:
    """Whether training plans its batches from the audio headers before reading any audio (raw lists with static or
    bucket batching), and so has the same batches on every world size and knows its steps per epoch in advance.
    Shards cannot (a shard is read sequentially, so the unit is a whole shard per worker), nor can dynamic batching
    (its cap on padded frames is a memory bound that lengths planned before speed perturbation cannot keep)."""
    return conf.data_type == "raw" and conf.batch_conf.batch_type != "dynamic"


def header_frames(lines: List[str], conf: DatasetConf) -> List[int]:
    """The 10 ms fbank frames of each raw line (at ``fbank_conf.frame_shift``), from its audio header, and at least
    ``pad_conf.min_length``: the lengths :func:`plan_batches` plans from."""
    frames_per_s = 1000 / conf.fbank_conf.frame_shift
    return [max(int(processor.audio_seconds(line) * frames_per_s), int(conf.pad_conf.min_length)) for line in lines]


def plan_batches(order: List[int], frames: List[int], conf: DatasetConf) -> List[List[int]]:
    """An epoch's training batches as lists of line indices, planned from the lines' lengths before any audio is
    read, with ``frames[i]`` (10 ms fbank frames of line ``i``, from its audio header) standing in for the features
    in the pipeline's own steps. Static batching: with ``sort``, each run of ``sort_conf.sort_size`` consecutive
    lines of ``order`` is sorted by length and cut into batches of ``batch_size`` (a batch never mixes two runs);
    without, ``order`` is cut as it is. Bucket batching: the sorted runs, bucketed (``processor.bucket_batch``).

    The plan depends on ``order``, ``frames`` and ``conf`` alone, never on the world size. Speed perturbation
    scales a length after the plan is made (by 0.9-1.1 by default), so a batch's lengths differ by that much more
    than a sort after it would leave.
    """
    batch = conf.batch_conf
    size = conf.sort_conf.sort_size if conf.sort else len(order)
    runs = [order[start:start + size] for start in range(0, len(order), max(1, size))]
    samples = [[{"index": i, "feat": torch.empty(frames[i], 0)} for i in run] for run in runs]
    if conf.sort:
        samples = [list(processor.sort(run, len(run))) for run in samples]
    if batch.batch_type == "static":
        groups = [group for run in samples for group in processor.static_batch(run, batch.batch_size)]
    else:
        groups = processor.bucket_batch((s for run in samples for s in run), batch.bucket_boundaries,
                                        batch.bucket_batch_sizes)
    return [[sample["index"] for sample in group] for group in groups]


def deal_batches(sizes: List[int], world_size: int) -> List[int]:
    """The rank of each planned batch (of ``sizes[i]`` lines): in order, each goes to the rank holding the fewest
    batches so far, then the fewest lines, then the lowest rank. The ranks end the epoch at most one batch apart
    whatever the batch sizes (bucket batching mixes 8- and 32-line batches), so the join, which stops every rank at
    the step the first runs out, drops at most ``world_size - 1`` batches; with equal batches it is the fewest
    lines' rule."""
    loads = [(0, 0, rank) for rank in range(world_size)]
    ranks = []
    for size in sizes:
        batches, lines, rank = heapq.heappop(loads)
        ranks.append(rank)
        heapq.heappush(loads, (batches + 1, lines + size, rank))
    return ranks


def partition(order: List[int], frames: List[int], conf: DatasetConf, planned: bool, world_size: int,
              num_workers: int) -> List[Tuple[List[int], int]]:
    """The epoch's parts in order, each ``(line indices, global worker reading it)``: with ``planned`` (see
    :func:`planned_batching`) the planned batches of ``order``, each dealt to a rank (:func:`deal_batches`) and
    within it to its ``num_workers`` workers in turn; otherwise one share per global worker. ``frames`` is read only
    when ``planned``; ``num_workers`` 0 counts as 1."""
    workers = max(1, num_workers)
    if not planned:
        total = world_size * workers
        return [(order[g::total], g) for g in range(total)]
    batches = plan_batches(order, frames, conf)
    dealt = Counter()  # planned batches each rank has got so far
    parts = []
    for lines, rank in zip(batches, deal_batches([len(b) for b in batches], world_size)):
        parts.append((lines, rank * workers + dealt[rank] % workers))
        dealt[rank] += 1
    return parts
