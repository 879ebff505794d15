#!/usr/bin/env python3
"""Train a SentencePiece model (Kudo & Richardson 2018) on the transcripts of a Kaldi ``text`` file.

Writes ``<model_prefix>.model``, ``<model_prefix>.vocab`` (SentencePiece's own) and ``<model_prefix>.units.txt``,
the symbol table used by ``toolkit.text.tokenizer.BpeTokenizer``: ``<blank> 0``, ``<unk> 1``, the pieces in
SentencePiece id order, ``<sos/eos> N-1``. ``--vocab_size`` counts SentencePiece's pieces including its
``<unk>``, so the symbol table has vocab_size + 2 entries. Literal special symbols in the transcripts (``<unk>``,
``<blank>``, ``<sos/eos>``) are left out of the training text, so no piece is learned from them.

Usage:
    python tools/spm_train.py --model_type unigram --vocab_size 100 \
        corpora/tiny_lj/data/train/text exp/bpe/lj_unigram100
"""
import argparse

from toolkit.text.units import train_sentencepiece
from toolkit.utils.config_parsing import ArgumentParser, exit_on_config_error


def main() -> None:
    parser = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model_type", choices=["unigram", "bpe"], default="unigram")
    parser.add_argument("--vocab_size", type=int, required=True, help="SentencePiece pieces, <unk> included")
    parser.add_argument("text", help="Kaldi text file: key followed by the transcript")
    parser.add_argument("model_prefix", help="output prefix for .model, .vocab and .units.txt")
    args = parser.parse_args()
    table = train_sentencepiece(args.text, args.model_prefix, args.model_type, args.vocab_size)
    print(f"wrote {args.model_prefix}.model and {table}")


if __name__ == "__main__":
    exit_on_config_error(main)
