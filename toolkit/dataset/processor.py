"""Steps of the data pipeline: pure per-sample functions and generator stream steps.

A *sample* is a dict that grows as it moves through the per-sample steps::

    {"line"} -> parse_raw -> {"key", "wav", "txt"[, "start", "end"]} -> read_audio -> + "waveform", "sample_rate"
    -> resample / speed_perturb -> tokenize -> + "tokens", "label" -> filter_sample -> pad_short
    -> compute_fbank -> + "feat" (waveform dropped) -> spec_aug

A per-sample step returns a new dict (its input is never modified) or raises :class:`SkipSample`; the stream
step :func:`map_skipping` turns that into a logged, counted skip so that bad input never stops training.
Shards (tar files) enter the same chain through :func:`toolkit.dataset.shard.read_shards`, which yields
``{"key", "wav", "wav_bytes", "txt"}`` samples.
"""
import bisect
import functools
import io
import json
import logging
import math
import os
import random
import warnings
import zlib
from collections import Counter
from typing import TYPE_CHECKING, Callable, Dict, Iterable, Iterator, List, Optional

import numpy as np
import soundfile as sf
import torch
from torch.nn.utils.rnn import pad_sequence

from toolkit.text.tokenizer import WORD_BOUNDARY
from toolkit.utils.common import IGNORE_ID, UNK_ID
from toolkit.utils.unicode_text import normalize_unicode

if TYPE_CHECKING:
    from lhotse.features.kaldi.extractors import Fbank

# NOTE: the resampling and feature libraries are imported where first used, not above: scipy.signal and lhotse were
# 3.8 s of the trainer's 8.5 s of imports on a slow 2-core machine, paid by every rank's main process, every
# decoding rank and run.sh's config check, none of which computes a feature. The loader imports them once, in its
# forkserver or in the process that forks its workers (:func:`toolkit.dataset.loader.loader_context`).
WORKER_IMPORTS = ("lhotse.features.kaldi.extractors", "scipy.signal")

logger = logging.getLogger(__name__)

# Kaldi computes fbank on 16-bit sample values; soundfile returns floats in [-1, 1).
INT16_SCALE = 32768.0
# Standard deviation of pad_short's noise on that scale: Kaldi's default dither, the floor of every training frame.
PAD_NOISE_STD = 1.0


class SkipSample(Exception):
    """Raised by a per-sample step when the sample must be dropped.

    Attributes:
        reason: short key used in the batch's ``num_skipped`` counts, e.g. ``"missing_audio"``.
        detail: human-readable explanation for the log.
    """

    def __init__(self, reason: str, detail: str):
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


def parse_raw(sample: dict) -> dict:
    """Parse one data.list JSON line.

    Reads ``line`` (str, ``{"key": ..., "wav": ..., "txt": ...}`` with optional ``"start"``/``"end"`` in
    seconds for a segment of a longer file); writes ``key``, ``wav``, ``txt`` (Unicode NFC,
    :func:`toolkit.utils.unicode_text.normalize_unicode`) and, when given, ``start`` and ``end`` (float seconds).

    Raises:
        SkipSample: ``bad_line`` when the line is not a JSON object with string key/wav/txt (key and wav not
            empty), or start/end
            are not numbers with ``0 <= start < end``.
    """
    try:
        obj = json.loads(sample["line"])
    except json.JSONDecodeError as err:
        raise SkipSample("bad_line", f"not JSON ({err})") from err
    if not isinstance(obj, dict) or not all(isinstance(obj.get(k), str) for k in ("key", "wav", "txt")):
        raise SkipSample("bad_line", "expected string fields key, wav, txt")
    if not obj["key"] or not obj["wav"]:
        raise SkipSample("bad_line", f"empty {'key' if not obj['key'] else 'wav'}")
    out = {"key": obj["key"], "wav": obj["wav"], "txt": normalize_unicode(obj["txt"])}
    if "start" in obj or "end" in obj:
        start, end = obj.get("start", 0.0), obj.get("end")
        numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (start, end))
        if not numbers or not 0 <= start < end:
            raise SkipSample("bad_line", f"need numbers 0 <= start < end seconds, got start={start} end={end}")
        out.update(start=float(start), end=float(end))
    return out


