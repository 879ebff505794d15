import math

import pytest
import torch

from toolkit.utils.config_parsing import ConfigError
from toolkit.utils.scheduler import WarmupCosineLR, WarmupLR, init_optimizer_and_scheduler


def test_warmup_lr_peaks_at_configured_lr_then_decays_as_inverse_sqrt():
    param = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.Adam([param], lr=0.002)
    scheduler = WarmupLR(optimizer, warmup_steps=100)
    lrs = []
    for _ in range(400):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    assert lrs[0] == pytest.approx(0.002 / 100)          # step 1 of warm-up
    assert lrs[49] == pytest.approx(0.002 * 50 / 100)    # linear
    assert lrs[99] == pytest.approx(0.002)               # peak at warmup_steps
    assert lrs[399] == pytest.approx(0.002 * (100 / 400) ** 0.5)  # inverse sqrt decay


def lrs_of(optimizer, scheduler, steps):
    lrs = []
    for _ in range(steps):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    return lrs


def test_warmup_cosine_lr_warms_up_then_anneals_to_its_final_ratio_at_max_steps():
    optimizer = torch.optim.Adam([torch.nn.Parameter(torch.zeros(1))], lr=0.002)
    lrs = lrs_of(optimizer, WarmupCosineLR(optimizer, warmup_steps=100, max_steps=500, final_lr_ratio=0.1), 600)
    assert lrs[0] == pytest.approx(0.002 / 100) and lrs[49] == pytest.approx(0.001)  # linear warm-up, step 1 and 50
    assert lrs[99] == pytest.approx(0.002)                             # peak at warmup_steps
    assert lrs[299] == pytest.approx(0.002 * (0.1 + 0.9 * 0.5))        # half-way down the cosine
    assert lrs[199] == pytest.approx(0.002 * (0.1 + 0.9 * (1 + 2 ** -0.5) / 2))  # a quarter of the way
    assert lrs[499] == pytest.approx(0.0002) and lrs[599] == pytest.approx(0.0002)  # final ratio, then held
    assert all(a >= b for a, b in zip(lrs[99:], lrs[100:]))            # never rises after the peak
    short = WarmupCosineLR(optimizer, warmup_steps=100, max_steps=25)  # a smoke test's run, shorter than warm-up
    assert lrs_of(optimizer, short, 25) == pytest.approx(lrs[:25])
    for bad, message in (({"warmup_steps": 0, "max_steps": 10}, "warmup_steps must be an integer >= 1, got 0"),
                         ({"warmup_steps": 10, "max_steps": 0}, "max_steps"),
                         ({"warmup_steps": 10.5, "max_steps": 20}, "warmup_steps .* got 10.5"),
                         ({"warmup_steps": True, "max_steps": 20}, "warmup_steps .* got True"),
                         ({"warmup_steps": 1, "max_steps": 10, "final_lr_ratio": 1.5}, r"\[0, 1\]"),
                         ({"warmup_steps": 1, "max_steps": 10, "final_lr_ratio": "0.1"}, "final_lr_ratio .* '0.1'")):
        with pytest.raises(ValueError, match=message):
            WarmupCosineLR(optimizer, **bad)
    params = [torch.nn.Parameter(torch.zeros(1))]
    with pytest.raises(ConfigError, match=r"scheduler_conf: unknown keys \['last_epoch'\]"):
        init_optimizer_and_scheduler(params, "adam", {"lr": 0.1}, "warmupcosinelr", {"last_epoch": 5}, 40)
    with pytest.raises(ConfigError, match=r"scheduler_conf: warmup_steps must be an integer"):
        init_optimizer_and_scheduler(params, "adam", {"lr": 0.1}, "warmuplr", {"warmup_steps": 2.5})


