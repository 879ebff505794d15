"""``max_train_minutes`` as a TimeBudget on a stand-in clock, in one process (no process group, so rank 0's
decision is this process's): the deadline, the CV + save time it keeps (estimated from a CV probe before one is
measured, at every start), no epoch started whose first step would end past the deadline, and no bound at 0."""

import math

import pytest

from toolkit.engine.time_budget import SAVE_TO_LAST_IO, CvShare, TimeBudget


def clocked(minutes: float, **start):
    now = [0.0]
    budget = TimeBudget(minutes, clock=lambda: now[0])
    budget.start(**start)
    return budget, now


def steps(budget, now, times) -> list[bool]:
    """Optimizer steps ending at ``times`` (an epoch's, from its start); whether each is past the deadline."""
    past = []
    for t in times:
        now[0] = t
        past.append(budget.step_past_deadline())
    return past


def probe(budget, now, loader_start_s: float, probe_s: float, probed: CvShare, share: CvShare) -> float:
    """A CV probe from now: its loader's first batch after ``loader_start_s``, its end after ``probe_s``."""
    started = now[0]
    now[0] += loader_start_s
    budget.loader_started(started)
    now[0] = started + probe_s
    return budget.cv_probed(probe_s, probed, share)


def test_steps_stop_at_the_bound_less_the_longest_cv_and_save():
    budget, now = clocked(1.0)  # no CV share: nothing to estimate from, so the first epoch keeps nothing back
    assert budget.bounded and budget.minutes == 1.0 and budget.seconds_left() == 60.0
    budget.epoch_started()
    assert steps(budget, now, [1.0, 59.0, 60.0]) == [False, False, True]
    budget.epoch_trained()
    now[0] = 70.0  # CV + save took 10 s
    assert not budget.next_epoch_fits() and budget.longest_tail_s == 10.0

    budget, now = clocked(1.0)
    budget.epoch_started()
    assert steps(budget, now, [1.0, 2.0, 20.0]) == [False, False, False]
    budget.epoch_trained()
    now[0] = 30.0  # CV + save took 10 s: the deadline moves back to 50 s
    assert budget.next_epoch_fits() and budget.longest_tail_s == 10.0 and budget.seconds_left() == 20.0
    assert budget.minutes_used() == 0.5
    budget.epoch_started()
    assert steps(budget, now, [31.0, 49.0, 50.0]) == [False, False, True]
    budget.epoch_trained()
    now[0] = 54.0
    assert not budget.next_epoch_fits()  # 54 s is past 50 s: no epoch starts
    assert budget.longest_tail_s == 10.0  # the shorter CV + save (4 s) kept the longest


def test_first_epoch_keeps_back_its_cv_probe_scaled_to_the_largest_share():
    # The init save took 1 s. The probe: its loader starts in 1 s, then 64 utterances (128 s of audio) take 2 s. The
    # largest CV share: 640 utterances, 1,600 s of audio: the audio ratio (12.5) beats the utterances' (10), so the
    # CV is 1 s + 2 s x 12.5 = 26 s, the save 3 x 1 s: steps stop at 60 - 29 = 31 s.
    budget, now = clocked(1.0, last_io_s=1.0)
    assert budget.seconds_left() == pytest.approx(60.0 - SAVE_TO_LAST_IO)  # before the probe: the save alone
    tail_s = probe(budget, now, 1.0, 3.0, CvShare(64, 128.0), CvShare(640, 1600.0))
    assert tail_s == pytest.approx(1.0 + 2.0 * 12.5 + SAVE_TO_LAST_IO)
    budget.epoch_started()
    assert steps(budget, now, [4.0, 30.5, 31.0]) == [False, False, True]
    budget.epoch_trained()
    now[0] = 40.0  # the CV + save measured (9 s) replaces the estimate: steps stop at 51 s
    assert budget.next_epoch_fits() and budget.seconds_left() == pytest.approx(11.0)
    budget.epoch_started()
    assert steps(budget, now, [45.0, 50.5, 51.0]) == [False, False, True]