def audio_seconds(line: str) -> float:
    """Duration in seconds of a raw data.list line's audio, from the file's header (no decoding), or its segment's
    ``end - start``; 0.0 for a line or file the pipeline will skip when it reads it (it counts the reason then).
    What the epoch's batches are planned from (:func:`toolkit.dataset.planning.plan_batches`)."""
    try:
        sample = parse_raw({"line": line})
        if "end" in sample:
            return sample["end"] - sample.get("start", 0.0)
        info = sf.info(sample["wav"])
        return info.frames / info.samplerate
    except (SkipSample, RuntimeError, OSError):  # NOTE: soundfile raises LibsndfileError (a RuntimeError)
        return 0.0


def read_audio(sample: dict) -> dict:
    """Read audio (any libsndfile format: WAV, FLAC, Ogg Opus, ...) as float32 mono.

    Reads ``wav`` (path), or ``wav_bytes`` (the encoded file, from a shard) when present, and the optional
    segment bounds ``start``/``end`` (seconds); writes ``waveform`` (float32 ndarray ``(N,)`` in [-1, 1),
    channels averaged) and ``sample_rate`` (int, Hz), and drops ``wav_bytes``.

    Raises:
        SkipSample: ``missing_audio`` (no such file), ``unreadable_audio`` (libsndfile cannot decode it),
            ``empty_audio`` (zero samples, or a segment that starts past the end), ``non_finite_audio`` (a float
            file holding NaN or infinite samples: they would make every feature, the loss and, through the gradient
            all-reduce, every rank's update NaN).
    """
    path = sample["wav"]
    if "wav_bytes" in sample:
        source = io.BytesIO(sample["wav_bytes"])
    elif os.path.isfile(path):
        source = path
    else:
        raise SkipSample("missing_audio", f"no such file {path}")
    try:
        with sf.SoundFile(source) as f:
            sample_rate = f.samplerate
            num_frames = -1
            if "start" in sample:
                first = round(sample["start"] * sample_rate)
                num_frames = round(sample["end"] * sample_rate) - first
                if first >= f.frames:
                    raise SkipSample("empty_audio", f"{path}: segment starts at {sample['start']} s, past the end")
                f.seek(first)
            data = f.read(num_frames, dtype="float32", always_2d=True)
    except (sf.SoundFileError, RuntimeError, OSError, ValueError) as err:
        raise SkipSample("unreadable_audio", f"{path}: {err}") from err
    if data.shape[0] == 0:
        raise SkipSample("empty_audio", f"{path} has no samples")
    waveform = data.mean(axis=1, dtype=np.float32) if data.shape[1] > 1 else data[:, 0]
    finite = np.isfinite(waveform)
    if not finite.all():
        raise SkipSample("non_finite_audio", f"{path}: {int((~finite).sum())} of {waveform.shape[0]} samples are "
                                             "NaN or infinite")
    out = {k: v for k, v in sample.items() if k != "wav_bytes"}
    out.update(waveform=np.ascontiguousarray(waveform), sample_rate=int(sample_rate))
    return out


@functools.lru_cache(maxsize=32)
def _lowpass(up: int, down: int) -> np.ndarray:
    # The filter resample_poly designs by default (Kaiser window, beta 5), kept: designing it took 40% of
    # the time of a speed perturbation.
    from scipy.signal import firwin
    max_rate = max(up, down)
    return firwin(2 * 10 * max_rate + 1, 1.0 / max_rate, window=("kaiser", 5.0)).astype(np.float32)


