import glob
import math
import os

import pytest

from toolkit.engine.train_conf import resolve_train_conf
from toolkit.models.registry import init_model
from toolkit.train_config import read_config
from toolkit.utils.config_parsing import ConfigError, apply_overrides, load_config

from test.helpers import REPO_ROOT

BASE = {"train_conf": {"max_epoch": 10, "grad_clip": 5.0, "dtype": "fp32"},
        "model_conf": {"ctc_weight": 0.3, "length_normalized_loss": False},
        "cmvn": "global_cmvn", "cmvn_conf": {"cmvn_file": "data/train/global_cmvn"}, "encoder": "conformer",
        "dataset_conf": {"speeds": [1.0], "filter_conf": {"max_length": 2000, "min_length": 10}},
        "tokenizer_conf": {"symbol_table_path": "units.txt"}}
RECIPE_YAML = os.path.join(REPO_ROOT, "examples", "english", "s0", "conf",
                           "train_conformer.yaml")
# Every training config the recipe ships, with the parameter count its docs state (examples/english/s0/README.md,
# docs/multi-gpu-and-nodes.md) for the recipe's dictionary of 31 units.
SHIPPED_PARAMETERS = {"train_conformer.yaml": 2_811_901, "train_conformer_gpu.yaml": 42_986_333,
                      "train_u2pp_conformer.yaml": 2_811_901,
                      "train_tiny.yaml": 553_022}


def test_override_is_typed_like_the_value_it_replaces():
    out = apply_overrides(BASE, ["train_conf.max_epoch 3", "train_conf.grad_clip=1", "model_conf.ctc_weight 0.5",
                                 "model_conf.length_normalized_loss true", "cmvn_conf.cmvn_file data/cmvn",
                                 "encoder transformer", "tokenizer_conf.symbol_table_path 123"])
    assert out["train_conf"]["max_epoch"] == 3 and isinstance(out["train_conf"]["max_epoch"], int)
    assert out["train_conf"]["grad_clip"] == 1.0 and isinstance(out["train_conf"]["grad_clip"], float)
    assert out["model_conf"]["ctc_weight"] == 0.5
    assert out["model_conf"]["length_normalized_loss"] is True
    assert out["cmvn_conf"]["cmvn_file"] == "data/cmvn"
    assert out["encoder"] == "transformer"
    assert out["tokenizer_conf"]["symbol_table_path"] == "123"  # a string key keeps the text as typed
    assert BASE["train_conf"]["max_epoch"] == 10  # the input is not modified


def test_override_values_are_yaml_null_turns_off_and_malformed_yaml_is_a_config_error():
    # The shipped case override-null: YAML null for a string key (global CMVN can be switched off) ...
    assert apply_overrides(BASE, ["cmvn null"])["cmvn"] is None
    assert apply_overrides(BASE, ["cmvn_conf.cmvn_file ~"])["cmvn_conf"]["cmvn_file"] is None
    # ... and malformed YAML is one line naming the key, not a yaml traceback.
    for item, key in (("dataset_conf.speeds [0.9, 1.1", "dataset_conf.speeds"),
                      ("tokenizer_conf {symbol_table_path: x", "tokenizer_conf")):
        with pytest.raises(ConfigError, match=f"override {key}: .* is not valid YAML"):
            apply_overrides(BASE, [item])


def test_a_whole_section_override_keeps_the_yaml_values_it_does_not_name():
    out = apply_overrides(BASE, ["dataset_conf.filter_conf {max_length: 500}"])
    assert out["dataset_conf"]["filter_conf"] == {"max_length": 500, "min_length": 10}
    config = read_config(RECIPE_YAML, ["dataset_conf {batch_conf: {batch_size: 4}}"])
    yaml_filter = load_config(RECIPE_YAML)["dataset_conf"]["filter_conf"]
    assert config.dataset_conf.batch_conf.batch_size == 4
    assert config.dataset_conf.filter_conf.token_max_length == yaml_filter["token_max_length"] == 400  # not 200


def test_unknown_override_key_lists_valid_keys():
    with pytest.raises(ConfigError, match=r"unknown key 'max_epochs'.*\['dtype', 'grad_clip', 'max_epoch'\]"):
        apply_overrides(BASE, ["train_conf.max_epochs 3"])
    # a key of an untyped section that the YAML does not set: the message shows the mapping form, which adds it
    with pytest.raises(ConfigError, match=r"unknown key 'max_steps' at scheduler_conf; valid keys: \['warmup_steps'\]"
                                          r" .*'scheduler_conf \{max_steps: value\}'"):
        read_config(RECIPE_YAML, ["scheduler_conf.max_steps 7520"])
    assert read_config(RECIPE_YAML, ["scheduler_conf {max_steps: 7520}"]).scheduler_conf == {
        "warmup_steps": 1500, "max_steps": 7520}
    with pytest.raises(ConfigError, match="expected an integer"):
        apply_overrides(BASE, ["train_conf.max_epoch three"])
    with pytest.raises(ConfigError, match="expected an integer"):
        apply_overrides(BASE, ["train_conf.max_epoch true"])
    with pytest.raises(ConfigError, match="expected"):
        apply_overrides(BASE, ["train_conf.max_epoch"])
    with pytest.raises(ConfigError, match="expected a YAML mapping"):
        apply_overrides(BASE, ["train_conf 3"])


