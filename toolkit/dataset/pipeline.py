"""Streaming ASR dataset: data.list lines -> padded batch dicts, partitioned over ranks and workers.

``dataset_conf.data_type`` names what a data.list line is: ``raw``, a JSON utterance
``{"key", "wav", "txt"[, "start", "end"]}`` (``tools/make_raw_list.py``), or ``shard``, a tar shard of many
utterances, ``{"shard": path, "num_utts": N}`` (``tools/make_shard_list.py``, format in
:mod:`toolkit.dataset.shard`). Either way the lines are the unit of the rank/worker partition, in chunks (see
:class:`AsrDataset`).

The batch dict is the one contract between the dataset and the model (the dataset produces it, training and
decoding consume it)::

    keys:           list[str], B utterance keys
    feats:          float32 (B, T, D) fbank, zero-padded, T frames at 10 ms, D = num_mel_bins (80 default)
    feats_lengths:  int64 (B,)
    target:         int64 (B, L) token ids padded with IGNORE_ID (-1)
    target_lengths: int64 (B,)
    padding_s:      float, seconds of ``feats`` that ``dataset_conf.pad_conf`` added (0.0 without it)
    num_skipped:    dict[str, int] utterances dropped since the previous batch of the same chunk, by reason
    position:       [chunk, index, last]: the chunk of the epoch the batch comes from, its index among the
                    chunk's batches, and whether it is the chunk's last (what a mid-epoch resume counts)

A chunk whose every remaining sample was skipped yields one batch with B=0 (``feats`` of shape ``(0, 0, D)``,
``target`` of shape ``(0, 0)``) so that its skip counts are not lost; consumers must read ``num_skipped`` and
then skip B=0 batches. In an epoch resumed with :meth:`AsrDataset.resume_epoch`, each batch the checkpoint
already read comes back as ``{"replayed": True}`` alone, so that the DataLoader's round robin over its workers
replays the interrupted run's order; consumers drop these (:meth:`AsrDataset.drop_replayed`).

Skip reasons: ``bad_line``, ``missing_audio``, ``unreadable_audio``, ``empty_audio``, ``non_finite_audio``,
``empty_text``, ``all_unknown``, ``unknown_token``, ``too_short``, ``too_long``, ``too_few_tokens``,
``too_many_tokens``, ``ratio_too_small``, ``ratio_too_large``, ``non_finite_feats``, and for shards
``missing_shard``, ``corrupt_shard``, ``corrupt_member``; each skip is also logged as a warning naming the key
(or the shard). Every count is in utterances: a lost shard counts the utterances its data.list line records (see
:mod:`toolkit.dataset.shard`). (The trainer adds ``too_few_encoder_frames`` and ``non_finite_loss`` for utterances
the model could not score, see :mod:`toolkit.engine.executor`.)

The model is called as ``model(feats, feats_lengths, target, target_lengths)``.
"""
import dataclasses
import functools
import heapq
import logging
import multiprocessing
import multiprocessing.connection
import multiprocessing.forkserver
import os
import random
import sys
import threading
from collections import Counter
from typing import Dict, Iterable, Iterator, List, Optional, Tuple

import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from toolkit.dataset import processor, shard
from toolkit.dataset.conf import DatasetConf, resolve_dataset_conf
from toolkit.utils.config import ConfigError

logger = logging.getLogger(__name__)

MODES = ("train", "cv", "test")


