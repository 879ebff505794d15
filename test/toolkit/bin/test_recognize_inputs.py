"""toolkit.bin.recognize decodes every readable utterance of a test list (issue 45): one longer than the positional
encodings' 5000 stored positions (the long-clip-decode case: 205 s, 5,125 encoder frames) no longer stops the job,
and the transcript is the reference of the score, never an input (the decode-empty-transcript case): an empty one,
one of units outside the dictionary and one over ``token_max_length`` are decoded like the others and scored; a
batch that runs out of memory is decoded an utterance at a time, and one that does not fit alone is skipped, named and
counted; and decoding into a model dir that a training job holds leaves its lock alone."""

import argparse
import json
import os
import re
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest
import soundfile as sf
import torch

from toolkit.bin.recognize import decode_share
from toolkit.utils.dir_lock import LOCK_FILE, DirLock
from toolkit.utils.metrics import score

from test.helpers import REPO_ROOT
from test.multiprocess.workers.recipe_data import ENV
from test.multiprocess.workers.recognize_setup import fsdd_test_entries, run_recognize, write_list, write_model

LONG_S = 205.0  # 20,500 fbank frames, 5,125 encoder frames after conv2d: past the 5,000 stored positions
MODES = ["ctc_greedy_search", "attention_rescoring"]


def _long_clip(path) -> dict:
    """The tiny_fsdd clips, repeated with 0.3 s of silence between them, to LONG_S seconds of real speech."""
    entries, pieces, words, total = fsdd_test_entries(), [], [], 0.0
    while total < LONG_S:
        entry = entries[len(words) % len(entries)]
        audio, rate = sf.read(entry["wav"], dtype="float32")
        pieces += [audio, np.zeros(4800, dtype=np.float32)]
        words.append(entry["txt"])
        total += len(audio) / rate + 0.3
    sf.write(path, np.concatenate(pieces), 16000)
    return {"key": "long_clip", "wav": str(path), "txt": " ".join(words)}


# The slow tier: 205 s of audio through the encoder (5,125 x 5,125 attention scores) and attention rescoring: 2 min 15 s
# on 2 cores shared with a training run (2026-12-07).
@pytest.mark.multiprocess
def test_a_long_clip_and_any_transcript_are_decoded_and_scored(tmp_path):
    model = write_model(tmp_path)
    short = fsdd_test_entries()[:3]
    rows = short + [_long_clip(tmp_path / "long.wav"),
                    dict(fsdd_test_entries()[3], key="empty-reference", txt=""),
                    dict(fsdd_test_entries()[4], key="unknown-units", txt="QQQ ZZZ"),
                    dict(fsdd_test_entries()[5], key="many-tokens", txt=" ".join(["SEVEN"] * 60))]
    proc = run_recognize(1, model, write_list(tmp_path / "test.list", rows), tmp_path / "dec", modes=MODES)
    summary = json.loads((tmp_path / "dec" / "decode_summary.json").read_text())
    assert summary["skipped"] == {} and summary["utterances"]["decoded"] == len(rows), proc.stderr[-2000:]
    references = {row["key"]: row["txt"] for row in rows}
    for mode in MODES:
        lines = (tmp_path / "dec" / mode / "text").read_text(encoding="utf-8").splitlines()
        hyps = dict((line.split(" ", 1) + [""])[:2] for line in lines)
        assert list(hyps) == list(references), mode  # every utterance, in the list's order
        assert hyps["long_clip"] and hyps["empty-reference"], mode  # the untrained model says something
        # the counts are those of the written hypotheses: the empty reference's words are insertions
        expected = score(references, hyps, "word").totals
        assert summary["scores"][mode]["word"] == dict(zip("NCSDI", expected.as_tuple())), mode
        alone = score({"empty-reference": ""}, {"empty-reference": hyps["empty-reference"]}, "word").totals
        assert alone.as_tuple() == (0, 0, 0, 0, len(hyps["empty-reference"].split()))


