#!/usr/bin/env python3
"""Markdown table of WER and CER for every test set and decoding mode of a decoded model dir; for a streaming
model, a second table of the rates at each ``decoding_chunk_size`` beside full context.

    python tools/results_table.py --data data --dir exp/conformer --test_sets test_fsdd test_kathleen \
        --modes ctc_greedy_search attention_rescoring --title "conformer" > exp/conformer/RESULTS.md
    python tools/results_table.py ... --decoding_chunk_sizes -1 16 8 4

Reads references from ``<data>/<test_set>/text`` and hypotheses from ``<dir>/<test_set>/<mode>/text`` (as written
by ``toolkit.bin.recognize``; at a chunk size C other than -1 from ``<dir>/<test_set>/chunk_C/<mode>/text``, where
run.sh's stage 5 decodes it) and scores them with :mod:`toolkit.utils.metrics` (the scorer of recognize and
``tools/compute_wer.py``); utterances without a hypothesis count as deletions, a rate with no reference word (N =
0) reads ``n/a``. Needs the toolkit importable (``pip install -e .``, or the recipe's ``path.sh``).
"""

import argparse
import os

from toolkit.utils.config_parsing import ArgumentParser, exit_on_config_error
from toolkit.utils.kaldi_files import read_table
from toolkit.utils.metrics import score


def hypotheses_dir(exp_dir: str, test_set: str, chunk: int) -> str:
    """Where ``test_set`` decoded at ``decoding_chunk_size`` ``chunk`` is (-1: full context)."""
    return os.path.join(exp_dir, test_set) if chunk == -1 else os.path.join(exp_dir, test_set, f"chunk_{chunk}")


def table(data: str, exp_dir: str, test_sets: list, modes: list, chunk: int = -1) -> list:
    """Rows ``(test_set, mode, utts, word Score, char Score)`` in the given order, decoded at ``chunk`` (see
    :func:`toolkit.utils.metrics.score`)."""
    rows = []
    for test_set in test_sets:
        ref = read_table(os.path.join(data, test_set, "text"), text=True)
        for mode in modes:
            hyp = read_table(os.path.join(hypotheses_dir(exp_dir, test_set, chunk), mode, "text"), text=True)
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
    parser.add_argument("--decoding_chunk_sizes", nargs="+", type=int, default=[-1],
                        help="the chunk sizes decoded (-1: full context); the first makes the main table, all of "
                             "them the streaming table")
    args = parser.parse_args()
    chunks = args.decoding_chunk_sizes
    first = "" if chunks[0] == -1 else f", decoding_chunk_size {chunks[0]}"
    print(f"# Results {args.title}{first}\n")
    print("| test set | decoding mode | utts | words N | WER % (S/D/I) | CER % |")
    print("|---|---|---:|---:|---:|---:|")
    for test_set, mode, utts, wer, cer in table(args.data, args.dir, args.test_sets, args.modes, chunks[0]):
        words, chars = wer.totals, cer.totals
        print(f"| {test_set} | {mode} | {utts} | {words.N} | {_rate(words.error_rate)} "
              f"({words.S}/{words.D}/{words.I}) | {_rate(chars.error_rate)} |")
    if len(chunks) > 1:
        by_chunk = [table(args.data, args.dir, args.test_sets, args.modes, chunk) for chunk in chunks]
        names = ["full context" if chunk == -1 else f"chunk {chunk}" for chunk in chunks]
        print("\n## Streaming: WER % / CER % by decoding_chunk_size (encoder frames)\n")
        print("| test set | decoding mode | " + " | ".join(names) + " |")
        print("|---|---|" + "---:|" * len(chunks))
        for rows in zip(*by_chunk):
            test_set, mode = rows[0][:2]
            cells = [f"{_rate(wer.totals.error_rate)} / {_rate(cer.totals.error_rate)}" for _, _, _, wer, cer in rows]
            print(f"| {test_set} | {mode} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    exit_on_config_error(main)
