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
import json
import os
import sys
from typing import Dict, List, Optional, Tuple

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from toolkit.utils.kaldi_files import read_table  # noqa: E402


def make_raw_list(wav_scp: str, text: str, wav_root: Optional[str] = None) -> Tuple[List[dict], List[str]]:
    """Return ``(entries, unmatched_keys)``: entries ``{"key","wav","txt"}`` in wav.scp order, and the sorted
    keys found in only one file."""
    wavs = read_table(wav_scp)
    texts = read_table(text)
    entries = []
    for key, wav in wavs.items():
        if key in texts:
            if wav_root is not None and not os.path.isabs(wav):
                wav = os.path.join(wav_root, wav)
            entries.append({"key": key, "wav": wav, "txt": texts[key]})
    return entries, sorted(set(wavs) ^ set(texts))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--wav_root", help="directory that relative wav.scp paths are relative to")
    parser.add_argument("wav_scp")
    parser.add_argument("text")
    parser.add_argument("data_list", help="output file")
    args = parser.parse_args()
    entries, unmatched = make_raw_list(args.wav_scp, args.text, args.wav_root)
    if unmatched:
        print(f"skipped {len(unmatched)} keys not in both {args.wav_scp} and {args.text}: {' '.join(unmatched)}",
              file=sys.stderr)
    if os.path.dirname(args.data_list):
        os.makedirs(os.path.dirname(args.data_list), exist_ok=True)
    with open(args.data_list, "w", encoding="utf-8") as f:
        for entry in entries:
            f.write(json.dumps(entry, ensure_ascii=False) + "\n")
    print(f"wrote {len(entries)} utterances to {args.data_list}")


if __name__ == "__main__":
    main()
