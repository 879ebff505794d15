import dataclasses
import json
import random
import subprocess
import sys
from collections import Counter

import numpy as np
import pytest
import soundfile as sf
import torch
from scipy.signal import resample_poly

from toolkit.dataset import processor
from toolkit.dataset.conf import FbankConf, FilterConf
from toolkit.dataset.processor import SkipSample
from toolkit.text.tokenizer import CharTokenizer, write_symbol_table
from toolkit.utils.common import IGNORE_ID

from test.helpers import REPO_ROOT

FSDD_WAV = REPO_ROOT / "corpora/tiny_fsdd/wav"
LJ_WAV = REPO_ROOT / "corpora/tiny_lj/wav/LJ001-0002.wav"
FBANK = dataclasses.asdict(FbankConf(dither=0.0))  # the recipe's features without dither
DITHERED = dict(FBANK, dither=1.0)
FILTER = dict(dataclasses.asdict(FilterConf()), frame_shift=10.0)


def fbank_sample(path, key="utt", label=(2, 3)):
    sample = processor.read_audio({"key": key, "wav": str(path), "txt": "x"})
    sample = processor.compute_fbank(sample, **FBANK)
    return dict(sample, label=list(label))


@pytest.fixture(scope="module")
def fsdd_samples():
    paths = sorted(FSDD_WAV.glob("*.wav"))[:24]
    return [fbank_sample(p, p.stem, label=range(2, 2 + i % 5 + 1)) for i, p in enumerate(paths)]


