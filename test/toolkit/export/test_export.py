"""toolkit-export on a tiny conformer with seeded random weights (``recognize_setup.write_model``), made streaming
(``encoder_conf.use_dynamic_chunk``, ``causal``), on real shipped audio: the export passes its own checks, its files
carry sherpa-onnx's metadata, onnxruntime's greedy CTC output equals torch's, and the chunk model run chunk by chunk
at another chunk size and cache than it was traced at equals the encoder's forward_chunk_by_chunk; bad input is one
line; a check that fails names itself."""

import os
import shutil

import numpy as np
import onnx
import pytest
import torch

from test.helpers import REPO_ROOT, kaldi_entries
from test.multiprocess.workers.recognize_setup import write_model
from toolkit.bin import export
from toolkit.export.check import ExportCheckError, audio_features, check_ctc, run_chunks
from toolkit.inference.loader import config_path_of, load_asr_model
from toolkit.export.onnx import chunk_inputs, export_model
from toolkit.models.transformer.search import ctc_greedy_search
from toolkit.utils.config_parsing import ConfigError

STREAMING = ("encoder_conf {use_dynamic_chunk: true, causal: true}",)
# Two unseen-speaker digits (under a second) and an LJ Speech sentence (many chunks).
CHECK_AUDIO = [e["wav"] for e in kaldi_entries("tiny_fsdd", "test")[:2]] + [
    str(REPO_ROOT / "corpora" / "tiny_lj" / "wav" / "LJ001-0013.wav")]


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """The streaming tiny model's dir and the export's out_dir (toolkit-export --int8 ran and passed)."""
    data_dir = tmp_path_factory.mktemp("model")
    write_model(data_dir, *STREAMING)
    out_dir = data_dir / "onnx"
    export.main(["--model_dir", str(data_dir / "model"), "--checkpoint", "init.pt", "--out_dir", str(out_dir),
                 "--int8", "--check_audio", *CHECK_AUDIO])
    return data_dir / "model", out_dir


def _session(path):
    import onnxruntime as ort

    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def test_the_export_writes_sherpa_onnx_files_with_its_metadata(exported):
    model_dir, out_dir = exported
    names = {"model.onnx", "model-streaming.onnx", "decoder.onnx", "tokens.txt", "model.int8.onnx",
             "model-streaming.int8.onnx", "decoder.int8.onnx"}
    assert set(os.listdir(out_dir)) == names
    loaded = load_asr_model(config_path_of(str(model_dir)), "init.pt")
    tokenizer, model = loaded.tokenizer, loaded.model
    tokens = (out_dir / "tokens.txt").read_text(encoding="utf-8").splitlines()
    assert tokens[0] == "<blank> 0" and len(tokens) == tokenizer.vocab_size()
    assert tokens[-1] == f"<sos/eos> {tokenizer.vocab_size() - 1}"
    offline = {p.key: p.value for p in onnx.load(str(out_dir / "model.onnx")).metadata_props}
    assert offline["model_type"] == "wenet_ctc" and offline["subsampling_factor"] == "4"
    assert offline["vocab_size"] == str(tokenizer.vocab_size())
    streaming = {p.key: p.value for p in onnx.load(str(out_dir / "model-streaming.onnx")).metadata_props}
    # train_tiny.yaml: 2 blocks of 96 with 4 heads, kernel 7; conv2d's right context is 6 fbank frames
    assert {k: streaming[k] for k in ("head", "num_blocks", "output_size", "cnn_module_kernel", "right_context")} \
        == {"head": "4", "num_blocks": "2", "output_size": "96", "cnn_module_kernel": "7", "right_context": "6"}
    inputs = [i.name for i in _session(out_dir / "model-streaming.onnx").get_inputs()]
    assert inputs == ["x", "offset", "required_cache_size", "attn_cache", "conv_cache", "attn_mask"]


def test_onnxruntime_greedy_output_equals_torch_on_every_test_clip(exported):
    model_dir, out_dir = exported
    loaded = load_asr_model(config_path_of(str(model_dir)), "init.pt")
    config, model = loaded.config, loaded.model
    session = _session(out_dir / "model.onnx")
    for entry in kaldi_entries("tiny_fsdd", "test"):
        feat = audio_features(entry["wav"], config.dataset_conf)
        lengths = torch.tensor([feat.size(0)])
        with torch.no_grad():
            expected = model.decode(["ctc_greedy_search"], feat.unsqueeze(0), lengths)["ctc_greedy_search"]
        log_probs, log_probs_lens, _ = session.run(None, {"x": feat.unsqueeze(0).numpy(), "x_lens": lengths.numpy()})
        assert ctc_greedy_search(torch.from_numpy(log_probs), torch.from_numpy(log_probs_lens)) == expected


