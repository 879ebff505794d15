"""``train_conf.max_train_minutes`` on 2 real gloo ranks. On stand-in clocks that disagree: global rank 0's clock
decides, after every step, whether training stops there, keeping back the longest CV + save so far (before the
first, an estimate from a probe of the CV) for the end, no epoch starts past that point, and both ranks cut the
epoch at the same step (one deciding on its own clock would leave the other in a collective alone). On real
clocks, ``toolkit.bin.train`` with the bound inside the first epoch and a CV pass of seconds ends within the bound
plus one step."""

import datetime
import json
import re
import statistics
import subprocess
import sys

import pytest
import yaml

from test.helpers import REPO_ROOT, kaldi_entries, read_rank_reports

from .workers.launch import WORKERS, run_ranks
from .workers.recipe_data import run_standalone, train_args, units_and_cmvn

WORKER = str(WORKERS / "worker_time_bound.py")


# Rank 0's clock: the CV probe ends at 1 s (its loader's start-up; the CV estimated at that 1 s, as long as the
# stand-in CV). Epoch e's step k ends at 5e + k + 2 s (k = 1..3: the join reads a batch ahead), its step 4 at 5e + 5 s,
# its CV and save at 5e + 6 s. Steps stop once the clock reaches M - 1 s, and an epoch starts only if its loader's
# start-up (1 s, the probe's) ends before that.
@pytest.mark.parametrize("join_mode, max_train_minutes, trained", [
    ("flag", 7.5 / 60, [[0, 4, False]]),  # epoch 1's loader would be ready at 7 s, past 6.5
    ("flag", 8.5 / 60, [[0, 4, False], [1, 5, True]]),  # epoch 1's step 1 ends at 8 s, past 7.5
    ("flag", 9.5 / 60, [[0, 4, False], [1, 6, True]]),  # its step 2 ends at 9 s, past 8.5
    ("flag", 4.5 / 60, [[0, 2, True]]),  # the estimate's deadline, 3.5 s: epoch 0's step 2 (4 s) is past it
    ("flag", 0.0, [[e, 4 * (e + 1), False] for e in range(10)]),  # disabled: max_epoch
    # monitored_barrier reads no batch ahead: epoch 1's step k ends at 6 + k s, so step 3 is the first past 8.5.
    ("monitored_barrier", 9.5 / 60, [[0, 4, False], [1, 7, True]]),
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
    """toolkit.bin.train on 2 ranks, real clocks: 200 x the 80 tiny_fsdd training utterances (about 0.4 s each; an
    epoch far longer than the bound), a CV list of 20 x the 15 tiny_lj utterances (about 7 s each: seconds of CV,
    the case time-bound-first-epoch's kind), bound 0.5 minutes, max_epoch 1 (what follows a measured CV + save is
    the stand-in clocks' test above). Nothing is measured when the epoch must be cut: the run still ends within the
    bound plus one step (the median step) and 1 s of logging slack, measured on rank 0's log from the bound's start
    to its last line, and the probe's estimate is not so high that the epoch is cut within its first steps."""
    fsdd = kaldi_entries("tiny_fsdd", "train")
    lj = [r for split in ("train", "dev", "test") for r in kaldi_entries("tiny_lj", split)]
    for name, entries, times in (("train.list", fsdd, 200), ("cv.list", lj, 20)):
        with open(tmp_path / name, "w") as f:
            f.writelines(json.dumps({**r, "key": f"{r['key']}-{i}"}) + "\n" for i in range(times) for r in entries)
    with open(tmp_path / "text", "w") as f:  # a table of both corpora: no CV utterance is skipped
        f.writelines(f"{r['key']} {r['txt']}\n" for r in fsdd + lj)
    subprocess.run([sys.executable, str(REPO_ROOT / "tools" / "make_dict.py"), str(tmp_path / "text"),
                    str(tmp_path / "units.txt")], check=True, capture_output=True, timeout=120)
    (tmp_path / "cmvn").write_bytes(units_and_cmvn()[1])
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
    info = yaml.safe_load(open(tmp_path / "exp" / "epoch_0.yaml"))
    assert info["cut_short"] and info["cv_utts"] == 300 and not info["cv_skipped"], summary  # cut in epoch 0
    assert elapsed <= 60 * minutes + step_s + 1.0, summary
    assert info["step"] >= 10, summary
    assert "CV + save of the largest share (150 utterances) estimated at" in proc.stderr, summary
    assert "past the bound" not in proc.stderr, summary
