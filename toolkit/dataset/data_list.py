"""Raw data.lists: one JSON line ``{"key", "wav", "txt"[, "start", "end"]}`` per utterance (``start``/``end`` in
seconds for a segment of a longer file), made from a Kaldi data dir (``wav.scp`` + ``text``) and read back checked.
The pipeline parses the same lines (:func:`toolkit.dataset.processor.parse_raw`)."""

from __future__ import annotations

import json
import os
from typing import Iterable, List, Optional, Tuple

from toolkit.dataset.processor import SkipSample, parse_raw
from toolkit.utils.kaldi_files import read_table


def make_raw_list(wav_scp: str, text: str, wav_root: Optional[str] = None) -> Tuple[List[dict], List[str]]:
    """Join a Kaldi ``wav.scp`` and ``text``.

    Relative wav paths are joined to ``wav_root`` when it is given (the corpora's wav.scp paths are relative to the
    corpus root), otherwise kept.

    Returns:
        ``(entries, unmatched_keys)``: entries ``{"key", "wav", "txt"}`` in wav.scp order, and the sorted keys found
        in only one of the two files.
    """
    wavs = read_table(wav_scp)
    texts = read_table(text)
    entries = []
    for key, wav in wavs.items():
        if key in texts:
            if wav_root is not None and not os.path.isabs(wav):
                wav = os.path.join(wav_root, wav)
            entries.append({"key": key, "wav": wav, "txt": texts[key]})
    return entries, sorted(set(wavs) ^ set(texts))


def write_raw_list(entries: Iterable[dict], path: str) -> int:
    """Write ``entries`` as a raw data.list at ``path`` (its folder is made); returns the number of lines."""
    if os.path.dirname(path):
        os.makedirs(os.path.dirname(path), exist_ok=True)
    count = 0
    with open(path, "w", encoding="utf-8") as f:
        for entry in entries:
            f.write(json.dumps(entry, ensure_ascii=False) + "\n")
            count += 1
    return count


def read_raw_list(path: str) -> List[dict]:
    """The entries of a raw data.list, each checked as the pipeline parses it.

    Raises:
        ValueError: a line is not a valid raw entry (the message names the file and line), or a key contains
            ``/`` (it could not name a shard member).
    """
    entries = []
    with open(path, encoding="utf-8") as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                entry = parse_raw({"line": line})
            except SkipSample as skip:
                raise ValueError(f"{path}:{line_no}: {skip.detail}") from skip
            if "/" in entry["key"]:
                raise ValueError(f"{path}:{line_no}: key {entry['key']!r} contains '/'")
            entries.append(entry)
    return entries
