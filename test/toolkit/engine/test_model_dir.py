"""toolkit.engine.model_dir: what a job does with the run its model dir holds (continue it, move it aside, or stop in
one line), and who may lock the dir: another job is refused at once, an elastic restart of the same job waits for its
earlier attempt. The lock holders are real processes (two locks of one process are one POSIX lock)."""

import os
import subprocess
import sys
import time

import pytest
import yaml

from toolkit.distributed.context import DistContext
from toolkit.engine.model_dir import PREVIOUS_RUNS, claim_model_dir, lock_model_dir, plan_model_dir
from toolkit.utils.config_parsing import ConfigError

from test.helpers import REPO_ROOT


def commit(model_dir, tag, step, **info):
    """A committed checkpoint as the listing sees it: ``tag.pt`` beside ``tag.yaml`` (its ``step``)."""
    os.makedirs(model_dir, exist_ok=True)
    (model_dir / f"{tag}.pt").write_bytes(b"weights")
    (model_dir / f"{tag}.yaml").write_text(yaml.safe_dump({"step": step, **info}))


def a_run(model_dir):
    """A run of 2 epochs (5 steps each) with a step checkpoint inside epoch 1 and a DeepSpeed shard dir."""
    commit(model_dir, "init", 0)
    commit(model_dir, "epoch_0", 5)
    commit(model_dir, "step_8", 8)
    commit(model_dir, "epoch_1", 10)
    (model_dir / "epoch_1").mkdir()
    (model_dir / "train.yaml").write_text("encoder: conformer\n")
    (model_dir / "tb").mkdir()


def test_an_empty_dir_takes_a_fresh_run_or_a_checkpoint_from_elsewhere(tmp_path):
    (tmp_path / "exp").mkdir()
    for checkpoint in (None, "auto", str(tmp_path / "other" / "epoch_3.pt")):
        claim = plan_model_dir(str(tmp_path / "exp"), checkpoint, start_over=False)
        assert (claim.checkpoint, claim.aside) == (None if checkpoint == "auto" else checkpoint, [])


def test_a_fresh_run_into_a_dir_holding_a_run_is_refused_in_one_line(tmp_path):
    exp = tmp_path / "exp"
    a_run(exp)
    with pytest.raises(ConfigError) as refused:
        plan_model_dir(str(exp), None, start_over=False)
    assert str(refused.value) == (
        f"--model_dir {exp} holds an earlier run (epoch_0.pt, epoch_1.pt, init.pt, step_8.pt, ... (5 files)): "
        "continue it with --checkpoint auto, start a new one there with --start_over (run.sh: --start_over true), "
        "which moves the old one into "
        f"{exp}/{PREVIOUS_RUNS}/, or train into another --model_dir (run.sh: --dir)")
    other = str(tmp_path / "other" / "epoch_3.pt")
    with pytest.raises(ConfigError, match=f"holds an earlier run .*, not the run of --checkpoint {other}: continue"):
        plan_model_dir(str(exp), other, start_over=False)


def test_checkpoint_auto_continues_the_newest_or_restarts_a_run_that_has_no_checkpoint_yet(tmp_path):
    exp = tmp_path / "exp"
    a_run(exp)
    claim = plan_model_dir(str(exp), "auto", start_over=False)
    assert (claim.checkpoint, claim.aside) == (str(exp / "epoch_1.pt"), [])
    killed_in_epoch_0 = tmp_path / "killed"
    commit(killed_in_epoch_0, "init", 0)
    (killed_in_epoch_0 / "train.yaml").write_text("encoder: conformer\n")
    assert plan_model_dir(str(killed_in_epoch_0), "auto", start_over=False).checkpoint is None
    averaged_only = tmp_path / "averaged"
    commit(averaged_only, "avg_3", 0)
    with pytest.raises(ConfigError, match=r"holds an earlier run \(avg_3\.pt\) with no epoch_N\.pt or step_N\.pt to "
                                          r"continue from: start a new one there with --start_over"):
        plan_model_dir(str(averaged_only), "auto", start_over=False)


def test_a_resume_from_an_earlier_checkpoint_of_the_dir_moves_the_abandoned_later_ones_aside(tmp_path):
    exp = tmp_path / "exp"
    a_run(exp)
    claim = plan_model_dir(str(exp), str(exp / "epoch_0.pt"), start_over=False)
    assert claim.aside == ["epoch_1.pt", "epoch_1.yaml", "epoch_1", "step_8.pt", "step_8.yaml"]
    assert plan_model_dir(str(exp), str(exp / "epoch_1.pt"), start_over=False).aside == []  # the newest
    claim.move_aside()
    assert sorted(os.listdir(exp / PREVIOUS_RUNS / "1")) == ["epoch_1", "epoch_1.pt", "epoch_1.yaml", "step_8.pt",
                                                             "step_8.yaml"]
    assert sorted(os.listdir(exp)) == ["epoch_0.pt", "epoch_0.yaml", "init.pt", "init.yaml", PREVIOUS_RUNS, "tb",
                                       "train.yaml"]


