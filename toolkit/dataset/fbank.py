"""Kaldi-compatible log mel filterbank, vectorised over frames with torch (one FFT call per utterance).

Follows Kaldi's ``compute-fbank-feats`` defaults (Povey et al., "The Kaldi speech recognition toolkit", 2011):
snip_edges, dither, DC removal, pre-emphasis 0.97, Povey window, FFT size rounded up to a power of two,
power spectrum, triangular filters on the mel scale ``1127 ln(1 + f / 700)`` from 20 Hz to Nyquist
(the Nyquist bin left out, as in Kaldi), natural log floored at float32 epsilon. It matches
kaldi-native-fbank to about 1e-3 in log energy (test/toolkit/dataset/test_fbank.py) and runs about 10x faster
than that library's per-frame loop, which made feature extraction the pipeline's bottleneck.
"""
import functools
import math
from typing import Optional

import torch

PREEMPHASIS = 0.97
LOW_FREQ_HZ = 20.0
_EPS = torch.finfo(torch.float32).eps


def _mel(freq_hz):
    return 1127.0 * torch.log1p(freq_hz / 700.0) if isinstance(freq_hz, torch.Tensor) else \
        1127.0 * math.log1p(freq_hz / 700.0)


@functools.lru_cache(maxsize=16)
def mel_banks(num_mel_bins: int, fft_size: int, sample_rate: int) -> torch.Tensor:
    """Kaldi's triangular mel filters: float32 ``(fft_size // 2, num_mel_bins)`` weights on FFT power bins
    ``0 .. fft_size/2 - 1``, bin centres evenly spaced in mel between 20 Hz and ``sample_rate / 2``."""
    mel_low, mel_high = _mel(LOW_FREQ_HZ), _mel(sample_rate / 2)
    delta = (mel_high - mel_low) / (num_mel_bins + 1)
    left = mel_low + delta * torch.arange(num_mel_bins, dtype=torch.float64)  # (M,)
    center, right = left + delta, left + 2 * delta
    fft_mel = _mel(torch.arange(fft_size // 2, dtype=torch.float64) * sample_rate / fft_size)[:, None]  # (F, 1)
    up = (fft_mel - left) / (center - left)
    down = (right - fft_mel) / (right - center)
    weights = torch.where(fft_mel <= center, up, down)
    inside = (fft_mel > left) & (fft_mel < right)
    return torch.where(inside, weights, torch.zeros(())).float()


@functools.lru_cache(maxsize=8)
def povey_window(frame_length: int) -> torch.Tensor:
    """``(0.5 - 0.5 cos(2 pi n / (N - 1))) ** 0.85``, float32 ``(N,)``."""
    n = torch.arange(frame_length, dtype=torch.float64)
    return ((0.5 - 0.5 * torch.cos(2 * math.pi * n / (frame_length - 1))) ** 0.85).float()


def kaldi_fbank(waveform: torch.Tensor, sample_rate: int, num_mel_bins: int = 80, frame_length_ms: float = 25.0,
                frame_shift_ms: float = 10.0, dither: float = 0.0,
                generator: Optional[torch.Generator] = None) -> torch.Tensor:
    """Log mel filterbank of one utterance.

    Args:
        waveform: float32 ``(N,)`` samples on the 16-bit scale (Kaldi's convention: ``[-32768, 32767]``).
        sample_rate: Hz.
        dither: standard deviation of the Gaussian noise added to each sample before analysis (0: none).
        generator: torch RNG for the dither (None: torch's global one).

    Returns:
        float32 ``(T, num_mel_bins)`` with ``T = 1 + (N - L) // S`` for frame length ``L`` and shift ``S`` in
        samples, or ``(0, num_mel_bins)`` when ``N < L``.
    """
    frame_length = int(sample_rate * frame_length_ms / 1000)
    frame_shift = int(sample_rate * frame_shift_ms / 1000)
    num_frames = 0 if waveform.numel() < frame_length else 1 + (waveform.numel() - frame_length) // frame_shift
    if num_frames == 0:
        return torch.zeros(0, num_mel_bins)
    frames = waveform.unfold(0, frame_length, frame_shift)[:num_frames]  # (T, L) view
    if dither > 0:
        frames = frames + dither * torch.randn(frames.shape, generator=generator)
    frames = frames - frames.mean(dim=1, keepdim=True)
    # Kaldi pre-emphasis: x[i] -= 0.97 x[i-1], and x[0] -= 0.97 x[0].
    frames = torch.cat([frames[:, :1] * (1 - PREEMPHASIS), frames[:, 1:] - PREEMPHASIS * frames[:, :-1]], dim=1)
    frames = frames * povey_window(frame_length)
    fft_size = 1 << (frame_length - 1).bit_length()
    power = torch.fft.rfft(frames, n=fft_size).abs().pow(2)[:, :fft_size // 2]  # (T, F), Nyquist bin dropped
    energies = power @ mel_banks(num_mel_bins, fft_size, sample_rate)  # (T, M)
    return energies.clamp_min(_EPS).log()
