import pytest
import torch

from toolkit.utils.config import ConfigError
from toolkit.utils.scheduler import WarmupLR, init_optimizer_and_scheduler


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
