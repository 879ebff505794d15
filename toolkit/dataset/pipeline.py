"""Streaming ASR dataset: data.list lines -> padded batch dicts, partitioned over ranks and workers.

``dataset_conf.data_type`` names what a data.list line is: ``raw``, a JSON utterance
``{"key", "wav", "txt"[, "start", "end"]}`` (``tools/make_raw_list.py``), or ``shard``, a tar shard of many
utterances, ``{"shard": path, "num_utts": N}`` (``tools/make_shard_list.py``, format in
:mod:`toolkit.dataset.shard`). Either way the lines are the unit of the rank/worker partition, in parts (see
:class:`AsrDataset` and :mod:`toolkit.dataset.planning`). The loader around the dataset is in
:mod:`toolkit.dataset.loader`, the reading of a data.list outside the pipeline in :mod:`toolkit.dataset.data_list`.

The batch dict is the one contract between the dataset and the model (the dataset produces it, training and
decoding consume it)::

    keys:           list[str], B utterance keys
    feats:          float32 (B, T, D) fbank, zero-padded, T frames at 10 ms, D = num_mel_bins (80 default)
    feats_lengths:  int64 (B,)
    target:         int64 (B, L) token ids padded with IGNORE_ID (-1); (B, 0) in ``test`` mode
    target_lengths: int64 (B,); zeros in ``test`` mode
    padding_s:      float, seconds of ``feats`` that ``dataset_conf.pad_conf`` added (0.0 without it)
    num_skipped:    dict[str, int] utterances dropped since the previous batch of the same part, by reason
    position:       [part, index, last]: the part of the epoch the batch comes from (a planned batch or a
                    worker's share, see :meth:`AsrDataset.parts`), its index among the part's batches, and
                    whether it is the part's last (what a mid-epoch resume counts)

A part whose every remaining sample was skipped yields one batch with B=0 (``feats`` of shape ``(0, 0, D)``,
``target`` of shape ``(0, 0)``) so that its skip counts are not lost; consumers must read ``num_skipped`` and
then skip B=0 batches. In an epoch resumed with :meth:`AsrDataset.resume_epoch`, each batch the checkpoint
already read comes back as ``{"replayed": True}`` alone, so that the DataLoader's round robin over its workers
replays the interrupted run's order; consumers drop these (:meth:`AsrDataset.drop_replayed`).

Skip reasons: ``bad_line``, ``missing_audio``, ``unreadable_audio``, ``empty_audio``, ``non_finite_audio``,
``empty_text``, ``all_unknown``, ``unknown_token``, ``too_short``, ``too_long``, ``too_few_tokens``,
``too_many_tokens``, ``ratio_too_small``, ``ratio_too_large`` (these eight not in ``test`` mode, which does not
read the transcript), ``non_finite_feats``, and for shards ``missing_shard``, ``corrupt_shard``, ``corrupt_member``;
each skip is also logged as a warning naming the key
(or the shard). Every count is in utterances: a lost shard counts the utterances its data.list line records (see
:mod:`toolkit.dataset.shard`). (The trainer adds ``too_few_encoder_frames`` and ``non_finite_loss`` for utterances
the model could not score, see :mod:`toolkit.engine.executor`.)

The model is called as ``model(feats, feats_lengths, target, target_lengths)``.
"""
import dataclasses
import functools
import logging
import math
import random
from collections import Counter
from typing import Dict, Iterable, Iterator, List, Optional, Tuple

from torch.utils.data import IterableDataset, get_worker_info

