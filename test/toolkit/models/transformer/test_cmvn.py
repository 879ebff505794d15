import json

import pytest
import torch

from toolkit.models.transformer.cmvn import GlobalCMVN, load_global_cmvn
from toolkit.utils.config_parsing import ConfigError


def test_stats_file_gives_zero_mean_unit_variance_on_its_data(tmp_path, tiny_fsdd):
    feats = torch.cat([tiny_fsdd.fbank(key) for key in ["george-0-01", "lucas-5-01"]]).double()
    stats = {"mean_stat": feats.sum(0).tolist(), "var_stat": (feats ** 2).sum(0).tolist(),
             "frame_num": feats.size(0)}
    path = tmp_path / "global_cmvn"
    path.write_text(json.dumps(stats))
    mean, istd = load_global_cmvn(str(path))
    assert mean.dtype == torch.float32 and mean.shape == (80,)
    cmvn = GlobalCMVN(mean, istd)
    normalised = cmvn(feats.float().unsqueeze(0))[0]
    assert torch.allclose(normalised.mean(0), torch.zeros(80), atol=1e-3)
    assert torch.allclose(normalised.std(0, unbiased=False), torch.ones(80), atol=1e-3)
    assert set(cmvn.state_dict()) == {"mean", "istd"}


def test_a_missing_or_broken_stats_file_is_a_one_line_config_error(tmp_path):
    missing = str(tmp_path / "global_cmvn")
    with pytest.raises(ConfigError, match=r"global_cmvn: No such file.*compute_cmvn_stats.py.*cmvn: null"):
        load_global_cmvn(missing)
    broken = tmp_path / "broken"
    broken.write_text('{"mean_stat": [1.0]')
    with pytest.raises(ConfigError, match="broken: not JSON"):
        load_global_cmvn(str(broken))
    broken.write_text(json.dumps({"mean_stat": [1.0], "var_stat": [1.0, 2.0], "frame_num": 3}))
    with pytest.raises(ConfigError, match=r"inconsistent stats \(mean_stat \(1,\), var_stat \(2,\)"):
        load_global_cmvn(str(broken))
    broken.write_text(json.dumps({"mean_stat": [1.0], "var_stat": [1.0]}))
    with pytest.raises(ConfigError, match=r"no \['frame_num'\]"):
        load_global_cmvn(str(broken))
