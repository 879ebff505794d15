"""Tar shards: many utterances per file, so that loading is a few large sequential reads instead of one open per
utterance.

A shard is a plain POSIX tar (written by :func:`write_shard`, driven by ``tools/make_shard_list.py``) whose
members come in adjacent pairs, one pair per utterance::

    <key>.txt     UTF-8 transcript (read back Unicode-normalised, NFC)
    <key>.<ext>   encoded audio: the source file's bytes as they are (ext wav, flac, opus, ...), or the audio
                  re-encoded as 16-bit FLAC or WAV (``audio_format``; always for a segment, ``start``/``end``
                  in the raw line, which is cut first and stored as FLAC unless WAV is asked for)

Re-encoding trades disk for CPU: 16-bit FLAC and WAV decode much faster than Ogg Opus, at several times the bytes
(``benchmarks/bench_dataset.py`` measures the pipeline on each).

The data.list of a shard set holds one JSON line per shard, ``{"shard": "/abs/path.tar", "num_utts": N}``
(:func:`write_shard_list`): the count is what lets a lost shard be counted in utterances. A bare path per line
(a list written by hand or by an older ``make_shard_list.py``) is still read, but then a lost rest of a shard can
only be counted as 1; :func:`toolkit.dataset.pipeline.build_dataset` warns about such lists. :func:`read_shards`
turns shard lines into ``{"key", "wav", "wav_bytes", "txt"}`` samples for
:func:`toolkit.dataset.processor.read_audio`.

Every utterance a shard line offers is yielded or counted, in utterances. Bad input never ends more than the
member it hits: the reader opens tars with ``ignore_zeros=True``, so a member whose header is corrupt (checksum
mismatch) is stepped over block by block until the next valid header, and the utterance left with only one of its
two members is skipped as ``corrupt_member``. A member whose audio bytes are corrupt decodes as
``unreadable_audio`` later in the chain. A truncated file (cut inside a member's data, inside a member header, or
at a header boundary: it then lacks the end-of-archive marker, or holds fewer utterances than its line records)
ends the shard early: the utterances it lost are counted as ``corrupt_shard``; a missing shard counts all of its
utterances as ``missing_shard``. Each is logged as a warning naming the shard.
"""
import glob
import hashlib
import io
import json
import logging
import os
import tarfile
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from typing import Iterable, Iterator, List, Optional, Tuple

import soundfile as sf

from toolkit.dataset.processor import SkipSample, read_audio
from toolkit.utils.unicode_text import normalize_unicode
from toolkit.utils.worker_start import LogSetup, start_pool_worker, worker_context

logger = logging.getLogger(__name__)

TRANSCRIPT_EXT = "txt"
AUDIO_FORMATS = ("keep", "flac", "wav")


def encode_audio(entry: dict, audio_format: str = "keep") -> Tuple[str, bytes]:
    """The audio member of one raw entry as ``(extension, bytes)``.

    Reads ``wav`` (path) and the optional ``start``/``end`` (seconds) of ``entry``. With ``audio_format``
    ``keep`` a whole file is stored as its own bytes; otherwise (and for every segment, which is cut first,
    as FLAC under ``keep``) the audio is decoded and stored as 16-bit PCM in FLAC or WAV, lossless for 16-bit
    sources, the original sample rate and channels averaged to mono.

    Raises:
        SkipSample: ``missing_audio``, ``unreadable_audio`` or ``empty_audio`` (see ``read_audio``).
        ValueError: ``audio_format`` not in :data:`AUDIO_FORMATS`.
    """
    if audio_format not in AUDIO_FORMATS:
        raise ValueError(f"audio_format must be one of {AUDIO_FORMATS}, got {audio_format!r}")
    path = entry["wav"]
    if audio_format == "keep" and "start" not in entry:
        if not os.path.isfile(path):
            raise SkipSample("missing_audio", f"no such file {path}")
        ext = os.path.splitext(path)[1].lstrip(".").lower() or "wav"
        with open(path, "rb") as f:
            return ext, f.read()
    audio = read_audio(entry)
    ext = "wav" if audio_format == "wav" else "flac"
    buffer = io.BytesIO()
    sf.write(buffer, audio["waveform"], audio["sample_rate"], format=ext.upper(), subtype="PCM_16")
    return ext, buffer.getvalue()


