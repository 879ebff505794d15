"""A model dir holds one run (the model-dir-one-run case), through ``python -m toolkit.bin.train`` in one process on
16 tiny_fsdd utterances: a resume refused for a changed config leaves the dir as it was, a fresh run into a dir
holding a run is refused in one line until ``--start_over`` moves that run aside, and of two jobs started at once on
one dir one trains and the other stops in one line."""

import hashlib
import os
import re
import shutil
import subprocess
import sys

import pytest
import yaml

from test.helpers import REPO_ROOT
from test.multiprocess.workers.recipe_data import ENV, TIMEOUT_S, train_args, write_data

pytestmark = pytest.mark.multiprocess  # 7 training processes: minutes on a busy 2-core machine


def train(data, model_dir, *extra, overrides=()) -> list[str]:
    return [sys.executable, *train_args(data, model_dir, "train_conf.max_epoch 1", *overrides), *extra]


def run(cmd) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S, env=ENV, cwd=REPO_ROOT)


def snapshot(model_dir) -> dict[str, str]:
    """``{path relative to the dir: md5}`` of every file in it, hidden ones and subfolders included."""
    files = {}
    for root, _, names in os.walk(model_dir):
        for name in names:
            path = os.path.join(root, name)
            files[os.path.relpath(path, model_dir)] = hashlib.md5(open(path, "rb").read()).hexdigest()
    return files


def errors(proc) -> list[str]:
    return [line for line in proc.stderr.splitlines() if " ERROR " in line]


@pytest.fixture(scope="module")
def run_a(tmp_path_factory):
    """One epoch of run A (encoder width 96) into ``exp``, and its data dir."""
    data = tmp_path_factory.mktemp("data")
    write_data(data, num_train=16)
    exp = data / "exp"
    proc = run(train(data, exp))
    assert proc.returncode == 0, proc.stderr[-4000:]
    return data, exp


def test_a_resume_refused_for_another_model_leaves_the_dir_as_it_was(run_a, tmp_path):
    data, exp = run_a
    before = snapshot(exp)
    proc = run(train(data, exp, "--checkpoint", str(exp / "epoch_0.pt"),
                     overrides=("encoder_conf.output_size 64", "train_conf.max_epoch 2")))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-4000:]
    assert errors(proc) == [errors(proc)[0]] and errors(proc)[0].endswith(
        f"ERROR {exp}/epoch_0.pt holds another model than this config's: encoder.embed.out.weight is (96, 608) in the "
        "checkpoint, (64, 608) in this config's model (104 keys differ); use the config it was trained with (the "
        "train.yaml beside it)")
    assert snapshot(exp) == before  # train.yaml too: the dir's own checkpoints still decode with it


def test_a_fresh_run_into_a_dir_holding_a_run_is_refused_until_start_over_moves_that_run_aside(run_a, tmp_path):
    data, exp = run_a
    exp2 = tmp_path / "exp2"
    shutil.copytree(exp, exp2)
    before = snapshot(exp2)
    fresh = train(data, exp2, overrides=("optim_conf.lr 0.0005", "train_conf.seed 1"))
    proc = run(fresh)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-4000:]
    assert [line.split(" ERROR ")[1] for line in errors(proc)] == [
        f"--model_dir {exp2} holds an earlier run (epoch_0.pt, init.pt, train.yaml): continue it with --checkpoint "
        f"auto, start a new one there with --start_over (run.sh: --start_over true), which moves the old one into "
        f"{exp2}/previous_runs/, or "
        "train into another --model_dir (run.sh: --dir)"]
    assert snapshot(exp2) == before

    proc = run(fresh + ["--start_over"])
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert f"--model_dir {exp2}: moved epoch_0.pt, epoch_0.yaml, global_cmvn, init.pt, ... (8 files) (--start_over) " \
           f"to {exp2}/previous_runs/1" in proc.stderr
    after = snapshot(exp2)
    assert {name[len("previous_runs/1/"):]: md5 for name, md5 in after.items()
            if name.startswith("previous_runs/1/")} == before  # run A whole, its tensorboard folder included
    top = {name for name in after if "/" not in name}
    assert top == {"epoch_0.pt", "epoch_0.yaml", "init.pt", "init.yaml", "train.yaml", "units.txt", "global_cmvn"}
    # run B's (init.yaml, and the symbol table and CMVN of the same data: the same bytes)
    assert all(after[name] != before[name] for name in top - {"init.yaml", "units.txt", "global_cmvn"})
    assert yaml.safe_load(open(exp2 / "train.yaml"))["optim_conf"]["lr"] == 0.0005


def test_of_two_jobs_started_at_once_on_one_dir_one_trains_and_the_other_stops_in_one_line(run_a, tmp_path):
    data, _ = run_a
    exp3 = tmp_path / "exp3"
    jobs = [subprocess.Popen(train(data, exp3, overrides=(f"optim_conf.lr {lr}",)), stderr=subprocess.PIPE, text=True,
                             env=ENV, cwd=REPO_ROOT) for lr in (0.004, 0.0005)]
    logs = [job.communicate(timeout=TIMEOUT_S)[1] for job in jobs]
    codes = [job.returncode for job in jobs]
    assert sorted(codes) == [0, 2], [log[-2000:] for log in logs]
    winner, loser = (logs[codes.index(0)], 0.004 if codes[0] == 0 else 0.0005), logs[codes.index(2)]
    assert "Traceback" not in loser
    refusal = [line for line in loser.splitlines() if " ERROR " in line]
    assert len(refusal) == 1 and re.search(rf"ERROR --model_dir {exp3} is in use by another training job \(pid \d+ on "
                                           r".*, since .*\); wait for it to end, or train into another --model_dir$",
                                           refusal[0]), refusal
    assert yaml.safe_load(open(exp3 / "train.yaml"))["optim_conf"]["lr"] == winner[1]
    cv_loss = yaml.safe_load(open(exp3 / "epoch_0.yaml"))["cv_loss"]
    assert f"cv_loss {cv_loss:.3f}" in winner[0]
    assert sorted(os.listdir(exp3)) == ["epoch_0.pt", "epoch_0.yaml", "global_cmvn", "init.pt", "init.yaml", "tb",
                                        "train.yaml", "units.txt"]