def _build_pipeline(lines: List[str], tokenizer, conf: DatasetConf, mode: str, rng: random.Random,
                    epoch: int, planned: bool = False) -> Iterator[dict]:
    """Chain every step of ``epoch`` over this worker's lines, reading ``conf`` top to bottom. ``planned``: the
    lines are one batch of :func:`plan_batches`, kept whole (speed perturbation and padding move lengths, which
    must not move a line into another of ``batch_conf``'s buckets and split the batch the dealing counted)."""
    train = mode == "train"
    num_skipped: Counter = Counter()

    def per_sample(stream, fn, **kwargs):
        return processor.map_skipping(stream, functools.partial(fn, **kwargs), num_skipped)

    def args(section) -> dict:
        return dataclasses.asdict(section)

    if conf.data_type == "raw":
        samples = per_sample(({"line": line} for line in lines), processor.parse_raw)
    else:
        samples = shard.read_shards(lines, num_skipped)
    if train and conf.shuffle:
        # Shuffling before audio is decoded keeps the buffer at a few bytes (raw) or the encoded audio (shard)
        # per sample instead of a waveform.
        samples = processor.shuffle(samples, rng, **args(conf.shuffle_conf))
    samples = per_sample(samples, processor.read_audio)
    samples = per_sample(samples, processor.resample, **args(conf.resample_conf))
    if train and conf.speed_perturb:
        samples = per_sample(samples, processor.speed_perturb, rng=rng, **args(conf.speed_perturb_conf))
    if train and conf.volume_perturb:
        samples = per_sample(samples, processor.volume_perturb, rng=rng, **args(conf.volume_perturb_conf))
    samples = per_sample(samples, processor.tokenize, tokenizer=tokenizer, **args(conf.tokenize_conf))
    fbank = conf.fbank_conf if train else dataclasses.replace(conf.fbank_conf, dither=0.0)
    samples = per_sample(samples, processor.filter_sample, frame_shift=fbank.frame_shift, **args(conf.filter_conf))
    if conf.pad_conf.min_length > 0:
        samples = per_sample(samples, processor.pad_short, frame_shift=fbank.frame_shift, **args(conf.pad_conf))
    samples = per_sample(samples, processor.compute_fbank, rng=rng, **args(fbank))
    if train and conf.spec_aug and epoch >= conf.spec_aug_conf.start_epoch:
        masks = {k: v for k, v in args(conf.spec_aug_conf).items() if k != "start_epoch"}
        samples = per_sample(samples, processor.spec_aug, rng=rng, **masks)
    if conf.sort:
        samples = processor.sort(samples, **args(conf.sort_conf))
    batch = conf.batch_conf
    if planned:
        batches = processor.static_batch(samples, len(lines))
    elif batch.batch_type == "static":
        batches = processor.static_batch(samples, batch.batch_size)
    elif batch.batch_type == "dynamic":
        batches = processor.dynamic_batch(samples, batch.max_frames_in_batch)
    else:
        batches = processor.bucket_batch(samples, batch.bucket_boundaries, batch.bucket_batch_sizes)
    return processor.padding(batches, num_skipped, fbank.num_mel_bins)


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


def deal_chunks(sizes: List[int], world_size: int) -> List[int]:
    """The rank of each chunk (one planned batch of ``sizes[i]`` lines): in order, each goes to the rank holding the
    fewest batches so far, then the fewest lines, then the lowest rank. The ranks end the epoch at most one batch
    apart whatever the batch sizes (bucket batching mixes 8- and 32-line batches), so the join, which stops every
    rank at the step the first runs out, drops at most ``world_size - 1`` batches; with equal batches it is the
    fewest lines' rule."""
    loads = [(0, 0, rank) for rank in range(world_size)]
    ranks = []
    for size in sizes:
        batches, lines, rank = heapq.heappop(loads)
        ranks.append(rank)
        heapq.heappush(loads, (batches + 1, lines + size, rank))
    return ranks


def _with_last(items: Iterator) -> Iterator[Tuple[object, bool]]:
    """``(item, is_last)`` for each item of ``items`` (one item of look-ahead)."""
    pending = sentinel = object()
    for item in items:
        if pending is not sentinel:
            yield pending, False
        pending = item
    if pending is not sentinel:
        yield pending, True


def plans_batches(conf: DatasetConf) -> bool:
    """Whether training plans its batches from the audio headers before reading any audio (raw lists with static or
    bucket batching; see :class:`AsrDataset`), and so knows its steps per epoch in advance."""
    return conf.data_type == "raw" and conf.batch_conf.batch_type != "dynamic"