def test_start_over_moves_everything_aside_each_time_into_its_own_folder(tmp_path):
    exp = tmp_path / "exp"
    a_run(exp)
    (exp / ".lock").write_text("{}")  # a lock file left by a killed job stays where it is
    for n in (1, 2):
        claim = plan_model_dir(str(exp), "auto", start_over=True)
        assert claim.checkpoint is None and claim.aside == sorted(set(os.listdir(exp)) - {".lock", PREVIOUS_RUNS})
        claim.move_aside()
        assert sorted(os.listdir(exp)) == [".lock", PREVIOUS_RUNS]
        assert sorted(os.listdir(exp / PREVIOUS_RUNS)) == [str(i) for i in range(1, n + 1)]
        commit(exp, "init", 0, run_id="job-b")  # the next run
    assert "epoch_1.yaml" in os.listdir(exp / PREVIOUS_RUNS / "1")
    assert os.listdir(exp / PREVIOUS_RUNS / "2") == ["init.pt", "init.yaml"]


def test_start_over_with_checkpoint_auto_lets_an_elastic_restart_continue_its_own_run(tmp_path):
    exp = tmp_path / "exp"
    commit(exp, "init", 0, run_id="job-a")  # the first attempt started over and committed these, then died
    commit(exp, "step_4", 4)
    own = plan_model_dir(str(exp), "auto", start_over=True, restart_of="job-a")
    assert (own.checkpoint, own.aside) == (str(exp / "step_4.pt"), [])
    another = plan_model_dir(str(exp), "auto", start_over=True, restart_of="job-b")
    assert another.checkpoint is None and another.aside == ["init.pt", "init.yaml", "step_4.pt", "step_4.yaml"]
    first_attempt = plan_model_dir(str(exp), "auto", start_over=True)  # restart count 0: not a restart
    assert first_attempt.aside == another.aside


def test_a_claim_refused_or_ended_leaves_no_lock_file_and_a_dir_it_cannot_make_is_one_line(one_rank, tmp_path):
    exp = tmp_path / "exp"
    a_run(exp)
    with pytest.raises(ConfigError, match="holds an earlier run"):
        claim_model_dir(one_rank, str(exp), None, start_over=False)
    with claim_model_dir(one_rank, str(exp), "auto", start_over=False) as claim:
        assert claim.checkpoint == str(exp / "epoch_1.pt") and claim.lock.held and (exp / ".lock").exists()
    assert not (exp / ".lock").exists() and not claim.lock.held
    (tmp_path / "file").write_text("")
    with pytest.raises(ConfigError, match=rf"^--model_dir {tmp_path}/file/exp: Not a directory \(.*/file/exp\)$"):
        claim_model_dir(one_rank, str(tmp_path / "file" / "exp"), None, start_over=False)


HOLD = """
import sys, time
from toolkit.distributed.context import DistContext
from toolkit.engine.model_dir import lock_model_dir
lock_model_dir(DistContext(run_id=sys.argv[2], restart_count=int(sys.argv[3])), sys.argv[1])
print("locked", flush=True)
time.sleep(float(sys.argv[4]))  # then ends without unlocking, as a killed attempt does
"""


def hold(model_dir, run_id: str, restart_count: int, seconds: float) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(model_dir), run_id, str(restart_count), str(seconds)],
                            stdout=subprocess.PIPE, text=True, cwd=REPO_ROOT)
    assert proc.stdout.readline() == "locked\n"
    return proc


def test_another_job_is_refused_at_once_naming_the_holder(tmp_path):
    holder = hold(tmp_path, "job-a", 0, 60)
    try:
        # another job, and a job that only shares the run id (a second launch with the same --rdzv_id)
        for ctx in (DistContext(run_id="job-b"), DistContext(), DistContext(run_id="job-a")):
            started = time.monotonic()
            with pytest.raises(ConfigError, match=rf"^--model_dir {tmp_path} is in use by another training job "
                                                  rf"\(pid {holder.pid} on .*, torchrun run id job-a, since .*\); "
                                                  r"wait for it to end, or train into another --model_dir$"):
                lock_model_dir(ctx, str(tmp_path))
            assert time.monotonic() - started < 1.0
    finally:
        holder.kill()
        holder.wait(timeout=30)


def test_an_elastic_restart_waits_for_its_own_earlier_attempt_to_let_go(tmp_path):
    holder = hold(tmp_path, "job-a", 0, 2.0)
    started = time.monotonic()
    lock = lock_model_dir(DistContext(run_id="job-a", restart_count=1), str(tmp_path))
    waited = time.monotonic() - started
    try:
        assert lock.held and holder.wait(timeout=30) == 0
        assert 1.0 < waited < 30.0, waited
    finally:
        lock.release()
    assert os.listdir(tmp_path) == []


def test_a_training_job_is_refused_while_an_average_is_made_in_its_dir(tmp_path):
    averaging = subprocess.Popen([sys.executable, "-c", "import sys, time\n"
                                  "from toolkit.engine.model_dir import lock_for_averaging\n"
                                  "lock_for_averaging(sys.argv[1])\nprint('locked', flush=True)\ntime.sleep(60)",
                                  str(tmp_path)], stdout=subprocess.PIPE, text=True, cwd=REPO_ROOT)
    try:
        assert averaging.stdout.readline() == "locked\n"
        with pytest.raises(ConfigError, match=rf"^--model_dir {tmp_path} is in use by another averaging job "
                                              rf"\(pid {averaging.pid} on .*, since .*\); wait for it to end"):
            lock_model_dir(DistContext(run_id="job-a"), str(tmp_path))
    finally:
        averaging.kill()
        averaging.wait(timeout=30)
