"""Raw data.lists: one JSON line ``{"key", "wav", "txt"[, "start", "end"]}`` per utterance (``start``/``end`` in
seconds for a segment of a longer file), made from a Kaldi data dir (``wav.scp`` + ``text``) and read back checked,
optionally with the audio re-encoded once into files that are cheaper to decode every epoch. The pipeline parses the
same lines (:func:`toolkit.dataset.processor.parse_raw`)."""

from __future__ import annotations

import json
import os
from concurrent.futures import ProcessPoolExecutor
from typing import Iterable, List, Optional, Tuple

from toolkit.dataset.processor import SkipSample, parse_raw
from toolkit.dataset.shard import clear_stale_outputs, encode_audio
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


def _reencode_job(job: Tuple[dict, str, str]) -> Tuple[dict, Optional[str]]:
    entry, audio_format, path = job
    if os.path.isfile(path):
        return entry, None
    try:
        _, audio = encode_audio(entry, audio_format)
    except SkipSample as skip:
        return entry, f"{skip.reason}: {skip.detail}"
    with open(path + ".tmp", "wb") as f:
        f.write(audio)
    os.replace(path + ".tmp", path)
    return entry, None


def reencode_audio(entries: List[dict], audio_dir: str, audio_format: str,
                   num_workers: int = 1) -> Tuple[List[dict], int, List[Tuple[str, str]]]:
    """Decode each entry's audio once and store it as 16-bit PCM ``<audio_dir>/<key>.<ext>`` (``audio_format`` flac
    or wav; a segment is cut first), so that training decodes that every epoch instead of the source: 16-bit FLAC
    decodes about twice as fast as Ogg Opus (README, "Data pipeline"), at several times the bytes. Lossless for
    16-bit sources; the sample rate is kept and channels are averaged to mono (see
    :func:`toolkit.dataset.shard.encode_audio`).

    Resumable: each file is written to ``NAME.tmp`` and renamed when complete, and an existing file is kept, so
    after an interruption the same call writes only the missing ones. ``<audio_dir>/audio.fingerprint`` records a
    hash of the entries and the format; when they change, the folder's old audio files are deleted first.

    Returns:
        ``(new_entries, num_reused, skipped)``: the entries whose audio was stored, in order, with ``wav`` the new
        file's absolute path (``start``/``end`` dropped); how many files existed already; and ``(key, "reason:
        detail")`` of the entries left out (reason ``missing_audio``, ``unreadable_audio`` or ``empty_audio``).

    Raises:
        ValueError: ``audio_format`` is not flac or wav, a key contains ``/`` or starts with ``.``, or
            ``num_workers`` < 1.
    """
    if audio_format not in ("flac", "wav"):
        raise ValueError(f"audio_format must be flac or wav, got {audio_format!r}")
    if num_workers < 1:
        raise ValueError(f"num_workers must be >= 1, got {num_workers}")
    for entry in entries:
        if "/" in entry["key"] or entry["key"].startswith("."):
            raise ValueError(f"key {entry['key']!r} cannot name a file in {audio_dir}")
    os.makedirs(audio_dir, exist_ok=True)
    clear_stale_outputs(audio_dir, "audio", ("*.flac", "*.wav", "*.tmp"), [entries, audio_format])
    audio_dir = os.path.abspath(audio_dir)
    jobs = [(entry, audio_format, os.path.join(audio_dir, f"{entry['key']}.{audio_format}")) for entry in entries]
    reused = sum(os.path.isfile(path) for _, _, path in jobs)
    if num_workers == 1:
        results = list(map(_reencode_job, jobs))
    else:
        with ProcessPoolExecutor(num_workers) as pool:
            results = list(pool.map(_reencode_job, jobs, chunksize=64))
    new_entries, skipped = [], []
    for (entry, reason), (_, _, path) in zip(results, jobs):
        if reason is None:
            new_entries.append({"key": entry["key"], "wav": path, "txt": entry["txt"]})
        else:
            skipped.append((entry["key"], reason))
    return new_entries, reused, skipped
