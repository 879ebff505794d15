"""Kaldi data-dir tables (``wav.scp``, ``text``, ``utt2spk``): one ``key value...`` per line."""

from __future__ import annotations


def read_table(path: str) -> dict[str, str]:
    """``key rest-of-line`` per line -> ``{key: rest}`` in file order; a key alone maps to ``""`` (an empty
    transcript). Blank lines are skipped.

    Raises:
        OSError: the file cannot be read.
        ValueError: a key is repeated, or the file is not UTF-8 (the message names the file and line).
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
            table[parts[0]] = parts[1].strip() if len(parts) == 2 else ""
            first_line[parts[0]] = number
    return table