def test_probe_estimates_from_utterances_alone_without_audio_and_nothing_from_an_empty_probe():
    budget, now = clocked(1.0)  # shards: audio unknown, 640 / 64 utterances x 2 s + 1 s
    assert probe(budget, now, 1.0, 3.0, CvShare(64, 128.0), CvShare(640)) == pytest.approx(21.0)
    budget, now = clocked(1.0)  # a rank 0 without a CV utterance: its loader's start-up alone
    assert probe(budget, now, 1.0, 1.5, CvShare(0, 0.0), CvShare(640, 1600.0)) == pytest.approx(1.0)
    budget, now = clocked(1.0)  # the whole share probed: exact
    assert probe(budget, now, 1.0, 3.0, CvShare(64, 128.0), CvShare(64, 128.0)) == pytest.approx(3.0)


def test_no_epoch_starts_whose_loader_start_up_would_end_past_the_deadline():
    for loader_start_s, fits in ((2.5, False), (1.5, True)):
        budget, now = clocked(1.0)
        budget.epoch_started()
        steps(budget, now, [3.0, 4.0, 40.0])
        budget.epoch_trained()
        now[0] = 40.0 + loader_start_s
        budget.loader_started(40.0)  # the CV loader's first batch came loader_start_s after its start
        now[0] = 49.0  # CV + save: 9 s, so steps stop at 51 s; a loader started now is ready at 51.5 / 50.5 s
        assert budget.next_epoch_fits() == fits


def test_every_start_estimates_again():
    """A resumed job (an elastic restart) has the bound again with nothing measured: probed again."""
    budget, now = clocked(1.0)
    probe(budget, now, 1.0, 2.0, CvShare(10, 20.0), CvShare(100, 200.0))  # 1 + 1 x 10 = 11 s
    budget.epoch_started()
    steps(budget, now, [3.0, 10.0])
    budget.epoch_trained()
    now[0] = 20.0
    assert budget.next_epoch_fits() and budget.longest_tail_s == 10.0
    now[0] = 1000.0
    budget.start()
    assert budget.longest_tail_s == 0.0 and budget.seconds_left() == 60.0
    probe(budget, now, 1.0, 2.0, CvShare(10, 20.0), CvShare(100, 200.0))
    assert budget.seconds_left() == pytest.approx(60.0 - 2.0 - 11.0)


def test_zero_minutes_bound_nothing():
    budget, now = clocked(0.0)
    budget.epoch_started()
    now[0] = 1e9
    assert not budget.bounded and not budget.step_past_deadline() and budget.next_epoch_fits()
    assert budget.seconds_left() == math.inf


def test_overrun_counts_past_the_bound_beyond_the_cut_step():
    budget, now = clocked(1.0)
    budget.epoch_started()
    assert steps(budget, now, [1.0, 2.0, 40.0]) == [False, False, False]
    budget.epoch_trained()
    now[0] = 45.0  # CV + save 5 s: steps stop at 55 s
    assert budget.next_epoch_fits()
    budget.epoch_started()
    assert steps(budget, now, [46.0, 54.0, 57.5]) == [False, False, True]  # the cut step ends 2.5 s late
    budget.epoch_trained()
    now[0] = 62.5  # its CV + save as measured: 60 s + the step's 2.5 s is within the bound
    assert budget.overrun_s() == 0.0
    now[0] = 63.5  # a CV + save 1 s longer than the longest measured
    assert budget.overrun_s() == pytest.approx(1.0)

    # An estimate far above the time left cuts the first epoch at its first step; a CV + save longer than the
    # whole bound still ends past it, by all of that beyond the bound and the cut step's own 1 s.
    budget, now = clocked(1.0)
    probe(budget, now, 1.0, 2.0, CvShare(10, 5.0), CvShare(10_000, 5_000.0))
    budget.epoch_started()
    assert steps(budget, now, [3.0]) == [True]
    budget.epoch_trained()
    now[0] = 100.0
    assert budget.overrun_s() == pytest.approx(100.0 - 60.0 - 1.0)


def test_a_step_checkpoint_that_would_end_past_the_deadline_cuts_the_epoch_instead():
    budget, now = clocked(1.0)
    budget.epoch_started()
    now[0] = 1.0
    assert not budget.step_past_deadline(saving_s=5.0)
    now[0] = 54.0
    assert not budget.step_past_deadline()  # no save due: steps stop at 60 s
    assert budget.step_past_deadline(saving_s=6.0)  # a 6 s save from 54 s would end at 60 s
