"""``train_conf.max_train_minutes`` on 2 real gloo ranks whose clocks disagree: global rank 0's clock decides, after
every step, whether training stops there, keeping the longest CV + save so far for the end, and both ranks cut the
epoch at the same step (one deciding on its own clock would leave the other in a collective alone)."""


import pytest

from test.helpers import read_rank_reports

from .workers.launch import WORKERS, run_ranks

WORKER = str(WORKERS / "worker_time_bound.py")


# Rank 0's clock: epoch e's step k ends at 5e + k + 1 s (k = 1..3: the join reads a batch ahead), its step 4 at
# 5e + 4 s, its CV and save at 5e + 5 s; from epoch 1 on, steps stop once the clock reaches M - 1 s.
@pytest.mark.parametrize("join_mode, max_train_minutes, trained", [
    ("flag", 10.5 / 60, [[0, 4, False], [1, 8, False]]),  # epoch 1 ends at 9 s, before 9.5; its CV at 10 s, past it
    ("flag", 12.5 / 60, [[0, 4, False], [1, 8, False], [2, 9, True]]),  # epoch 2's step 1 ends at 12 s, past 11.5
    ("flag", 13.5 / 60, [[0, 4, False], [1, 8, False], [2, 10, True]]),  # its step 2 ends at 13 s, past 12.5
    ("flag", 3.5 / 60, [[0, 3, True]]),  # no CV time kept in the first epoch: its step 3 ends at 4 s, past 3.5
    ("flag", 0.0, [[e, 4 * (e + 1), False] for e in range(10)]),  # disabled: max_epoch
    # monitored_barrier reads no batch ahead: epoch 2's step k ends at 10 + k s, so step 2 is the first past 11.5.
    ("monitored_barrier", 12.5 / 60, [[0, 4, False], [1, 8, False], [2, 10, True]]),
])
def test_rank_0_clock_cuts_every_rank_at_the_same_step(tmp_path, join_mode, max_train_minutes, trained):
    proc = run_ranks(WORKER, str(tmp_path), str(max_train_minutes), join_mode, timeout=150)
    assert proc.returncode == 0, proc.stderr[-4000:]
    reports = read_rank_reports(tmp_path, 2)
    assert reports[0] == reports[1] == trained
    announced = f"train_conf.max_train_minutes {max_train_minutes:g}: training stops there"
    assert (announced in proc.stderr) == bool(max_train_minutes)
    epoch, steps, cut = trained[-1]
    assert (f"epoch {epoch} cut short after {steps - 4 * epoch} batches (step {steps})" in proc.stderr) == cut
    if max_train_minutes:
        assert (f"train_conf.max_train_minutes {max_train_minutes:g}: stopping after epoch {epoch} of max_epoch 10"
                in proc.stderr)
