"""data.list files, outside the pipeline that streams them (:mod:`toolkit.dataset.pipeline`).

Raw data.lists: one JSON line ``{"key", "wav", "txt"[, "start", "end"]}`` per utterance (``start``/``end`` in
seconds for a segment of a longer file), made from a Kaldi data dir (``wav.scp`` + ``text``) and read back checked,
optionally with the audio re-encoded once into files that are cheaper to decode every epoch. The pipeline parses the
same lines (:func:`toolkit.dataset.processor.parse_raw`).

Either kind, raw or shard (one ``{"shard": path, "num_utts": N}`` line per tar shard, :mod:`toolkit.dataset.shard`):
its lines (:func:`read_lines`), the shard lines' recorded counts (:func:`shard_counts`), its utterance count
(:func:`count_utterances`) and its transcripts in order (:func:`read_transcripts`)."""

from __future__ import annotations

import json
import os
from concurrent.futures import ProcessPoolExecutor
from typing import Iterable, List, Optional, Tuple

from toolkit.dataset.processor import SkipSample, parse_raw
from toolkit.dataset.shard import (clear_stale_outputs, count_shard_utterances, encode_audio, parse_shard_line,
                                   read_shard_transcripts)
from toolkit.utils.config_parsing import ConfigError
from toolkit.utils.kaldi_files import read_table
from toolkit.utils.worker_start import LogSetup, start_pool_worker, worker_context


def make_raw_list(wav_scp: str, text: str, wav_root: Optional[str] = None) -> Tuple[List[dict], List[str]]:
    """Join a Kaldi ``wav.scp`` and ``text``.

    Relative wav paths are joined to ``wav_root`` when it is given (the corpora's wav.scp paths are relative to the
    corpus root), otherwise kept.

    Returns:
        ``(entries, unmatched_keys)``: entries ``{"key", "wav", "txt"}`` in wav.scp order, and the sorted keys found
        in only one of the two files.
    """
    wavs = read_table(wav_scp)
    texts = read_table(text, text=True)
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
        toolkit.utils.worker_start.WorkerStartError: the processes cannot start in this script shape (one line
            saying what to do).
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
        context = worker_context((_reencode_job, jobs), "reencode_audio's processes", "use one (num_workers 1)")
        with ProcessPoolExecutor(num_workers, mp_context=context, initializer=start_pool_worker,
                                 initargs=(LogSetup.of_this_process(),)) as pool:
            results = list(pool.map(_reencode_job, jobs, chunksize=64))
    new_entries, skipped = [], []
    for (entry, reason), (_, _, path) in zip(results, jobs):
        if reason is None:
            new_entries.append({"key": entry["key"], "wav": path, "txt": entry["txt"]})
        else:
            skipped.append((entry["key"], reason))
    return new_entries, reused, skipped


def read_lines(data_list_file: str) -> List[str]:
    """The non-blank lines of a data.list, stripped.

    Raises:
        OSError: ``data_list_file`` cannot be read.
    """
    with open(data_list_file, encoding="utf-8") as f:
        return [line.strip() for line in f if line.strip()]


def shard_counts(data_list_file: str, lines: List[str]) -> List[Optional[int]]:
    """Each shard line's recorded utterance count (None for a bare path).

    Raises:
        ConfigError: a malformed line (names the file and line).
    """
    counts = []
    for line_no, line in enumerate(lines, 1):
        try:
            counts.append(parse_shard_line(line)[1])
        except ValueError as err:
            raise ConfigError(f"{data_list_file}:{line_no}: not a shard data.list line: {err}; write the list with "
                              f"tools/make_shard_list.py") from err
    return counts


def count_utterances(data_list_file: str, data_type: str) -> int:
    """Utterances listed by a data.list, before filtering: its lines for ``raw``; for ``shard`` the counts its
    lines record, or for a bare-path line the transcripts in that shard (header scan, see
    :func:`toolkit.dataset.shard.count_shard_utterances`).

    Raises:
        OSError: ``data_list_file`` cannot be read. ConfigError: a malformed shard line.
    """
    lines = read_lines(data_list_file)
    if data_type == "raw":
        return len(lines)
    counts = shard_counts(data_list_file, lines)
    return sum(count_shard_utterances(parse_shard_line(line)[0]) if n is None else n
               for line, n in zip(lines, counts))


def read_transcripts(data_list_file: str, data_type: str) -> List[Tuple[str, str]]:
    """``(key, transcript)`` of every utterance a data.list names, in input order (raw: line order; shard: shard
    order, then member order), repeats included: the references of a test set and the order its results are
    written in. A raw line that is not a valid JSON utterance, and the utterances of a missing or damaged shard
    past the damage, are left out (the pipeline skips them too, counted as ``bad_line``, ``missing_shard`` or
    ``corrupt_shard``).

    Raises:
        OSError: ``data_list_file`` cannot be read. ConfigError: a malformed shard line.
    """
    lines = read_lines(data_list_file)
    if data_type == "shard":
        shard_counts(data_list_file, lines)  # checks every line
        return [pair for line in lines for pair in read_shard_transcripts(parse_shard_line(line)[0])]
    pairs = []
    for line in lines:
        try:
            sample = parse_raw({"line": line})
        except SkipSample:
            continue
        pairs.append((sample["key"], sample["txt"]))
    return pairs
