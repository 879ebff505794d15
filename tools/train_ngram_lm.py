#!/usr/bin/env python3
"""Estimate a word n-gram LM (interpolated modified Kneser-Ney, :mod:`toolkit.text.kneser_ney`) from the transcripts
of a Kaldi ``text`` file (``key word word ...`` per line) and write it as an ARPA file, for decoding with
``toolkit.bin.recognize --lm``. With ``--common_words N`` the N most frequent English words (wordfreq) spelt with
the transcripts' characters join the vocabulary, as the prior of the unigrams
(``toolkit.text.common_words.common_words``). With ``--spelling``, the spelling LM for ``recognize.py
--spelling_lm`` instead: a letter n-gram over the distinct words of the transcripts (and the common words).

Usage:
    python tools/train_ngram_lm.py --order 3 data/train/text data/lm/lm.arpa
    python tools/train_ngram_lm.py --order 3 --common_words 30000 data/train/text data/lm/lm.arpa
    python tools/train_ngram_lm.py --spelling --order 6 --common_words 30000 data/train/text data/lm/spelling.arpa
"""
import argparse
import logging
from pathlib import Path

from toolkit.text.kneser_ney import write_kneser_ney_arpa
from toolkit.utils.config_parsing import ArgumentParser, exit_on_config_error


def main() -> None:
    parser = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--order", type=int, default=3, help="n-gram order, 2..6 (what KenLM loads)")
    parser.add_argument("--common_words", type=int, default=0,
                        help="add this many of the most frequent English words as the unigrams' prior (0: none)")
    parser.add_argument("--spelling", action="store_true",
                        help="a letter n-gram of the words (the spelling LM for recognize.py --spelling_lm)")
    parser.add_argument("text", help="Kaldi text file: key followed by the transcript")
    parser.add_argument("arpa", help="output ARPA file")
    args = parser.parse_args()
    if args.common_words < 0:
        parser.error(f"--common_words must be >= 0, got {args.common_words}")
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    Path(args.arpa).parent.mkdir(parents=True, exist_ok=True)
    try:
        sizes = write_kneser_ney_arpa(args.text, args.arpa, args.order, args.common_words, args.spelling)
    except ValueError as e:  # the text's content (sentence N is line N)
        raise SystemExit(f"{args.text}: {e}")
    except OSError as e:  # reading the text or writing the ARPA file (the message names the file)
        raise SystemExit(f"train_ngram_lm.py: {e}")
    print(f"wrote {args.arpa}: " + ", ".join(f"{name} {count}" for name, count in sizes.items()))


if __name__ == "__main__":
    exit_on_config_error(main)
