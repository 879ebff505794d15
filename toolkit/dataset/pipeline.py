"""Streaming ASR dataset: data.list lines -> padded batch dicts, partitioned over ranks and workers.

``dataset_conf.data_type`` names what a data.list line is: ``raw``, a JSON utterance
``{"key", "wav", "txt"[, "start", "end"]}`` (``tools/make_raw_list.py``), or ``shard``, the path of a tar shard
of many utterances (``tools/make_shard_list.py``, format in :mod:`toolkit.dataset.shard`). Either way the
lines are the unit of the rank/worker partition.

The batch dict is the one contract between the dataset and the model (the dataset produces it, training and
decoding consume it)::

    keys:           list[str], B utterance keys
    feats:          float32 (B, T, D) fbank, zero-padded, T frames at 10 ms, D = num_mel_bins (80 default)
    feats_lengths:  int64 (B,)
    target:         int64 (B, L) token ids padded with IGNORE_ID (-1)
    target_lengths: int64 (B,)
    num_skipped:    dict[str, int] samples dropped by this dataloader worker since its previous batch, by reason

A worker whose every remaining sample was skipped yields one batch with B=0 (``feats`` of shape ``(0, 0, D)``,
``target`` of shape ``(0, 0)``) so that its skip counts are not lost; consumers must read ``num_skipped`` and
then skip B=0 batches. Skip reasons: ``bad_line``, ``missing_audio``, ``unreadable_audio``, ``empty_audio``,
``empty_text``, ``all_unknown``, ``unknown_token``, ``too_short``, ``too_long``, ``too_few_tokens``,
``too_many_tokens``, ``ratio_too_small``, ``ratio_too_large``, and for shards ``missing_shard``, ``corrupt_shard``,
``corrupt_member``; each skip is also logged as a warning naming the key.

The model is called as ``model(feats, feats_lengths, target, target_lengths)``.
"""
import copy
import functools
import logging
import random
from collections import Counter
from typing import Iterator, List, Optional, Tuple

import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from toolkit.dataset import processor, shard
from toolkit.utils.config import ConfigError

logger = logging.getLogger(__name__)

DEFAULT_DATASET_CONF = {
    "data_type": "raw",
    "filter_conf": {"max_length": 2000, "min_length": 10, "token_max_length": 200, "token_min_length": 1,
                    "min_output_input_ratio": 0.0005, "max_output_input_ratio": 1.0},
    "resample_conf": {"resample_rate": 16000},
    "tokenize_conf": {"max_unk_ratio": 0.0},
    "speed_perturb": False,
    "volume_perturb": False,
    "volume_perturb_conf": {"min_gain_db": -30.0, "max_gain_db": 6.0},
    "fbank_conf": {"num_mel_bins": 80, "frame_shift": 10, "frame_length": 25, "dither": 1.0},
    "spec_aug": True,
    "spec_aug_conf": {"num_t_mask": 2, "num_f_mask": 2, "max_t": 50, "max_f": 10},
    "shuffle": True,
    "shuffle_conf": {"shuffle_size": 1500},
    "sort": True,
    "sort_conf": {"sort_size": 500},
    "batch_conf": {"batch_type": "static", "batch_size": 16, "max_frames_in_batch": 12000,
                   "bucket_boundaries": [500, 1000], "bucket_batch_sizes": [32, 16, 8]},
    "dataloader_conf": {"num_workers": 1, "prefetch_factor": 4, "pin_memory": False, "persistent_workers": False},
}
MODES = ("train", "cv", "test")
BATCH_TYPES = ("static", "dynamic", "bucket")
DATA_TYPES = ("raw", "shard")


