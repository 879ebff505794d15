"""``max_train_minutes`` as a TimeBudget on a stand-in clock, in one process (no process group, so rank 0's
decision is this process's): the deadline, the CV + save time it keeps (estimated before one is measured, at every
start), no epoch started whose first step would end past the deadline, and no bound at 0."""

import math

import pytest

from toolkit.engine.time_budget import SAVE_TO_LAST_IO, CvShare, TimeBudget


def clocked(minutes: float, **start):
    now = [0.0]
    budget = TimeBudget(minutes, clock=lambda: now[0])
    budget.start(**start)
    return budget, now


def steps(budget, now, times, utts_per_step: int, audio_per_step: float) -> list[bool]:
    """Optimizer steps ending at ``times`` (an epoch's, from its start), each training ``utts_per_step`` utterances
    and ``audio_per_step`` seconds of audio; whether each is past the deadline."""
    past = []
    for n, t in enumerate(times, 1):
        now[0] = t
        past.append(budget.step_past_deadline(n * utts_per_step, n * audio_per_step))
    return past


def test_steps_stop_at_the_bound_less_the_longest_cv_and_save():
    budget, now = clocked(1.0)  # no CV share: nothing to estimate from, so the first epoch keeps nothing back
    assert budget.bounded and budget.minutes == 1.0 and budget.seconds_left() == 60.0
    budget.epoch_started()
    assert steps(budget, now, [1.0, 59.0, 60.0], 8, 4.0) == [False, False, True]
    budget.epoch_trained()
    now[0] = 70.0  # CV + save took 10 s
    assert not budget.next_epoch_fits() and budget.longest_tail_s == 10.0

    budget, now = clocked(1.0)
    budget.epoch_started()
    assert steps(budget, now, [1.0, 2.0, 20.0], 8, 4.0) == [False, False, False]
    budget.epoch_trained()
    now[0] = 30.0  # CV + save took 10 s: the deadline moves back to 50 s
    assert budget.next_epoch_fits() and budget.longest_tail_s == 10.0 and budget.seconds_left() == 20.0
    assert budget.minutes_used() == 0.5
    budget.epoch_started()
    assert steps(budget, now, [31.0, 49.0, 50.0], 8, 4.0) == [False, False, True]
    budget.epoch_trained()
    now[0] = 54.0
    assert not budget.next_epoch_fits()  # 54 s is past 50 s: no epoch starts
    assert budget.longest_tail_s == 10.0  # the shorter CV + save (4 s) kept the longest


def test_first_epoch_keeps_back_an_estimate_of_its_cv_and_save():
    # CV: 100 utterances, 50 s of audio; the init save took 1 s. Training: the loader starts in 1.5 s, then each
    # step of 0.5 s trains 10 utterances and 2 s of audio. From the second step on, the CV is estimated at the first
    # step (2 s: the CV loader's start-up stand-in) + 0.5 s per 2 s of audio x 50 s (the audio ratio, 25, beats the
    # utterances', 10) = 14.5 s, the save at 3 x 1 s: steps stop at 60 - 17.5 = 42.5 s.
    budget, now = clocked(1.0, cv=CvShare(100, 50.0), last_io_s=1.0)
    budget.epoch_started()
    times = [2.0 + 0.5 * k for k in range(82)]  # 2.0 ... 42.5
    past = steps(budget, now, times, 10, 2.0)
    assert past == [False] * 81 + [True]
    assert budget.tail_estimate_s(820, 164.0) == pytest.approx(2.0 + 12.5 + SAVE_TO_LAST_IO)
    budget.epoch_trained()
    now[0] = 49.5  # the CV + save measured (7 s) replaces the estimate: steps stop at 53 s
    assert budget.next_epoch_fits() and budget.seconds_left() == pytest.approx(3.5)
    budget.epoch_started()
    assert steps(budget, now, [51.5, 52.0, 52.5, 53.0], 10, 2.0) == [False, False, False, True]


