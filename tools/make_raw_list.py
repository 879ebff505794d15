#!/usr/bin/env python3
"""Join a Kaldi ``wav.scp`` and ``text`` into a data.list: one JSON line ``{"key", "wav", "txt"}`` per utterance.

Keys present in only one of the two files are reported on stderr and skipped. Relative wav paths are joined
to --wav_root when it is given (the corpora's wav.scp paths are relative to the corpus root), otherwise kept.
Output follows wav.scp order.

With --audio_format flac (or wav) the audio is decoded once and stored as 16-bit PCM in --audio_dir/<key>.flac,
and the list points there: training then decodes FLAC every epoch instead of the source (16-bit FLAC decodes about
twice as fast as the corpora's Ogg Opus; docs/data-pipeline.md). Resumable; utterances whose audio cannot be read
are left out and listed on stderr.

Usage:
    python tools/make_raw_list.py --wav_root corpora/tiny_fsdd \
        corpora/tiny_fsdd/data/train/wav.scp corpora/tiny_fsdd/data/train/text exp/tiny_fsdd/train.list
    python tools/make_raw_list.py --audio_format flac --audio_dir data/train/audio --num_workers 2 \
        data/train/wav.scp data/train/text data/train/data.list
"""
import argparse
import sys

from toolkit.dataset.data_list import make_raw_list, reencode_audio, write_raw_list
from toolkit.utils.config_parsing import ArgumentParser, exit_on_config_error


def main() -> None:
    parser = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--wav_root", help="directory that relative wav.scp paths are relative to")
    parser.add_argument("--audio_format", choices=("keep", "flac", "wav"), default="keep",
                        help="keep the source files, or store each utterance as 16-bit FLAC/WAV in --audio_dir")
    parser.add_argument("--audio_dir", help="folder for the re-encoded audio (needed unless --audio_format keep)")
    parser.add_argument("--num_workers", type=int, default=1, help="processes re-encoding audio")
    parser.add_argument("wav_scp")
    parser.add_argument("text")
    parser.add_argument("data_list", help="output file")
    args = parser.parse_args()
    if args.audio_format != "keep" and not args.audio_dir:
        parser.error(f"--audio_format {args.audio_format} needs --audio_dir")
    try:
        entries, unmatched = make_raw_list(args.wav_scp, args.text, args.wav_root)
        if args.audio_format != "keep":
            num_entries = len(entries)
            entries, reused, skipped = reencode_audio(entries, args.audio_dir, args.audio_format, args.num_workers)
            for key, reason in skipped:
                print(f"left out {key}: {reason}", file=sys.stderr)
            print(f"{args.audio_dir}: {len(entries)} of {num_entries} utterances as {args.audio_format} "
                  f"({reused} already there), {len(skipped)} left out")
    except (OSError, ValueError) as e:  # a missing file, a repeated key, bytes that are not UTF-8: one line
        sys.exit(f"make_raw_list.py: {e}")
    if unmatched:
        print(f"skipped {len(unmatched)} keys not in both {args.wav_scp} and {args.text}: {' '.join(unmatched)}",
              file=sys.stderr)
    print(f"wrote {write_raw_list(entries, args.data_list)} utterances to {args.data_list}")


if __name__ == "__main__":
    exit_on_config_error(main)