def _resample_poly(waveform: np.ndarray, up: int, down: int) -> np.ndarray:
    from scipy.signal import resample_poly
    g = math.gcd(up, down)
    up, down = up // g, down // g
    return resample_poly(waveform, up, down, window=_lowpass(up, down)).astype(np.float32)


def resample(sample: dict, resample_rate: int) -> dict:
    """Polyphase resampling (scipy ``resample_poly``) to ``resample_rate`` when the rate differs.

    Reads ``waveform``, ``sample_rate``; writes ``waveform`` (float32 ``(N * resample_rate / sample_rate,)``)
    and ``sample_rate``.
    """
    if sample["sample_rate"] == resample_rate:
        return sample
    waveform = _resample_poly(sample["waveform"], resample_rate, sample["sample_rate"])
    return dict(sample, waveform=waveform, sample_rate=resample_rate)


def speed_perturb(sample: dict, rng: random.Random, speeds: List[float]) -> dict:
    """Speed perturbation (Ko et al., Interspeech 2015): change tempo and pitch by a random factor.

    Reads ``waveform``, ``sample_rate``; writes ``waveform`` (float32, about ``N / speed`` samples). Done by
    resampling: the signal is played back as if recorded at ``speed * sample_rate``.
    """
    speed = rng.choice(speeds)
    if speed == 1.0:
        return sample
    waveform = _resample_poly(sample["waveform"], 100, round(speed * 100))
    return dict(sample, waveform=waveform)


def volume_perturb(sample: dict, rng: random.Random, min_gain_db: float, max_gain_db: float) -> dict:
    """Random gain, uniform in dB, clipped to [-1, 1] (Lhotse's and ESPnet's volume perturbation).

    NOTE: global CMVN does not remove level differences between recordings: the FSDD test speaker is recorded
    ~20 dB below the training speakers, and a model trained without this step scores ~90% WER on him.

    Reads and writes ``waveform`` (float32 ``(N,)``).
    """
    gain = 10.0 ** (rng.uniform(min_gain_db, max_gain_db) / 20.0)
    return dict(sample, waveform=np.clip(sample["waveform"] * np.float32(gain), -1.0, 1.0))


def tokenize(sample: dict, tokenizer, max_unk_ratio: float) -> dict:
    """Tokenize the transcript; units missing from the symbol table become ``<unk>`` (id 1).

    ``max_unk_ratio`` is the largest allowed fraction of ``<unk>`` among the units other than the word
    boundary ``"▁"`` (0: any unknown unit drops the sample, the training default; 1: keep every sample that
    has at least one known unit, e.g. for decoding). Reads ``txt``; writes ``tokens`` (list[str]) and
    ``label`` (list[int] token ids).

    Raises:
        SkipSample: ``empty_text`` (blank transcript), ``all_unknown`` (every unit maps to ``<unk>``) or
            ``unknown_token`` (more than ``max_unk_ratio`` of the units do).
    """
    if not sample["txt"].strip():
        raise SkipSample("empty_text", "empty transcript")
    tokens, label = tokenizer.tokenize(sample["txt"])
    units = [(t, i) for t, i in zip(tokens, label) if t != WORD_BOUNDARY]
    unknown = sorted({t for t, i in units if i == UNK_ID})
    num_unknown = sum(i == UNK_ID for _, i in units)
    if num_unknown == len(units):
        raise SkipSample("all_unknown", f"every unit is unknown to the symbol table: {unknown}")
    if num_unknown > max_unk_ratio * len(units):
        raise SkipSample("unknown_token", f"{num_unknown} of {len(units)} units not in the symbol table: {unknown}")
    return dict(sample, tokens=tokens, label=label)