def test_shards_estimate_from_utterances_alone():
    budget, now = clocked(1.0, cv=CvShare(100))  # audio unknown: 10 utterances per 0.5 s x 100 = 5 s + 2 s
    budget.epoch_started()
    steps(budget, now, [2.0, 2.5], 10, 2.0)
    assert budget.seconds_left() == pytest.approx(60.0 - 7.0 - 2.5)


def test_no_epoch_starts_whose_loader_start_up_would_end_past_the_deadline():
    for loader_start_s, fits in ((2.5, False), (1.5, True)):
        budget, now = clocked(1.0)
        budget.epoch_started()
        steps(budget, now, [3.0, 4.0, 40.0], 8, 4.0)
        budget.epoch_trained()
        now[0] = 40.0 + loader_start_s
        budget.loader_started(40.0)  # the CV loader's first batch came loader_start_s after its start
        now[0] = 49.0  # CV + save: 9 s, so steps stop at 51 s; a loader started now is ready at 51.5 / 50.5 s
        assert budget.next_epoch_fits() == fits


def test_every_start_estimates_again():
    """A resumed job (an elastic restart) has the bound again with nothing measured: the estimate again."""
    budget, now = clocked(1.0, cv=CvShare(100, 50.0))
    budget.epoch_started()
    steps(budget, now, [2.0, 2.5, 10.0], 10, 2.0)
    budget.epoch_trained()
    now[0] = 20.0
    assert budget.next_epoch_fits() and budget.longest_tail_s == 10.0
    now[0] = 1000.0
    budget.start(cv=CvShare(100, 50.0))
    assert budget.longest_tail_s == 0.0 and budget.seconds_left() == 60.0
    budget.epoch_started()
    steps(budget, now, [1002.0, 1002.5], 10, 2.0)
    assert budget.seconds_left() == pytest.approx(60.0 - 14.5 - 2.5)


def test_zero_minutes_bound_nothing():
    budget, now = clocked(0.0, cv=CvShare(100, 50.0))
    budget.epoch_started()
    now[0] = 1e9
    assert not budget.bounded and not budget.step_past_deadline(10, 2.0) and budget.next_epoch_fits()
    assert budget.seconds_left() == math.inf


def test_overrun_counts_past_the_bound_beyond_the_cut_step():
    budget, now = clocked(1.0)
    budget.epoch_started()
    assert steps(budget, now, [1.0, 2.0, 40.0], 8, 4.0) == [False, False, False]
    budget.epoch_trained()
    now[0] = 45.0  # CV + save 5 s: steps stop at 55 s
    assert budget.next_epoch_fits()
    budget.epoch_started()
    assert steps(budget, now, [46.0, 54.0, 57.5], 8, 4.0) == [False, False, True]  # the cut step ends 2.5 s late
    budget.epoch_trained()
    now[0] = 62.5  # its CV + save as measured: 60 s + the step's 2.5 s is within the bound
    assert budget.overrun_s() == 0.0
    now[0] = 63.5  # a CV + save 1 s longer than the longest measured
    assert budget.overrun_s() == pytest.approx(1.0)

    # An estimate far above the time left cuts the first epoch at its second step; a CV + save longer than the
    # whole bound still ends past it, by all of that beyond the bound and the cut step's own 1 s.
    budget, now = clocked(1.0, cv=CvShare(10_000, 5_000.0))
    budget.epoch_started()
    assert steps(budget, now, [2.0, 3.0], 10, 2.0) == [False, True]
    budget.epoch_trained()
    now[0] = 100.0
    assert budget.overrun_s() == pytest.approx(100.0 - 60.0 - 1.0)


def test_a_step_checkpoint_that_would_end_past_the_deadline_cuts_the_epoch_instead():
    budget, now = clocked(1.0)
    budget.epoch_started()
    now[0] = 1.0
    assert not budget.step_past_deadline(8, 4.0, saving_s=5.0)
    now[0] = 54.0
    assert not budget.step_past_deadline(16, 8.0)  # no save due: steps stop at 60 s
    assert budget.step_past_deadline(16, 8.0, saving_s=6.0)  # a 6 s save from 54 s would end at 60 s
