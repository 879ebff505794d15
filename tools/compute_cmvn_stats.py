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
import logging
import os
import sys

from toolkit.dataset.cmvn_stats import compute_stats, read_entries
from toolkit.train_config import read_config
from toolkit.utils.config_parsing import ArgumentParser, exit_on_config_error


def main() -> None:
    parser = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
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
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
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
