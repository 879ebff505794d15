"""Kaldi data-dir tables (``wav.scp``, ``text``, ``utt2spk``): one ``key value...`` per line."""

from __future__ import annotations

from toolkit.utils.unicode_text import normalize_unicode


def read_table(path: str, text: bool = False) -> dict[str, str]:
    """``key rest-of-line`` per line -> ``{key: rest}`` in file order. Blank lines are skipped. In a ``text``
    file a key alone maps to ``""`` (an empty transcript); in any other table (``wav.scp``: the path) it is an
    error. With ``text`` (a ``text`` file, or hypotheses: values are transcripts),
    each value is Unicode-normalised (:func:`toolkit.utils.unicode_text.normalize_unicode`); keys and other values
    (``wav.scp`` paths) are kept byte for byte.

    Raises:
        OSError: the file cannot be read.
        ValueError: a key is repeated or, unless ``text``, alone on its line; or the file is not UTF-8 (the message
            names the file and line).
    """
    table: dict[str, str] = {}
    first_line: dict[str, int] = {}
    with open(path, "rb") as f:  # NOTE: bytes, decoded line by line, so a bad byte is reported at its line
        for number, raw in enumerate(f, 1):
            try:
                parts = raw.decode("utf-8").split(maxsplit=1)
            except UnicodeDecodeError as e:
                raise ValueError(f"{path}:{number}: not UTF-8 text ({e.reason})") from e
            if not parts:
                continue
            if parts[0] in table:
                raise ValueError(f"{path}:{number}: key {parts[0]!r} repeats line {first_line[parts[0]]}")
            if len(parts) == 1 and not text:
                raise ValueError(f"{path}:{number}: key {parts[0]!r} has no value: expected 'key value'")
            value = parts[1].strip() if len(parts) == 2 else ""
            table[parts[0]] = normalize_unicode(value) if text else value
            first_line[parts[0]] = number
    return table
