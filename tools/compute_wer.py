#!/usr/bin/env python3
"""Word (or character) error rate between Kaldi-style ``key words...`` reference and hypothesis files.

Alignment is Levenshtein via jiwer (``process_words``; ``process_characters`` with --cer, where the single
space between words counts as a character). Keys of the reference missing from the hypothesis are scored as
all deletions and reported; hypothesis keys absent from the reference are reported and ignored.

Output: ``N=.. C=.. S=.. D=.. I=..`` and ``WER xx.xx % [ S+D+I / N ]`` (CER with --cer); with --per_utt, one line
``key N C S D I`` per reference utterance.

Usage:
    python tools/compute_wer.py corpora/tiny_fsdd/data/test/text exp/tiny_fsdd/decode_test/text \
        --per_utt exp/tiny_fsdd/decode_test/wer_per_utt
"""
import argparse
import os
import sys
from typing import Dict

import jiwer

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from toolkit.utils.kaldi_files import read_table  # noqa: E402

COUNTS = ("N", "C", "S", "D", "I")


def _chunk_counts(chunks) -> Dict[str, int]:
    counts = dict.fromkeys(COUNTS, 0)
    op_to_count = {"equal": "C", "substitute": "S", "delete": "D"}
    for chunk in chunks:
        if chunk.type == "insert":
            counts["I"] += chunk.hyp_end_idx - chunk.hyp_start_idx
        else:
            counts[op_to_count[chunk.type]] += chunk.ref_end_idx - chunk.ref_start_idx
    counts["N"] = counts["C"] + counts["S"] + counts["D"]
    return counts


def score(ref: Dict[str, str], hyp: Dict[str, str], cer: bool = False) -> dict:
    """Score hypotheses against references, utterance keys matched.

    Returns:
        ``{"N", "C", "S", "D", "I"}`` corpus totals (int), ``"error_rate"`` (percent, float; 0.0 when N=0 and
        nothing was inserted, inf when N=0 with insertions), ``"missing"`` (sorted ref keys absent from hyp),
        ``"extra"`` (sorted hyp keys absent from ref), ``"per_utt"`` ({key: {"N","C","S","D","I"}}).
    """
    keys = list(ref)
    refs = [" ".join(ref[k].split()) for k in keys]
    hyps = [" ".join(hyp.get(k, "").split()) for k in keys]
    process = jiwer.process_characters if cer else jiwer.process_words
    alignments = process(refs, hyps).alignments if keys else []
    per_utt = {k: _chunk_counts(chunks) for k, chunks in zip(keys, alignments)}
    totals = {c: sum(u[c] for u in per_utt.values()) for c in COUNTS}
    errors = totals["S"] + totals["D"] + totals["I"]
    if totals["N"]:
        rate = 100.0 * errors / totals["N"]
    else:
        rate = float("inf") if errors else 0.0
    return dict(totals, error_rate=rate, missing=sorted(set(ref) - set(hyp)), extra=sorted(set(hyp) - set(ref)),
                per_utt=per_utt)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("ref", help="reference Kaldi text file")
    parser.add_argument("hyp", help="hypothesis Kaldi text file")
    parser.add_argument("--cer", action="store_true", help="character error rate instead of word error rate")
    parser.add_argument("--per_utt", help="write per-utterance 'key N C S D I' lines here")
    args = parser.parse_args()
    try:
        ref, hyp = read_table(args.ref), read_table(args.hyp)
    except OSError as e:
        sys.exit(f"compute_wer.py: cannot read {e.filename}: {e.strerror}")
    result = score(ref, hyp, args.cer)
    for name, what in (("missing", "keys missing from hyp (scored as deletions)"),
                       ("extra", "hyp keys not in ref (ignored)")):
        keys = result[name]
        if keys:
            more = f" ... and {len(keys) - 10} more" if len(keys) > 10 else ""
            print(f"{len(keys)} {what}: {' '.join(keys[:10])}{more}", file=sys.stderr)
    if args.per_utt:
        with open(args.per_utt, "w", encoding="utf-8") as f:
            for key, counts in result["per_utt"].items():
                f.write(f"{key} " + " ".join(str(counts[c]) for c in COUNTS) + "\n")
    print(" ".join(f"{c}={result[c]}" for c in COUNTS))
    errors = result["S"] + result["D"] + result["I"]
    print(f"{'CER' if args.cer else 'WER'} {result['error_rate']:.2f} % [ {errors} / {result['N']} ]")


if __name__ == "__main__":
    main()