def resolve_dataset_conf(dataset_conf: Optional[dict]) -> dict:
    """Fill ``dataset_conf`` (may be None or partial) with :data:`DEFAULT_DATASET_CONF`; returns a new dict.

    Raises:
        ConfigError: (a ValueError) an unknown key at the top level or inside a ``*_conf`` section (the message
            names it and lists the valid keys), ``data_type`` not in ``raw|shard``, ``batch_conf.batch_type`` not in
            ``static|dynamic|bucket``, bucket sizes that do not match the boundaries, or a batch size, frame budget,
            SpecAugment width below 1 or a negative ``num_workers``.
    """
    conf = copy.deepcopy(DEFAULT_DATASET_CONF)
    for key, value in (dataset_conf or {}).items():
        if key not in conf:
            raise ConfigError(f"unknown dataset_conf key {key!r}; valid keys: {sorted(conf)}")
        if isinstance(conf[key], dict):
            for sub_key in value:
                if sub_key not in conf[key]:
                    raise ConfigError(f"unknown dataset_conf.{key} key {sub_key!r}; valid keys: {sorted(conf[key])}")
            conf[key].update(value)
        else:
            conf[key] = value
    batch_type = conf["batch_conf"]["batch_type"]
    if batch_type not in BATCH_TYPES:
        raise ConfigError(f"batch_conf.batch_type must be one of {BATCH_TYPES}, got {batch_type!r}")
    if conf["data_type"] not in DATA_TYPES:
        raise ConfigError(f"data_type must be one of {DATA_TYPES}, got {conf['data_type']!r}")
    boundaries, sizes = conf["batch_conf"]["bucket_boundaries"], conf["batch_conf"]["bucket_batch_sizes"]
    if batch_type == "bucket" and len(sizes) != len(boundaries) + 1:
        raise ConfigError(f"batch_conf.bucket_batch_sizes needs len(bucket_boundaries) + 1 = {len(boundaries) + 1} "
                          f"entries, got {sizes}")
    minimums = [("batch_conf", "batch_size", 1), ("batch_conf", "max_frames_in_batch", 1),
                ("dataloader_conf", "num_workers", 0), ("spec_aug_conf", "max_t", 1), ("spec_aug_conf", "max_f", 1)]
    for section, key, least in minimums:
        value = conf[section][key]
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise ConfigError(f"dataset_conf.{section}.{key} must be an integer >= {least}, got {value!r}")
    return conf


def _build_pipeline(lines: List[str], tokenizer, conf: dict, mode: str, rng: random.Random) -> Iterator[dict]:
    """Chain every step over this worker's lines, reading ``conf`` top to bottom."""
    train = mode == "train"
    num_skipped: Counter = Counter()

    def per_sample(stream, fn, **kwargs):
        return processor.map_skipping(stream, functools.partial(fn, **kwargs), num_skipped)

    if conf["data_type"] == "raw":
        samples = per_sample(({"line": line} for line in lines), processor.parse_raw)
    else:
        samples = shard.read_shards(lines, num_skipped)
    if train and conf["shuffle"]:
        # Shuffling before audio is decoded keeps the buffer at a few bytes (raw) or the encoded audio (shard)
        # per sample instead of a waveform.
        samples = processor.shuffle(samples, rng, **conf["shuffle_conf"])
    samples = per_sample(samples, processor.read_audio)
    samples = per_sample(samples, processor.resample, **conf["resample_conf"])
    if train and conf["speed_perturb"]:
        samples = per_sample(samples, processor.speed_perturb, rng=rng)
    if train and conf["volume_perturb"]:
        samples = per_sample(samples, processor.volume_perturb, rng=rng, **conf["volume_perturb_conf"])
    samples = per_sample(samples, processor.tokenize, tokenizer=tokenizer, **conf["tokenize_conf"])
    samples = per_sample(samples, processor.filter_sample, **conf["filter_conf"])
    fbank_conf = dict(conf["fbank_conf"], dither=conf["fbank_conf"]["dither"] if train else 0.0)
    samples = per_sample(samples, processor.compute_fbank, rng=rng, **fbank_conf)
    if train and conf["spec_aug"]:
        samples = per_sample(samples, processor.spec_aug, rng=rng, **conf["spec_aug_conf"])
    if conf["sort"]:
        samples = processor.sort(samples, **conf["sort_conf"])
    batch_conf = conf["batch_conf"]
    if batch_conf["batch_type"] == "static":
        batches = processor.static_batch(samples, batch_conf["batch_size"])
    elif batch_conf["batch_type"] == "dynamic":
        batches = processor.dynamic_batch(samples, batch_conf["max_frames_in_batch"])
    else:
        batches = processor.bucket_batch(samples, batch_conf["bucket_boundaries"], batch_conf["bucket_batch_sizes"])
    return processor.padding(batches, num_skipped, fbank_conf["num_mel_bins"])