def test_max_steps_comes_from_the_trainer_unless_the_config_sets_it_and_a_resume_keeps_the_configs_shape():
    params = [torch.nn.Parameter(torch.zeros(1))]
    with pytest.raises(ConfigError, match=r"scheduler_conf.max_steps: warmupcosinelr needs .*shards or dynamic"):
        init_optimizer_and_scheduler(params, "adam", {"lr": 0.1}, "warmupcosinelr", {"warmup_steps": 2})
    _, scheduler = init_optimizer_and_scheduler(params, "adam", {"lr": 0.1}, "warmupcosinelr", {"warmup_steps": 2}, 40)
    assert scheduler.max_steps == 40
    _, scheduler = init_optimizer_and_scheduler(params, "adam", {"lr": 0.1}, "warmupcosinelr",
                                                {"warmup_steps": 2, "max_steps": 30}, 40)
    assert scheduler.max_steps == 30
    _, warmup = init_optimizer_and_scheduler(params, "adam", {"lr": 0.1}, "warmuplr", {"warmup_steps": 2}, 40)
    assert not hasattr(warmup, "max_steps")  # a schedule without an end takes no step count
    # 20 of 40 steps taken, resumed with twice the epochs: the rest of the cosine stretches to step 80
    optimizer, short = init_optimizer_and_scheduler(params, "adam", {"lr": 0.1}, "warmupcosinelr",
                                                    {"warmup_steps": 2}, 40)
    lrs_of(optimizer, short, 20)
    saved = {"optimizer": optimizer.state_dict(), "scheduler": short.state_dict()}
    optimizer, long = init_optimizer_and_scheduler(params, "adam", {"lr": 0.1}, "warmupcosinelr",
                                                   {"warmup_steps": 2}, 80)
    optimizer.load_state_dict(saved["optimizer"])  # as the engines restore: the optimizer, then the scheduler
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.1 * (1 + math.cos(math.pi * 19 / 38)) / 2)
    long.load_state_dict(saved["scheduler"])
    assert long.last_epoch == 20 and long.max_steps == 80
    # the first step after the resume already runs at the new shape's LR
    assert lrs_of(optimizer, long, 2) == pytest.approx([0.1 * (1 + math.cos(math.pi * s / 78)) / 2 for s in (19, 20)])
    # the same shape: the saved LR to the bit (exact resume)
    optimizer, again = init_optimizer_and_scheduler(params, "adam", {"lr": 0.1}, "warmupcosinelr",
                                                    {"warmup_steps": 2}, 40)
    optimizer.load_state_dict(saved["optimizer"])
    again.load_state_dict(saved["scheduler"])
    assert optimizer.param_groups[0]["lr"] == saved["optimizer"]["param_groups"][0]["lr"]


def test_unknown_optimizer_or_scheduler_lists_choices():
    params = [torch.nn.Parameter(torch.zeros(1))]
    with pytest.raises(ValueError, match=r"\['adam', 'adamw'\]"):
        init_optimizer_and_scheduler(params, "sgdd", {"lr": 1.0}, "warmuplr", {})
    with pytest.raises(ValueError, match=r"\['warmuplr', 'warmupcosinelr'\]"):
        init_optimizer_and_scheduler(params, "adam", {"lr": 1.0}, "cosine", {})


def test_unknown_optim_and_scheduler_keys_are_config_errors_listing_the_valid_ones():
    params = [torch.nn.Parameter(torch.zeros(3))]
    with pytest.raises(ConfigError, match=r"optim_conf: unknown keys \['lrr'\].*'lr'"):
        init_optimizer_and_scheduler(params, "adam", {"lrr": 0.1}, "warmuplr", {})
    with pytest.raises(ConfigError, match=r"scheduler_conf: unknown keys \['warmup'\].*'warmup_steps'"):
        init_optimizer_and_scheduler(params, "adamw", {"lr": 0.1}, "warmuplr", {"warmup": 3})


def test_the_optimizer_is_fused_unless_the_config_chooses():
    params = [torch.nn.Parameter(torch.randn(3))]
    optimizer, _ = init_optimizer_and_scheduler(params, "adam", {"lr": 0.1}, "warmuplr", {})
    assert optimizer.defaults["fused"] is True
    for conf in ({"lr": 0.1, "fused": False}, {"lr": 0.1, "foreach": True}):
        optimizer, _ = init_optimizer_and_scheduler(params, "adamw", conf, "warmuplr", {})
        assert not optimizer.defaults["fused"]
