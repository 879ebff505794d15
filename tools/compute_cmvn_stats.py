#!/usr/bin/env python3
"""Global CMVN statistics of Kaldi fbank features over a data.list or a wav.scp.

Features follow ``dataset_conf.fbank_conf`` (and ``resample_conf``) of the training config, the same way the
data pipeline computes them (Lhotse's Kaldi fbank, int16-scaled waveform, povey window, snip_edges) but with
dither 0 so the statistics are deterministic. A data.list segment line (``start``/``end`` seconds) counts only its
segment. Utterances whose audio cannot be used are named on stderr, left out and counted by reason in the summary
line; a malformed input line, or no frame at all, is a one-line error (exit 1) and no file is written.

Output JSON: ``{"mean_stat": [D sums of x], "var_stat": [D sums of x^2], "frame_num": total frames}``;
mean = mean_stat / frame_num, variance = var_stat / frame_num - mean^2.

Usage:
    python tools/compute_cmvn_stats.py --train_config conf/train.yaml --num_workers 2 \
        --in_data_list exp/tiny_fsdd/train.list --out_cmvn exp/tiny_fsdd/global_cmvn
"""
import argparse
import json
import os
import sys
from collections import Counter
from functools import partial
from multiprocessing import Pool
from typing import List, Optional, Tuple, Union

import numpy as np
from tqdm import tqdm

from toolkit.config import read_config
from toolkit.dataset.processor import SkipSample, compute_fbank, parse_raw, read_audio, resample
from toolkit.utils.config import exit_on_config_error


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
    used (also printed to stderr with the key).

    The features come from the data pipeline's own processors (same reader, segment cut, resampler and fbank),
    with dither 0.
    """
    try:
        sample = resample(read_audio(entry), resample_rate)
        feats = compute_fbank(sample, **fbank_conf, dither=0.0)["feat"].numpy().astype(np.float64)
    except SkipSample as err:
        print(f"skipping {entry['key']}: {err}", file=sys.stderr)
        return err.reason
    return feats.sum(axis=0), (feats ** 2).sum(axis=0), feats.shape[0]


def compute_stats(entries: List[dict], fbank_conf: dict, resample_rate: int, num_workers: int) -> Tuple[dict, Counter]:
    """Sum per-utterance statistics over ``entries`` with ``num_workers`` processes (tqdm progress on stderr).

    Returns:
        ``(stats, skipped)``: the CMVN JSON dict and the utterances left out, by reason.
    """
    dim = fbank_conf["num_mel_bins"]
    mean_stat, var_stat, frame_num, skipped = np.zeros(dim), np.zeros(dim), 0, Counter()
    worker = partial(utterance_stats, fbank_conf=fbank_conf, resample_rate=resample_rate)
    with Pool(num_workers) as pool:
        for stats in tqdm(pool.imap_unordered(worker, entries, chunksize=16), total=len(entries), desc="cmvn"):
            if isinstance(stats, str):
                skipped[stats] += 1
                continue
            mean_stat += stats[0]
            var_stat += stats[1]
            frame_num += stats[2]
    return {"mean_stat": mean_stat.tolist(), "var_stat": var_stat.tolist(), "frame_num": frame_num}, skipped


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--in_data_list", help="data.list of JSON lines with a 'wav' field")
    source.add_argument("--in_scp", help="Kaldi wav.scp")
    parser.add_argument("--wav_root", help="directory that relative --in_scp paths are relative to")
    parser.add_argument("--train_config", required=True, help="YAML with dataset_conf.fbank_conf")
    parser.add_argument("--override_config", action="append", default=[],
                        help="as train.py's (the recipe passes the same ones), e.g. a frame shift")
    parser.add_argument("--num_workers", type=int, default=1)
    parser.add_argument("--out_cmvn", required=True, help="output JSON file")
    args = parser.parse_args()
    conf = read_config(args.train_config, args.override_config).dataset_conf
    fbank = conf.fbank_conf
    fbank_conf = {"num_mel_bins": fbank.num_mel_bins, "frame_length": fbank.frame_length,
                  "frame_shift": fbank.frame_shift}
    resample_rate = conf.resample_conf.resample_rate
    try:
        entries = read_entries(args.in_data_list, args.in_scp, args.wav_root)
    except (ValueError, OSError) as err:
        sys.exit(f"{sys.argv[0]}: {err}")
    stats, skipped = compute_stats(entries, fbank_conf, resample_rate, args.num_workers)
    used = len(entries) - sum(skipped.values())
    if stats["frame_num"] == 0:
        sys.exit(f"{sys.argv[0]}: no frames from the {len(entries)} utterances of {args.in_data_list or args.in_scp} "
                 f"(skipped: {dict(skipped)}); not writing {args.out_cmvn}")
    if os.path.dirname(args.out_cmvn):
        os.makedirs(os.path.dirname(args.out_cmvn), exist_ok=True)
    with open(args.out_cmvn, "w", encoding="utf-8") as f:
        json.dump(stats, f)
    print(f"wrote {args.out_cmvn}: {stats['frame_num']} frames from {used} of {len(entries)} utterances"
          + (f"; skipped by reason: {dict(skipped)}" if skipped else ""))


if __name__ == "__main__":
    exit_on_config_error(main)
