import pytest

from toolkit.utils.config import (ConfigError, apply_overrides, check_modify_and_save_config, load_config,
                                  resolve_train_conf)

BASE = {"train_conf": {"max_epoch": 10, "grad_clip": 5.0, "dtype": "fp32"},
        "model_conf": {"ctc_weight": 0.3, "length_normalized_loss": False},
        "cmvn_conf": {"cmvn_file": None}, "encoder": "conformer"}


def test_override_is_typed_like_the_value_it_replaces():
    out = apply_overrides(BASE, ["train_conf.max_epoch 3", "train_conf.grad_clip=1", "model_conf.ctc_weight 0.5",
                                 "model_conf.length_normalized_loss true", "cmvn_conf.cmvn_file data/cmvn",
                                 "encoder transformer"])
    assert out["train_conf"]["max_epoch"] == 3 and isinstance(out["train_conf"]["max_epoch"], int)
    assert out["train_conf"]["grad_clip"] == 1.0 and isinstance(out["train_conf"]["grad_clip"], float)
    assert out["model_conf"]["ctc_weight"] == 0.5
    assert out["model_conf"]["length_normalized_loss"] is True
    assert out["cmvn_conf"]["cmvn_file"] == "data/cmvn"
    assert out["encoder"] == "transformer"
    assert BASE["train_conf"]["max_epoch"] == 10  # the input is not modified


def test_unknown_override_key_lists_valid_keys():
    with pytest.raises(ConfigError, match=r"unknown key 'max_epochs'.*\['dtype', 'grad_clip', 'max_epoch'\]"):
        apply_overrides(BASE, ["train_conf.max_epochs 3"])
    with pytest.raises(ConfigError, match="expected an integer"):
        apply_overrides(BASE, ["train_conf.max_epoch three"])
    with pytest.raises(ConfigError, match="expected"):
        apply_overrides(BASE, ["train_conf.max_epoch"])
    with pytest.raises(ConfigError, match="expected a YAML dict"):
        apply_overrides(BASE, ["train_conf 3"])


def test_train_conf_validation():
    assert resolve_train_conf({"train_conf": {"max_epoch": 2}})["accum_grad"] == 1
    with pytest.raises(ConfigError, match="unknown keys \\['grad_clipping'\\]"):
        resolve_train_conf({"train_conf": {"grad_clipping": 1.0}})
    with pytest.raises(ConfigError, match="'fp8' is not one of"):
        resolve_train_conf({"train_conf": {"dtype": "fp8"}})


def test_check_modify_and_save_config_writes_effective_config(tmp_path):
    units = tmp_path / "units.txt"
    units.write_text("<blank> 0\n<unk> 1\nA 2\nB 3\n<sos/eos> 4\n")
    config = {"encoder": "conformer", "decoder": "transformer", "tokenizer_conf": {"symbol_table_path": str(units)},
              "dataset_conf": {"fbank_conf": {"num_mel_bins": 40}}, "train_conf": {"max_epoch": 2}}
    out = check_modify_and_save_config(config, str(tmp_path / "exp"), is_main=True)
    assert out["output_dim"] == 5 and out["input_dim"] == 40
    saved = load_config(str(tmp_path / "exp" / "train.yaml"))
    assert saved["output_dim"] == 5 and saved["train_conf"]["grad_clip"] == 5.0
    assert not (tmp_path / "other").exists()
    check_modify_and_save_config(config, str(tmp_path / "other"), is_main=False)
    assert not (tmp_path / "other").exists()  # only rank 0 writes


def test_load_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(str(tmp_path / "missing.yaml"))
    bad = tmp_path / "bad.yaml"
    bad.write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_config(str(bad))


@pytest.mark.parametrize("key", ["save_interval_minutes", "join_timeout_s"])
def test_nan_and_inf_seconds_are_rejected(key):
    for value in (float("nan"), float("inf")):
        with pytest.raises(ConfigError, match=f"train_conf.{key}"):
            resolve_train_conf({"train_conf": {key: value}})


@pytest.mark.parametrize("text", ["nan", "inf", "-inf", "-1", "1e999"])
def test_grad_clip_must_be_a_finite_non_negative_number(text):
    # Through the command line as a user types it: parsed as a float, then refused in one line naming the key.
    config = apply_overrides({"train_conf": {"grad_clip": 5.0}}, [f"train_conf.grad_clip {text}"])
    with pytest.raises(ConfigError, match=r"train_conf.grad_clip must be a finite number >= 0 .*0 disables"):
        resolve_train_conf(config)


@pytest.mark.parametrize("value", [float("nan"), "5", True, None])
def test_grad_clip_of_another_type_is_refused(value):
    with pytest.raises(ConfigError, match="train_conf.grad_clip"):
        resolve_train_conf({"train_conf": {"grad_clip": value}})


def test_grad_clip_zero_disables_clipping_and_integers_are_numbers():
    assert resolve_train_conf({"train_conf": {"grad_clip": 0}})["grad_clip"] == 0
    assert resolve_train_conf({"train_conf": {"grad_clip": 1}})["grad_clip"] == 1