from toolkit.dataset import data_list, planning, processor, shard
from toolkit.dataset.conf import DatasetConf, resolve_dataset_conf

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
    fbank = conf.fbank_conf if train else dataclasses.replace(conf.fbank_conf, dither=0.0)
    if mode != "test":  # NOTE: at test time the transcript is the score's reference, never a filter (issue 45)
        samples = per_sample(samples, processor.tokenize, tokenizer=tokenizer, **args(conf.tokenize_conf))
        samples = per_sample(samples, processor.filter_sample, frame_shift=fbank.frame_shift,
                             **args(conf.filter_conf))
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
        # NOTE: decoding filters no length, so a clip longer than filter_conf.max_length (the longest trained) is
        # batched with fewer others, or alone: one long clip must not multiply a batch's memory (issue 45)
        bound = conf.filter_conf.max_length if mode == "test" else math.inf
        batches = processor.static_batch(samples, batch.batch_size, bound)
    elif batch.batch_type == "dynamic":
        batches = processor.dynamic_batch(samples, batch.max_frames_in_batch)
    else:
        batches = processor.bucket_batch(samples, batch.bucket_boundaries, batch.bucket_batch_sizes)
    return processor.padding(batches, num_skipped, fbank.num_mel_bins)


def decoding_features(sample: dict, conf: DatasetConf) -> dict:
    """One utterance's features as the pipeline computes them for decoding (``test`` mode), for audio that comes
    from elsewhere than a data.list (``toolkit-transcribe``, :func:`toolkit.load_model`): resampled to
    ``resample_conf.resample_rate``, padded to ``pad_conf.min_length`` frames when set, fbank without dither.

    Reads ``waveform`` (float32 ``(N,)`` in [-1, 1), mono), ``sample_rate`` (Hz), ``key``; writes ``feat`` (float32
    ``(T, num_mel_bins)``, 10 ms frames), ``padding_s`` (seconds added, half before the audio, half after; 0.0 when
    none) and drops ``waveform``.

    Raises:
        processor.SkipSample: ``too_short`` (under one fbank frame), ``non_finite_feats``.
    """
    fbank = dataclasses.replace(conf.fbank_conf, dither=0.0)
    sample = processor.resample(dict(sample, padding_s=0.0), **dataclasses.asdict(conf.resample_conf))
    if conf.pad_conf.min_length > 0:
        sample = processor.pad_short(sample, frame_shift=fbank.frame_shift, **dataclasses.asdict(conf.pad_conf))
    return processor.compute_fbank(sample, **dataclasses.asdict(fbank))


def _with_last(items: Iterator) -> Iterator[Tuple[object, bool]]:
    """``(item, is_last)`` for each item of ``items`` (one item of look-ahead)."""
    pending = sentinel = object()
    for item in items:
        if pending is not sentinel:
            yield pending, False
        pending = item
    if pending is not sentinel:
        yield pending, True


