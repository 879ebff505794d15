"""``max_train_minutes`` as a TimeBudget on a stand-in clock, in one process (no process group, so rank 0's
decision is this process's): the deadline, the CV + save time it keeps, and no bound at 0."""

import math

from toolkit.engine.time_budget import TimeBudget


def test_steps_stop_at_the_bound_less_the_longest_cv_and_save():
    now = [100.0]
    budget = TimeBudget(1.0, clock=lambda: now[0])
    budget.start()
    assert budget.bounded and budget.minutes == 1.0 and budget.seconds_left() == 60.0
    now[0] = 159.0
    assert not budget.step_past_deadline()
    now[0] = 160.0
    assert budget.step_past_deadline()  # no CV + save measured yet: the whole minute

    now[0] = 120.0
    budget.epoch_trained()
    now[0] = 130.0  # CV + save took 10 s
    assert budget.next_epoch_fits() and budget.longest_tail_s == 10.0
    assert budget.seconds_left() == 20.0  # the deadline moved back to 150 s
    assert budget.minutes_used() == 0.5
    now[0] = 150.0
    assert budget.step_past_deadline()
    budget.epoch_trained()
    now[0] = 154.0
    assert not budget.next_epoch_fits()  # 154 s is past 150 s: no epoch starts
    assert budget.longest_tail_s == 10.0  # the shorter CV + save (4 s) kept the longest


def test_start_restarts_the_bound():
    now = [0.0]
    budget = TimeBudget(0.5, clock=lambda: now[0])
    now[0] = 1000.0
    budget.start()
    now[0] = 1029.0
    assert not budget.step_past_deadline() and budget.seconds_left() == 1.0


def test_zero_minutes_bound_nothing():
    now = [0.0]
    budget = TimeBudget(0.0, clock=lambda: now[0])
    budget.start()
    now[0] = 1e9
    assert not budget.bounded and not budget.step_past_deadline() and budget.next_epoch_fits()
    assert budget.seconds_left() == math.inf