def _add_member(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = 0o644  # mtime/uid stay 0 so that the same input gives byte-identical shards
    tar.addfile(info, io.BytesIO(data))


def write_shard(entries: Iterable[dict], tar_path: str,
                audio_format: str = "keep") -> Tuple[int, List[Tuple[str, str]]]:
    """Write one shard atomically: into ``tar_path + ".tmp"``, renamed to ``tar_path`` when complete, so an
    existing ``tar_path`` is always a finished shard (what makes ``make_shard_list`` resumable).

    Args:
        entries: raw entries ``{"key", "wav", "txt"[, "start", "end"]}``; keys must not contain ``/``.
        audio_format: ``keep``, ``flac`` or ``wav`` (see :func:`encode_audio`).

    Returns:
        ``(num_written, skipped)`` with ``skipped`` the ``(key, reason)`` of entries whose audio could not be
        read (each also logged as a warning).

    Raises:
        OSError: the shard cannot be written. ValueError: unknown ``audio_format``.
    """
    skipped: List[Tuple[str, str]] = []
    num_written = 0
    tmp_path = tar_path + ".tmp"
    with tarfile.open(tmp_path, "w") as tar:
        for entry in entries:
            try:
                ext, audio = encode_audio(entry, audio_format)
            except SkipSample as skip:
                logger.warning("not sharding utterance %s: %s (%s)", entry["key"], skip.reason, skip.detail)
                skipped.append((entry["key"], skip.reason))
                continue
            _add_member(tar, f"{entry['key']}.{TRANSCRIPT_EXT}", entry["txt"].encode("utf-8"))
            _add_member(tar, f"{entry['key']}.{ext}", audio)
            num_written += 1
    os.replace(tmp_path, tar_path)
    return num_written, skipped


def parse_shard_line(line: str) -> Tuple[str, Optional[int]]:
    """``(path, num_utts)`` of one shard data.list line: ``{"shard": path, "num_utts": N}``, or a bare path, whose
    ``num_utts`` is None (unknown).

    Raises:
        ValueError: a JSON line that is not an object with a string ``shard`` and an integer ``num_utts`` >= 0.
    """
    line = line.strip()
    if not line.startswith("{"):
        return line, None
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as err:
        raise ValueError(f"not JSON ({err})") from err
    num_utts = obj.get("num_utts") if isinstance(obj, dict) else None
    if (not isinstance(obj, dict) or not isinstance(obj.get("shard"), str) or isinstance(num_utts, bool)
            or not isinstance(num_utts, int) or num_utts < 0):
        raise ValueError(f'expected {{"shard": "<path>", "num_utts": <integer >= 0>}}, got {line}')
    return obj["shard"], num_utts


def _data_end(member: tarfile.TarInfo) -> int:
    """Byte offset just past ``member``'s data blocks."""
    return member.offset_data + -(-member.size // tarfile.BLOCKSIZE) * tarfile.BLOCKSIZE


def _ends_cleanly(path: str, data_end: int) -> bool:
    """Whether only zeros follow ``data_end`` (the end of the last member's data), at least the two zero blocks of
    the end-of-archive marker. NOTE: with ``ignore_zeros`` tarfile reads a file cut at a header boundary, or inside
    a header block, as a normal end; the missing marker is the only sign of it."""
    with open(path, "rb") as f:
        if f.seek(0, os.SEEK_END) - data_end < 2 * tarfile.BLOCKSIZE:
            return False
        f.seek(data_end)
        while chunk := f.read(1 << 16):
            if chunk.strip(b"\0"):
                return False
    return True


def scan_shard(path: str) -> Tuple[int, bool]:
    """``(utterances, complete)`` of a shard from its headers only (tarfile seeks over the audio): the number of
    transcript members (those before the damage in a damaged shard, 0 for a missing one), and whether the archive
    was read to its end-of-archive marker."""
    count, data_end = 0, 0
    try:
        with tarfile.open(path, mode="r:", ignore_zeros=True) as tar:
            for member in tar:
                count += member.name.endswith("." + TRANSCRIPT_EXT)
                data_end = _data_end(member)
    except (tarfile.TarError, OSError, EOFError):
        return count, False
    return count, _ends_cleanly(path, data_end)


def count_shard_utterances(path: str) -> int:
    """Number of transcript members in a shard (see :func:`scan_shard`)."""
    return scan_shard(path)[0]


def write_shard_list(shard_paths: Iterable[str], list_path: str) -> int:
    """Write the shard data.list: one ``{"shard", "num_utts"}`` line per shard, the count read from the shard.

    Returns:
        The total number of utterances listed.

    Raises:
        ValueError: a shard is missing or incomplete (names it); OSError: ``list_path`` cannot be written.
    """
    lines, total = [], 0
    for path in shard_paths:
        num_utts, complete = scan_shard(path)
        if not complete:
            raise ValueError(f"shard {path} is missing or incomplete (no end-of-archive marker): delete it and run "
                             f"tools/make_shard_list.py again to rewrite it")
        lines.append(json.dumps({"shard": path, "num_utts": num_utts}, ensure_ascii=False) + "\n")
        total += num_utts
    with open(list_path, "w", encoding="utf-8") as f:
        f.write("".join(lines))
    return total


def _skip(num_skipped: Counter, reason: str, what: str, detail: str, num_utts: int = 1) -> None:
    logger.warning("skipping %s: %s (%s)", what, reason, detail)
    num_skipped[reason] += num_utts


def _utterance(path: str, key: str, members: dict, num_skipped: Counter) -> Iterator[dict]:
    """Yield the sample of one key's members, or count it as ``corrupt_member`` when a member is missing."""
    audio_exts = [ext for ext in members if ext != TRANSCRIPT_EXT]
    if TRANSCRIPT_EXT not in members or len(audio_exts) != 1:
        _skip(num_skipped, "corrupt_member", f"utterance {key}",
              f"{path} has members {sorted(members)} for it; expected {TRANSCRIPT_EXT} and one audio member")
        return
    try:
        txt = normalize_unicode(members[TRANSCRIPT_EXT].decode("utf-8"))
    except UnicodeDecodeError as err:
        _skip(num_skipped, "corrupt_member", f"utterance {key}", f"{path}: transcript is not UTF-8 ({err})")
        return
    ext = audio_exts[0]
    yield {"key": key, "wav": f"{path}:{key}.{ext}", "wav_bytes": members[ext], "txt": txt}


_UNKNOWN_COUNT = "counted as 1 utterance: the data.list records no utterance count for this shard"


def _count_lost(num_skipped: Counter, path: str, num_utts: Optional[int], done: int, damage: Optional[str]) -> None:
    """Count what a shard lost after its first ``done`` utterances (each yielded or counted already)."""
    if num_utts is None:
        if damage:
            _skip(num_skipped, "corrupt_shard", f"shard {path}", f"{damage}; the rest is lost, {_UNKNOWN_COUNT}")
        return
    lost = num_utts - done
    if lost > 0 or damage:
        lost = max(lost, 1)  # NOTE: damage with no shortfall means the list's count is stale; one member is lost
        _skip(num_skipped, "corrupt_shard", f"shard {path}",
              f"{damage or 'ends early'}: {done} of the {num_utts} utterances its data.list line records were read, "
              f"{lost} lost", num_utts=lost)
    elif lost < 0:
        logger.warning("shard %s holds %d utterances, more than the %d its data.list line records: the list is "
                       "stale (write it again with tools/make_shard_list.py)", path, done, num_utts)


def _read_shard(line: str, num_skipped: Counter) -> Iterator[dict]:
    path, num_utts = parse_shard_line(line)
    if not os.path.isfile(path):
        _skip(num_skipped, "missing_shard", f"shard {path}", "no such file; " + (
            _UNKNOWN_COUNT if num_utts is None else f"its {num_utts} utterances are lost"),
            num_utts=1 if num_utts is None else num_utts)
        return
    done, damage, key, members, data_end = 0, None, None, {}, 0
    try:
        # NOTE: ignore_zeros makes tarfile step over a block that fails the header checksum instead of ending
        # the archive there, so one corrupt member header costs that member, not the rest of the shard.
        with tarfile.open(path, mode="r:", ignore_zeros=True) as tar:
            for member in tar:
                data_end = _data_end(member)
                if not member.isfile():
                    continue
                member_key, _, ext = member.name.rpartition(".")
                data = tar.extractfile(member).read()
                if member_key != key:
                    if key is not None:
                        yield from _utterance(path, key, members, num_skipped)
                        done += 1
                    key, members = member_key, {}
                members[ext] = data
    except (tarfile.TarError, OSError, EOFError) as err:
        damage, key = f"unreadable after {done} utterance(s) ({err})", None  # the key being read is lost
    if key is not None:
        yield from _utterance(path, key, members, num_skipped)
        done += 1
    if damage is None and num_utts is None and not _ends_cleanly(path, data_end):
        damage = f"no end-of-archive marker after {done} utterance(s): the file was cut"
    _count_lost(num_skipped, path, num_utts, done, damage)


def read_shard_transcripts(path: str) -> List[Tuple[str, str]]:
    """``(key, transcript)`` of every transcript member of a shard, in order, without reading the audio (tarfile
    seeks over it). A missing or unreadable shard gives the members before the damage (none when missing); a
    transcript that is not UTF-8 is left out. Both are reported, per utterance, when the shard is read for
    decoding."""
    pairs = []
    try:
        with tarfile.open(path, mode="r:", ignore_zeros=True) as tar:
            for member in tar:
                key, _, ext = member.name.rpartition(".")
                if member.isfile() and ext == TRANSCRIPT_EXT:
                    try:
                        pairs.append((key, normalize_unicode(tar.extractfile(member).read().decode("utf-8"))))
                    except UnicodeDecodeError:
                        continue
    except (tarfile.TarError, OSError, EOFError):
        pass  # NOTE: the members before the damage stand; the damage is reported when the shard is decoded
    return pairs


def read_shards(shard_lines: Iterable[str], num_skipped: Counter) -> Iterator[dict]:
    """Stream step: read shards one after another, in order, each sequentially.

    Args:
        shard_lines: shard data.list lines (see :func:`parse_shard_line`).
        num_skipped: skip counts by reason, in utterances, updated in place.

    Yields ``{"key", "wav", "wav_bytes", "txt"}`` per utterance (``wav`` is ``"<shard>:<member>"``, for logs).
    Skips are logged naming the key (or shard) and counted under ``missing_shard`` (every utterance of the
    shard), ``corrupt_shard`` (a truncated or unreadable tar: the utterances after the damage) or
    ``corrupt_member`` (one utterance).

    Raises:
        ValueError: a malformed line (``build_dataset`` checks every line before reading).
    """
    for line in shard_lines:
        yield from _read_shard(line, num_skipped)


def clear_stale_outputs(folder: str, name: str, stale_patterns: Tuple[str, ...], settings: object) -> None:
    """Make ``folder`` resumable without mixing inputs: ``<folder>/<name>.fingerprint`` records a hash of
    ``settings`` (JSON-serialisable: the entries and options the outputs are made from); when it differs from the
    recorded one, every file matching one of ``stale_patterns`` (globs in ``folder``) is deleted first, then the new
    hash is recorded. Outputs that are already there are kept otherwise."""
    path = os.path.join(folder, f"{name}.fingerprint")
    fingerprint = hashlib.sha256(json.dumps(settings, sort_keys=True).encode("utf-8")).hexdigest()
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as f:
            if f.read().strip() == fingerprint:
                return
    stale = [old for pattern in stale_patterns for old in glob.glob(os.path.join(glob.escape(folder), pattern))]
    if stale:
        logger.warning("%s: input or settings changed, deleting %d old %s files", folder, len(stale), name)
    for old in stale:
        os.remove(old)
    with open(path, "w", encoding="utf-8") as f:
        f.write(fingerprint + "\n")


def _write_job(job: Tuple[List[dict], str, str]) -> Tuple[int, List[Tuple[str, str]]]:
    entries, tar_path, audio_format = job
    return write_shard(entries, tar_path, audio_format)


def make_shards(entries: List[dict], shard_dir: str, num_utts_per_shard: int, num_workers: int,
                prefix: str = "shards",
                audio_format: str = "keep") -> Tuple[List[str], int, int, List[Tuple[str, str]]]:
    """Pack ``entries`` into shards of ``num_utts_per_shard`` utterances, in order, with ``num_workers`` processes,
    writing only the shards that do not exist yet (``audio_format``: keep, flac or wav).

    Resumable: each shard is written to ``NAME.tmp`` and renamed when complete, and an existing shard is kept, so
    after an interruption the same call writes only the missing ones. ``<shard_dir>/<prefix>.fingerprint`` records a
    hash of the entries and settings; when they change, the old shards of that prefix are deleted first, so a
    resumed run never mixes two inputs.

    Returns:
        ``(shard_paths, num_reused, num_utts_written, skipped)``: every shard's absolute path in order, how many existed
        already, utterances written in this run, and ``(key, reason)`` of the entries left out in this run.

    Raises:
        ValueError: ``num_utts_per_shard`` or ``num_workers`` < 1.
        toolkit.utils.worker_start.WorkerStartError: the processes cannot start in this script shape (one line
            saying what to do; :func:`toolkit.utils.worker_start.worker_context`).
    """
    if num_utts_per_shard < 1 or num_workers < 1:
        raise ValueError(f"need num_utts_per_shard >= 1 and num_workers >= 1, got {num_utts_per_shard}, {num_workers}")
    os.makedirs(shard_dir, exist_ok=True)
    clear_stale_outputs(shard_dir, prefix, (f"{glob.escape(prefix)}_*.tar*",),
                        [entries, num_utts_per_shard, audio_format])
    chunks = [entries[i:i + num_utts_per_shard] for i in range(0, len(entries), num_utts_per_shard)]
    paths = [os.path.abspath(os.path.join(shard_dir, f"{prefix}_{i:06d}.tar")) for i in range(len(chunks))]
    jobs = [(chunk, path, audio_format) for chunk, path in zip(chunks, paths) if not os.path.isfile(path)]
    if num_workers == 1 or len(jobs) <= 1:
        results = list(map(_write_job, jobs))
    else:
        context = worker_context((_write_job, jobs), "make_shards' processes", "use one (--num_workers 1)")
        with ProcessPoolExecutor(min(num_workers, len(jobs)), mp_context=context, initializer=start_pool_worker,
                                 initargs=(LogSetup.of_this_process(),)) as pool:
            results = list(pool.map(_write_job, jobs))
    written = sum(num for num, _ in results)
    skipped = [item for _, job_skipped in results for item in job_skipped]
    return paths, len(chunks) - len(jobs), written, skipped
