"""Global CMVN statistics of the fbank features of a raw data.list or a Kaldi wav.scp (``tools/compute_cmvn_stats.py``).

The features come from the data pipeline's own processors (same reader, segment cut, resampler and Kaldi fbank on
the int16 scale), with dither 0 so that the statistics are deterministic. The result is the JSON that
:func:`toolkit.models.transformer.cmvn.load_global_cmvn` reads: ``{"mean_stat": [D sums of x], "var_stat": [D sums
of x^2], "frame_num": total frames}``; mean = mean_stat / frame_num, variance = var_stat / frame_num - mean^2.
"""

import contextlib
import logging
import os
from collections import Counter
from functools import partial
from typing import List, Optional, Tuple, Union

import numpy as np
import torch
from tqdm import tqdm

from toolkit.dataset.processor import SkipSample, compute_fbank, parse_raw, read_audio, resample
from toolkit.utils.worker_start import LogSetup, start_worker_logging, worker_context

logger = logging.getLogger(__name__)


def read_entries(in_data_list: Optional[str], in_scp: Optional[str], wav_root: Optional[str]) -> List[dict]:
    """Utterances ``{"key", "wav"[, "start", "end"]}`` of a raw data.list (a segment line keeps its bounds, in
    seconds) or of a wav.scp (relative paths joined to ``wav_root``).

    Raises:
        ValueError: a line that is not a raw data.list entry or not ``key path`` (names the file and line).
    """
    entries = []
    with open(in_data_list or in_scp, encoding="utf-8") as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            if in_data_list:
                try:
                    entries.append(parse_raw({"line": line}))
                except SkipSample as skip:
                    raise ValueError(f"{in_data_list}:{line_no}: {skip.detail}; --in_data_list takes a raw "
                                     f"data.list (tools/make_raw_list.py), not a shard list") from skip
                continue
            fields = line.split(maxsplit=1)
            if len(fields) != 2:
                raise ValueError(f"{in_scp}:{line_no}: expected 'key path', got {line.strip()!r}")
            path = fields[1].strip()
            if wav_root is not None and not os.path.isabs(path):
                path = os.path.join(wav_root, path)
            entries.append({"key": fields[0], "wav": path})
    return entries


Stats = Tuple[np.ndarray, np.ndarray, int]


def utterance_stats(entry: dict, fbank_conf: dict, resample_rate: int) -> Union[Stats, str]:
    """``(sum, sum of squares, frames)`` of one utterance's fbank (float64), or the skip reason when it cannot be
    used (also logged as a warning with the key).

    The features come from the data pipeline's own processors (same reader, segment cut, resampler and fbank),
    with dither 0.
    """
    try:
        sample = resample(read_audio(entry), resample_rate)
        feats = compute_fbank(sample, **fbank_conf, dither=0.0)["feat"].numpy().astype(np.float64)
    except SkipSample as err:
        logger.warning("skipping %s: %s", entry["key"], err)
        return err.reason
    return feats.sum(axis=0), (feats ** 2).sum(axis=0), feats.shape[0]


def _start_worker(log_setup: LogSetup) -> None:
    """A pool worker: one torch thread, and the log of the process that started the pool."""
    torch.set_num_threads(1)
    start_worker_logging(log_setup)


def compute_stats(entries: List[dict], fbank_conf: dict, resample_rate: int, num_workers: int) -> Tuple[dict, Counter]:
    """Sum per-utterance statistics over ``entries`` (tqdm progress on stderr), in this process for
    ``num_workers`` 1, else in that many worker processes.

    The workers start as :func:`toolkit.utils.worker_start.worker_context` says (forked from a process without
    other threads), each with one torch thread.

    Returns:
        ``(stats, skipped)``: the CMVN JSON dict and the utterances left out, by reason.

    Raises:
        toolkit.utils.worker_start.WorkerStartError: the workers cannot start in this script shape (one line
            saying what to do).
    """
    dim = fbank_conf["num_mel_bins"]
    mean_stat, var_stat, frame_num, skipped = np.zeros(dim), np.zeros(dim), 0, Counter()
    worker = partial(utterance_stats, fbank_conf=fbank_conf, resample_rate=resample_rate)
    with contextlib.ExitStack() as stack:
        if num_workers > 1:
            # NOTE: one torch thread per worker: with torch's default (one per core) the workers' fbank threads
            # outnumber the cores and spin against each other.
            context = worker_context((worker, entries), "compute_stats' workers", "use one (--num_workers 1)")
            pool = stack.enter_context(context.Pool(num_workers, initializer=_start_worker,
                                                    initargs=(LogSetup.of_this_process(),)))
            results = pool.imap_unordered(worker, entries, chunksize=16)
        else:
            results = map(worker, entries)
        for stats in tqdm(results, total=len(entries), desc="cmvn"):
            if isinstance(stats, str):
                skipped[stats] += 1
                continue
            mean_stat += stats[0]
            var_stat += stats[1]
            frame_num += stats[2]
    return {"mean_stat": mean_stat.tolist(), "var_stat": var_stat.tolist(), "frame_num": frame_num}, skipped
