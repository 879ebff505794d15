"""``train_conf.max_train_minutes`` on 2 real gloo ranks. On stand-in clocks that disagree: global rank 0's clock
decides, after every step, whether training stops there, keeping back the longest CV + save so far (an estimate
before the first) for the end, no epoch starts past that point, and both ranks cut the
epoch at the same step (one deciding on its own clock would leave the other in a collective alone). On real
clocks, ``toolkit.bin.train`` with the bound inside the first epoch and a CV pass of seconds ends within the bound
plus one step."""

import datetime
import json
import re
import statistics

import pytest
import yaml

from test.helpers import kaldi_entries, read_rank_reports

from .workers.launch import WORKERS, run_ranks
from .workers.recipe_data import run_standalone, train_args, units_and_cmvn

WORKER = str(WORKERS / "worker_time_bound.py")


# Rank 0's clock: epoch e's step k ends at 5e + k + 1 s (k = 1..3: the join reads a batch ahead), its step 4 at
# 5e + 4 s, its CV and save at 5e + 5 s. In epoch 0, from its second step on, the CV is estimated at 3 s (the first
# step's 2 s + 1 s per batch of utterances trained since); from epoch 1 on, steps stop once the clock reaches
# M - 1 s, and an epoch starts only before that (the stand-in CV has no loader whose start-up to add).
@pytest.mark.parametrize("join_mode, max_train_minutes, trained", [
    ("flag", 10.5 / 60, [[0, 4, False], [1, 8, False]]),  # epoch 1 ends at 9 s, before 9.5; its CV at 10 s, past it
    ("flag", 12.5 / 60, [[0, 4, False], [1, 8, False], [2, 9, True]]),  # epoch 2's step 1 ends at 12 s, past 11.5
    ("flag", 13.5 / 60, [[0, 4, False], [1, 8, False], [2, 10, True]]),  # its step 2 ends at 13 s, past 12.5
    ("flag", 3.5 / 60, [[0, 2, True]]),  # the estimate's deadline, 0.5 s: step 2 (3 s) is past it
    ("flag", 0.0, [[e, 4 * (e + 1), False] for e in range(10)]),  # disabled: max_epoch
    # monitored_barrier reads no batch ahead: epoch 2's step k ends at 10 + k s, so step 2 is the first past 11.5.
    ("monitored_barrier", 12.5 / 60, [[0, 4, False], [1, 8, False], [2, 10, True]]),
])
def test_rank_0_clock_cuts_every_rank_at_the_same_step(tmp_path, join_mode, max_train_minutes, trained):
    proc = run_ranks(WORKER, str(tmp_path), str(max_train_minutes), join_mode, timeout=150)
    assert proc.returncode == 0, proc.stderr[-4000:]
    (trained_0, end_0), (trained_1, _) = read_rank_reports(tmp_path, 2)
    assert trained_0 == trained_1 == trained
    if max_train_minutes:
        assert end_0 <= 60 * max_train_minutes + 1.0  # the bound plus one step (1 s on this clock)
    announced = f"train_conf.max_train_minutes {max_train_minutes:g}: training stops there"
    assert (announced in proc.stderr) == bool(max_train_minutes)
    epoch, steps, cut = trained[-1]
    assert (f"epoch {epoch} cut short after {steps - 4 * epoch} batches (step {steps})" in proc.stderr) == cut
    if max_train_minutes:
        assert (f"train_conf.max_train_minutes {max_train_minutes:g}: stopping after epoch {epoch} of max_epoch 10"
                in proc.stderr)
    assert "past the bound" not in proc.stderr


STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) rank0 ")


def test_a_bound_inside_the_first_epoch_holds_on_real_clocks(tmp_path):
    """toolkit.bin.train on 2 ranks, real clocks: 200 x the 80 tiny_fsdd training utterances (an epoch far longer
    than the bound), a CV list of 20 x the 100 tiny_fsdd training and dev utterances (seconds of CV), bound 0.5
    minutes, max_epoch 1 (what follows a measured CV + save is the stand-in clocks' test above). Nothing is
    measured when the epoch must be cut: the run still ends within the bound plus one step (the median step) and
    1 s of logging slack, measured on rank 0's log from the bound's start to its last line."""
    rows = kaldi_entries("tiny_fsdd", "train")
    for name, entries, times in (("train.list", rows, 200), ("cv.list", rows + kaldi_entries("tiny_fsdd", "dev"), 20)):
        with open(tmp_path / name, "w") as f:
            f.writelines(json.dumps({**r, "key": f"{r['key']}-{i}"}) + "\n" for i in range(times) for r in entries)
    units, cmvn = units_and_cmvn()
    (tmp_path / "units.txt").write_bytes(units)
    (tmp_path / "cmvn").write_bytes(cmvn)
    minutes = 0.5
    proc = run_standalone(train_args(tmp_path, tmp_path / "exp", "train_conf.max_epoch 1",
                                     f"train_conf.max_train_minutes {minutes}"), timeout=400)
    assert proc.returncode == 0, proc.stderr[-4000:]
    lines = [(datetime.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f"), line)
             for line in proc.stderr.splitlines() if (m := STAMP.match(line))]
    start = next(t for t, line in lines if "training stops there" in line)
    steps = [t for t, line in lines if re.search(r"epoch \d+ \| step \d+ \|", line)]
    step_s = statistics.median((b - a).total_seconds() for a, b in zip(steps, steps[1:]))
    elapsed = (lines[-1][0] - start).total_seconds()
    summary = (elapsed, step_s, [line for _, line in lines if re.search("max_train_minutes|done:|wrote", line)])
    assert yaml.safe_load(open(tmp_path / "exp" / "epoch_0.yaml"))["cut_short"], summary  # the bound fell in epoch 0
    assert elapsed <= 60 * minutes + step_s + 1.0, summary
    assert "past the bound" not in proc.stderr, summary
