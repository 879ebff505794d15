#!/usr/bin/env python3
"""Build a character symbol table from a Kaldi ``text`` file (``key word word ...`` per line).

Output format: ``<blank> 0``, ``<unk> 1``, the sorted character units (the word-boundary unit ``▁`` is always
included), ``<sos/eos> N-1``. A literal special symbol in a transcript (``<unk>``, ``<blank>``, ``<sos/eos>``) is
not text: it adds no unit (the tokenizer maps it to ``<unk>`` as one unit).

Usage:
    python tools/make_dict.py corpora/tiny_fsdd/data/train/text exp/dict/units.txt
"""
import argparse
from pathlib import Path

from toolkit.text.tokenizer import write_symbol_table
from toolkit.text.units import collect_char_units
from toolkit.utils.config_parsing import ArgumentParser, exit_on_config_error


def main() -> None:
    parser = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("text", help="Kaldi text file: key followed by the transcript")
    parser.add_argument("symbol_table", help="output symbol table")
    args = parser.parse_args()
    Path(args.symbol_table).parent.mkdir(parents=True, exist_ok=True)
    size = write_symbol_table(collect_char_units(args.text), args.symbol_table)
    print(f"wrote {args.symbol_table}: vocab_size {size}")


if __name__ == "__main__":
    exit_on_config_error(main)
