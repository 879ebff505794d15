#!/usr/bin/env python3
"""Build a character symbol table from a Kaldi ``text`` file (``key word word ...`` per line).

Output format: ``<blank> 0``, ``<unk> 1``, the sorted character units (the word-boundary unit ``▁`` is always
included), ``<sos/eos> N-1``. A literal special symbol in a transcript (``<unk>``, ``<blank>``, ``<sos/eos>``) is
not text: it adds no unit (the tokenizer maps it to ``<unk>`` as one unit).

Usage:
    python tools/make_dict.py corpora/tiny_fsdd/data/train/text exp/dict/units.txt
"""
import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from any directory

from toolkit.text.tokenizer import (  # noqa: E402
    WORD_BOUNDARY, strip_special_symbols, text_to_char_units, write_symbol_table)


def collect_units(text_file: str) -> list:
    """Sorted set of char units over all transcripts of ``text_file`` (keys and special symbols excluded), plus
    ``▁``."""
    units = {WORD_BOUNDARY}
    with open(text_file, encoding="utf-8") as f:
        for line in f:
            parts = line.split(maxsplit=1)
            if len(parts) == 2:
                units.update(text_to_char_units(strip_special_symbols(parts[1])))
    return sorted(units)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("text", help="Kaldi text file: key followed by the transcript")
    parser.add_argument("symbol_table", help="output symbol table")
    args = parser.parse_args()
    Path(args.symbol_table).parent.mkdir(parents=True, exist_ok=True)
    size = write_symbol_table(collect_units(args.text), args.symbol_table)
    print(f"wrote {args.symbol_table}: vocab_size {size}")


if __name__ == "__main__":
    main()
