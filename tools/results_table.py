#!/usr/bin/env python3
"""Markdown table of WER and CER for every test set and decoding mode of a decoded model dir.

    python tools/results_table.py --data data --dir exp/conformer --test_sets test_fsdd test_kathleen \
        --modes ctc_greedy_search attention_rescoring --title "conformer" > exp/conformer/RESULTS.md

Reads references from ``<data>/<test_set>/text`` and hypotheses from ``<dir>/<test_set>/<mode>/text`` (as written
by ``toolkit.bin.recognize``); utterances without a hypothesis count as deletions.
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compute_wer import read_table, score  # noqa: E402


def table(data: str, exp_dir: str, test_sets: list, modes: list) -> list:
    """Rows ``(test_set, mode, utts, wer_dict, cer_dict)`` in the given order."""
    rows = []
    for test_set in test_sets:
        ref = read_table(os.path.join(data, test_set, "text"))
        for mode in modes:
            hyp = read_table(os.path.join(exp_dir, test_set, mode, "text"))
            rows.append((test_set, mode, len(ref), score(ref, hyp), score(ref, hyp, cer=True)))
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", required=True)
    parser.add_argument("--dir", required=True)
    parser.add_argument("--test_sets", nargs="+", required=True)
    parser.add_argument("--modes", nargs="+", required=True)
    parser.add_argument("--title", default="")
    args = parser.parse_args()
    print(f"# Results {args.title}\n")
    print("| test set | decoding mode | utts | words N | WER % (S/D/I) | CER % |")
    print("|---|---|---:|---:|---:|---:|")
    for test_set, mode, utts, wer, cer in table(args.data, args.dir, args.test_sets, args.modes):
        print(f"| {test_set} | {mode} | {utts} | {wer['N']} | {wer['error_rate']:.2f} "
              f"({wer['S']}/{wer['D']}/{wer['I']}) | {cer['error_rate']:.2f} |")


if __name__ == "__main__":
    main()