@pytest.mark.parametrize("chunk_size, num_left_chunks", [(8, 2), (4, 1)])
def test_the_chunk_model_runs_other_chunk_sizes_and_caches_than_traced(exported, chunk_size, num_left_chunks):
    model_dir, out_dir = exported
    loaded = load_asr_model(config_path_of(str(model_dir)), "init.pt")
    config, model = loaded.config, loaded.model
    feat = audio_features(CHECK_AUDIO[2], config.dataset_conf)
    encoder = model.encoder
    stride, window, _ = encoder.chunk_windows(chunk_size, num_left_chunks)
    inputs = {k: v.numpy() for k, v in chunk_inputs(model, config.input_dim, chunk_size, num_left_chunks).items()}
    got = run_chunks(_session(out_dir / "model-streaming.onnx"), feat.numpy(), inputs, stride, window,
                     encoder.embed.receptive_field, lambda n: int(encoder.output_lengths(torch.tensor([n]))))
    with torch.no_grad():
        expected = model.ctc.log_softmax(encoder.forward_chunk_by_chunk(feat.unsqueeze(0), chunk_size,
                                                                        num_left_chunks)[0])[0].numpy()
    assert got.shape == expected.shape and got.shape[0] > 50  # LJ001-0013 has over 2 s of speech
    np.testing.assert_allclose(got, expected, rtol=1e-3, atol=1e-4)


def test_a_check_against_other_weights_fails_naming_the_file_and_output(exported):
    model_dir, out_dir = exported
    loaded = load_asr_model(config_path_of(str(model_dir)), "init.pt")
    config, model = loaded.config, loaded.model
    with torch.no_grad():
        model.ctc.ctc_lo.bias[0] += 0.01  # the blank's logit: the exported file is now of another model
    feats = [audio_features(CHECK_AUDIO[0], config.dataset_conf)]
    with pytest.raises(ExportCheckError, match=r"model\.onnx log_probs \(utterance 0\): .* differ beyond rtol"):
        check_ctc(model, str(out_dir / "model.onnx"), feats)


def test_an_export_into_an_earlier_ones_dir_leaves_none_of_its_files(exported, tmp_path):
    model_dir, out_dir = exported
    again = tmp_path / "onnx"
    shutil.copytree(out_dir, again)  # streaming and int8 files of the earlier export
    (again / "notes.txt").write_text("mine")
    loaded = load_asr_model(config_path_of(str(model_dir)), "init.pt")
    files = export_model(loaded.model, loaded.tokenizer, loaded.config.input_dim, str(again), streaming=False)
    assert sorted(os.listdir(again)) == ["decoder.onnx", "model.onnx", "notes.txt", "tokens.txt"]
    assert sorted(os.path.basename(path) for path in files.values()) == ["decoder.onnx", "model.onnx", "tokens.txt"]


def test_bad_input_is_one_line(tmp_path):
    write_model(tmp_path)  # full context: not trained for streaming
    model_dir = str(tmp_path / "model")
    base = ["--model_dir", model_dir, "--checkpoint", "init.pt", "--out_dir", str(tmp_path / "onnx")]
    with pytest.raises(ConfigError, match="--streaming true: the model was not trained for streaming"):
        export.main(base + ["--streaming", "true"])
    with pytest.raises(ConfigError, match=f"model dir {tmp_path} holds no train.yaml"):
        export.main(["--model_dir", str(tmp_path), "--checkpoint", "init.pt", "--out_dir", str(tmp_path / "o")])
    with pytest.raises(ConfigError, match="checkpoint missing.pt: no such file"):
        export.main(base[:3] + ["missing.pt"] + base[4:])
    with pytest.raises(ConfigError, match=f"checkpoint {tmp_path}: a directory, not a checkpoint file"):
        export.main(base[:3] + [str(tmp_path)] + base[4:])
    empty = tmp_path / "empty.wav"
    empty.write_bytes(b"")
    with pytest.raises(ConfigError, match=f"--out_dir {empty}: not a directory"):
        export.main(base[:-1] + [str(empty)])
    with pytest.raises(ConfigError, match=f"--check_audio check audio {empty}: "):
        export.main(base + ["--check_audio", str(empty)])
    with pytest.raises(ConfigError, match=f"--check_audio check audio {tmp_path}: "):
        export.main(base + ["--check_audio", str(tmp_path)])
    assert not (tmp_path / "onnx").exists()  # nothing written before the inputs were good
