"""Text <-> token id conversion for CTC/attention ASR targets.

Symbol table format (one ``symbol id`` pair per line, ids contiguous from 0)::

    <blank> 0
    <unk> 1
    A 2
    ...
    <sos/eos> N-1

Two tokenizers share it: :class:`CharTokenizer` (one unit per character, the word boundary is the unit
``"▁"`` as in SentencePiece, Kudo & Richardson 2018) and :class:`BpeTokenizer` (SentencePiece pieces, which
carry the same ``"▁"`` word-boundary marker). Both return ``<unk>`` (id 1) for units missing from the table;
no case folding is done, so the text must be in the case the table was built from.
"""
from typing import Dict, Iterable, List, Tuple

import sentencepiece as spm

from toolkit.utils.common import BLANK_ID, UNK_ID

WORD_BOUNDARY = "\u2581"  # "▁", SentencePiece's whitespace marker
BLANK = "<blank>"
UNK = "<unk>"
SOS_EOS = "<sos/eos>"


def read_symbol_table(path: str) -> Dict[str, int]:
    """Read a ``symbol id`` per-line table.

    Raises:
        ValueError: a line is not ``symbol id``, ids are not exactly 0..N-1, or ``<blank>``/``<unk>``/
            ``<sos/eos>`` are not at ids 0, 1 and N-1.
        OSError: the file cannot be read.
    """
    table: Dict[str, int] = {}
    with open(path, encoding="utf-8") as f:
        for line_no, line in enumerate(f, 1):
            parts = line.split()
            if not parts:
                continue
            if len(parts) != 2 or not parts[1].isdigit():
                raise ValueError(f"{path}:{line_no}: expected 'symbol id', got {line.rstrip()!r}")
            table[parts[0]] = int(parts[1])
    if sorted(table.values()) != list(range(len(table))):
        raise ValueError(f"{path}: ids must be exactly 0..{len(table) - 1} with no duplicates")
    expected = {BLANK: BLANK_ID, UNK: UNK_ID, SOS_EOS: len(table) - 1}
    for symbol, symbol_id in expected.items():
        if table.get(symbol) != symbol_id:
            raise ValueError(f"{path}: {symbol} must have id {symbol_id}, found {table.get(symbol)}")
    return table


def write_symbol_table(units: Iterable[str], path: str) -> int:
    """Write ``<blank> 0``, ``<unk> 1``, ``units`` in the given order, ``<sos/eos>`` last.

    Returns:
        The vocabulary size (number of lines written).

    Raises:
        ValueError: a unit is empty, contains whitespace, repeats, or is one of the special symbols.
    """
    units = list(units)
    for unit in units:
        if not unit or unit.split() != [unit] or unit in (BLANK, UNK, SOS_EOS):
            raise ValueError(f"invalid unit {unit!r}")
    if len(set(units)) != len(units):
        raise ValueError("units must be unique")
    symbols = [BLANK, UNK] + units + [SOS_EOS]
    with open(path, "w", encoding="utf-8") as f:
        for symbol_id, symbol in enumerate(symbols):
            f.write(f"{symbol} {symbol_id}\n")
    return len(symbols)


def text_to_char_units(text: str) -> List[str]:
    """Split text into characters with ``"▁"`` between words: ``"HI YOU"`` -> ``H I ▁ Y O U``."""
    units: List[str] = []
    for word in text.split():
        if units:
            units.append(WORD_BOUNDARY)
        units.extend(word)
    return units


def units_to_text(units: Iterable[str]) -> str:
    """Join char or SentencePiece units back into space-separated words."""
    return " ".join("".join(units).replace(WORD_BOUNDARY, " ").split())


class _SymbolTableTokenizer:
    """Id lookup shared by both tokenizers."""

    def __init__(self, symbol_table_path: str):
        self.symbol_table = read_symbol_table(symbol_table_path)
        self.id_to_symbol = {i: s for s, i in self.symbol_table.items()}

    def vocab_size(self) -> int:
        """Number of symbols including ``<blank>``, ``<unk>`` and ``<sos/eos>``."""
        return len(self.symbol_table)

    def _units_to_ids(self, units: List[str]) -> List[int]:
        return [self.symbol_table.get(u, UNK_ID) for u in units]

    def detokenize(self, ids: Iterable[int]) -> Tuple[str, List[str]]:
        """Map ids to units and units to text (``"▁"`` becomes a space).

        Returns:
            ``(text, tokens)``.

        Raises:
            KeyError: an id is outside ``[0, vocab_size())``.
        """
        tokens = [self.id_to_symbol[int(i)] for i in ids]
        return units_to_text(tokens), tokens


class CharTokenizer(_SymbolTableTokenizer):
    """Character tokenizer; words are separated by the unit ``"▁"``.

    Args:
        symbol_table_path: table written by ``tools/make_dict.py``.
    """

    def tokenize(self, text: str) -> Tuple[List[str], List[int]]:
        """``"HI YOU"`` -> ``(["H","I","▁","Y","O","U"], ids)``; unknown characters get id 1 (``<unk>``)."""
        units = text_to_char_units(text)
        return units, self._units_to_ids(units)


class BpeTokenizer(_SymbolTableTokenizer):
    """SentencePiece (unigram or BPE) tokenizer.

    Args:
        bpe_model: ``.model`` file written by ``tools/spm_train.py``.
        symbol_table_path: the symbol table written next to it.

    Raises:
        OSError: the model cannot be loaded.
    """

    def __init__(self, bpe_model: str, symbol_table_path: str):
        super().__init__(symbol_table_path)
        self.bpe_model = bpe_model
        self.sp = spm.SentencePieceProcessor()
        if not self.sp.Load(bpe_model):
            raise OSError(f"cannot load SentencePiece model {bpe_model}")

    def __getstate__(self):
        # SentencePieceProcessor is not picklable; DataLoader workers receive the tokenizer by pickling.
        state = self.__dict__.copy()
        del state["sp"]
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self.sp = spm.SentencePieceProcessor()
        self.sp.Load(self.bpe_model)

    def tokenize(self, text: str) -> Tuple[List[str], List[int]]:
        """Encode into SentencePiece pieces; pieces missing from the table get id 1 (``<unk>``)."""
        units = self.sp.EncodeAsPieces(" ".join(text.split()))
        return units, self._units_to_ids(units)


TOKENIZERS = {"char": CharTokenizer, "bpe": BpeTokenizer}


def init_tokenizer(tokenizer: str, tokenizer_conf: dict):
    """Build a tokenizer by name.

    Args:
        tokenizer: ``"char"`` or ``"bpe"``.
        tokenizer_conf: ``{"symbol_table_path": ...}`` for char, plus ``"bpe_model"`` for bpe.

    Raises:
        ValueError: unknown tokenizer name (the message lists the choices).
        TypeError: missing or unexpected keys in ``tokenizer_conf``.
    """
    if tokenizer not in TOKENIZERS:
        raise ValueError(f"unknown tokenizer {tokenizer!r}; choose one of {sorted(TOKENIZERS)}")
    return TOKENIZERS[tokenizer](**tokenizer_conf)
