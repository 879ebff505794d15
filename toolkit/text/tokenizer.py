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
no case folding is done, so the text must be in the case the table was built from. Both take text in any Unicode
normal form: it is normalised to NFC first (:func:`toolkit.utils.unicode_text.normalize_unicode`), as the tools that
build the tables do, and text from ids comes back in NFC too.

The special symbols are atomic: a literal ``<unk>`` in a transcript (Kaldi corpora use it for an unintelligible
word) is one unit with the unk id, never the characters ``< u n k >``; a literal ``<blank>`` or ``<sos/eos>`` is one
unit that also maps to the unk id, because those ids must never be a target. ``tools/make_dict.py`` and
``tools/spm_train.py`` leave them out of what they learn (:func:`strip_special_symbols`).

A table that cannot be right is refused with a :class:`~toolkit.utils.config_parsing.ConfigError` (one line naming the
file and line, and what to do): a malformed line, a repeated symbol or id, a missing id, the special symbols out of
place, a BPE table that is not the SentencePiece model's, or (:func:`check_model_fits_table`) a table whose size is
not the model's output dimension, or a symbol not in Unicode NFC (normalised text would never reach it).
"""
import inspect
import re
from typing import Dict, Iterable, List, Optional, Tuple

import sentencepiece as spm

from toolkit.utils.common import BLANK_ID, UNK_ID
from toolkit.utils.config_parsing import ConfigError
from toolkit.utils.unicode_text import NORMAL_FORM, is_normalized, normalize_unicode

WORD_BOUNDARY = "\u2581"  # "▁", SentencePiece's whitespace marker
BLANK = "<blank>"
UNK = "<unk>"
SOS_EOS = "<sos/eos>"
SPECIAL_SYMBOLS = (BLANK, UNK, SOS_EOS)
_SPECIAL_RE = re.compile("(" + "|".join(map(re.escape, SPECIAL_SYMBOLS)) + ")")
# NOTE: private-use code points stand in for the special symbols while SentencePiece encodes, so that each becomes
# one piece of its own (an unknown one) instead of "<", "unk", ">" pieces; they are mapped back right after.
_SENTINELS = {symbol: chr(0xE000 + i) for i, symbol in enumerate(SPECIAL_SYMBOLS)}
_FROM_SENTINEL = {sentinel: symbol for symbol, sentinel in _SENTINELS.items()}
_SENTINEL_RE = re.compile("([" + "".join(_FROM_SENTINEL) + "])")
_REBUILD = "write the table with tools/make_dict.py (char) or tools/spm_train.py (bpe)"


def read_symbol_table(path: str) -> Dict[str, int]:
    """Read a ``symbol id`` per-line table.

    Raises:
        ConfigError: (a ValueError) the file is missing, a line is not ``symbol id``, a symbol or an id repeats,
            ids are not exactly 0..N-1, ``<blank>``/``<unk>``/``<sos/eos>`` are not at ids 0, 1 and N-1, or a symbol
            is not in Unicode NFC (a table built from decomposed text); the message names the file and line.
        OSError: the file cannot be read.
    """
    table: Dict[str, int] = {}
    line_of_id: Dict[int, int] = {}
    line_of_symbol: Dict[str, int] = {}
    try:
        with open(path, encoding="utf-8") as f:
            lines = list(f)
    except FileNotFoundError as err:
        raise ConfigError(f"symbol table not found: {path} (tokenizer_conf.symbol_table_path)") from err
    for line_no, line in enumerate(lines, 1):
        parts = line.split()
        if not parts:
            continue
        if len(parts) != 2 or not parts[1].isdigit():
            raise ConfigError(f"{path}:{line_no}: expected 'symbol id', got {line.rstrip()!r}; {_REBUILD}")
        symbol, symbol_id = parts[0], int(parts[1])
        if not is_normalized(symbol):
            raise ConfigError(f"{path}:{line_no}: symbol {symbol!r} is not in Unicode {NORMAL_FORM}, the form all "
                              f"text is normalised to, so no text would map to it; {_REBUILD}")
        for seen, value, what in ((line_of_symbol, symbol, "symbol"), (line_of_id, symbol_id, "id")):
            if value in seen:
                raise ConfigError(f"{path}:{line_no}: {what} {value!r} already on line {seen[value]}; every symbol "
                                  f"and id must appear once: {_REBUILD}")
        line_of_symbol[symbol], line_of_id[symbol_id] = line_no, line_no
        table[symbol] = symbol_id
    missing = sorted(set(range(len(table))) - set(line_of_id))
    if missing:
        raise ConfigError(f"{path}: ids must be exactly 0..{len(table) - 1}, but id {missing[0]} is missing "
                          f"(line {line_of_id[max(line_of_id)]} has id {max(line_of_id)}); {_REBUILD}")
    expected = {BLANK: BLANK_ID, UNK: UNK_ID, SOS_EOS: len(table) - 1}
    for symbol, symbol_id in expected.items():
        if symbol not in table:
            raise ConfigError(f"{path}: no {symbol} line; it must have id {symbol_id}: {_REBUILD}")
        if table[symbol] != symbol_id:
            raise ConfigError(f"{path}:{line_of_symbol[symbol]}: {symbol} must have id {symbol_id}"
                              f"{' (the last id)' if symbol == SOS_EOS else ''}, found {table[symbol]}; {_REBUILD}")
    return table


def check_model_fits_table(tokenizer, output_dim: Optional[int], model_source: str) -> None:
    """Refuse a symbol table whose size is not the model's output dimension: every id from the first difference on
    would decode as another symbol, and ``<sos/eos>`` (the last id) would be wrong.

    Args:
        tokenizer: a tokenizer of this module (its table has ``vocab_size()`` symbols, ``<sos/eos>`` the last).
        output_dim: the model's output dimension V (its ``<sos/eos>`` = V - 1): ``output_dim`` of its train.yaml.
        model_source: where ``output_dim`` comes from, for the message (e.g. the train.yaml path).

    Raises:
        ConfigError: ``output_dim`` is missing or differs from the table's size.
    """
    size, path = tokenizer.vocab_size(), tokenizer.symbol_table_path
    if output_dim is None:
        raise ConfigError(f"{model_source} has no output_dim (train.yaml written by toolkit.bin.train has it), so "
                          f"symbol table {path} cannot be checked against the model")
    if size != output_dim:
        raise ConfigError(f"symbol table {path} has {size} symbols (<sos/eos> = {size - 1}), but the model "
                          f"({model_source}) has output_dim {output_dim} (<sos/eos> = {output_dim - 1}): use the "
                          f"symbol table the model was trained with")


def strip_special_symbols(text: str) -> str:
    """``text`` with each literal special symbol replaced by a space, for the tools that learn units from
    transcripts (a ``<unk>`` must not teach them ``<``, ``u``, ``n``, ``k``, ``>``)."""
    return _SPECIAL_RE.sub(" ", text)


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
    """Split text into characters with ``"▁"`` between words: ``"HI YOU"`` -> ``H I ▁ Y O U``; a special symbol
    is one unit: ``"HI <unk>"`` -> ``H I ▁ <unk>``."""
    units: List[str] = []
    for word in text.split():
        if units:
            units.append(WORD_BOUNDARY)
        for part in _SPECIAL_RE.split(word):
            units.extend([part] if part in SPECIAL_SYMBOLS else part)
    return units


def units_to_text(units: Iterable[str]) -> str:
    """Join char or SentencePiece units back into space-separated words, in Unicode NFC (a base letter and a
    combining mark from two units compose)."""
    return " ".join(normalize_unicode("".join(units)).replace(WORD_BOUNDARY, " ").split())


class _SymbolTableTokenizer:
    """Id lookup shared by both tokenizers."""

    def __init__(self, symbol_table_path: str):
        self.symbol_table_path = symbol_table_path
        self.symbol_table = read_symbol_table(symbol_table_path)
        self.id_to_symbol = {i: s for s, i in self.symbol_table.items()}

    def vocab_size(self) -> int:
        """Number of symbols including ``<blank>``, ``<unk>`` and ``<sos/eos>``."""
        return len(self.symbol_table)

    def _units_to_ids(self, units: List[str]) -> List[int]:
        # NOTE: a literal <blank> or <sos/eos> in a transcript must not become the CTC blank or the end symbol.
        return [UNK_ID if u in (BLANK, SOS_EOS) else self.symbol_table.get(u, UNK_ID) for u in units]

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
        """``"HI YOU"`` -> ``(["H","I","▁","Y","O","U"], ids)``, after Unicode NFC normalisation (``"E\u0301"``
        is the one unit ``"\u00c9"``); unknown characters get id 1 (``<unk>``), and so does a literal special symbol,
        as one unit."""
        units = text_to_char_units(normalize_unicode(text))
        return units, self._units_to_ids(units)


class BpeTokenizer(_SymbolTableTokenizer):
    """SentencePiece (unigram or BPE) tokenizer.

    Args:
        bpe_model: ``.model`` file written by ``tools/spm_train.py``.
        symbol_table_path: the symbol table written next to it.

    Raises:
        ConfigError: the model cannot be loaded, or the table's units are not the model's pieces (a table written
            for another model).
    """

    def __init__(self, bpe_model: str, symbol_table_path: str):
        super().__init__(symbol_table_path)
        self.bpe_model = bpe_model
        self.sp = spm.SentencePieceProcessor()
        try:
            loaded, reason = self.sp.Load(bpe_model), "not a SentencePiece model"
        except (OSError, RuntimeError) as err:
            loaded, reason = False, err
        if not loaded:
            raise ConfigError(f"cannot load SentencePiece model {bpe_model} (tokenizer_conf.bpe_model): {reason}")
        pieces = {self.sp.IdToPiece(i) for i in range(self.sp.GetPieceSize()) if not self.sp.IsUnknown(i)}
        units = set(self.symbol_table) - set(SPECIAL_SYMBOLS)
        if pieces != units:
            raise ConfigError(f"symbol table {symbol_table_path} does not belong to SentencePiece model {bpe_model}: "
                              f"{len(pieces - units)} of the model's pieces are not in the table (e.g. "
                              f"{sorted(pieces - units)[:3]}) and {len(units - pieces)} of the table's units are not "
                              f"pieces (e.g. {sorted(units - pieces)[:3]}); use the .units.txt that "
                              f"tools/spm_train.py wrote beside the model")

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
        """Encode into SentencePiece pieces, after Unicode NFC normalisation; pieces missing from the table get id 1
        (``<unk>``), and so does a literal special symbol, as one unit: ``"A <unk> B"`` -> ``["▁A", "▁", "<unk>",
        "▁B"]``."""
        text = " ".join(normalize_unicode(text).split())
        if not _SPECIAL_RE.search(text):
            units = self.sp.EncodeAsPieces(text)
        else:
            pieces = self.sp.EncodeAsPieces(_SPECIAL_RE.sub(lambda m: _SENTINELS[m.group(0)], text))
            units = [_FROM_SENTINEL.get(part, part) for piece in pieces for part in _SENTINEL_RE.split(piece) if part]
        return units, self._units_to_ids(units)


TOKENIZERS = {"char": CharTokenizer, "bpe": BpeTokenizer}


def init_tokenizer(tokenizer: str, tokenizer_conf: dict):
    """Build a tokenizer by name.

    Args:
        tokenizer: ``"char"`` or ``"bpe"``.
        tokenizer_conf: ``{"symbol_table_path": ...}`` for char, plus ``"bpe_model"`` for bpe.

    Raises:
        ConfigError: (a ValueError) unknown tokenizer name (the message lists the choices), missing or unexpected
            keys in ``tokenizer_conf``, or a bad symbol table or model (see the tokenizers).
    """
    if tokenizer not in TOKENIZERS:
        raise ConfigError(f"unknown tokenizer {tokenizer!r}; choose one of {sorted(TOKENIZERS)}")
    keys = sorted(inspect.signature(TOKENIZERS[tokenizer]).parameters)
    if sorted(tokenizer_conf) != keys:
        raise ConfigError(f"tokenizer_conf for tokenizer {tokenizer!r} must have exactly the keys {keys}, got "
                          f"{sorted(tokenizer_conf)}")
    return TOKENIZERS[tokenizer](**tokenizer_conf)