class AsrDataset(IterableDataset):
    """Iterable over batch dicts for one rank; see the module docstring for the batch contract.

    Each pass, the line order is (train mode with ``shuffle``) a permutation seeded by ``seed + epoch``, identical
    on all ranks, then cut into chunks; each chunk is read, shuffled, decoded, sorted and batched by one loader
    worker of one rank, with a random generator of its own (``seed``, epoch, chunk), so every line is read by
    exactly one rank and one worker per epoch and a chunk's batches do not depend on who reads it.

    * Training on raw lines with static or bucket batching (:attr:`resumes_on_any_world_size`): each chunk is one
      batch of :func:`plan_batches`, planned from the lengths in the audio headers (read once, when the dataset
      is made), dealt to ranks by :func:`deal_chunks` and, within a rank, to its workers in turn. The epoch's
      batches are then the same for every world size (a mid-epoch checkpoint resumes on any number of ranks), as
      well sorted as one sort buffer over the whole list, and the ranks end the epoch at most one batch apart.
    * Otherwise (shards, whose lines are read sequentially and cannot be cut finer; dynamic batching, whose cap on
      padded frames is a memory bound that lengths planned before speed perturbation cannot keep; cross-validation
      and test): chunk ``g`` is global worker
      ``g``'s share, positions ``i`` with ``i % (world_size * num_workers) == g``, global worker =
      ``rank * num_workers + worker_id``. With shards the unit is a whole shard, read in order by its worker.

    Ranks may get unequal line counts (logged by :func:`build_dataset`). The epoch of a pass is the last
    :meth:`set_epoch` value plus the passes this copy of the dataset has made since, so persistent DataLoader
    workers (whose copy never sees ``set_epoch``) still reshuffle each epoch.
    """

    def __init__(self, lines: List[str], tokenizer, conf: DatasetConf, mode: str, rank: int, world_size: int,
                 seed: int):
        super().__init__()
        self.lines = lines
        self.tokenizer = tokenizer
        self.conf = conf
        self.mode = mode
        self.rank = rank
        self.world_size = world_size
        self.seed = seed
        self.epoch = 0
        self._passes_since_set_epoch = 0
        self._consumed: Dict[int, Tuple[int, bool]] = {}
        self.frames: List[int] = []  # 10 ms frames per line, from the audio headers: what the batches are planned from
        if self.resumes_on_any_world_size:
            frames_per_s = 1000 / conf.fbank_conf.frame_shift
            self.frames = [max(int(processor.audio_seconds(line) * frames_per_s), int(conf.pad_conf.min_length))
                           for line in lines]

    @property
    def resumes_on_any_world_size(self) -> bool:
        """Whether the epoch's batches are the same for every world size (so a mid-epoch position holds on any)."""
        return self.mode == "train" and plans_batches(self.conf)

    # The resume protocol (toolkit.engine.position.ResumableDataset): the training executor calls these four.

    def set_seed(self, seed: int) -> None:
        """Shuffle and augment every later pass with ``seed`` (a resumed run keeps its checkpoint's)."""
        self.seed = seed

    def set_epoch(self, epoch: int) -> None:
        """The next pass reads epoch ``epoch`` (its order and augmentation seeded by ``seed`` and ``epoch``) from its
        start; call it before each epoch."""
        self.resume_epoch(epoch, {})

    def resume_epoch(self, epoch: int, batches_read: Dict[int, Tuple[int, bool]]) -> None:
        """The next pass reads epoch ``epoch`` without the batches a checkpoint inside it had read:
        ``batches_read`` is ``{chunk: (batches, done)}``, the first ``batches`` batches of each chunk, ``done`` when
        they were all of the chunk's (see the ``position`` of a batch). Those batches come back as
        ``{"replayed": True}`` (:meth:`drop_replayed` removes them); a done chunk is not read at all."""
        self.epoch = epoch
        self._passes_since_set_epoch = 0
        self._consumed = dict(batches_read)

    @staticmethod
    def drop_replayed(batches: Iterable[dict]) -> Iterator[dict]:
        """``batches`` from a loader over this dataset without the placeholders of :meth:`resume_epoch`."""
        return (batch for batch in batches if "replayed" not in batch)

    def chunks(self, epoch: int, num_workers: int) -> List[Tuple[List[int], int]]:
        """The chunks of ``epoch`` in order: ``(line indices, global worker reading it)`` (``num_workers`` 0
        counts as 1)."""
        order = list(range(len(self.lines)))
        if self.mode == "train" and self.conf.shuffle:
            random.Random(self.seed + epoch).shuffle(order)
        workers = max(1, num_workers)
        if not self.resumes_on_any_world_size:
            total = self.world_size * workers
            return [(order[g::total], g) for g in range(total)]
        batches = plan_batches(order, self.frames, self.conf)
        dealt = Counter()  # chunks each rank has got so far
        chunks = []
        for lines, rank in zip(batches, deal_chunks([len(b) for b in batches], self.world_size)):
            chunks.append((lines, rank * workers + dealt[rank] % workers))
            dealt[rank] += 1
        return chunks

    def lines_per_rank(self) -> List[int]:
        """How many lines each rank reads in epoch 0 (the same every epoch except with bucket batching, whose batch
        sizes depend on which lengths a run holds: the permutation changes which lines, not how many)."""
        workers = max(1, self.conf.dataloader_conf.num_workers)
        counts = [0] * self.world_size
        for lines, worker in self.chunks(0, workers):
            counts[worker // workers] += len(lines)
        return counts

    def batches_per_epoch(self) -> Optional[int]:
        """The batches of the rank with the most in epoch 0 when they are planned (:attr:`resumes_on_any_world_size`;
        the same every epoch but with bucket batching, where they can differ by a few), else ``None``: shards and
        dynamic batching are cut into batches as they are read."""
        if not self.resumes_on_any_world_size:
            return None
        workers = max(1, self.conf.dataloader_conf.num_workers)
        return max(Counter(worker // workers for _, worker in self.chunks(0, workers)).values(), default=0)

    def __iter__(self) -> Iterator[dict]:
        epoch = self.epoch + self._passes_since_set_epoch
        consumed = self._consumed if self._passes_since_set_epoch == 0 else {}
        self._passes_since_set_epoch += 1
        info = get_worker_info()
        worker_id, num_workers = (info.id, info.num_workers) if info is not None else (0, 1)
        me = self.rank * num_workers + worker_id
        mine = [(chunk, lines) for chunk, (lines, worker) in enumerate(self.chunks(epoch, num_workers)) if worker == me]
        if not any(lines for _, lines in mine):
            logger.warning("rank %d worker %d has no %s lines this epoch: %d lines for %d workers", self.rank,
                           worker_id, self.conf.data_type, len(self.lines), self.world_size * num_workers)
        return (batch for chunk, lines in mine
                for batch in self._chunk_batches(epoch, chunk, lines, consumed.get(chunk, (0, False))))

    def _chunk_batches(self, epoch: int, chunk: int, lines: List[int], consumed: Tuple[int, bool]) -> Iterator[dict]:
        num_consumed, done = consumed
        if done:  # all its batches were accounted for: nothing to read, only their places in the loader's order
            yield from ({"replayed": True} for _ in range(num_consumed))
            return
        rng = random.Random(f"{self.seed}:{epoch}:{chunk}")
        batches = _build_pipeline([self.lines[i] for i in lines], self.tokenizer, self.conf, self.mode, rng,
                                  epoch, planned=self.resumes_on_any_world_size)
        for index, (batch, last) in enumerate(_with_last(batches)):
            yield {"replayed": True} if index < num_consumed else dict(batch, position=[chunk, index, last])


def _log_partition(data_list_file: str, dataset: AsrDataset) -> None:
    counts = dataset.lines_per_rank()
    unit = "shards" if dataset.conf.data_type == "shard" else "lines"
    if len(set(counts)) > 1 and dataset.rank == 0:
        # NOTE: uneven counts mean uneven batch counts; the trainer's join absorbs them, this says why.
        logger.info("%s: %d %s do not divide evenly over %d ranks x %d workers; %s per rank: %s", data_list_file,
                    len(dataset.lines), unit, dataset.world_size, max(1, dataset.conf.dataloader_conf.num_workers),
                    unit, counts)


def _read_lines(data_list_file: str) -> List[str]:
    with open(data_list_file, encoding="utf-8") as f:
        return [line.strip() for line in f if line.strip()]


def _shard_counts(data_list_file: str, lines: List[str]) -> List[Optional[int]]:
    """Each shard line's recorded utterance count (None for a bare path).

    Raises:
        ConfigError: a malformed line (names the file and line).
    """
    counts = []
    for line_no, line in enumerate(lines, 1):
        try:
            counts.append(shard.parse_shard_line(line)[1])
        except ValueError as err:
            raise ConfigError(f"{data_list_file}:{line_no}: not a shard data.list line: {err}; write the list with "
                              f"tools/make_shard_list.py") from err
    return counts


def count_utterances(data_list_file: str, data_type: str) -> int:
    """Utterances listed by a data.list, before filtering: its lines for ``raw``; for ``shard`` the counts its
    lines record, or for a bare-path line the transcripts in that shard (header scan, see
    :func:`toolkit.dataset.shard.count_shard_utterances`).

    Raises:
        OSError: ``data_list_file`` cannot be read. ConfigError: a malformed shard line.
    """
    lines = _read_lines(data_list_file)
    if data_type == "raw":
        return len(lines)
    counts = _shard_counts(data_list_file, lines)
    return sum(shard.count_shard_utterances(shard.parse_shard_line(line)[0]) if n is None else n
               for line, n in zip(lines, counts))


def read_transcripts(data_list_file: str, data_type: str) -> List[Tuple[str, str]]:
    """``(key, transcript)`` of every utterance a data.list names, in input order (raw: line order; shard: shard
    order, then member order), repeats included: the references of a test set and the order its results are
    written in. A raw line that is not a valid JSON utterance, and the utterances of a missing or damaged shard
    past the damage, are left out (the pipeline skips them too, counted as ``bad_line``, ``missing_shard`` or
    ``corrupt_shard``).

    Raises:
        OSError: ``data_list_file`` cannot be read. ConfigError: a malformed shard line.
    """
    lines = _read_lines(data_list_file)
    if data_type == "shard":
        _shard_counts(data_list_file, lines)  # checks every line
        return [pair for line in lines for pair in shard.read_shard_transcripts(shard.parse_shard_line(line)[0])]
    pairs = []
    for line in lines:
        try:
            sample = processor.parse_raw({"line": line})
        except processor.SkipSample:
            continue
        pairs.append((sample["key"], sample["txt"]))
    return pairs


def build_dataset(data_list_file: str, tokenizer, conf: DatasetConf | dict | None, *, mode: str = "train",
                  rank: int = 0, world_size: int = 1, seed: int = 777) -> AsrDataset:
    """Build the dataset of one rank from a data.list file (see the module docstring for its two line formats).

    Args:
        data_list_file: written by ``tools/make_raw_list.py`` (relative wav paths resolve against the cwd) or
            ``tools/make_shard_list.py``.
        tokenizer: a ``toolkit.text.tokenizer`` tokenizer.
        conf: the resolved ``dataset_conf`` (:func:`toolkit.dataset.conf.resolve_dataset_conf`), or the YAML's
            dict (None or partial), which is resolved here.
        mode: ``"train"``, or ``"cv"``/``"test"`` (no shuffle, speed perturbation, SpecAugment; dither 0).
        rank, world_size: this process's place among the distributed ranks.
        seed: base seed; the pass of epoch ``e`` shuffles lines with ``seed + e``.

    Raises:
        ValueError: bad ``mode`` or ``rank``/``world_size``; ConfigError (a ValueError) for a malformed shard
            data.list line or a bad ``dataset_conf`` dict.
        OSError: ``data_list_file`` cannot be read.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if not 0 <= rank < world_size:
        raise ValueError(f"need 0 <= rank < world_size, got rank={rank} world_size={world_size}")
    conf = resolve_dataset_conf(conf)
    lines = _read_lines(data_list_file)
    if conf.data_type == "shard":
        num_uncounted = _shard_counts(data_list_file, lines).count(None)
        if num_uncounted and rank == 0:
            # NOTE: without a count the reader cannot tell how many utterances a lost shard held.
            logger.warning("%s: %d of %d shard lines are bare paths with no utterance count, so a missing or cut "
                           "shard among them is counted as 1 skipped utterance; run tools/make_shard_list.py again "
                           "(it keeps the shards) to record the counts", data_list_file, num_uncounted, len(lines))
    dataset = AsrDataset(lines, tokenizer, conf, mode, rank, world_size, seed)
    _log_partition(data_list_file, dataset)
    return dataset


def build_dataloader(dataset: AsrDataset, conf: DatasetConf | dict | None = None) -> DataLoader:
    """Wrap ``dataset`` in a DataLoader (``batch_size=None``: the dataset already yields batches).

    ``dataloader_conf`` of ``conf`` (default: the dataset's own ``dataset_conf``) sets num_workers,
    prefetch_factor, pin_memory and persistent_workers; the worker-only options are dropped when num_workers is 0.

    The loader gets its own ``torch.Generator`` seeded with ``dataset.seed`` (reseed it per epoch through
    ``loader.generator``). NOTE: without one, every ``iter(loader)`` draws the workers' base seed from the global
    torch RNG, so where dropout's random stream stands would depend on how many loaders were iterated (an exact
    resume would diverge).

    Workers start from a forkserver (:func:`worker_context`), never by forking the calling process, and end when
    that process does (:func:`end_with_the_loader`).
    """
    conf = dataset.conf.dataloader_conf if conf is None else resolve_dataset_conf(conf).dataloader_conf
    kwargs = {"batch_size": None, "num_workers": conf.num_workers, "pin_memory": conf.pin_memory,
              "generator": torch.Generator().manual_seed(dataset.seed)}
    if conf.num_workers > 0:
        kwargs.update(prefetch_factor=conf.prefetch_factor, persistent_workers=conf.persistent_workers,
                      multiprocessing_context=worker_context(), worker_init_fn=end_with_the_loader)
    return DataLoader(dataset, **kwargs)


def worker_context() -> multiprocessing.context.BaseContext:
    """The multiprocessing context DataLoader workers start in: a forkserver, with the toolkit's modules imported so
    far (and so torch) and the feature libraries (``processor.WORKER_IMPORTS``) imported once in the server, so a
    worker starts in milliseconds and receives the dataset pickled. A worker runs the main module's top level
    again, as with ``spawn``: a script that builds loaders does so under ``if __name__ == "__main__"``.

    NOTE: not ``fork``. A training process holds threads (gloo's, tensorboard's writer) and a fork while one of
    them held CPython's thread-state lock leaves the child hung inside ``os.fork()`` for good (CPython gh-112275,
    Python 3.8 to 3.11; seen here as a 2-rank DeepSpeed job that never finished cross-validation after a restart:
    rank 0's loader worker stuck in ``PyOS_AfterFork_Child``, rank 1 waiting in the all-reduce). The server is a
    fresh single-threaded process, so forking it is safe.
    """
    main_name = getattr(getattr(sys.modules["__main__"], "__spec__", None), "name", None)
    context = multiprocessing.get_context("forkserver")
    # NOTE: not the main module itself: a worker runs it again by name, and runpy warns about one already imported
    context.set_forkserver_preload(sorted(name for name in sys.modules
                                          if name.split(".")[0] == "toolkit" and name != main_name)
                                   + list(processor.WORKER_IMPORTS))
    # started now, so that its imports overlap with what the caller does before it iterates a loader (the model)
    multiprocessing.forkserver.ensure_running()
    return context


def end_with_the_loader(worker_id: int) -> None:
    """``worker_init_fn``: a thread that ends this worker (exit status 1) once the process iterating the loader is
    gone, e.g. a rank killed with SIGKILL.

    NOTE: torch's own watchdog in the worker compares ``os.getppid()`` with its value at start, and a forkserver
    child's parent is the server, which lives while any of its children do: without this thread a dead rank's
    workers, the server and its resource tracker would live on, holding the job's stdout open (``run.sh`` then
    never returned: seen in 3 of 14 stress runs of a killed-and-restarted 2-rank job). ``parent_process()`` is the
    loader's process, whatever the start method.
    """
    sentinel = multiprocessing.parent_process().sentinel
    threading.Thread(target=_exit_when_ready, args=(sentinel,), name="end_with_the_loader", daemon=True).start()


def _exit_when_ready(sentinel: int) -> None:
    multiprocessing.connection.wait([sentinel])
    os._exit(1)
