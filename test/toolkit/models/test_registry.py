import json

import pytest
import torch

from toolkit.models.registry import init_model
from toolkit.models.transformer.asr_model import ASRModel
from toolkit.models.transformer.cmvn import GlobalCMVN
from toolkit.models.transformer.encoder import ConformerEncoder, TransformerEncoder
from toolkit.train_config import Config
from toolkit.utils.config_parsing import ConfigError

from .conftest import assert_equal_up_to_rounding


def _config(**overrides) -> Config:
    """Model sections of a config (input_dim 80 and vocab_size 30 are init_model's own arguments)."""
    config = dict(
        cmvn=None,
        encoder="conformer",
        encoder_conf=dict(output_size=32, attention_heads=4, linear_units=64, num_blocks=1,
                          dropout_rate=0.1, positional_dropout_rate=0.1,
                          attention_dropout_rate=0.0, input_layer="conv2d",
                          normalize_before=True, macaron_style=True, use_cnn_module=True,
                          cnn_module_kernel=15, cnn_module_norm="batch_norm",
                          activation_type="swish", pos_enc_layer_type="rel_pos",
                          selfattention_layer_type="rel_selfattn"),
        decoder="transformer",
        decoder_conf=dict(attention_heads=4, linear_units=64, num_blocks=1, dropout_rate=0.1,
                          positional_dropout_rate=0.1, self_attention_dropout_rate=0.0,
                          src_attention_dropout_rate=0.0),
        model_conf=dict(ctc_weight=0.3, lsm_weight=0.1, length_normalized_loss=False))
    config.update(overrides)
    return Config(**config)


def test_builds_conformer_with_global_cmvn_from_stats_file(tmp_path):
    path = tmp_path / "global_cmvn"
    path.write_text(json.dumps({"mean_stat": [20.0] * 80, "var_stat": [404.0] * 80,
                                "frame_num": 2}))
    model = init_model(_config(cmvn="global_cmvn", cmvn_conf={"cmvn_file": str(path)}), 80, 30)
    assert isinstance(model, ASRModel) and isinstance(model.encoder, ConformerEncoder)
    assert model.sos == model.eos == 29 and model.ctc_weight == 0.3
    cmvn = model.encoder.global_cmvn
    assert isinstance(cmvn, GlobalCMVN)
    # mean = 20 / 2 = 10, var = 404 / 2 - 10^2 = 102.
    assert torch.allclose(cmvn.mean, torch.full((80,), 10.0))
    assert torch.allclose(cmvn.istd, torch.full((80,), 102.0 ** -0.5))
    assert "encoder.global_cmvn.mean" in model.state_dict()
    assert model.decoder.output_layer.out_features == 30


def test_transformer_encoder_without_cmvn():
    encoder_conf = dict(output_size=32, attention_heads=4, linear_units=64, num_blocks=1,
                        pos_enc_layer_type="abs_pos", selfattention_layer_type="selfattn")
    model = init_model(_config(encoder="transformer", encoder_conf=encoder_conf), 80, 30)
    assert isinstance(model.encoder, TransformerEncoder)
    assert model.encoder.global_cmvn is None


def test_unknown_encoder_name_lists_choices():
    with pytest.raises(ValueError, match=r"\['conformer', 'transformer'\]"):
        init_model(_config(encoder="lstm"), 80, 30)
    with pytest.raises(ValueError, match=r"\['bitransformer', 'transformer'\]"):
        init_model(_config(decoder="rnn"), 80, 30)
    with pytest.raises(ValueError, match="global_cmvn"):
        init_model(_config(cmvn="utterance_cmvn"), 80, 30)