def filter_sample(sample: dict, frame_shift: float, max_length: float, min_length: float, token_max_length: int,
                  token_min_length: int, min_output_input_ratio: float, max_output_input_ratio: float) -> dict:
    """Drop samples whose length or label/frame ratio is out of range.

    Lengths are in frames of ``frame_shift`` ms (``num_samples / sample_rate * 1000 / frame_shift``); the ratio is
    ``len(label) / frames``. Reads ``waveform``, ``sample_rate``, ``label``; writes nothing.

    Raises:
        SkipSample: ``too_short``, ``too_long``, ``too_few_tokens``, ``too_many_tokens``,
            ``ratio_too_small`` or ``ratio_too_large``.
    """
    frames = sample["waveform"].shape[0] / sample["sample_rate"] * 1000.0 / frame_shift
    num_tokens = len(sample["label"])
    checks = [
        ("too_short", frames < min_length, f"{frames:.0f} frames < min_length {min_length}"),
        ("too_long", frames > max_length, f"{frames:.0f} frames > max_length {max_length}"),
        ("too_few_tokens", num_tokens < token_min_length, f"{num_tokens} tokens < {token_min_length}"),
        ("too_many_tokens", num_tokens > token_max_length, f"{num_tokens} tokens > {token_max_length}"),
    ]
    if frames > 0:
        ratio = num_tokens / frames
        checks += [("ratio_too_small", ratio < min_output_input_ratio, f"tokens/frames {ratio:.4f}"),
                   ("ratio_too_large", ratio > max_output_input_ratio, f"tokens/frames {ratio:.4f}")]
    for reason, failed, detail in checks:
        if failed:
            raise SkipSample(reason, detail)
    return sample


def pad_short(sample: dict, frame_shift: float, min_length: float) -> dict:
    """Pad an utterance shorter than ``min_length`` frames of ``frame_shift`` ms to that duration, half of the
    padding before the audio and half after.

    Why: the 4x front end gives CTC one frame per 40 ms, and CTC needs a frame per unit (two for a doubled letter),
    so a word trimmed to its edges and spoken faster than that has no alignment at all (24 of the 500 dev_fsdd
    digits at 1.0x speed, 47 at 1.1x, are shorter than their letters need). Padding them in training and in
    decoding alike keeps the two consistent. The padding is Gaussian noise of ``PAD_NOISE_STD`` on the 16-bit scale
    (the level dither gives silence in training; digital zeros would hit the log floor when decoding, where dither
    is off), drawn from a generator seeded by the utterance key, so an utterance is padded the same way on any
    rank, worker or world size.

    Reads ``waveform`` (float32 ``(N,)``), ``sample_rate``, ``key``; writes ``waveform`` (float32
    ``(max(N, round(min_length * frame_shift / 1000 * sample_rate)),)``) and ``padding_s`` (seconds added, so that
    decoding reports its real-time factor on the real audio).
    """
    waveform = sample["waveform"]
    missing = round(min_length * frame_shift / 1000.0 * sample["sample_rate"]) - waveform.shape[0]
    if missing <= 0:
        return sample
    # NOTE: surrogatepass: a key may hold a lone surrogate (a JSON escape, or a shard member name that is not UTF-8).
    rng = np.random.default_rng(zlib.crc32(sample["key"].encode("utf-8", "surrogatepass")))
    noise = rng.standard_normal(missing, dtype=np.float32) * np.float32(PAD_NOISE_STD / INT16_SCALE)
    before = missing // 2
    return dict(sample, waveform=np.concatenate([noise[:before], waveform, noise[before:]]),
                padding_s=missing / sample["sample_rate"])


@functools.lru_cache(maxsize=8)
def _fbank_extractor(sample_rate: int, num_mel_bins: int, frame_length: float, frame_shift: float) -> "Fbank":
    from lhotse.features.kaldi.extractors import Fbank, FbankConfig
    with warnings.catch_warnings():
        # NOTE: Lhotse warns that snip_edges=True breaks its own duration bookkeeping, which is not used here:
        # lengths come from the frame counts this function returns.
        warnings.simplefilter("ignore", UserWarning)
        return Fbank(FbankConfig(sampling_rate=sample_rate, num_filters=num_mel_bins, frame_length=frame_length / 1000,
                                 frame_shift=frame_shift / 1000, snip_edges=True, high_freq=0.0, dither=0.0))