class AsrDataset(IterableDataset):
    """Iterable over batch dicts for one rank; see the module docstring for the batch contract.

    Partition: each pass, the line order is (train mode with ``shuffle``) a permutation seeded by
    ``seed + epoch``, identical on all ranks; position ``i`` goes to global worker
    ``i % (world_size * num_workers)``, global worker = ``rank * num_workers + worker_id``. Every line is
    thus read by exactly one rank and one worker per epoch; ranks may get unequal counts (logged by
    :func:`build_dataset`). With shards the unit is a whole shard, read in order by its worker.

    The epoch of a pass is the last :meth:`set_epoch` value plus the passes this copy of the dataset has made
    since, so persistent DataLoader workers (whose copy never sees ``set_epoch``) still reshuffle each epoch.
    """

    def __init__(self, lines: List[str], tokenizer, conf: dict, mode: str, rank: int, world_size: int, seed: int):
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

    def set_epoch(self, epoch: int) -> None:
        """Select the shuffling/augmentation seed for the next pass (call before each epoch)."""
        self.epoch = epoch
        self._passes_since_set_epoch = 0

    def __iter__(self) -> Iterator[dict]:
        epoch = self.epoch + self._passes_since_set_epoch
        self._passes_since_set_epoch += 1
        info = get_worker_info()
        worker_id, num_workers = (info.id, info.num_workers) if info is not None else (0, 1)
        global_worker = self.rank * num_workers + worker_id
        total_workers = self.world_size * num_workers
        order = list(range(len(self.lines)))
        if self.mode == "train" and self.conf["shuffle"]:
            random.Random(self.seed + epoch).shuffle(order)
        mine = [self.lines[i] for pos, i in enumerate(order) if pos % total_workers == global_worker]
        if not mine:
            logger.warning("rank %d worker %d has no %s lines this epoch: %d lines for %d workers", self.rank,
                           worker_id, self.conf["data_type"], len(self.lines), total_workers)
        rng = random.Random(f"{self.seed}:{epoch}:{global_worker}")
        return _build_pipeline(mine, self.tokenizer, self.conf, self.mode, rng)


def lines_per_rank(num_lines: int, world_size: int, num_workers: int) -> List[int]:
    """How many data.list lines each rank reads per epoch under :class:`AsrDataset`'s partition (the same every
    epoch: the permutation changes which lines, not how many). ``num_workers`` 0 counts as 1."""
    total_workers = world_size * max(1, num_workers)
    per_worker = [len(range(w, num_lines, total_workers)) for w in range(total_workers)]
    return [sum(per_worker[r * max(1, num_workers):(r + 1) * max(1, num_workers)]) for r in range(world_size)]


def _log_partition(data_list_file: str, num_lines: int, conf: dict, rank: int, world_size: int) -> None:
    num_workers = conf["dataloader_conf"]["num_workers"]
    counts = lines_per_rank(num_lines, world_size, num_workers)
    unit = "shards" if conf["data_type"] == "shard" else "lines"
    if len(set(counts)) > 1 and rank == 0:
        # NOTE: uneven shard counts mean uneven batch counts; the trainer's join absorbs them, this says why.
        logger.info("%s: %d %s do not divide evenly over %d ranks x %d workers; %s per rank: %s", data_list_file,
                    num_lines, unit, world_size, max(1, num_workers), unit, counts)


def count_utterances(data_list_file: str, dataset_conf: Optional[dict]) -> int:
    """Utterances listed by a data.list: its non-empty lines for ``raw``, the transcripts in its shards (header
    scan, see :func:`toolkit.dataset.shard.count_shard_utterances`) for ``shard``. Before filtering.

    Raises:
        OSError: ``data_list_file`` cannot be read. ValueError: bad ``dataset_conf``.
    """
    data_type = resolve_dataset_conf(dataset_conf)["data_type"]
    with open(data_list_file, encoding="utf-8") as f:
        lines = [line.strip() for line in f if line.strip()]
    return len(lines) if data_type == "raw" else sum(shard.count_shard_utterances(line) for line in lines)


