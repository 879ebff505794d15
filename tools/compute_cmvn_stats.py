#!/usr/bin/env python3
"""Global CMVN statistics of Kaldi fbank features over a data.list or a wav.scp.

Features follow ``dataset_conf.fbank_conf`` (and ``resample_conf``) of the training config, the same way the
data pipeline computes them (Lhotse's Kaldi fbank, int16-scaled waveform, povey window, snip_edges) but with
dither 0 so the statistics are deterministic. Unreadable or too-short files are reported and left out.

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
from functools import partial
from multiprocessing import Pool
from typing import List, Optional, Tuple

import numpy as np
from tqdm import tqdm

from toolkit.config import read_config
from toolkit.dataset.processor import SkipSample, compute_fbank, read_audio, resample
from toolkit.utils.config import exit_on_config_error


def read_wav_paths(in_data_list: Optional[str], in_scp: Optional[str], wav_root: Optional[str]) -> List[str]:
    """Wav paths from a data.list (``wav`` field) or a wav.scp (relative paths joined to ``wav_root``)."""
    paths = []
    if in_data_list:
        with open(in_data_list, encoding="utf-8") as f:
            paths = [json.loads(line)["wav"] for line in f if line.strip()]
    else:
        with open(in_scp, encoding="utf-8") as f:
            paths = [line.split(maxsplit=1)[1].strip() for line in f if len(line.split(maxsplit=1)) == 2]
        if wav_root is not None:
            paths = [p if os.path.isabs(p) else os.path.join(wav_root, p) for p in paths]
    return paths


def file_stats(path: str, fbank_conf: dict, resample_rate: int) -> Optional[Tuple[np.ndarray, np.ndarray, int]]:
    """``(sum, sum of squares, frames)`` of one file's fbank (float64), or None when it cannot be used.

    The features come from the data pipeline's own processors (same reader, resampler and fbank), with dither 0.
    """
    try:
        sample = resample(read_audio({"key": path, "wav": path}), resample_rate)
        feats = compute_fbank(sample, **fbank_conf, dither=0.0)["feat"].numpy().astype(np.float64)
    except SkipSample as err:
        print(f"skipping {path}: {err}", file=sys.stderr)
        return None
    return feats.sum(axis=0), (feats ** 2).sum(axis=0), feats.shape[0]


def compute_stats(paths: List[str], fbank_conf: dict, resample_rate: int, num_workers: int) -> dict:
    """Sum per-file statistics over ``paths`` with ``num_workers`` processes (tqdm progress on stderr)."""
    dim = fbank_conf["num_mel_bins"]
    mean_stat, var_stat, frame_num = np.zeros(dim), np.zeros(dim), 0
    worker = partial(file_stats, fbank_conf=fbank_conf, resample_rate=resample_rate)
    with Pool(num_workers) as pool:
        for stats in tqdm(pool.imap_unordered(worker, paths, chunksize=16), total=len(paths), desc="cmvn"):
            if stats is not None:
                mean_stat += stats[0]
                var_stat += stats[1]
                frame_num += stats[2]
    return {"mean_stat": mean_stat.tolist(), "var_stat": var_stat.tolist(), "frame_num": frame_num}


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
    paths = read_wav_paths(args.in_data_list, args.in_scp, args.wav_root)
    stats = compute_stats(paths, fbank_conf, resample_rate, args.num_workers)
    if os.path.dirname(args.out_cmvn):
        os.makedirs(os.path.dirname(args.out_cmvn), exist_ok=True)
    with open(args.out_cmvn, "w", encoding="utf-8") as f:
        json.dump(stats, f)
    print(f"wrote {args.out_cmvn}: {stats['frame_num']} frames from {len(paths)} files")


if __name__ == "__main__":
    exit_on_config_error(main)