def compute_fbank(sample: dict, num_mel_bins: int, frame_length: float, frame_shift: float, dither: float,
                  rng: Optional[random.Random] = None) -> dict:
    """Kaldi-compatible log mel filterbank: Kaldi's ``compute-fbank-feats`` defaults (povey window, pre-emphasis
    0.97, DC removal, power spectrum, mel bins from 20 Hz to Nyquist, snip_edges=true) on the 16-bit sample scale,
    computed by Lhotse's Kaldi feature extractor (``lhotse.features.kaldi``; it matches kaldi-native-fbank, an
    independent Kaldi implementation, to a mean absolute difference below 5e-5 in log energy: see
    ``test_fbank_matches_kaldi_native_fbank_on_real_speech``). ``frame_length``/``frame_shift`` in ms.

    Dither: ``dither * N(0, 1)`` noise (16-bit scale) added to the waveform, drawn from ``rng``, so that features are
    reproducible from the pipeline's seed (Kaldi draws it per frame from a global generator).

    Reads ``waveform``, ``sample_rate``; writes ``feat`` (float32 tensor ``(T, num_mel_bins)`` with
    ``T = 1 + (N - frame_length_samples) // frame_shift_samples``) and drops ``waveform``.

    Raises:
        SkipSample: ``too_short`` when the audio is shorter than one frame; ``non_finite_feats`` when finite samples
            still give a NaN or infinite feature (float samples far outside [-1, 1] overflow the power spectrum).
        ValueError: ``dither`` > 0 without ``rng``.
    """
    sample_rate = sample["sample_rate"]
    waveform = sample["waveform"]
    if waveform.shape[0] < round(sample_rate * frame_length / 1000):
        raise SkipSample("too_short", f"{waveform.shape[0]} samples is shorter than one {frame_length} ms frame")
    waveform = waveform * np.float32(INT16_SCALE)
    if dither > 0.0:
        if rng is None:
            raise ValueError("compute_fbank: dither > 0 needs the pipeline's rng")
        noise = np.random.default_rng(rng.getrandbits(64)).standard_normal(waveform.shape[0], dtype=np.float32)
        waveform += np.float32(dither) * noise
    feat = _fbank_extractor(sample_rate, num_mel_bins, frame_length, frame_shift).extract(waveform, sample_rate)
    feat = torch.from_numpy(np.ascontiguousarray(feat, dtype=np.float32))
    if not bool(torch.isfinite(feat).all()):
        raise SkipSample("non_finite_feats", f"{sample['wav']}: fbank holds NaN or infinite values (peak sample "
                                             f"{float(np.abs(sample['waveform']).max()):.3g}, expected within [-1, 1])")
    out = {k: v for k, v in sample.items() if k != "waveform"}
    out["feat"] = feat
    return out


def spec_aug(sample: dict, rng: random.Random, num_t_mask: int, num_f_mask: int, max_t: int, max_f: int) -> dict:
    """SpecAugment time and frequency masking (Park et al., Interspeech 2019), without time warping.

    Each mask zeroes a band of ``randint(1, max_t)`` frames (or ``randint(1, max_f)`` bins) starting at a
    uniform position; bands are clipped at the edge. Reads and writes ``feat`` (float32 ``(T, D)``, a copy).

    Raises:
        ValueError: ``max_t`` or ``max_f`` < 1 while the matching mask count is positive.
    """
    feat = sample["feat"].clone()
    num_frames, num_bins = feat.shape
    for _ in range(num_t_mask):
        start = rng.randrange(num_frames)
        feat[start:start + rng.randint(1, max_t), :] = 0
    for _ in range(num_f_mask):
        start = rng.randrange(num_bins)
        feat[:, start:start + rng.randint(1, max_f)] = 0
    return dict(sample, feat=feat)


