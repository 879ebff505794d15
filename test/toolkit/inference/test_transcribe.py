"""A model dir used as a user does (issue 47), on a tiny conformer with seeded random weights (its words are nonsense
but depend on the audio, which is all an identity needs): the model dir holds its files and decodes from anywhere;
``toolkit.load_model(...).transcribe`` gives recognize.py's hypotheses with the settings of the dir's decode.yaml,
the options overriding them; bad inputs are one line each, skipped, and the exit status says so."""

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import soundfile as sf
import torch
import yaml

import toolkit
from toolkit.bin import transcribe
from toolkit.inference.loader import load_asr_model
from toolkit.train_config import read_config, save_model_dir_config
from toolkit.utils.config_parsing import ConfigError

from test.multiprocess.workers.recipe_data import ENV
from test.multiprocess.workers.recognize_setup import fsdd_test_entries, write_list, write_model

DECODE = {"checkpoint": "epoch_0.pt", "mode": "attention_rescoring", "beam_size": 3, "length_penalty": 1.5,
          "ctc_weight": 0.3}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A model dir as training and the recipe leave it: train.yaml with its files (save_model_dir_config),
    epoch_0.pt + .yaml, decode.yaml."""
    tmp = tmp_path_factory.mktemp("model")
    config, checkpoint = write_model(tmp)
    exp = tmp / "exp"
    exp.mkdir()
    save_model_dir_config(read_config(config), str(exp))
    for suffix in (".pt", ".yaml"):
        shutil.copy(checkpoint[:-3] + suffix, exp / f"epoch_0{suffix}")
    (exp / "decode.yaml").write_text(yaml.safe_dump(DECODE))
    return exp


def test_the_model_dir_holds_the_files_train_yaml_names(model_dir):
    saved = yaml.safe_load((model_dir / "train.yaml").read_text())
    assert saved["tokenizer_conf"] == {"symbol_table_path": str(model_dir / "units.txt")}
    assert saved["cmvn_conf"] == {"cmvn_file": str(model_dir / "global_cmvn")}
    assert (model_dir / "units.txt").read_bytes() == (model_dir.parent / "units.txt").read_bytes()
    assert (model_dir / "global_cmvn").read_bytes() == (model_dir.parent / "cmvn").read_bytes()


def test_paths_resolve_in_the_model_dir_and_an_older_train_yaml_from_the_recipe_dir(model_dir, tmp_path,
                                                                                       monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = read_config(str(model_dir / "train.yaml"))
    assert config.tokenizer_conf["symbol_table_path"] == str(model_dir / "units.txt")
    assert config.cmvn_conf["cmvn_file"] == str(model_dir / "global_cmvn")
    # a train.yaml written before model dirs held their files names them relative to the recipe dir (cwd)
    (tmp_path / "data" / "dict").mkdir(parents=True)
    shutil.copy(model_dir / "units.txt", tmp_path / "data" / "dict" / "units.txt")
    older = read_config(str(model_dir / "train.yaml"), ["tokenizer_conf.symbol_table_path data/dict/units.txt"])
    assert older.tokenizer_conf["symbol_table_path"] == "data/dict/units.txt"


def test_a_moved_model_dir_reads_its_own_files_and_a_train_yaml_copied_out_of_it_the_model_dirs(model_dir, tmp_path):
    # the errors-as-tracebacks case's kind: a run's train.yaml copied elsewhere (to edit it) still finds its files
    shutil.copy(model_dir / "train.yaml", tmp_path / "edited.yaml")
    edited = read_config(str(tmp_path / "edited.yaml"))
    assert edited.tokenizer_conf["symbol_table_path"] == str(model_dir / "units.txt")
    assert edited.cmvn_conf["cmvn_file"] == str(model_dir / "global_cmvn")
    # a copy of the model dir takes its own files, not the original's
    moved = tmp_path / "moved"
    shutil.copytree(model_dir, moved)
    for name in ("units.txt", "global_cmvn"):
        (moved / name).write_bytes((model_dir / name).read_bytes() + b"\n")  # told apart from the original's
    config = read_config(str(moved / "train.yaml"))
    assert config.tokenizer_conf["symbol_table_path"] == str(moved / "units.txt")
    assert config.cmvn_conf["cmvn_file"] == str(moved / "global_cmvn")


def test_transcribe_gives_recognizes_hypotheses_with_decode_yaml(model_dir, tmp_path):
    entries = fsdd_test_entries()[:4]
    # recognize.py: decode.yaml's checkpoint, beam and weights, --length_penalty given overriding its 1.5
    proc = subprocess.run([sys.executable, "-m", "toolkit.bin.recognize", "--config", str(model_dir / "train.yaml"),
                           "--test_data", write_list(tmp_path / "test.list", entries), "--result_dir",
                           str(tmp_path / "dec"), "--modes", "ctc_greedy_search", "attention_rescoring",
                           "--length_penalty", "0.5", "--batch_size", "1"],
                          capture_output=True, text=True, timeout=300, env=ENV)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((tmp_path / "dec" / "decode_summary.json").read_text())
    assert summary["checkpoint"] == str(model_dir / "epoch_0.pt")
    assert summary["search"]["beam_size"] == 3 and summary["search"]["ctc_weight"] == 0.3
    assert summary["search"]["length_penalty"] == 0.5
    for mode in ("ctc_greedy_search", "attention_rescoring"):
        model = toolkit.load_model(str(model_dir), mode=mode, length_penalty=0.5)
        assert model.decode_conf.beam_size == 3
        expected = (tmp_path / "dec" / mode / "text").read_text().splitlines()
        got = [f"{r.key} {r.text}".rstrip() for r in (model.transcribe(e["wav"], key=e["key"]) for e in entries)]
        assert got == [line.rstrip() for line in expected] and len(got) == 4


def test_a_model_dir_copied_elsewhere_transcribes_the_same(model_dir, tmp_path, monkeypatch):
    wav = fsdd_test_entries()[5]["wav"]
    before = toolkit.load_model(str(model_dir)).transcribe(wav)
    copy = tmp_path / "moved" / "exp"
    shutil.copytree(model_dir, copy)
    os.unlink(copy / "epoch_0.yaml")  # the checkpoint copied alone: inference takes it with one warning
    monkeypatch.chdir(tmp_path)  # nowhere near the first dir
    after = toolkit.load_model("moved/exp", checkpoint="epoch_0.pt").transcribe(wav)
    assert after == before and before.text


def test_word_times_and_confidences_are_consistent(model_dir):
    entry = fsdd_test_entries()[2]
    audio, rate = sf.read(entry["wav"], dtype="float32")
    model = toolkit.load_model(str(model_dir), mode="ctc_greedy_search")
    result = model.transcribe(audio, sample_rate=rate)
    stereo = model.transcribe(np.stack([audio, audio], axis=1), sample_rate=rate)  # equal channels mix to the same
    assert result == stereo and result.key == "audio"
    assert " ".join(w.word for w in result.words) == result.text
    duration = len(audio) / rate
    for word in result.words:
        assert 0.0 <= word.start < word.end <= round(duration, 3) and 0.0 < word.confidence <= 1.0  # times in ms
    assert result.confidence == pytest.approx(np.mean([w.confidence for w in result.words]), abs=1e-4)


def _run(argv, capsys):
    status = transcribe.main(argv)
    out, err = capsys.readouterr()
    return status, out.splitlines(), [line for line in err.splitlines() if line.startswith("error:")]


def test_bad_recordings_are_named_skipped_and_counted(model_dir, tmp_path, capsys):
    good = fsdd_test_entries()[0]["wav"]
    (tmp_path / "empty.wav").write_bytes(b"")
    sf.write(tmp_path / "silent.wav", np.zeros(0, dtype=np.float32), 16000)
    (tmp_path / "text.flac").write_text("not audio\n")
    sf.write(tmp_path / "low.wav", sf.read(good, dtype="float32")[0][::4], 4000)
    (tmp_path / "list.scp").write_text(f"clip_a {good}\nclip_b {tmp_path / 'absent.wav'}\n")
    bad = [str(tmp_path), str(tmp_path / "empty.wav"), str(tmp_path / "silent.wav"), str(tmp_path / "text.flac"),
           str(tmp_path / "low.wav")]
    status, out, errors = _run(["--model_dir", str(model_dir), good, *bad, str(tmp_path / "list.scp")], capsys)
    assert status == 1
    assert [line.split()[0] for line in out] == ["theo-0-00", "clip_a"]
    assert len(errors) == 7
    assert errors[0] == f"error: {tmp_path}: a directory, not an audio file"
    assert errors[1].startswith(f"error: {tmp_path / 'empty.wav'}: ") and errors[1].endswith("(unreadable_audio)")
    assert errors[2] == f"error: {tmp_path / 'silent.wav'} has no samples (empty_audio)"
    assert errors[3].startswith(f"error: {tmp_path / 'text.flac'}: ") and errors[3].endswith("(unreadable_audio)")
    assert errors[4] == (f"error: {tmp_path / 'low.wav'}: sample rate 4000 Hz; the model takes 16000 Hz, and audio "
                         "below 8000 Hz lacks the upper part of its mel bins")
    assert errors[5] == f"error: no such file {tmp_path / 'absent.wav'} (missing_audio)"
    assert errors[-1] == "error: 6 of 8 recordings not transcribed (the error lines above name them)"


def test_the_exit_status_of_the_command(model_dir, tmp_path):
    good = fsdd_test_entries()[0]["wav"]
    proc = subprocess.run([sys.executable, "-m", "toolkit.bin.transcribe", "--model_dir", str(model_dir),
                           "--format", "jsonl", str(tmp_path / "absent.wav"), good],
                          capture_output=True, text=True, timeout=300, env=ENV)
    assert proc.returncode == 1, proc.stderr[-2000:]
    line = json.loads(proc.stdout)
    assert line["key"] == "theo-0-00" and line["partial"] is False
    assert [w["word"] for w in line["words"]] == line["text"].split()


@pytest.mark.parametrize("case, message", [
    ("no_dir", "model dir {d}/nowhere: no such directory"),
    ("no_train_yaml", "model dir {d}/empty holds no train.yaml (toolkit.bin.train writes it beside the checkpoints): "
                      "is it the dir of a trained model?"),
    ("no_units", "{d}/no_units/train.yaml: tokenizer_conf.symbol_table_path {d}/no_units/units.txt: no such file"),
    ("streaming", "--streaming: {d}/exp was trained with full context (encoder_conf has neither use_dynamic_chunk "
                  "nor static_chunk_size): it cannot stream; transcribe without --streaming"),
])
def test_a_model_dir_that_cannot_be_used_is_one_line(model_dir, tmp_path, case, message, capsys):
    d = tmp_path
    shutil.copytree(model_dir, d / "exp")
    (d / "empty").mkdir()
    shutil.copytree(model_dir, d / "no_units")
    os.unlink(d / "no_units" / "units.txt")  # and the train.yaml of a dir that came from elsewhere
    saved = yaml.safe_load((d / "no_units" / "train.yaml").read_text())
    saved["tokenizer_conf"]["symbol_table_path"] = str(d / "gone" / "units.txt")
    (d / "no_units" / "train.yaml").write_text(yaml.safe_dump(saved))
    target = {"no_dir": d / "nowhere", "no_train_yaml": d / "empty", "no_units": d / "no_units"}.get(case, d / "exp")
    argv = ["--model_dir", str(target), *(["--streaming"] if case == "streaming" else []),
            fsdd_test_entries()[0]["wav"]]
    with pytest.raises(ConfigError) as e:
        transcribe.main(argv)
    assert str(e.value).startswith(message.format(d=d)), str(e.value)


def test_a_checkpoint_of_another_model_with_the_same_shapes_is_refused(model_dir, tmp_path):
    # causal convolution and dynamic chunks change no tensor's shape: the checkpoint's own train.yaml tells
    write_model(tmp_path, "encoder_conf {use_dynamic_chunk: true, causal: true}")
    streaming = str(tmp_path / "model" / "init.pt")
    with pytest.raises(ConfigError, match=rf"checkpoint {streaming} was trained with {tmp_path}/model/train.yaml, "
                                          r"another model: encoder_conf.causal True there, False in "):
        load_asr_model(str(model_dir / "train.yaml"), streaming)
    assert load_asr_model(str(tmp_path / "model" / "train.yaml"), streaming).checkpoint == streaming


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU machine can use --device cuda")
def test_a_device_this_torch_cannot_use_is_one_line(model_dir):
    for device, message in (("bogus", "device bogus: not a torch device"),
                            ("cuda", "device cuda: this torch sees no CUDA GPU")):
        with pytest.raises(ConfigError, match=message):
            transcribe.main(["--model_dir", str(model_dir), "--device", device, fsdd_test_entries()[0]["wav"]])


def test_a_streaming_model_gives_partial_results_and_the_masked_decodings_result(tmp_path, capsys):
    config, checkpoint = write_model(tmp_path, "encoder_conf {use_dynamic_chunk: true, causal: true}")
    exp = tmp_path / "exp"
    exp.mkdir()
    save_model_dir_config(read_config(config), str(exp))
    for suffix in (".pt", ".yaml"):
        shutil.copy(checkpoint[:-3] + suffix, exp / f"epoch_0{suffix}")
    (exp / "decode.yaml").write_text(yaml.safe_dump({"beam_size": 3, "streaming_chunk_size": 4}))
    wav = fsdd_test_entries()[7]["wav"]
    results = list(toolkit.load_model(str(exp)).stream(wav))
    assert [r.partial for r in results] == [True] * (len(results) - 1) + [False] and len(results) >= 3
    masked = toolkit.load_model(str(exp), decoding_chunk_size=4).transcribe(wav)
    assert results[-1] == masked  # the stream's two passes equal the masked whole-utterance decoding (U2)
    assert transcribe.main(["--model_dir", str(exp), "--streaming", wav]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out == [f"theo-3-01 (partial) {r.text}" for r in results[:-1]] + [f"theo-3-01 {masked.text}"]
