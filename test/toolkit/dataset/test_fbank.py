from pathlib import Path

import kaldi_native_fbank as knf
import numpy as np
import pytest
import soundfile as sf
import torch

from toolkit.dataset.fbank import kaldi_fbank, mel_banks

ROOT = Path(__file__).resolve().parents[3]
AUDIO = [ROOT / "corpora/tiny_lj/wav/LJ001-0002.wav", ROOT / "corpora/tiny_fsdd/wav/george-0-00.wav",
         next((ROOT / "corpora/kathleen/audio").glob("*.opus"))]


def reference(waveform, sample_rate, num_mel_bins, frame_length_ms, frame_shift_ms):
    opts = knf.FbankOptions()
    opts.frame_opts.samp_freq = sample_rate
    opts.frame_opts.frame_length_ms = frame_length_ms
    opts.frame_opts.frame_shift_ms = frame_shift_ms
    opts.frame_opts.dither = 0.0
    opts.frame_opts.snip_edges = True
    opts.mel_opts.num_bins = num_mel_bins
    fbank = knf.OnlineFbank(opts)
    fbank.accept_waveform(sample_rate, waveform)
    fbank.input_finished()
    return np.stack([fbank.get_frame(i) for i in range(fbank.num_frames_ready)])


@pytest.mark.parametrize("path", AUDIO, ids=lambda p: p.suffix)
@pytest.mark.parametrize("num_mel_bins, frame_length_ms, frame_shift_ms", [(80, 25, 10), (40, 20, 8)])
def test_matches_kaldi_native_fbank_on_real_speech(path, num_mel_bins, frame_length_ms, frame_shift_ms):
    waveform, sample_rate = sf.read(path, dtype="float32")
    waveform = waveform * 32768
    expected = reference(waveform, sample_rate, num_mel_bins, frame_length_ms, frame_shift_ms)
    ours = kaldi_fbank(torch.from_numpy(waveform), sample_rate, num_mel_bins, frame_length_ms, frame_shift_ms)
    assert ours.dtype == torch.float32 and ours.shape == expected.shape
    assert np.abs(ours.numpy() - expected).max() < 2e-3


def test_dither_is_reproducible_with_a_generator_and_small():
    waveform, sample_rate = sf.read(AUDIO[0], dtype="float32")
    x = torch.from_numpy(waveform * 32768)
    a = kaldi_fbank(x, sample_rate, dither=1.0, generator=torch.Generator().manual_seed(3))
    b = kaldi_fbank(x, sample_rate, dither=1.0, generator=torch.Generator().manual_seed(3))
    c = kaldi_fbank(x, sample_rate, dither=1.0, generator=torch.Generator().manual_seed(4))
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert (a - kaldi_fbank(x, sample_rate)).abs().mean() < 0.1


def test_short_input_and_filter_shapes():
    assert kaldi_fbank(torch.ones(399), 16000).shape == (0, 80)
    assert kaldi_fbank(torch.ones(400), 16000).shape == (1, 80)
    banks = mel_banks(80, 512, 16000)
    assert banks.shape == (256, 80) and (banks >= 0).all() and (banks <= 1).all()
    assert (banks.sum(dim=0) > 0).all()  # every filter covers at least one FFT bin
