"""Decoding on every rank: ``toolkit.bin.recognize`` alone and under torchrun (real gloo processes, real tiny_fsdd
speech, a seeded random-init tiny conformer). The texts and the error counts must not depend on the number of
ranks; uneven, single-utterance, empty and unreadable shares must finish with the right counts.

Batch size 1 in the identity tests: NOTE the batched attention beam search bounds a hypothesis by the padded
length of its batch (``memory.size(1)``), so with larger batches the ``attention`` mode of a model that never
emits <eos> (like this random one) depends on which utterances share a batch, which depends on the partition.
"""

import json
import subprocess
import sys

import pytest
import yaml

from toolkit.dataset.shard import write_shard

from test.helpers import REPO_ROOT

from .workers.launch import WORKERS
from .workers.recognize_setup import (ENV, MODES, TIMEOUT_S, assert_same_decoding, compute_wer, fsdd_test_entries,
                                      read_outputs, run_recognize, write_list, write_model, write_text)

PADDED_WORKER = str(WORKERS / "worker_recognize_padded.py")


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return write_model(tmp_path_factory.mktemp("recognize_model"))


@pytest.fixture(scope="module")
def thirteen(tmp_path_factory, model):
    """13 test utterances (neither 2 nor 3 divides 13), decoded by one plain process: ``(dir, list, text,
    outputs)``."""
    d = tmp_path_factory.mktemp("thirteen")
    entries = fsdd_test_entries()[:13]
    test_list, text = write_list(d / "data.list", entries), write_text(d / "text", entries)
    run_recognize(1, model, test_list, d / "1")
    return d, test_list, text, read_outputs(d / "1")


def hyp_lines(outputs: dict, mode: str) -> dict:
    return dict(line.split(" ", 1) for line in outputs[f"{mode}/text"].decode().splitlines())


def test_one_two_three_ranks_give_identical_texts_and_counts(model, thirteen):
    d, test_list, text, one = thirteen
    hyps = hyp_lines(one, "attention_rescoring")
    assert len(hyps) == 13 and len(set(hyps.values())) > 3  # real, varied hypotheses, one per utterance
    utts = one["summary"]["utterances"]
    assert (utts["listed"], utts["decoded"], utts["decoded_keys"], utts["repeated"]) == (13, 13, 13, 0)
    chars = sum(len(e["txt"]) for e in fsdd_test_entries()[:13])  # one word each
    for mode in MODES:
        assert one["summary"]["scores"][mode]["word"]["N"] == 13
        assert one["summary"]["scores"][mode]["char"]["N"] == chars
        for unit, flag in (("wer", []), ("cer", ["--cer"])):  # the in-job score is compute_wer.py's, to the byte
            assert compute_wer(*flag, text, str(d / "1" / mode / "text")).encode() == one[f"{mode}/{unit}"]
    for nproc, shares in ((2, [7, 6]), (3, [5, 4, 4])):
        proc = run_recognize(nproc, model, test_list, d / str(nproc))
        assert_same_decoding(one, read_outputs(d / str(nproc)))
        summary = json.loads((d / str(nproc) / "decode_summary.json").read_text())
        assert summary["world_size"] == nproc and summary["decoded_per_rank"] == shares
        assert "13/13" in proc.stderr  # rank 0's progress bar counts every rank's utterances


def test_a_padded_partition_fails_the_identity_check(model, thirteen):
    d, test_list, _, one = thirteen
    proc = run_recognize(2, model, test_list, d / "padded", worker=PADDED_WORKER)
    padded = read_outputs(d / "padded")
    with pytest.raises(AssertionError):
        assert_same_decoding(one, padded)
    utts = padded["summary"]["utterances"]
    assert (utts["decoded"], utts["decoded_keys"], utts["repeated"]) == (14, 13, 1)
    assert "1 decoding(s) repeated an utterance" in proc.stderr
    # the de-duplication still keeps texts and counts exact
    assert {k: v for k, v in padded.items() if k != "summary"} == {k: v for k, v in one.items() if k != "summary"}
    assert padded["summary"]["scores"] == one["summary"]["scores"]


def test_one_utterance_on_three_ranks(model, thirteen, tmp_path):
    _, _, _, one = thirteen
    entry = fsdd_test_entries()[4]
    run_recognize(3, model, write_list(tmp_path / "one.list", [entry]), tmp_path / "out")
    out = read_outputs(tmp_path / "out")
    summary = json.loads((tmp_path / "out" / "decode_summary.json").read_text())
    assert summary["decoded_per_rank"] == [1, 0, 0]
    for mode in MODES:
        assert hyp_lines(out, mode) == {entry["key"]: hyp_lines(one, mode)[entry["key"]]}
        assert out["summary"]["scores"][mode]["word"]["N"] == 1