def test_read_config_resolves_every_section_once_and_any_section_key_can_be_overridden():
    config = read_config(RECIPE_YAML, ["train_conf.keep_last_n 2", "dataset_conf.batch_conf.max_frames_in_batch 900",
                                       "cmvn null"])
    assert config.train_conf.keep_last_n == 2  # not in the YAML: the section's defaults make it overridable
    assert config.dataset_conf.batch_conf.max_frames_in_batch == 900
    assert config.cmvn is None
    assert config.input_dim == config.dataset_conf.fbank_conf.num_mel_bins == 80


def test_train_yaml_round_trips(tmp_path):
    config = read_config(RECIPE_YAML, ["train_conf.max_epoch 2"])
    config.save(str(tmp_path / "train.yaml"))
    assert read_config(str(tmp_path / "train.yaml")) == config


@pytest.mark.parametrize("given, message", [
    ({"grad_clipping": 1.0}, r"unknown keys \['grad_clipping'\]"),
    ({"dtype": "fp8"}, r"train_conf.dtype: 'fp8' is not one of \['fp32', 'bf16', 'fp16'\]"),
    ({"max_epoch": True}, "train_conf.max_epoch: expected an integer, got True"),
    ({"max_epoch": 0}, "train_conf.max_epoch must be a positive integer"),
    ({"grad_clip": math.nan}, "train_conf.grad_clip: expected a finite number"),
    ({"grad_clip": -1.0}, "train_conf.grad_clip must be a non-negative number"),
    ({"save_interval_minutes": math.inf}, "train_conf.save_interval_minutes: expected a finite number"),
    ({"max_train_minutes": -1.0}, "train_conf.max_train_minutes must be a non-negative number"),
    ({"join_timeout_s": math.nan}, "train_conf.join_timeout_s: expected a finite number"),
    ({"seed": "777"}, "train_conf.seed: expected an integer"),
])
def test_train_conf_checks_every_key_type_and_range(given, message):
    assert resolve_train_conf({"max_epoch": 2}).accum_grad == 1
    with pytest.raises(ConfigError, match=message):
        resolve_train_conf(given)


def test_load_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(str(tmp_path / "missing.yaml"))
    bad = tmp_path / "bad.yaml"
    bad.write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_config(str(bad))
    bad.write_text("train_conf: {max_epoch: 3\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(str(bad))
    bad.write_text("train_conf: {max_epoch: 3}\nencoder_layers: 4\n")
    with pytest.raises(ConfigError, match=r"unknown keys \['encoder_layers'\]; valid keys: \['cmvn'"):
        read_config(str(bad))


@pytest.mark.parametrize("text", ["nan", ".nan", "inf", ".inf", "-.inf", "-1", "1e999", '"5"', "true", "null"])
def test_grad_clip_must_be_a_finite_non_negative_number(text):
    # Through the command line as a user types it: refused in one line naming the key, by the override's own
    # parse or by the typed section.
    with pytest.raises(ConfigError, match=r"train_conf.grad_clip"):
        resolve_train_conf(apply_overrides({"train_conf": {"grad_clip": 5.0}},
                                           [f"train_conf.grad_clip {text}"])["train_conf"])


def test_grad_clip_zero_disables_clipping_and_integers_are_numbers():
    assert resolve_train_conf({"grad_clip": 0}).grad_clip == 0.0
    assert resolve_train_conf({"grad_clip": 1}).grad_clip == 1.0


def test_every_shipped_recipe_config_is_listed_here():
    shipped = {os.path.basename(p) for p in glob.glob(os.path.join(os.path.dirname(RECIPE_YAML), "*.yaml"))}
    assert shipped == set(SHIPPED_PARAMETERS)


@pytest.mark.parametrize("name, parameters", sorted(SHIPPED_PARAMETERS.items()))
def test_every_shipped_recipe_config_reads_and_builds_the_model_its_docs_state(name, parameters):
    # cmvn null: the recipe's CMVN file is written by its stage 1; it holds no parameter
    config = read_config(os.path.join(os.path.dirname(RECIPE_YAML), name), ["cmvn null"])
    model = init_model(config, config.input_dim, 31)
    assert sum(p.numel() for p in model.parameters()) == parameters