def read_transcripts(data_list_file: str, dataset_conf: Optional[dict]) -> List[Tuple[str, str]]:
    """``(key, transcript)`` of every utterance a data.list names, in input order (raw: line order; shard: shard
    order, then member order), repeats included: the references of a test set and the order its results are
    written in. A raw line that is not a valid JSON utterance, and the utterances of a missing or damaged shard
    past the damage, are left out (the pipeline skips them too, counted as ``bad_line``, ``missing_shard`` or
    ``corrupt_shard``).

    Raises:
        OSError: ``data_list_file`` cannot be read. ValueError: bad ``dataset_conf``.
    """
    data_type = resolve_dataset_conf(dataset_conf)["data_type"]
    with open(data_list_file, encoding="utf-8") as f:
        lines = [line.strip() for line in f if line.strip()]
    if data_type == "shard":
        return [pair for line in lines for pair in shard.read_shard_transcripts(line)]
    pairs = []
    for line in lines:
        try:
            sample = processor.parse_raw({"line": line})
        except processor.SkipSample:
            continue
        pairs.append((sample["key"], sample["txt"]))
    return pairs


def build_dataset(data_list_file: str, tokenizer, dataset_conf: Optional[dict], *, mode: str = "train",
                  rank: int = 0, world_size: int = 1, seed: int = 777) -> AsrDataset:
    """Build the dataset of one rank from a data.list file (JSON lines ``{"key", "wav", "txt"}``).

    Args:
        data_list_file: written by ``tools/make_raw_list.py``; relative wav paths resolve against the cwd.
        tokenizer: a ``toolkit.text.tokenizer`` tokenizer.
        dataset_conf: see :data:`DEFAULT_DATASET_CONF`; missing keys take the defaults.
        mode: ``"train"``, or ``"cv"``/``"test"`` (no shuffle, speed perturbation, SpecAugment; dither 0).
        rank, world_size: this process's place among the distributed ranks.
        seed: base seed; the pass of epoch ``e`` shuffles lines with ``seed + e``.

    Raises:
        ValueError: bad ``mode``, ``rank``/``world_size``, or ``dataset_conf`` key (see
            :func:`resolve_dataset_conf`).
        OSError: ``data_list_file`` cannot be read.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if not 0 <= rank < world_size:
        raise ValueError(f"need 0 <= rank < world_size, got rank={rank} world_size={world_size}")
    conf = resolve_dataset_conf(dataset_conf)
    with open(data_list_file, encoding="utf-8") as f:
        lines = [line.strip() for line in f if line.strip()]
    _log_partition(data_list_file, len(lines), conf, rank, world_size)
    return AsrDataset(lines, tokenizer, conf, mode, rank, world_size, seed)


def build_dataloader(dataset: AsrDataset, dataset_conf: Optional[dict]) -> DataLoader:
    """Wrap ``dataset`` in a DataLoader (``batch_size=None``: the dataset already yields batches).

    ``dataset_conf.dataloader_conf`` sets num_workers, prefetch_factor, pin_memory and persistent_workers
    (defaults 1, 4, false, false); the last two worker-only options are dropped when num_workers is 0.

    The loader gets its own ``torch.Generator`` seeded with ``dataset.seed`` (reseed it per epoch through
    ``loader.generator``). NOTE: without one, every ``iter(loader)`` draws the workers' base seed from the global
    torch RNG, so where dropout's random stream stands would depend on how many loaders were iterated (an exact
    resume would diverge).

    Raises:
        ValueError: unknown ``dataset_conf`` key.
    """
    loader_conf = resolve_dataset_conf(dataset_conf)["dataloader_conf"]
    kwargs = {"batch_size": None, "num_workers": loader_conf["num_workers"], "pin_memory": loader_conf["pin_memory"],
              "generator": torch.Generator().manual_seed(dataset.seed)}
    if loader_conf["num_workers"] > 0:
        kwargs.update(prefetch_factor=loader_conf["prefetch_factor"],
                      persistent_workers=loader_conf["persistent_workers"])
    return DataLoader(dataset, **kwargs)