def test_empty_shard_on_its_own_rank(model, thirteen, tmp_path):
    _, _, _, one = thirteen
    entries = fsdd_test_entries()[:5]
    shards = [str(tmp_path / f"shard_{i}.tar") for i in range(3)]
    for path, part in zip(shards, (entries[:3], [], entries[3:])):
        assert write_shard(part, path) == (len(part), [])
    shard_list = tmp_path / "shards.list"
    shard_list.write_text("".join(json.dumps({"shard": p, "num_utts": n}) + "\n"
                                  for p, n in zip(shards, (3, 0, len(entries) - 3))))
    proc = run_recognize(3, model, str(shard_list), tmp_path / "out",
                         "--override_config", "dataset_conf.data_type shard")
    assert "5/5" in proc.stderr  # the bar counts utterances, not the 3 shard lines
    out = read_outputs(tmp_path / "out")
    summary = json.loads((tmp_path / "out" / "decode_summary.json").read_text())
    assert summary["decoded_per_rank"] == [3, 0, 2] and summary["skipped"] == {}
    for mode in MODES:  # the same audio as in the raw list, the same hypotheses, in shard order
        expected = {e["key"]: hyp_lines(one, mode)[e["key"]] for e in entries}
        assert list(hyp_lines(out, mode).items()) == list(expected.items())
        assert out["summary"]["scores"][mode]["word"]["N"] == 5


def test_a_rank_whose_every_utterance_is_unreadable(model, thirteen, tmp_path):
    _, _, _, one = thirteen
    garbage = tmp_path / "garbage.wav"
    garbage.write_bytes(b"RIFF but not audio at all" * 40)
    good = fsdd_test_entries()[:3]
    bad = [{"key": f"unreadable-{i}", "wav": str(garbage), "txt": "ONE"} for i in range(3)]
    entries = [e for pair in zip(good, bad) for e in pair]  # rank 1 of 2 gets lines 1, 3, 5: all unreadable
    text = write_text(tmp_path / "text", entries)
    proc = run_recognize(2, model, write_list(tmp_path / "data.list", entries), tmp_path / "out")
    summary = json.loads((tmp_path / "out" / "decode_summary.json").read_text())
    assert summary["decoded_per_rank"] == [3, 0] and summary["skipped"] == {"unreadable_audio": 3}
    assert summary["utterances"]["without_hypothesis"] == 3
    assert "unreadable-0" in proc.stderr  # each skip names its key
    for mode in MODES:
        assert hyp_lines(read_outputs(tmp_path / "out"), mode) == {e["key"]: hyp_lines(one, mode)[e["key"]]
                                                                    for e in good}
        words = summary["scores"][mode]["word"]
        assert words["N"] == 6 and words["D"] >= 3  # the unreadable ones are deletions, not dropped
        wer_file = (tmp_path / "out" / mode / "wer").read_text()
        assert compute_wer(text, str(tmp_path / "out" / mode / "text")) == wer_file


def test_a_list_of_which_nothing_decodes_is_an_error_not_a_table(model, thirteen, tmp_path):
    _, _, text, _ = thirteen  # a Kaldi text file where the data.list belongs: every line is a bad line
    config, checkpoint = model
    proc = subprocess.run([sys.executable, "-m", "toolkit.bin.recognize", "--config", config, "--checkpoint",
                           checkpoint, "--test_data", str(text), "--result_dir", str(tmp_path / "out"), "--modes",
                           "ctc_greedy_search"], capture_output=True, text=True, timeout=TIMEOUT_S, env=ENV,
                          cwd=REPO_ROOT)
    assert proc.returncode == 2
    assert f"--test_data {text}: not one utterance was decoded" in proc.stderr
    assert not (tmp_path / "out" / "decode_summary.json").exists()


@pytest.mark.parametrize("option", ["--checkpoint", "--test_data"])
def test_a_missing_input_file_is_one_line(model, thirteen, tmp_path, option):
    _, test_list, _, _ = thirteen
    config, checkpoint = model
    given = {"--checkpoint": checkpoint, "--test_data": str(test_list), option: str(tmp_path / "nope")}
    proc = subprocess.run([sys.executable, "-m", "toolkit.bin.recognize", "--config", config, "--checkpoint",
                           given["--checkpoint"], "--test_data", given["--test_data"], "--result_dir",
                           str(tmp_path / "out"), "--modes", "ctc_greedy_search"],
                          capture_output=True, text=True, timeout=TIMEOUT_S, env=ENV, cwd=REPO_ROOT)
    assert proc.returncode == 2
    assert f"{option} {tmp_path / 'nope'}: no such file" in proc.stderr and "Traceback" not in proc.stderr


