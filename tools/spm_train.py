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
import os
import sys
import tempfile
from pathlib import Path

import sentencepiece as spm

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from any directory

from toolkit.text.tokenizer import strip_special_symbols, write_symbol_table  # noqa: E402


def train(text_file: str, model_prefix: str, model_type: str, vocab_size: int) -> str:
    """Train on the transcripts (keys stripped) and write the symbol table; returns its path.

    Raises:
        RuntimeError: SentencePiece rejects the settings (e.g. vocab_size too large for the text).
    """
    with open(text_file, encoding="utf-8") as f:
        transcripts = [strip_special_symbols(parts[1]) for parts in (line.split(maxsplit=1) for line in f)
                       if len(parts) == 2]
    Path(model_prefix).parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", encoding="utf-8", suffix=".txt", delete=False) as tmp:
        tmp.write("".join(t if t.endswith("\n") else t + "\n" for t in transcripts))
    try:
        # Only <unk> is kept as a SentencePiece special piece: <blank> and <sos/eos> live in our table.
        spm.SentencePieceTrainer.Train(
            input=tmp.name, model_prefix=model_prefix, model_type=model_type, vocab_size=vocab_size,
            character_coverage=1.0, unk_id=0, bos_id=-1, eos_id=-1, pad_id=-1, minloglevel=2)
    finally:
        os.unlink(tmp.name)
    sp = spm.SentencePieceProcessor()
    sp.Load(model_prefix + ".model")
    pieces = [sp.IdToPiece(i) for i in range(sp.GetPieceSize()) if not sp.IsUnknown(i)]
    table_path = model_prefix + ".units.txt"
    write_symbol_table(pieces, table_path)
    return table_path


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model_type", choices=["unigram", "bpe"], default="unigram")
    parser.add_argument("--vocab_size", type=int, required=True, help="SentencePiece pieces, <unk> included")
    parser.add_argument("text", help="Kaldi text file: key followed by the transcript")
    parser.add_argument("model_prefix", help="output prefix for .model, .vocab and .units.txt")
    args = parser.parse_args()
    table = train(args.text, args.model_prefix, args.model_type, args.vocab_size)
    print(f"wrote {args.model_prefix}.model and {table}")


if __name__ == "__main__":
    main()