def test_fbank_shape_follows_kaldi_snip_edges():
    sample = processor.read_audio({"key": "LJ001-0002", "wav": str(LJ_WAV), "txt": ""})
    num_samples = sample["waveform"].shape[0]
    assert sample["sample_rate"] == 16000 and sample["waveform"].dtype == np.float32
    out = processor.compute_fbank(sample, **FBANK)
    assert "waveform" not in out and "waveform" in sample
    assert out["feat"].dtype == torch.float32
    assert out["feat"].shape == (1 + (num_samples - 400) // 160, 80)
    # Log mel energies of int16-scaled speech: well above the log floor, finite.
    assert torch.isfinite(out["feat"]).all() and out["feat"].mean() > 5
    again = processor.compute_fbank(sample, **FBANK)["feat"]
    assert torch.equal(out["feat"], again)
    dithered = processor.compute_fbank(sample, **DITHERED, rng=random.Random(3))["feat"]
    assert not torch.equal(out["feat"], dithered)
    assert (out["feat"] - dithered).abs().mean() < 0.1
    # The dither comes from the pipeline's seeded generator: same seed, same features (exact resume relies on it).
    assert torch.equal(dithered, processor.compute_fbank(sample, **DITHERED, rng=random.Random(3))["feat"])
    assert not torch.equal(dithered, processor.compute_fbank(sample, **DITHERED, rng=random.Random(4))["feat"])
    with pytest.raises(ValueError, match="rng"):
        processor.compute_fbank(sample, **DITHERED)


def test_fbank_matches_kaldi_native_fbank_on_real_speech():
    # An independent Kaldi implementation as the reference: same frames, same log mel energies.
    import kaldi_native_fbank as knf

    for path in [LJ_WAV] + sorted(FSDD_WAV.glob("*.wav"))[:3]:
        sample = processor.read_audio({"key": path.stem, "wav": str(path), "txt": ""})
        ours = processor.compute_fbank(sample, **FBANK)["feat"]
        opts = knf.FbankOptions()
        opts.frame_opts.dither = 0.0
        opts.mel_opts.num_bins = 80
        reference = knf.OnlineFbank(opts)
        reference.accept_waveform(16000, sample["waveform"] * 32768.0)
        reference.input_finished()
        expected = torch.from_numpy(np.stack([reference.get_frame(i) for i in range(reference.num_frames_ready)]))
        assert ours.shape == expected.shape
        # NOTE: two float32 FFT implementations: a bin's power differs by rounding relative to the frame's whole
        # power, so the log of a quiet bin differs most. Measured on these files: mean 0.9e-5 to 3.4e-5, max 1.2e-3
        # (log energies 2.5 to 16); README states the mean.
        assert (ours - expected).abs().mean() < 5e-5
        assert (ours - expected).abs().max() < 5e-3


def test_resample_44k_to_16k_keeps_duration(tmp_path):
    original, rate = sf.read(LJ_WAV, dtype="float32")
    path = tmp_path / "lj_44k.wav"
    sf.write(path, resample_poly(original, 441, 160).astype(np.float32), 44100)
    sample = processor.read_audio({"key": "lj", "wav": str(path), "txt": ""})
    assert sample["sample_rate"] == 44100
    out = processor.resample(sample, resample_rate=16000)
    assert out["sample_rate"] == 16000
    assert abs(out["waveform"].shape[0] - original.shape[0]) <= 1
    assert out["waveform"].dtype == np.float32
    n = min(out["waveform"].shape[0], original.shape[0])
    assert np.corrcoef(out["waveform"][:n], original[:n])[0, 1] > 0.99
    assert processor.resample(out, resample_rate=16000) is out


def test_speed_perturb_changes_length_by_factor():
    sample = processor.read_audio({"key": "lj", "wav": str(LJ_WAV), "txt": ""})
    n = sample["waveform"].shape[0]
    lengths = {round(processor.speed_perturb(sample, random.Random(s), speeds=[0.9, 1.0, 1.1])["waveform"].shape[0] * 100 / n)
               for s in range(20)}
    assert lengths == {91, 100, 111}


def test_pad_short_centres_a_short_digit_in_keyed_near_silence():
    # yweweler-6-01 ("SIX", 0.156 s): 13 fbank frames, 2 encoder frames at 40 ms for 3 letters: no CTC alignment.
    sample = processor.read_audio({"key": "yweweler-6-01", "wav": str(FSDD_WAV / "yweweler-6-01.wav"), "txt": ""})
    n = sample["waveform"].shape[0]
    assert n == 2502
    out = processor.pad_short(sample, frame_shift=10.0, min_length=50)
    wave = out["waveform"]
    assert wave.dtype == np.float32 and wave.shape == (8000,)
    before = (8000 - n) // 2
    assert before == 2749 and np.array_equal(wave[before:before + n], sample["waveform"])
    assert out["padding_s"] == (8000 - n) / 16000 and "padding_s" not in sample
    noise = np.concatenate([wave[:before], wave[before + n:]]) * processor.INT16_SCALE
    assert abs(noise.mean()) < 0.05 and abs(noise.std() - processor.PAD_NOISE_STD) < 0.03
    # Keyed: the same padding on any rank or pass; another key, other noise.
    assert np.array_equal(processor.pad_short(sample, 10.0, 50)["waveform"], wave)
    other = processor.pad_short(dict(sample, key="other"), 10.0, 50)["waveform"]
    assert not np.array_equal(other, wave) and np.array_equal(other[before:before + n], sample["waveform"])
    # A key with a lone surrogate (a JSON escape, a shard member name that is not UTF-8) seeds its noise too.
    assert processor.pad_short(dict(sample, key="odd\udcffkey"), 10.0, 50)["waveform"].shape == (8000,)
    # 48 frames, 11 at 40 ms; the padded frames sit at dither's level (log mel energy about 4.4), far above the
    # log floor (-15.9) that digital zeros would give when decoding without dither.
    feat = processor.compute_fbank(out, **FBANK)["feat"]
    assert feat.shape == (48, 80)
    assert 3.0 < feat[:14].mean() < 6.0 and 3.0 < feat[-14:].mean() < 6.0 and feat[18:28].mean() > 10.0
    zeros = processor.compute_fbank(dict(sample, waveform=np.zeros(8000, np.float32)), **FBANK)["feat"]
    assert zeros.mean() < -15
    # Long enough already: returned as it is.
    assert processor.pad_short(sample, frame_shift=10.0, min_length=15) is sample


IMPORTS_THEN_FEATURES = """
import importlib, json, random, sys
import toolkit.bin.average_model, toolkit.bin.recognize, toolkit.bin.train
from toolkit.dataset import processor
entry_points = sorted({m.split(".")[0] for m in sys.modules} & {"scipy", "lhotse"})
for name in processor.WORKER_IMPORTS:
    importlib.import_module(name)
before = set(sys.modules)
sample = processor.read_audio({"key": "lj", "wav": sys.argv[1], "txt": ""})
sample = processor.resample(dict(sample, sample_rate=22050), resample_rate=16000)
sample = processor.speed_perturb(sample, random.Random(1), speeds=[0.9])
processor.compute_fbank(sample, num_mel_bins=80, frame_length=25, frame_shift=10, dither=0.0)
print(json.dumps([entry_points, sorted({m.split(".")[0] for m in set(sys.modules) - before})]))
"""


def test_feature_libraries_are_imported_by_the_loader_workers_only():
    # The trainer's, decoder's and averaging's main processes compute no feature: scipy.signal and lhotse (3.8 of the
    # trainer's 8.5 s of imports on a slow machine) wait for a worker, whose forkserver imports WORKER_IMPORTS
    # up front. Those are all that resampling, speed perturbation and fbank then need: nothing is imported later.
    proc = subprocess.run([sys.executable, "-c", IMPORTS_THEN_FEATURES, str(LJ_WAV)], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout) == [[], []]


def test_spec_aug_zeros_only_whole_bands():
    feat = fbank_sample(LJ_WAV)["feat"]
    for seed in range(10):
        out = processor.spec_aug({"feat": feat}, random.Random(seed), num_t_mask=2, num_f_mask=2, max_t=20,
                                 max_f=10)["feat"]
        changed = out != feat
        assert (out[changed] == 0).all()
        zero_rows = (out == 0).all(dim=1)
        zero_cols = (out == 0).all(dim=0)
        # Every changed value lies in a fully masked frame or a fully masked bin...
        assert (zero_rows[:, None] | zero_cols[None, :])[changed].all()
        # ...and the masked frames/bins form at most 2 bands each, no wider than the limits allow.
        for zero, width in ((zero_rows, 20), (zero_cols, 10)):
            runs = torch.diff(torch.cat([torch.tensor([0]), zero.int(), torch.tensor([0])])).eq(1).sum()
            assert 1 <= runs <= 2 and zero.sum() <= 2 * width
    assert not (feat == 0).any()


def test_static_batch_respects_size_and_pads(fsdd_samples):
    batches = list(processor.static_batch(fsdd_samples, batch_size=5))
    assert [len(b) for b in batches] == [5, 5, 5, 5, 4]
    batch = processor.collate(batches[0], {}, 80)
    lengths = [s["feat"].size(0) for s in batches[0]]
    assert batch["feats"].shape == (5, max(lengths), 80)
    assert batch["feats_lengths"].tolist() == lengths
    for i, s in enumerate(batches[0]):
        assert torch.equal(batch["feats"][i, :lengths[i]], s["feat"])
        assert (batch["feats"][i, lengths[i]:] == 0).all()
        n = len(s["label"])
        assert batch["target"][i, :n].tolist() == s["label"]
        assert (batch["target"][i, n:] == IGNORE_ID).all()
    assert batch["target_lengths"].tolist() == [len(s["label"]) for s in batches[0]]
    assert batch["target"].dtype == torch.int64 and batch["feats_lengths"].dtype == torch.int64


def test_static_batch_with_a_length_bound_gives_a_longer_sample_fewer_companions(fsdd_samples):
    bound = max(s["feat"].size(0) for s in fsdd_samples[:6])
    samples = [dict(fsdd_samples[0], key=f"long{x}", feat=torch.zeros(int(bound * x), 80)) for x in (1.5, 3.0)]
    samples = fsdd_samples[:3] + samples[:1] + fsdd_samples[3:6] + samples[1:] + fsdd_samples[6:8]
    batches = list(processor.static_batch(samples, batch_size=4, max_length=bound))
    # 1.5 x the bound: 4 / 1.5**2 = 1.8 samples of room; 3 x: 0.4, alone; up to the bound: 4 samples
    keys = [s["key"] for s in samples]
    assert [[s["key"] for s in b] for b in batches] == [keys[:3], keys[3:4], keys[4:7], keys[7:8], keys[8:10]]
    assert [len(b) for b in processor.static_batch(samples, batch_size=4)] == [4, 4, 2]  # no bound: sizes alone


def test_dynamic_batch_respects_padded_frame_budget(fsdd_samples):
    budget = 300
    batches = list(processor.dynamic_batch(fsdd_samples, max_frames_in_batch=budget))
    assert sum(len(b) for b in batches) == len(fsdd_samples)
    for i, b in enumerate(batches):
        longest = max(s["feat"].size(0) for s in b)
        assert longest * len(b) <= budget
        if i + 1 < len(batches):  # greedy: the next sample would have broken the budget
            nxt = batches[i + 1][0]["feat"].size(0)
            assert max(longest, nxt) * (len(b) + 1) > budget
    assert len(batches) > 1


def test_padding_carries_skip_counts_and_final_rest(fsdd_samples):
    counter = Counter()

    def batches():
        counter["empty_text"] += 1
        yield fsdd_samples[:2]
        counter["missing_audio"] += 2
        yield fsdd_samples[2:3]
        counter["too_long"] += 1

    out = list(processor.padding(batches(), counter, 80))
    assert [b["keys"] for b in out] == [[s["key"] for s in fsdd_samples[:2]], [fsdd_samples[2]["key"]]]
    assert out[0]["num_skipped"] == {"empty_text": 1, "missing_audio": 2}
    assert out[1]["num_skipped"] == {"too_long": 1}

    counter["unreadable_audio"] += 3
    (empty,) = processor.padding(iter([]), counter, 80)
    assert empty["num_skipped"] == {"unreadable_audio": 3}
    assert empty["feats"].shape == (0, 0, 80) and empty["target"].shape == (0, 0)
    assert list(processor.padding(iter([]), Counter(), 80)) == []


def test_shuffle_and_sort_buffers(fsdd_samples):
    keys = [s["key"] for s in fsdd_samples]
    shuffled = [s["key"] for s in processor.shuffle(fsdd_samples, random.Random(0), shuffle_size=10)]
    assert shuffled != keys and sorted(shuffled[:10]) == sorted(keys[:10]) and sorted(shuffled) == sorted(keys)
    lengths = [s["feat"].size(0) for s in processor.sort(fsdd_samples, sort_size=8)]
    for start in range(0, 24, 8):
        assert lengths[start:start + 8] == sorted(lengths[start:start + 8])
    assert lengths != sorted(lengths)


@pytest.mark.parametrize("content, reason", [(None, "missing_audio"), (b"RIFF not a wav" * 4, "unreadable_audio"),
                                             (b"", "unreadable_audio")])
def test_read_audio_bad_files(tmp_path, content, reason):
    path = tmp_path / "bad.wav"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(SkipSample) as info:
        processor.read_audio({"key": "k", "wav": str(path), "txt": "A"})
    assert info.value.reason == reason


def test_read_audio_zero_length(tmp_path):
    path = tmp_path / "empty.wav"
    sf.write(path, np.zeros(0, dtype=np.float32), 16000)
    with pytest.raises(SkipSample) as info:
        processor.read_audio({"key": "k", "wav": str(path), "txt": "A"})
    assert info.value.reason == "empty_audio"


def test_parse_raw():
    line = '{"key": "a", "wav": "/x.wav", "txt": "HI"}'
    assert processor.parse_raw({"line": line}) == {"key": "a", "wav": "/x.wav", "txt": "HI"}
    segment = processor.parse_raw({"line": '{"key": "a", "wav": "/x.wav", "txt": "HI", "start": 1, "end": 2.5}'})
    assert segment == {"key": "a", "wav": "/x.wav", "txt": "HI", "start": 1.0, "end": 2.5}
    for bad in ('{"key": "a"', '["a", "b"]', '{"key": "a", "wav": 3, "txt": "HI"}',
                '{"key": "a", "wav": "w", "txt": "HI", "start": 2, "end": 1}',
                '{"key": "a", "wav": "w", "txt": "HI", "start": 1}',
                '{"key": "a", "wav": "w", "txt": "HI", "start": "0", "end": 1}',
                '{"key": "a", "wav": "", "txt": "HI"}', '{"key": "", "wav": "w", "txt": "HI"}'):
        with pytest.raises(SkipSample, match="bad_line"):
            processor.parse_raw({"line": bad})


def test_tokenize_and_filter_reasons(tmp_path):
    table = tmp_path / "units.txt"
    write_symbol_table(["E", "N", "O", "▁"], str(table))
    tok = CharTokenizer(str(table))
    assert processor.tokenize({"txt": "ONE"}, tok, max_unk_ratio=0.0)["label"] == [4, 3, 2]
    for txt, reason in (("  ", "empty_text"), ("TWO", "unknown_token"), ("TW XY", "all_unknown")):
        with pytest.raises(SkipSample) as info:
            processor.tokenize({"txt": txt}, tok, max_unk_ratio=0.0)
        assert info.value.reason == reason
    assert processor.tokenize({"txt": "TWO ONE"}, tok, max_unk_ratio=0.4)["label"] == [1, 1, 4, 5, 4, 3, 2]
    with pytest.raises(SkipSample, match="unknown_token"):
        processor.tokenize({"txt": "TWO ONE"}, tok, max_unk_ratio=0.3)  # 2 of 6 units unknown
    with pytest.raises(SkipSample, match="all_unknown"):
        processor.tokenize({"txt": "TW XY"}, tok, max_unk_ratio=1.0)
    sample = {"waveform": np.zeros(16000, dtype=np.float32), "sample_rate": 16000, "label": [2, 3, 4]}  # 100 frames
    assert processor.filter_sample(sample, **FILTER) is sample
    cases = [({"min_length": 101}, "too_short"), ({"max_length": 99}, "too_long"),
             ({"token_min_length": 4}, "too_few_tokens"), ({"token_max_length": 2}, "too_many_tokens"),
             ({"min_output_input_ratio": 0.04}, "ratio_too_small"),
             ({"max_output_input_ratio": 0.02}, "ratio_too_large")]
    for conf, reason in cases:
        with pytest.raises(SkipSample) as info:
            processor.filter_sample(sample, **{**FILTER, **conf})
        assert info.value.reason == reason


def test_fbank_of_audio_shorter_than_a_frame_is_skipped():
    sample = {"key": "k", "waveform": np.full(399, 0.1, dtype=np.float32), "sample_rate": 16000}
    with pytest.raises(SkipSample, match="too_short"):
        processor.compute_fbank(sample, **FBANK)


def test_map_skipping_logs_key_and_counts(caplog):
    counter = Counter()
    lines = [{"line": '{"key": "good", "wav": "w", "txt": "t"}'}, {"line": "oops"}]
    out = list(processor.map_skipping(lines, processor.parse_raw, counter))
    assert [s["key"] for s in out] == ["good"]
    assert counter == {"bad_line": 1}
    assert "oops" in caplog.text and "bad_line" in caplog.text


def test_read_audio_segment_of_real_speech():
    whole = processor.read_audio({"key": "lj", "wav": str(LJ_WAV), "txt": ""})["waveform"]
    seg = processor.read_audio({"key": "lj", "wav": str(LJ_WAV), "txt": "", "start": 0.25, "end": 0.75})
    np.testing.assert_array_equal(seg["waveform"], whole[4000:12000])
    past = {"key": "lj", "wav": str(LJ_WAV), "txt": "", "start": 1000.0, "end": 1001.0}
    with pytest.raises(SkipSample, match="empty_audio"):
        processor.read_audio(past)


def test_filter_on_real_speech(tmp_path):
    sample = processor.read_audio({"key": "lj", "wav": str(LJ_WAV), "txt": ""})
    frames = sample["waveform"].shape[0] / 160
    sample = dict(sample, label=list(range(2, 40)))
    assert processor.filter_sample(sample, **{**FILTER, "max_length": frames + 1}) is sample
    with pytest.raises(SkipSample, match="too_long"):
        processor.filter_sample(sample, **{**FILTER, "max_length": frames - 1})


def test_bucket_batch_groups_by_length(fsdd_samples):
    lengths = sorted(s["feat"].size(0) for s in fsdd_samples)
    boundary = lengths[len(lengths) // 2]
    batches = list(processor.bucket_batch(fsdd_samples, [boundary], [3, 2]))
    assert sorted(s["key"] for b in batches for s in b) == sorted(s["key"] for s in fsdd_samples)
    for b in batches:
        short = [s["feat"].size(0) < boundary for s in b]
        assert all(short) or not any(short)
        assert len(b) <= (3 if short[0] else 2)
    assert sum(len(b) == (3 if b[0]["feat"].size(0) < boundary else 2) for b in batches) >= len(batches) - 2
    with pytest.raises(ValueError, match="bucket_batch_sizes"):
        list(processor.bucket_batch(fsdd_samples, [100, 200], [4, 2]))