def test_a_refusal_on_every_rank_is_one_line_through_the_launcher(model, thirteen, tmp_path):
    # errors-as-tracebacks under torchrun: each rank refused the checkpoint of another config, and torchrun ended in
    # its ChildFailedError traceback. Through toolkit.bin.launch (run.sh's launcher) the job says it once.
    _, test_list, _, _ = thirteen
    config, checkpoint = model
    other = yaml.safe_load(open(config))
    other["encoder_conf"]["output_size"] = 64
    yaml.safe_dump(other, open(tmp_path / "other.yaml", "w"))
    proc = subprocess.run([sys.executable, "-m", "toolkit.bin.launch", "--standalone", "--nproc_per_node=2", "-m",
                           "toolkit.bin.recognize", "--config", str(tmp_path / "other.yaml"), "--checkpoint",
                           checkpoint, "--test_data", test_list, "--result_dir", str(tmp_path / "out"), "--modes",
                           "ctc_greedy_search"], capture_output=True, text=True, timeout=TIMEOUT_S, env=ENV,
                          cwd=REPO_ROOT)
    assert proc.returncode == 2, proc.stderr[-4000:]
    errors = [line for line in proc.stderr.splitlines() if "error" in line.lower()]
    message = (f"checkpoint {checkpoint} ({tmp_path / 'other.yaml'}) holds another model than this "
               "config's: encoder.embed.out.weight is (96, 608) in the checkpoint, (64, 608) in this config's model "
               "(104 keys differ); use the config it was trained with (the train.yaml beside it)")
    assert errors in ([f"error: rank 0: {message}"], [f"error: rank 1: {message}"]), proc.stderr[-4000:]  # the first
    assert "Traceback" not in proc.stderr and not (tmp_path / "out").exists()


def test_a_full_context_model_decodes_at_a_chunk_size_with_one_warning(model, thirteen, tmp_path):
    # issue 46: --decoding_chunk_size reaches the encoder's mask; train_tiny's model has no streaming key
    _, test_list, _, one = thirteen
    proc = run_recognize(1, model, test_list, tmp_path / "chunk", "--decoding_chunk_size", "2",
                         "--num_decoding_left_chunks", "0")
    warnings = [line for line in proc.stderr.splitlines() if "not trained for" in line]
    assert len(warnings) == 1 and "--decoding_chunk_size 2: the model was trained with full context" in warnings[0]
    chunked = read_outputs(tmp_path / "chunk")
    assert chunked["summary"]["search"]["decoding_chunk_size"] == 2
    assert chunked["summary"]["search"]["num_decoding_left_chunks"] == 0
    assert one["summary"]["search"]["decoding_chunk_size"] == -1  # the default: full context, no warning
    for mode in MODES:
        assert list(hyp_lines(chunked, mode)) == list(hyp_lines(one, mode)), mode
    # chunks of 80 ms that see no other chunk change what CTC reads (the random model's decoder says the same
    # "FTTT..." whatever it attends to, so only the CTC modes can show it)
    assert hyp_lines(chunked, "ctc_greedy_search") != hyp_lines(one, "ctc_greedy_search")


def test_simulate_streaming_gives_the_masked_decoding_of_a_streaming_model(model, thirteen, tmp_path):
    # issue 46: a causal dynamic-chunk model decoded chunk by chunk (forward_chunk with caches, the CTC prefix beam
    # search fed per chunk, rescoring at the end) writes exactly what the masked whole-utterance decoding writes
    streaming = write_model(tmp_path, "encoder_conf {causal: true, use_dynamic_chunk: true}")
    _, test_list, _, _ = thirteen
    chunk = ["--decoding_chunk_size", "4", "--num_decoding_left_chunks", "2"]
    run_recognize(1, streaming, test_list, tmp_path / "masked", *chunk)
    run_recognize(1, streaming, test_list, tmp_path / "stream", *chunk, "--simulate_streaming")
    masked, stream = read_outputs(tmp_path / "masked"), read_outputs(tmp_path / "stream")
    for mode in MODES:
        assert stream[f"{mode}/text"] == masked[f"{mode}/text"], mode
    assert stream["summary"]["utterances"] == masked["summary"]["utterances"]
    # train_tiny's own model has no causal convolution: refused in one line before any data is read
    refused = subprocess.run([sys.executable, "-m", "toolkit.bin.recognize", "--config", model[0], "--checkpoint",
                              model[1], "--test_data", test_list, "--result_dir", str(tmp_path / "refused"), *chunk,
                              "--simulate_streaming"], capture_output=True, text=True, timeout=TIMEOUT_S, env=ENV)
    assert refused.returncode == 2 and "--simulate_streaming: " in refused.stderr, refused.stderr[-2000:]
    assert "encoder_conf.causal" in refused.stderr and "Traceback" not in refused.stderr