def map_skipping(samples: Iterable[dict], fn: Callable[[dict], dict], num_skipped: Counter) -> Iterator[dict]:
    """Stream step: apply ``fn``; on :class:`SkipSample` log a warning naming the key and count the reason."""
    for sample in samples:
        try:
            yield fn(sample)
        except SkipSample as skip:
            key = sample.get("key", sample.get("line", "")[:80])
            logger.warning("skipping utterance %s: %s (%s)", key, skip.reason, skip.detail)
            num_skipped[skip.reason] += 1


def shuffle(samples: Iterable[dict], rng: random.Random, shuffle_size: int) -> Iterator[dict]:
    """Stream step: shuffle within consecutive buffers of ``shuffle_size`` samples."""
    buffer: List[dict] = []
    for sample in samples:
        buffer.append(sample)
        if len(buffer) >= shuffle_size:
            rng.shuffle(buffer)
            yield from buffer
            buffer = []
    rng.shuffle(buffer)
    yield from buffer


def sort(samples: Iterable[dict], sort_size: int) -> Iterator[dict]:
    """Stream step: sort by number of frames (``feat.size(0)``) within buffers of ``sort_size`` samples,
    so that batches hold similar lengths and waste less padding."""
    buffer: List[dict] = []
    for sample in samples:
        buffer.append(sample)
        if len(buffer) >= sort_size:
            yield from sorted(buffer, key=lambda s: s["feat"].size(0))
            buffer = []
    yield from sorted(buffer, key=lambda s: s["feat"].size(0))


def static_batch(samples: Iterable[dict], batch_size: int, max_length: float = math.inf) -> Iterator[List[dict]]:
    """Stream step: groups of ``batch_size`` samples (the last one may be smaller). With ``max_length`` (frames;
    reads ``feat``), a group whose longest sample has T > ``max_length`` frames holds at most
    ``max(1, batch_size * (max_length / T) ** 2)`` samples, so that self-attention's padded size ``B * T**2`` stays
    that of ``batch_size`` samples of ``max_length`` frames: a much longer sample forms a group of its own."""
    def room(frames: int) -> float:
        return batch_size if frames <= max_length else max(1.0, batch_size * (max_length / frames) ** 2)

    buffer: List[dict] = []
    longest = 0
    for sample in samples:
        if max_length < math.inf:
            frames = sample["feat"].size(0)
            if buffer and len(buffer) + 1 > room(max(longest, frames)):
                yield buffer
                buffer, longest = [], 0
            longest = max(longest, frames)
        buffer.append(sample)
        if len(buffer) >= batch_size:
            yield buffer
            buffer, longest = [], 0
    if buffer:
        yield buffer


def dynamic_batch(samples: Iterable[dict], max_frames_in_batch: int) -> Iterator[List[dict]]:
    """Stream step: groups whose padded size ``B * max(T)`` stays within ``max_frames_in_batch``.

    A single sample longer than ``max_frames_in_batch`` forms a batch of its own.
    """
    buffer: List[dict] = []
    longest = 0
    for sample in samples:
        frames = sample["feat"].size(0)
        if buffer and max(longest, frames) * (len(buffer) + 1) > max_frames_in_batch:
            yield buffer
            buffer, longest = [], 0
        buffer.append(sample)
        longest = max(longest, frames)
    if buffer:
        yield buffer


