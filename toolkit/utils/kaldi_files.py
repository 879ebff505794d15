"""Kaldi data-dir tables (``wav.scp``, ``text``, ``utt2spk``): one ``key value...`` per line."""

from __future__ import annotations


def read_table(path: str) -> dict[str, str]:
    """``key rest-of-line`` per line -> ``{key: rest}`` in file order; a key alone maps to ``""`` (an empty
    transcript). Blank lines are skipped; a repeated key keeps its last value.

    Raises:
        OSError: the file cannot be read.
    """
    table = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            parts = line.split(maxsplit=1)
            if parts:
                table[parts[0]] = parts[1].strip() if len(parts) == 2 else ""
    return table
