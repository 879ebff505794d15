#!/usr/bin/env python3
"""Pack a raw data.list into tar shards of --num_utts_per_shard utterances and write the shard data.list.

The shard data.list holds one JSON line per shard, ``{"shard": "/abs/path/shards_000000.tar", "num_utts": 1000}``:
the count, read from the written shard, lets training count a lost shard in utterances. Lists of bare shard paths
(older versions) still train; run this again on them (it keeps the shards) to record the counts.

Each shard holds ``<key>.txt`` + ``<key>.<ext>`` (audio bytes) per utterance, in data.list order (format in
toolkit/dataset/shard.py). --audio_format keep stores the source files' bytes; flac or wav re-encode to 16-bit
PCM, several times the bytes of Ogg Opus but much cheaper to decode (``benchmarks/bench_dataset.py`` measures it).

Shards are written by --num_workers processes. The run is resumable: a shard is written to ``NAME.tmp`` and
renamed when complete, and a shard file that already exists is kept, so after an interruption the same command
writes only the missing shards. ``<shard_dir>/<prefix>.fingerprint`` records a hash of the entries and settings;
when they change, the old shards of that prefix are deleted first, so a resumed run never mixes two inputs.
Entries whose audio cannot be read are left out and listed on stderr (those of a resumed run's earlier shards
are counted in the summary line). Relative wav paths resolve against
the current directory, like the training pipeline's; the shard data.list holds absolute shard paths, so that
training may run from any directory.

Usage:
    python tools/make_shard_list.py --num_utts_per_shard 1000 --num_workers 4 \
        data/train/raw.list data/train/shards data/train/data.list
"""
import argparse
import logging
import sys

from toolkit.dataset.data_list import read_raw_list
from toolkit.dataset.shard import AUDIO_FORMATS, make_shards, write_shard_list
from toolkit.utils.config_parsing import ArgumentParser, exit_on_config_error


def main() -> None:
    parser = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num_utts_per_shard", type=int, default=1000)
    parser.add_argument("--num_workers", type=int, default=1, help="processes writing shards")
    parser.add_argument("--prefix", default="shards", help="shard file name prefix")
    parser.add_argument("--audio_format", choices=AUDIO_FORMATS, default="keep",
                        help="keep the source bytes, or store 16-bit FLAC/WAV (faster to decode, larger)")
    parser.add_argument("raw_list", help="raw data.list (JSON lines key, wav, txt[, start, end])")
    parser.add_argument("shard_dir", help="folder for the .tar shards")
    parser.add_argument("shard_list", help="output data.list: one shard path per line")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    try:
        entries = read_raw_list(args.raw_list)
    except ValueError as err:
        sys.exit(f"{sys.argv[0]}: {err}")
    paths, reused, written, skipped = make_shards(entries, args.shard_dir, args.num_utts_per_shard,
                                                  args.num_workers, args.prefix, args.audio_format)
    for key, reason in skipped:
        print(f"left out {key}: {reason}", file=sys.stderr)
    try:
        total = write_shard_list(paths, args.shard_list)
    except ValueError as err:
        sys.exit(f"{sys.argv[0]}: {err}")
    print(f"{args.shard_list}: {len(paths)} shards ({reused} already there), {written} utterances written, "
          f"{len(skipped)} left out in this run; the list holds {total} of the {len(entries)} entries")


if __name__ == "__main__":
    exit_on_config_error(main)
