#!/usr/bin/env python3
"""Join a Kaldi ``wav.scp`` and ``text`` into a data.list: one JSON line ``{"key", "wav", "txt"}`` per utterance.

Keys present in only one of the two files are reported on stderr and skipped. Relative wav paths are joined
to --wav_root when it is given (the corpora's wav.scp paths are relative to the corpus root), otherwise kept.
Output follows wav.scp order.

Usage:
    python tools/make_raw_list.py --wav_root corpora/tiny_fsdd \
        corpora/tiny_fsdd/data/train/wav.scp corpora/tiny_fsdd/data/train/text exp/tiny_fsdd/train.list
"""
import argparse
import sys

from toolkit.dataset.data_list import make_raw_list, write_raw_list


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--wav_root", help="directory that relative wav.scp paths are relative to")
    parser.add_argument("wav_scp")
    parser.add_argument("text")
    parser.add_argument("data_list", help="output file")
    args = parser.parse_args()
    try:
        entries, unmatched = make_raw_list(args.wav_scp, args.text, args.wav_root)
    except (OSError, ValueError) as e:  # a missing file, a repeated key, bytes that are not UTF-8: one line
        sys.exit(f"make_raw_list.py: {e}")
    if unmatched:
        print(f"skipped {len(unmatched)} keys not in both {args.wav_scp} and {args.text}: {' '.join(unmatched)}",
              file=sys.stderr)
    print(f"wrote {write_raw_list(entries, args.data_list)} utterances to {args.data_list}")


if __name__ == "__main__":
    main()