class _SmallMemoryModel:
    """Decodes an utterance to one token, its length modulo 7; runs out of memory past 100 padded frames."""
    encoder = SimpleNamespace(output_lengths=lambda lengths: lengths // 4)

    def __init__(self):
        self.batch_sizes = []

    def decode(self, modes, feats, lengths, **_):
        self.batch_sizes.append(feats.size(0))
        if feats.size(0) * feats.size(1) > 100:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 9.00 GiB")
        return {mode: [[int(n) % 7] for n in lengths] for mode in modes}


def _batch(lengths: dict) -> dict:
    return {"keys": list(lengths), "feats": torch.zeros(len(lengths), max(lengths.values()), 80),
            "feats_lengths": torch.tensor(list(lengths.values())), "num_skipped": {}, "padding_s": 0.0}


def test_a_batch_out_of_memory_is_decoded_one_utterance_at_a_time_and_one_too_big_alone_is_skipped(caplog):
    model, counted = _SmallMemoryModel(), []
    args = argparse.Namespace(modes=["ctc_greedy_search", "attention"], beam_size=1, ctc_weight=0.5,
                              length_penalty=0.0, reverse_weight=0.0, decoding_chunk_size=-1,
                              num_decoding_left_chunks=-1, simulate_streaming=False)
    loader = [_batch({"a": 40, "b": 20, "c": 10}), _batch({"huge": 200}), _batch({"d": 30, "e": 30})]
    results = decode_share(model, loader, SimpleNamespace(detokenize=lambda ids: (str(ids),)), None, args,
                           torch.device("cpu"), SimpleNamespace(add=counted.append))
    assert results.keys == ["a", "b", "c", "d", "e"] and results.skipped == {"out_of_memory": 1}
    assert results.hyps == {mode: ["[5]", "[6]", "[3]", "[2]", "[2]"] for mode in args.modes}
    assert model.batch_sizes == [3, 1, 1, 1, 1, 1, 2] and counted == [3, 1, 2]  # huge: whole, then alone
    assert "skipping utterance huge: out_of_memory (200 fbank frames do not fit on cpu alone)" in caplog.text


@pytest.mark.multiprocess  # torchrun with 2 ranks, each with 2 loader workers: ~40 s on 2 busy cores
@pytest.mark.parametrize("nproc", [1, 2])
def test_every_unreadable_utterance_is_named_once_in_the_decoding_log(tmp_path, nproc):
    # The case: a test list whose FIRST line's audio is missing (and two later ones unreadable): the skip count was
    # right, but the loader workers (from the forkserver in a decoding rank) logged without the log's format.
    model = write_model(tmp_path)
    (tmp_path / "corrupt.wav").write_bytes(b"RIFF\x10\x00\x00\x00WAVEfmt not audio")
    entries = fsdd_test_entries()[:8]
    bad = {0: ("missing_audio", str(tmp_path / "gone.wav")), 4: ("unreadable_audio", str(tmp_path / "corrupt.wav")),
           7: ("missing_audio", str(tmp_path / "gone_too.wav"))}
    rows = [dict(entry, wav=bad[i][1]) if i in bad else entry for i, entry in enumerate(entries)]
    proc = run_recognize(nproc, model, write_list(tmp_path / "test.list", rows), tmp_path / "dec",
                         "--override_config", "dataset_conf.dataloader_conf.num_workers 2",
                         modes=["ctc_greedy_search"])
    summary = json.loads((tmp_path / "dec" / "decode_summary.json").read_text())
    assert summary["skipped"] == {"missing_audio": 2, "unreadable_audio": 1}
    assert summary["utterances"]["decoded"] == 5
    named = sorted(re.search(r" rank\d WARNING skipping utterance (\S+): (\w+) ", line).groups()
                   for line in proc.stderr.splitlines() if "skipping utterance" in line)
    assert named == sorted((entries[i]["key"], reason) for i, (reason, _) in bad.items()), proc.stderr[-3000:]


def test_decoding_into_a_model_dir_a_training_job_holds_leaves_its_lock_alone(tmp_path):
    # decoding a committed checkpoint while training goes on is legitimate: it neither takes nor breaks the lock
    model = write_model(tmp_path)
    model_dir = os.path.dirname(model[0])
    training = DirLock(model_dir, {"command": "training", "host": "node0", "pid": os.getpid(), "since": "now"})
    assert training.acquire() is None
    try:
        before = os.stat(os.path.join(model_dir, LOCK_FILE))
        result_dir = os.path.join(model_dir, "test_fsdd")
        run_recognize(1, model, write_list(tmp_path / "test.list", fsdd_test_entries()[:2]), result_dir,
                      modes=["ctc_greedy_search"])
        assert json.loads(open(os.path.join(result_dir, "decode_summary.json")).read())["utterances"]["decoded"] == 2
        after = os.stat(os.path.join(model_dir, LOCK_FILE))
        assert (after.st_ino, after.st_size) == (before.st_ino, before.st_size)
        other = subprocess.run([sys.executable, "-c", "import sys; from toolkit.utils.dir_lock import DirLock; "
                                "print(DirLock(sys.argv[1], {}).acquire())", model_dir],
                               capture_output=True, text=True, timeout=60, env=ENV)
        assert other.stdout.strip() == repr(training.record), other.stderr  # still held, by the training job
    finally:
        training.release()


def test_a_checkpoint_copied_without_its_record_decodes_with_one_warning(tmp_path):
    # found by the new-user trial: an intact avg_3.pt copied alone was refused (issue 47: inference accepts it,
    # saying so in one line; resuming training still refuses it)
    config, checkpoint = write_model(tmp_path)
    alone = tmp_path / "copied" / "avg_3.pt"
    alone.parent.mkdir()
    alone.write_bytes(open(checkpoint, "rb").read())
    test_list = write_list(tmp_path / "test.list", fsdd_test_entries()[:2])
    texts, warnings = [], []
    for name, weights in (("alone", alone), ("committed", checkpoint)):
        proc = subprocess.run([sys.executable, "-m", "toolkit.bin.recognize", "--config", config, "--checkpoint",
                               str(weights), "--test_data", test_list, "--result_dir", str(tmp_path / name),
                               "--modes", "ctc_greedy_search"], capture_output=True, text=True, timeout=300, env=ENV)
        assert proc.returncode == 0, proc.stderr[-2000:]
        warnings.append([line for line in proc.stderr.splitlines() if "beside it" in line])
        texts.append((tmp_path / name / "ctc_greedy_search" / "text").read_text())
    assert len(warnings[0]) == 1 and warnings[1] == [], warnings
    assert warnings[0][0].endswith(f"{alone}: no avg_3.yaml beside it (copied without it, or a save that never "
                                   "finished): loading it anyway")
    assert texts[0] == texts[1] and len(texts[0].splitlines()) == 2
