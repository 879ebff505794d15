"""Tar shards: many utterances per file, so that loading is a few large sequential reads instead of one open per
utterance.

A shard is a plain POSIX tar (written by :func:`write_shard`, driven by ``tools/make_shard_list.py``) whose
members come in adjacent pairs, one pair per utterance::

    <key>.txt     UTF-8 transcript
    <key>.<ext>   encoded audio: the source file's bytes as they are (ext wav, flac, opus, ...), or the audio
                  re-encoded as 16-bit FLAC or WAV (``audio_format``; always for a segment, ``start``/``end``
                  in the raw line, which is cut first and stored as FLAC unless WAV is asked for)

Re-encoding trades disk for CPU: decoding Ogg Opus costs about 2.5 ms per audio second on one core here,
16-bit FLAC 0.4 ms and WAV 0.1 ms (while the fbank costs 0.7 ms), at about 4.5x (FLAC: 81 MB for the 18 MB
of the kathleen corpus) and 9x (WAV) the bytes.

The data.list of a shard set holds one shard path per line. :func:`read_shards` turns shard paths into
``{"key", "wav", "wav_bytes", "txt"}`` samples for :func:`toolkit.dataset.processor.read_audio`.

Bad input never ends more than the member it hits: the reader opens tars with ``ignore_zeros=True``, so a
member whose header is corrupt (checksum mismatch) is stepped over block by block until the next valid
header, and the utterance left with only one of its two members is skipped as ``corrupt_member``. A member
whose audio bytes are corrupt decodes as ``unreadable_audio`` later in the chain. Only a truncated file ends a
shard early (``corrupt_shard``); a missing one is ``missing_shard``.
"""
import io
import logging
import os
import tarfile
from collections import Counter
from typing import Iterable, Iterator, List, Tuple

import soundfile as sf

from toolkit.dataset.processor import SkipSample, read_audio

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


def _skip(num_skipped: Counter, reason: str, what: str, detail: str) -> None:
    logger.warning("skipping %s: %s (%s)", what, reason, detail)
    num_skipped[reason] += 1


def _utterance(path: str, key: str, members: dict, num_skipped: Counter) -> Iterator[dict]:
    """Yield the sample of one key's members, or count it as ``corrupt_member`` when a member is missing."""
    audio_exts = [ext for ext in members if ext != TRANSCRIPT_EXT]
    if TRANSCRIPT_EXT not in members or len(audio_exts) != 1:
        _skip(num_skipped, "corrupt_member", f"utterance {key}",
              f"{path} has members {sorted(members)} for it; expected {TRANSCRIPT_EXT} and one audio member")
        return
    try:
        txt = members[TRANSCRIPT_EXT].decode("utf-8")
    except UnicodeDecodeError as err:
        _skip(num_skipped, "corrupt_member", f"utterance {key}", f"{path}: transcript is not UTF-8 ({err})")
        return
    ext = audio_exts[0]
    yield {"key": key, "wav": f"{path}:{key}.{ext}", "wav_bytes": members[ext], "txt": txt}


def _read_shard(path: str, num_skipped: Counter) -> Iterator[dict]:
    if not os.path.isfile(path):
        _skip(num_skipped, "missing_shard", f"shard {path}", "no such file")
        return
    key, members = None, {}
    try:
        # NOTE: ignore_zeros makes tarfile step over a block that fails the header checksum instead of ending
        # the archive there, so one corrupt member header costs that member, not the rest of the shard.
        with tarfile.open(path, mode="r:", ignore_zeros=True) as tar:
            for member in tar:
                if not member.isfile():
                    continue
                member_key, _, ext = member.name.rpartition(".")
                data = tar.extractfile(member).read()
                if member_key != key:
                    if key is not None:
                        yield from _utterance(path, key, members, num_skipped)
                    key, members = member_key, {}
                members[ext] = data
    except (tarfile.TarError, OSError, EOFError) as err:
        _skip(num_skipped, "corrupt_shard", f"shard {path}", f"unreadable after key {key} ({err}); rest lost")
        return
    if key is not None:
        yield from _utterance(path, key, members, num_skipped)


def count_shard_utterances(path: str) -> int:
    """Number of transcript members in a shard, from its headers only (tarfile seeks over the audio); 0 for a
    missing or unreadable shard, and the members before the damage for a damaged one."""
    count = 0
    try:
        with tarfile.open(path, mode="r:", ignore_zeros=True) as tar:
            for member in tar:
                count += member.name.endswith("." + TRANSCRIPT_EXT)
    except (tarfile.TarError, OSError, EOFError):
        return count  # the damage is reported, per utterance, when the shard is read for training
    return count


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
                        pairs.append((key, tar.extractfile(member).read().decode("utf-8")))
                    except UnicodeDecodeError:
                        continue
    except (tarfile.TarError, OSError, EOFError):
        pass
    return pairs


def read_shards(shard_paths: Iterable[str], num_skipped: Counter) -> Iterator[dict]:
    """Stream step: read shards one after another, in order, each sequentially.

    Yields ``{"key", "wav", "wav_bytes", "txt"}`` per utterance (``wav`` is ``"<shard>:<member>"``, for logs).
    Skips are logged naming the key (or shard) and counted into ``num_skipped`` under ``missing_shard``,
    ``corrupt_shard`` (unreadable tar: the utterances before the damage are kept) or ``corrupt_member``.
    """
    for path in shard_paths:
        yield from _read_shard(path, num_skipped)
