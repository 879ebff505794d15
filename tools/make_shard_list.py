#!/usr/bin/env python3
"""Pack a raw data.list into tar shards of --num_utts_per_shard utterances and write the shard data.list.

The shard data.list holds one JSON line per shard, ``{"shard": "/abs/path/shards_000000.tar", "num_utts": 1000}``:
the count, read from the written shard, lets training count a lost shard in utterances. Lists of bare shard paths
(older versions) still train; run this again on them (it keeps the shards) to record the counts.

Each shard holds ``<key>.txt`` + ``<key>.<ext>`` (audio bytes) per utterance, in data.list order (format in
toolkit/dataset/shard.py). --audio_format keep stores the source files' bytes; flac or wav re-encode to 16-bit
PCM, several times the bytes of Ogg Opus but 6x (FLAC) to 25x (WAV) cheaper to decode.

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
import glob
import hashlib
import json
import os
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import List, Tuple

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from any directory

from toolkit.dataset.processor import SkipSample, parse_raw  # noqa: E402
from toolkit.dataset.shard import AUDIO_FORMATS, write_shard, write_shard_list  # noqa: E402


def read_entries(raw_list: str) -> List[dict]:
    """Parse the raw data.list.

    Raises:
        ValueError: a line is not a valid raw entry (names the line number), or a key contains ``/``.
    """
    entries = []
    with open(raw_list, encoding="utf-8") as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                entry = parse_raw({"line": line})
            except SkipSample as skip:
                raise ValueError(f"{raw_list}:{line_no}: {skip.detail}") from skip
            if "/" in entry["key"]:
                raise ValueError(f"{raw_list}:{line_no}: key {entry['key']!r} contains '/'")
            entries.append(entry)
    return entries


def _clear_stale_shards(shard_dir: str, prefix: str, fingerprint: str) -> None:
    """Delete ``prefix`` shards written from other entries or settings, then record ``fingerprint``."""
    path = os.path.join(shard_dir, f"{prefix}.fingerprint")
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as f:
            if f.read().strip() == fingerprint:
                return
    stale = glob.glob(os.path.join(glob.escape(shard_dir), f"{glob.escape(prefix)}_*.tar*"))
    if stale:
        print(f"{shard_dir}: input or settings changed, deleting {len(stale)} old {prefix} shards", file=sys.stderr)
    for old in stale:
        os.remove(old)
    with open(path, "w", encoding="utf-8") as f:
        f.write(fingerprint + "\n")


def _write_job(job: Tuple[List[dict], str, str]) -> Tuple[int, List[Tuple[str, str]]]:
    entries, tar_path, audio_format = job
    return write_shard(entries, tar_path, audio_format)


def make_shards(entries: List[dict], shard_dir: str, num_utts_per_shard: int, num_workers: int,
                prefix: str = "shards",
                audio_format: str = "keep") -> Tuple[List[str], int, int, List[Tuple[str, str]]]:
    """Write the shards that do not exist yet (``audio_format``: keep, flac or wav).

    Returns:
        ``(shard_paths, num_reused, num_utts_written, skipped)``: every shard's absolute path in order, how many existed
        already, utterances written in this run, and ``(key, reason)`` of the entries left out in this run.

    Raises:
        ValueError: ``num_utts_per_shard`` or ``num_workers`` < 1.
    """
    if num_utts_per_shard < 1 or num_workers < 1:
        raise ValueError(f"need num_utts_per_shard >= 1 and num_workers >= 1, got {num_utts_per_shard}, {num_workers}")
    os.makedirs(shard_dir, exist_ok=True)
    settings = json.dumps([entries, num_utts_per_shard, audio_format], sort_keys=True)
    _clear_stale_shards(shard_dir, prefix, hashlib.sha256(settings.encode("utf-8")).hexdigest())
    chunks = [entries[i:i + num_utts_per_shard] for i in range(0, len(entries), num_utts_per_shard)]
    paths = [os.path.abspath(os.path.join(shard_dir, f"{prefix}_{i:06d}.tar")) for i in range(len(chunks))]
    jobs = [(chunk, path, audio_format) for chunk, path in zip(chunks, paths) if not os.path.isfile(path)]
    if num_workers == 1 or len(jobs) <= 1:
        results = list(map(_write_job, jobs))
    else:
        with ProcessPoolExecutor(min(num_workers, len(jobs))) as pool:
            results = list(pool.map(_write_job, jobs))
    written = sum(num for num, _ in results)
    skipped = [item for _, job_skipped in results for item in job_skipped]
    return paths, len(chunks) - len(jobs), written, skipped


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num_utts_per_shard", type=int, default=1000)
    parser.add_argument("--num_workers", type=int, default=1, help="processes writing shards")
    parser.add_argument("--prefix", default="shards", help="shard file name prefix")
    parser.add_argument("--audio_format", choices=AUDIO_FORMATS, default="keep",
                        help="keep the source bytes, or store 16-bit FLAC/WAV (faster to decode, larger)")
    parser.add_argument("raw_list", help="raw data.list (JSON lines key, wav, txt[, start, end])")
    parser.add_argument("shard_dir", help="folder for the .tar shards")
    parser.add_argument("shard_list", help="output data.list: one shard path per line")
    args = parser.parse_args()
    entries = read_entries(args.raw_list)
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
    main()
