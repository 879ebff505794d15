"""Resuming on another world size (torch_ddp, real tiny_fsdd pipeline).

An ``epoch_N.pt`` written by 2 ranks resumes on 1 and on 3. What carries over: the weights, the optimizer and the
scheduler, which counts optimizer steps (so warmup and decay go on from the checkpoint's step), and the epoch. What
changes: the global batch (ranks x batch_size x accum_grad) and so the steps per epoch; the per-rank RNG states
belong to ranks that no longer exist and are not restored (a warning says so); at an epoch boundary there is
nothing partial to lose.

A ``step_N.pt`` (inside an epoch) of a raw list with static or bucket batching resumes on any world size: the
epoch's batches do not depend on it, the checkpoint records which of them every rank accounted for, and the new
ranks train the rest, each utterance once; the partial statistics of the old ranks are summed. With dynamic
batching (or shards) the epoch is dealt per rank and such a checkpoint is refused on another world size.
"""

import json
import subprocess
import sys

import pytest
import yaml

from toolkit.text.tokenizer import write_symbol_table
from toolkit.utils.checkpoint import load_checkpoint

from test.helpers import REPO_ROOT, kaldi_entries, read_rank_reports

from .workers.launch import WORKERS, run_ranks
from .workers.recipe_data import (ENV, TIMEOUT_S, copy_checkpoint, run_standalone, session_data, train_args,
                                  uninterrupted, write_data)

WORKER = str(WORKERS / "worker_resume_keys.py")


@pytest.mark.parametrize("nproc", [1, 3])
def test_an_epoch_checkpoint_resumes_on_another_world_size(tmp_path, nproc):
    two, _ = uninterrupted()  # 2 ranks
    before = yaml.safe_load(open(two / "epoch_0.yaml"))
    out = tmp_path / f"on{nproc}"
    path = copy_checkpoint(two, out, "epoch_0")
    proc = run_standalone(train_args(session_data(), out, "train_conf.max_epoch 2") + ["--checkpoint", path],
                          TIMEOUT_S, nproc=nproc)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert f"was saved by 2 ranks, this job has {nproc}; not restored" in proc.stderr
    after = yaml.safe_load(open(out / "epoch_1.yaml"))
    # every utterance of the list is accounted for in the resumed epoch, on the new number of ranks
    assert after["train_utts"] + after["dropped_utts"] + sum(after["skipped"].values()) == 82
    assert after["epoch"] == 1 and after["step"] > before["step"]
    state = load_checkpoint(str(out / "epoch_1.pt"))
    assert state["scheduler"]["last_epoch"] == after["step"]  # the schedule went on from the checkpoint's step


def test_a_step_checkpoint_of_a_raw_list_resumes_on_another_world_size(tmp_path):
    two, _ = uninterrupted()
    assert yaml.safe_load(open(two / "step_4.yaml"))["batches_in_epoch"] == 4  # of epoch 0's 5
    out = tmp_path / "step_on1"
    path = copy_checkpoint(two, out, "step_4")
    proc = run_standalone(train_args(session_data(), out, "train_conf.max_epoch 1") + ["--checkpoint", path],
                          TIMEOUT_S, nproc=1)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "resumed from" in proc.stderr and "epoch 0 after 4 of its batches, step 4" in proc.stderr
    after, before = (yaml.safe_load(open(d / "epoch_0.yaml")) for d in (out, two))
    # The old ranks' partial statistics are in the epoch's: every utterance of the list is accounted for once.
    assert after["train_utts"] + after["dropped_utts"] + sum(after["skipped"].values()) == 82
    assert after["skipped"]["missing_audio"] == 2 and after["train_utts"] >= before["train_utts"]
    assert after["step"] > before["step"]  # the 2 ranks' batches left are one step each on 1 rank


def test_a_step_checkpoint_with_dynamic_batching_is_refused_on_another_world_size(tmp_path):
    write_data(tmp_path, num_train=16)
    dynamic = ("dataset_conf.batch_conf.batch_type dynamic", "dataset_conf.batch_conf.max_frames_in_batch 300")
    proc = run_standalone(train_args(tmp_path, tmp_path / "two", "train_conf.max_epoch 1",
                                     "train_conf.save_interval_steps 1", *dynamic), TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr[-4000:]
    path = str(tmp_path / "two" / "step_1.pt")
    plain = [sys.executable] + train_args(tmp_path, tmp_path / "one", "train_conf.max_epoch 1", *dynamic)
    proc = subprocess.run(plain + ["--checkpoint", path], capture_output=True, text=True, timeout=TIMEOUT_S, env=ENV,
                          cwd=REPO_ROOT)
    assert proc.returncode == 2, proc.stderr[-4000:]
    assert (f"--checkpoint {path} stops inside epoch 0, but world_size changed since it was written (by 2 ranks: "
            "with shards or dynamic batching each rank reads its own share of the epoch)") in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.fixture(scope="module")
def keys_on_two_ranks(tmp_path_factory):
    """Epoch 0 of the real pipeline (2 loader workers per rank) trained by the real Executor on 2 ranks, with a
    ``step_4`` checkpoint inside it; each rank's trained (by join step) and dropped keys."""
    root = tmp_path_factory.mktemp("keys")
    rows = kaldi_entries("tiny_fsdd", "train")
    (root / "train.list").write_text("".join(json.dumps(row) + "\n" for row in rows))
    write_symbol_table(list("EFGHINORSTUVWXZ"), str(root / "units.txt"))  # tiny_ctc's alphabet: no skips
    (root / "two").mkdir()
    proc = run_ranks(WORKER, str(root / "two"), str(root / "train.list"), str(root / "units.txt"),
                     "--save_interval_steps", "4", timeout=TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return root, sorted(row["key"] for row in rows)


@pytest.mark.parametrize("nproc", [1, 3])
def test_the_keys_trained_before_a_step_checkpoint_and_after_its_resume_are_the_list_once(keys_on_two_ranks,
                                                                                          nproc):
    root, keys = keys_on_two_ranks
    full = read_rank_reports(root / "two", 2)
    assert sorted(k for r in full for _, batch in r["trained"] for k in batch) == keys  # 10 steps, nothing dropped
    before = [k for r in full for step, batch in r["trained"] if step <= 4 for k in batch]
    out = root / f"on{nproc}"
    path = copy_checkpoint(root / "two", out, "step_4")
    proc = run_ranks(WORKER, str(out), str(root / "train.list"), str(root / "units.txt"), "--checkpoint", path,
                     nproc=nproc, timeout=TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr[-4000:]
    resumed = read_rank_reports(out, nproc)
    after = [k for r in resumed for _, batch in r["trained"] for k in batch]
    after += [k for r in resumed for k in r["dropped"]]
    assert len(before) == 32 and sorted(before + after) == keys  # each utterance once: trained, or dropped
    trained_after = sum(len(batch) for r in resumed for _, batch in r["trained"])
    for r in resumed:  # the reduced epoch statistics cover both halves of the epoch
        assert r["utts"] == len(before) + trained_after and r["utts"] + r["dropped_utts"] + r["skipped"] == 80
