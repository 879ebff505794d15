#!/usr/bin/env python3
"""Word (or character) error rate between Kaldi-style ``key words...`` reference and hypothesis files.

A thin command line over :mod:`toolkit.utils.metrics` (the scorer ``toolkit.bin.recognize`` uses inside the
decoding job, so both give the same counts): Levenshtein alignment by jiwer, whitespace- and Unicode-normalised
(NFC: ``É`` precomposed or as ``E`` + combining accent is the same letter); with --cer
the single space between words counts as a character. Keys of the reference missing from the hypothesis are
scored as all deletions and reported; hypothesis keys absent from the reference are reported and ignored.

Output: ``N=.. C=.. S=.. D=.. I=..`` and ``WER xx.xx % [ S+D+I / N ]`` (CER with --cer); with --per_utt, one line
``key N C S D I`` per reference utterance.

Exit status 1, with a one-line error naming the file: an unreadable or non-UTF-8 file, a repeated key (file and
line), a reference file with no utterance, a hypothesis file sharing no key with it, or references that hold no word
at all (N = 0: the error rate is undefined; the counts are still printed).

Usage (from the repository root, or the recipe directory after ``. ./path.sh``; needs the toolkit importable):
    python tools/compute_wer.py corpora/tiny_fsdd/data/test/text exp/tiny_fsdd/decode_test/text \
        --per_utt exp/tiny_fsdd/decode_test/wer_per_utt
"""
import argparse
import sys

from toolkit.utils.config_parsing import ArgumentParser, exit_on_config_error
from toolkit.utils.kaldi_files import read_table
from toolkit.utils.metrics import format_report, score


def main(argv=None) -> None:
    parser = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("ref", help="reference Kaldi text file")
    parser.add_argument("hyp", help="hypothesis Kaldi text file")
    parser.add_argument("--cer", action="store_true", help="character error rate instead of word error rate")
    parser.add_argument("--per_utt", help="write per-utterance 'key N C S D I' lines here")
    args = parser.parse_args(argv)
    try:
        ref, hyp = read_table(args.ref, text=True), read_table(args.hyp, text=True)
    except OSError as e:
        sys.exit(f"compute_wer.py: cannot read {e.filename}: {e.strerror}")
    except ValueError as e:
        sys.exit(f"compute_wer.py: {e}")
    if not ref:
        sys.exit(f"compute_wer.py: the reference file {args.ref} holds no utterance; nothing to score")
    if not ref.keys() & hyp.keys():
        sys.exit(f"compute_wer.py: none of the {len(ref)} keys of {args.ref} is in {args.hyp} ({len(hyp)} keys): "
                 "not hypotheses of this test set")
    unit = "char" if args.cer else "word"
    result = score(ref, hyp, unit)
    for keys, what in ((result.missing, "keys missing from hyp (scored as deletions)"),
                       (result.extra, "hyp keys not in ref (ignored)")):
        if keys:
            more = f" ... and {len(keys) - 10} more" if len(keys) > 10 else ""
            print(f"{len(keys)} {what}: {' '.join(keys[:10])}{more}", file=sys.stderr)
    if args.per_utt:
        try:
            with open(args.per_utt, "w", encoding="utf-8") as f:
                for key, counts in result.per_utt.items():
                    f.write(f"{key} " + " ".join(map(str, counts.as_tuple())) + "\n")
        except OSError as e:
            sys.exit(f"compute_wer.py: cannot write --per_utt {e.filename}: {e.strerror}")
    sys.stdout.write(format_report(result.totals, unit))
    if result.totals.N == 0:
        sys.exit(f"compute_wer.py: the {len(ref)} references in {args.ref} hold no {unit}: the error rate is "
                 "undefined (counts above)")


if __name__ == "__main__":
    exit_on_config_error(main)