class AsrDataset(IterableDataset):
    """Iterable over batch dicts for one rank; see the module docstring for the batch contract.

    Each pass, the line order is (train mode with ``shuffle``) a permutation seeded by ``seed + epoch``, identical
    on all ranks, then cut into parts (:meth:`parts`, :mod:`toolkit.dataset.planning`); each part is read,
    shuffled, decoded, sorted and batched by one loader worker of one rank, with a random generator of its own
    (``seed``, epoch, part), so every line is read by exactly one rank and one worker per epoch and a part's
    batches do not depend on who reads it.

    * With planned batching (:attr:`planned_batching`: training on raw lines with static or bucket batching) each
      part is one planned batch, planned from the lengths in the audio headers (read once, when the dataset is
      made), dealt to a rank and, within it, to its workers in turn. The epoch's batches are then the same for
      every world size (a mid-epoch checkpoint resumes on any number of ranks), as well sorted as one sort buffer
      over the whole list, and the ranks end the epoch at most one batch apart.
    * Otherwise (shards, dynamic batching, cross-validation and test) each part is one global worker's share of the
      lines, batched as they are read. With shards the unit is a whole shard, read in order by its worker.

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
        # 10 ms frames per line, from the audio headers: what the batches are planned from
        self.frames: List[int] = planning.header_frames(lines, conf) if self.planned_batching else []

    @property
    def planned_batching(self) -> bool:
        """Whether the epoch's batches are planned (:func:`toolkit.dataset.planning.planned_batching`), and so the
        same for every world size (a mid-epoch position holds on any)."""
        return self.mode == "train" and planning.planned_batching(self.conf)

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
        ``batches_read`` is ``{part: (batches, done)}``, the first ``batches`` batches of each part, ``done`` when
        they were all of the part's (see the ``position`` of a batch). Those batches come back as
        ``{"replayed": True}`` (:meth:`drop_replayed` removes them); a done part is not read at all."""
        self.epoch = epoch
        self._passes_since_set_epoch = 0
        self._consumed = dict(batches_read)

    @staticmethod
    def drop_replayed(batches: Iterable[dict]) -> Iterator[dict]:
        """``batches`` from a loader over this dataset without the placeholders of :meth:`resume_epoch`."""
        return (batch for batch in batches if "replayed" not in batch)

    def parts(self, epoch: int, num_workers: int) -> List[Tuple[List[int], int]]:
        """The parts of ``epoch`` in order: ``(line indices, global worker reading it)`` (``num_workers`` 0 counts
        as 1; see :func:`toolkit.dataset.planning.partition`)."""
        order = list(range(len(self.lines)))
        if self.mode == "train" and self.conf.shuffle:
            random.Random(self.seed + epoch).shuffle(order)
        return planning.partition(order, self.frames, self.conf, self.planned_batching, self.world_size, num_workers)

    def lines_per_rank(self) -> List[int]:
        """How many lines each rank reads in epoch 0 (the same every epoch except with bucket batching, whose batch
        sizes depend on which lengths a run holds: the permutation changes which lines, not how many)."""
        workers = max(1, self.conf.dataloader_conf.num_workers)
        counts = [0] * self.world_size
        for lines, worker in self.parts(0, workers):
            counts[worker // workers] += len(lines)
        return counts

    def sample(self, utts: int) -> "AsrDataset":
        """A dataset in this one's mode and ``dataset_conf`` over ``utts`` of this rank's lines of epoch 0 taken at
        an even stride (raw; all of them if fewer), so that its batches look like this rank's (lengths, padding,
        batch sizes): what ``max_train_minutes`` times to estimate a CV pass. Shards: this rank's first whole shards
        holding ``utts`` utterances by what their lines record (a bare path counts 1)."""
        workers = max(1, self.conf.dataloader_conf.num_workers)
        mine = sorted(i for lines, worker in self.parts(0, workers) if worker // workers == self.rank for i in lines)
        if self.conf.data_type == "raw":
            picked = mine[::max(1, len(mine) // max(utts, 1))][:utts]
        else:
            picked, held = [], 0
            for i in mine:
                if held >= utts:
                    break
                picked.append(i)
                held += shard.parse_shard_line(self.lines[i])[1] or 1
        return AsrDataset([self.lines[i] for i in picked], self.tokenizer, self.conf, self.mode, rank=0,
                          world_size=1, seed=self.seed)

    def largest_share(self) -> Tuple[int, Optional[float]]:
        """``(utterances, audio seconds)``: the most any rank reads in one pass (epoch 0), each the largest over the
        ranks. Raw lines count one utterance each and are timed from their audio headers (read here, as for planned
        batching); shards count what their lines record (a bare path 1), their audio unknown (None)."""
        workers = max(1, self.conf.dataloader_conf.num_workers)
        raw = self.conf.data_type == "raw"
        utts, audio_s = [0] * self.world_size, [0.0] * self.world_size
        for lines, worker in self.parts(0, workers):
            rank = worker // workers
            if raw:
                utts[rank] += len(lines)
                audio_s[rank] += sum(processor.audio_seconds(self.lines[i]) for i in lines)
            else:
                utts[rank] += sum(shard.parse_shard_line(self.lines[i])[1] or 1 for i in lines)
        return max(utts), (max(audio_s) if raw else None)

    def batches_per_epoch(self) -> Optional[int]:
        """The batches of the rank with the most in epoch 0 when they are planned (:attr:`planned_batching`;
        the same every epoch but with bucket batching, where they can differ by a few), else ``None``: shards and
        dynamic batching are cut into batches as they are read."""
        if not self.planned_batching:
            return None
        workers = max(1, self.conf.dataloader_conf.num_workers)
        return max(Counter(worker // workers for _, worker in self.parts(0, workers)).values(), default=0)

    def __iter__(self) -> Iterator[dict]:
        epoch = self.epoch + self._passes_since_set_epoch
        consumed = self._consumed if self._passes_since_set_epoch == 0 else {}
        self._passes_since_set_epoch += 1
        info = get_worker_info()
        worker_id, num_workers = (info.id, info.num_workers) if info is not None else (0, 1)
        me = self.rank * num_workers + worker_id
        mine = [(part, lines) for part, (lines, worker) in enumerate(self.parts(epoch, num_workers)) if worker == me]
        if not any(lines for _, lines in mine):
            logger.warning("rank %d worker %d has no %s lines this epoch: %d lines for %d workers", self.rank,
                           worker_id, self.conf.data_type, len(self.lines), self.world_size * num_workers)
        return (batch for part, lines in mine
                for batch in self._part_batches(epoch, part, lines, consumed.get(part, (0, False))))

    def _part_batches(self, epoch: int, part: int, lines: List[int], consumed: Tuple[int, bool]) -> Iterator[dict]:
        num_consumed, done = consumed
        if done:  # all its batches were accounted for: nothing to read, only their places in the loader's order
            yield from ({"replayed": True} for _ in range(num_consumed))
            return
        rng = random.Random(f"{self.seed}:{epoch}:{part}")
        batches = _build_pipeline([self.lines[i] for i in lines], self.tokenizer, self.conf, self.mode, rng,
                                  epoch, planned=self.planned_batching)
        for index, (batch, last) in enumerate(_with_last(batches)):
            yield {"replayed": True} if index < num_consumed else dict(batch, position=[part, index, last])


def _log_partition(data_list_file: str, dataset: AsrDataset) -> None:
    counts = dataset.lines_per_rank()
    unit = "shards" if dataset.conf.data_type == "shard" else "lines"
    if len(set(counts)) > 1 and dataset.rank == 0:
        # NOTE: uneven counts mean uneven batch counts; the trainer's join absorbs them, this says why.
        logger.info("%s: %d %s do not divide evenly over %d ranks x %d workers; %s per rank: %s", data_list_file,
                    len(dataset.lines), unit, dataset.world_size, max(1, dataset.conf.dataloader_conf.num_workers),
                    unit, counts)


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
            ``"test"`` (decoding) neither tokenizes nor filters: every readable utterance comes out, whatever its
            transcript (empty, of unknown units, longer than ``token_max_length``) or its length, with no target.
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
    lines = data_list.read_lines(data_list_file)
    if conf.data_type == "shard":
        num_uncounted = data_list.shard_counts(data_list_file, lines).count(None)
        if num_uncounted and rank == 0:
            # NOTE: without a count the reader cannot tell how many utterances a lost shard held.
            logger.warning("%s: %d of %d shard lines are bare paths with no utterance count, so a missing or cut "
                           "shard among them is counted as 1 skipped utterance; run tools/make_shard_list.py again "
                           "(it keeps the shards) to record the counts", data_list_file, num_uncounted, len(lines))
    dataset = AsrDataset(lines, tokenizer, conf, mode, rank, world_size, seed)
    _log_partition(data_list_file, dataset)
    return dataset


def __getattr__(name: str):
    """``build_dataloader``, the former name (until 2026-12-07) of :func:`toolkit.dataset.loader.build_dataloader`,
    kept so that users' scripts that import it from here keep working; new code imports it from
    ``toolkit.dataset``."""
    if name == "build_dataloader":
        # NOTE: imported here, not at the top: the loader imports this module
        from toolkit.dataset.loader import build_dataloader
        return build_dataloader
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
