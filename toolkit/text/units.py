"""Units learned from the transcripts of a Kaldi ``text`` file (``key word word ...`` per line): the character set
of a char symbol table, or a SentencePiece model with its symbol table (format in :mod:`toolkit.text.tokenizer`).

A literal special symbol in a transcript (``<unk>``, ``<blank>``, ``<sos/eos>``) is not text: nothing is learned
from it (the tokenizers map it to ``<unk>`` as one unit). Transcripts are Unicode-normalised to NFC first
(:func:`toolkit.utils.unicode_text.normalize_unicode`), as the tokenizers normalise what they encode, so text in
composed and decomposed form gives the same units and no combining accent becomes a unit of its own.
"""

import os
import re
import tempfile
from pathlib import Path

import sentencepiece as spm

from toolkit.text.tokenizer import WORD_BOUNDARY, strip_special_symbols, text_to_char_units, write_symbol_table
from toolkit.utils.config_parsing import ConfigError
from toolkit.utils.unicode_text import normalize_unicode


def read_transcripts(text_file: str) -> list:
    """The transcripts of a Kaldi ``text`` file (keys and lines without a transcript dropped), NFC-normalised, with
    special symbols left out (:func:`toolkit.text.tokenizer.strip_special_symbols`) and one space between words.

    Raises:
        OSError: the file cannot be read. UnicodeDecodeError: it is not UTF-8.
    """
    with open(text_file, encoding="utf-8") as f:
        return [" ".join(strip_special_symbols(normalize_unicode(parts[1])).split())
                for parts in (line.split(maxsplit=1) for line in f) if len(parts) == 2]


def collect_char_units(text_file: str) -> list:
    """Sorted set of char units over all transcripts of ``text_file`` (keys and special symbols excluded), plus
    ``▁``."""
    units = {WORD_BOUNDARY}
    for transcript in read_transcripts(text_file):
        units.update(text_to_char_units(transcript))
    return sorted(units)


def _vocab_size_error(message: str, text_file: str, model_type: str, vocab_size: int) -> str:
    """One line for SentencePiece's refusal ``message``, saying which vocabulary sizes ``text_file`` allows."""
    most = re.search(r"value <= (\d+)", message)
    least = re.search(r"smaller than required_chars\. \d+ vs (\d+)", message)
    if most:
        return (f"--vocab_size {vocab_size}: the transcripts of {text_file} allow at most {most.group(1)} "
                f"{model_type} pieces; pass --vocab_size {most.group(1)} or less (run.sh: --nbpe)")
    if least:
        return (f"--vocab_size {vocab_size}: the transcripts of {text_file} hold {int(least.group(1)) - 1} "
                f"characters, so it needs at least {least.group(1)} pieces (they and <unk>); pass --vocab_size "
                f"{least.group(1)} or more (run.sh: --nbpe)")
    return f"SentencePiece refused {text_file} with --vocab_size {vocab_size}: {' '.join(message.split())}"


def train_sentencepiece(text_file: str, model_prefix: str, model_type: str, vocab_size: int) -> str:
    """Train a SentencePiece model (Kudo & Richardson 2018) on the transcripts of a Kaldi ``text`` file (keys
    stripped) and write its symbol table ``<model_prefix>.units.txt``; returns that path.

    Raises:
        ConfigError: SentencePiece rejects the settings, in one line: a ``vocab_size`` the text cannot fill says the
            largest one it allows, one below the text's characters the smallest.
    """
    transcripts = read_transcripts(text_file)
    Path(model_prefix).parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", encoding="utf-8", suffix=".txt", delete=False) as tmp:
        tmp.write("".join(t if t.endswith("\n") else t + "\n" for t in transcripts))
    try:
        # Only <unk> is kept as a SentencePiece special piece: <blank> and <sos/eos> live in our table.
        spm.SentencePieceTrainer.Train(
            input=tmp.name, model_prefix=model_prefix, model_type=model_type, vocab_size=vocab_size,
            character_coverage=1.0, unk_id=0, bos_id=-1, eos_id=-1, pad_id=-1, minloglevel=2,
            # NOTE: the text is NFC already; SentencePiece's default rule (nmt_nfkc) would fold compatibility
            # characters too, so that the model's text and the scorer's differ (https://github.com/google/
            # sentencepiece/blob/master/doc/normalization.md)
            normalization_rule_name="identity")
    except RuntimeError as e:
        raise ConfigError(_vocab_size_error(str(e), text_file, model_type, vocab_size)) from e
    finally:
        os.unlink(tmp.name)
    sp = spm.SentencePieceProcessor()
    sp.Load(model_prefix + ".model")
    pieces = [sp.IdToPiece(i) for i in range(sp.GetPieceSize()) if not sp.IsUnknown(i)]
    table_path = model_prefix + ".units.txt"
    write_symbol_table(pieces, table_path)
    return table_path