def test_unknown_conf_key_lists_valid_keys():
    config = _config()
    config.encoder_conf["num_layers"] = 2
    with pytest.raises(ValueError, match="num_layers.*num_blocks"):
        init_model(config, 80, 30)
    config = _config(model_conf=dict(ctc_weight=0.3, lsm=0.1))
    with pytest.raises(ValueError, match="lsm_weight"):
        init_model(config, 80, 30)
    # Keys filled in by init_model itself are not accepted from the config either.
    config = _config()
    config.decoder_conf["vocab_size"] = 10
    with pytest.raises(ValueError, match="vocab_size"):
        init_model(config, 80, 30)


def test_ctc_conf_builds_the_ctc_head_and_refuses_what_it_does_not_take():
    model = init_model(_config(ctc_conf={"upsample": 2, "dropout_rate": 0.1}), 80, 30)
    assert model.ctc.upsample == 2 and model.ctc.ctc_lo.weight.shape == (60, 32)
    assert init_model(_config(), 80, 30).ctc.ctc_lo.weight.shape == (30, 32)  # none: one CTC frame per encoder frame
    with pytest.raises(ConfigError, match=r"^ctc_conf: unknown key\(s\) \['odim'\] for CTC; valid: \['dropout_rate', "
                                          r"'upsample'\]"):
        init_model(_config(ctc_conf={"odim": 3}), 80, 30)
    with pytest.raises(ConfigError, match="ctc_conf: upsample must be an integer >= 1, got 0"):
        init_model(_config(ctc_conf={"upsample": 0}), 80, 30)


def test_encoder_conf_sets_the_time_reduction_and_a_bad_pair_is_a_config_error():
    encoder_conf = dict(output_size=32, attention_heads=4, linear_units=64, num_blocks=3, time_reduce_idx=1,
                        time_recover_idx=3)
    model = init_model(_config(encoder_conf=encoder_conf), 80, 30)
    assert model.encoder.time_reduction.depthwise.stride == (2,) and model.encoder.time_recover_idx == 3
    with pytest.raises(ConfigError, match=r"^encoder_conf: time_reduce_idx 1 and time_recover_idx 4: need 1 <= "):
        init_model(_config(encoder_conf=dict(encoder_conf, time_recover_idx=4)), 80, 30)


def test_scripted_encoder_and_decoder_with_cmvn_match_eager(tmp_path, tiny_fsdd):
    path = tmp_path / "global_cmvn"
    path.write_text(json.dumps({"mean_stat": [30.0] * 80, "var_stat": [500.0] * 80,
                                "frame_num": 2}))
    torch.manual_seed(0)
    model = init_model(_config(cmvn="global_cmvn", cmvn_conf={"cmvn_file": str(path)}), 80, 30).double().eval()
    feats, lengths = tiny_fsdd.batch(["george-0-01", "nicolas-6-00"])
    feats = feats.double()
    encoder = torch.jit.script(model.encoder)
    decoder = torch.jit.script(model.decoder)
    ys_in = torch.tensor([[29, 3, 4], [29, 5, 29]])
    ys_lens = torch.tensor([3, 2])
    with torch.no_grad():
        out, mask = model.encoder(feats, lengths)
        out_script, mask_script = encoder(feats, lengths)
        assert torch.equal(mask, mask_script)
        assert_equal_up_to_rounding(out, out_script)
        assert_equal_up_to_rounding(decoder(out, mask, ys_in, ys_lens), model.decoder(out, mask, ys_in, ys_lens))


def test_non_finite_cmvn_stats_are_refused_naming_the_file(tmp_path):
    # What compute_cmvn_stats.py wrote before it skipped audio holding NaN samples: NaN sums in every bin.
    path = tmp_path / "global_cmvn"
    path.write_text(json.dumps({"mean_stat": [float("nan")] * 80, "var_stat": [404.0] * 80, "frame_num": 2}))
    with pytest.raises(ConfigError, match=r"global_cmvn: NaN or infinite statistics in 80 of 80 bins \(first \[0, "):
        init_model(_config(cmvn="global_cmvn", cmvn_conf={"cmvn_file": str(path)}), 80, 30)
