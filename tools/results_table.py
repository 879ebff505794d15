#!/usr/bin/env python3
"""Markdown table of WER and CER for every test set and decoding mode of a decoded model dir.

    python tools/results_table.py --data data --dir exp/conformer --test_sets test_fsdd test_kathleen \
        --modes ctc_greedy_search attention_rescoring --title "conformer" > exp/conformer/RESULTS.md

Reads references from ``<data>/<test_set>/text`` and hypotheses from ``<dir>/<test_set>/<mode>/text`` (as written
by ``toolkit.bin.recognize``) and scores them with :mod:`toolkit.utils.metrics` (the scorer of recognize and
``tools/compute_wer.py``); utterances without a hypothesis count as deletions, a rate with no reference word (N =
0) reads ``n/a``. Needs the toolkit importable (``pip install -e .``, or the recipe's ``path.sh``).
"""

import argparse
import os

from toolkit.utils.config_parsing import ArgumentParser, exit_on_config_error
from toolkit.utils.kaldi_files import read_table
from toolkit.utils.metrics import score


def table(data: str, exp_dir: str, test_sets: list, modes: list) -> list:
    """Rows ``(test_set, mode, utts, word Score, char Score)`` in the given order (see
    :func:`toolkit.utils.metrics.score`)."""
    rows = []
    for test_set in test_sets:
        ref = read_table(os.path.join(data, test_set, "text"), text=True)
        for mode in modes:
            hyp = read_table(os.path.join(exp_dir, test_set, mode, "text"), text=True)
            rows.append((test_set, mode, len(ref), score(ref, hyp, "word"), score(ref, hyp, "char")))
    return rows


def _rate(rate) -> str:
    return "n/a" if rate is None else f"{rate:.2f}"


def main():
    parser = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
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
        words, chars = wer.totals, cer.totals
        print(f"| {test_set} | {mode} | {utts} | {words.N} | {_rate(words.error_rate)} "
              f"({words.S}/{words.D}/{words.I}) | {_rate(chars.error_rate)} |")


if __name__ == "__main__":
    exit_on_config_error(main)