def bucket_batch(samples: Iterable[dict], bucket_boundaries: List[int],
                 bucket_batch_sizes: List[int]) -> Iterator[List[dict]]:
    """Stream step: bucketed batching by length (one open batch per length bucket).

    A sample of ``T = feat.size(0)`` frames goes to bucket ``bisect_right(bucket_boundaries, T)``; bucket ``i``
    is released as a batch when it holds ``bucket_batch_sizes[i]`` samples, and the partial buckets are
    released shortest first when the stream ends. Boundaries are in 10 ms frames, ascending.

    Raises:
        ValueError: ``len(bucket_batch_sizes) != len(bucket_boundaries) + 1``, boundaries not strictly
            ascending, or a batch size < 1 (raised when the generator starts).
    """
    if len(bucket_batch_sizes) != len(bucket_boundaries) + 1:
        raise ValueError(f"need len(bucket_batch_sizes) == len(bucket_boundaries) + 1, got "
                         f"{len(bucket_batch_sizes)} sizes for {len(bucket_boundaries)} boundaries")
    if any(b >= c for b, c in zip(bucket_boundaries, bucket_boundaries[1:])) or min(bucket_batch_sizes) < 1:
        raise ValueError(f"bucket_boundaries must ascend and sizes be >= 1: {bucket_boundaries} {bucket_batch_sizes}")
    buckets: List[List[dict]] = [[] for _ in bucket_batch_sizes]
    for sample in samples:
        i = bisect.bisect_right(bucket_boundaries, sample["feat"].size(0))
        buckets[i].append(sample)
        if len(buckets[i]) >= bucket_batch_sizes[i]:
            yield buckets[i]
            buckets[i] = []
    for bucket in buckets:
        if bucket:
            yield bucket


def collate(samples: List[dict], num_skipped: Dict[str, int], num_mel_bins: int) -> dict:
    """Pad a list of samples into the batch dict (see :mod:`toolkit.dataset.pipeline`).

    Reads ``key``, ``feat``, ``label`` (none: no target, as in decoding) and ``padding_s`` where ``pad_short``
    padded. ``feats`` is zero-padded, ``target`` padded with ``IGNORE_ID``; an empty list gives B=0 tensors of shape
    ``(0, 0, num_mel_bins)`` and ``(0, 0)``.
    """
    if not samples:
        no_lengths = torch.zeros(0, dtype=torch.int64)
        return {"keys": [], "feats": torch.zeros(0, 0, num_mel_bins), "feats_lengths": no_lengths,
                "target": torch.zeros(0, 0, dtype=torch.int64), "target_lengths": no_lengths.clone(),
                "padding_s": 0.0, "num_skipped": num_skipped}
    feats = [s["feat"] for s in samples]
    labels = [torch.tensor(s.get("label", []), dtype=torch.int64) for s in samples]
    return {
        "keys": [s["key"] for s in samples],
        "feats": pad_sequence(feats, batch_first=True, padding_value=0.0),
        "feats_lengths": torch.tensor([f.size(0) for f in feats], dtype=torch.int64),
        "target": pad_sequence(labels, batch_first=True, padding_value=IGNORE_ID),
        "target_lengths": torch.tensor([t.size(0) for t in labels], dtype=torch.int64),
        "padding_s": sum(s.get("padding_s", 0.0) for s in samples),
        "num_skipped": num_skipped,
    }


def padding(batches: Iterable[List[dict]], num_skipped: Counter, num_mel_bins: int) -> Iterator[dict]:
    """Stream step: collate batches and attach the skip counts accumulated since the previous batch.

    Each batch is held back until the next one is formed (or the stream ends), so the counts it carries cover
    everything skipped up to its release and the final batch carries the rest. When every sample was skipped
    a single B=0 batch carries the counts; consumers must skip B=0 batches after reading ``num_skipped``.
    ``num_skipped`` is the live counter filled by :func:`map_skipping`; it is emptied on each release.
    """
    def release(samples: List[dict]) -> dict:
        counts = dict(num_skipped)
        num_skipped.clear()
        return collate(samples, counts, num_mel_bins)

    pending = None
    for samples in batches:
        if pending is not None:
            yield release(pending)
        pending = samples
    if pending is not None or num_skipped:
        yield release(pending or [])
