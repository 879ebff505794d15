"""The one validator between the DeepSpeed JSON and the training YAML, and the shard-file naming."""

import dataclasses
import glob
import os

import pytest

from toolkit.distributed.context import DistContext
from toolkit.engine import init_engine
from toolkit.engine.deepspeed import check_deepspeed_config, expected_shard_files, load_deepspeed_config
from toolkit.engine.train_conf import resolve_train_conf
from toolkit.train_config import read_config
from toolkit.utils.config_parsing import ConfigError

from test.helpers import REPO_ROOT

RECIPE_CONF = os.path.join(REPO_ROOT, "examples", "english", "s0", "conf")
RECIPE_YAMLS = sorted(os.path.basename(p) for p in glob.glob(os.path.join(RECIPE_CONF, "*.yaml")))  # every one shipped
TRAIN_CONF = resolve_train_conf({"accum_grad": 4, "grad_clip": 5.0, "dtype": "bf16"})
STATIC = 16  # a static batch of 16 utterances


def test_absent_keys_are_filled_from_the_yaml():
    conf = check_deepspeed_config({"zero_optimization": {"stage": 2}}, TRAIN_CONF, STATIC)
    assert conf["train_micro_batch_size_per_gpu"] == 16
    assert conf["gradient_accumulation_steps"] == 4
    assert conf["gradient_clipping"] == 5.0
    assert conf["bf16"] == {"enabled": True} and conf["fp16"] == {"enabled": False}


def test_each_mismatch_names_both_values():
    ds = {"train_micro_batch_size_per_gpu": 8, "gradient_accumulation_steps": 2, "gradient_clipping": 1.0,
          "bf16": {"enabled": False}}
    with pytest.raises(ConfigError) as e:
        check_deepspeed_config(ds, TRAIN_CONF, STATIC, "conf/ds.json")
    message = str(e.value)
    assert "train_micro_batch_size_per_gpu = 8 but dataset_conf.batch_conf.batch_size = 16" in message
    assert "gradient_accumulation_steps = 2 but train_conf.accum_grad = 4" in message
    assert "gradient_clipping = 1.0 but train_conf.grad_clip = 5.0" in message
    assert "bf16.enabled = False but train_conf.dtype = bf16" in message
    assert message.count("conf/ds.json") == 4


def test_dynamic_batches_skip_the_micro_batch_pair_and_optimizer_sections_are_refused():
    conf = check_deepspeed_config({}, TRAIN_CONF, None)  # dynamic batches: no micro batch size
    assert conf["train_micro_batch_size_per_gpu"] == 1
    with pytest.raises(ConfigError, match="'optimizer' is not allowed"):
        check_deepspeed_config({"optimizer": {"type": "Adam"}}, TRAIN_CONF, STATIC)
    with pytest.raises(ConfigError, match="train_batch_size"):
        check_deepspeed_config({"train_batch_size": 64}, TRAIN_CONF, STATIC)


@pytest.mark.parametrize("yaml_name", RECIPE_YAMLS)
@pytest.mark.parametrize("stage", [1, 2, 3])
def test_shipped_json_agrees_with_the_recipe_yaml(stage, yaml_name):
    # The recipe pairs each shipped JSON with its YAMLs (run.sh --train_engine deepspeed): the JSON's values must
    # agree with what the YAML says, and what the JSON leaves out is taken from the YAML.
    config = read_config(os.path.join(RECIPE_CONF, yaml_name))
    train_conf, batch_conf = config.train_conf, config.dataset_conf.batch_conf
    ds = load_deepspeed_config(os.path.join(RECIPE_CONF, f"ds_stage{stage}.json"))
    conf = check_deepspeed_config(ds, train_conf, batch_conf.batch_size)
    assert conf["zero_optimization"]["stage"] == stage
    assert conf["train_micro_batch_size_per_gpu"] == batch_conf.batch_size
    assert conf["gradient_accumulation_steps"] == train_conf.accum_grad
    assert conf["gradient_clipping"] == train_conf.grad_clip
    assert conf["bf16"]["enabled"] == (train_conf.dtype == "bf16")


def test_bad_json_and_wrong_engine_are_config_errors(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        load_deepspeed_config(str(bad))
    with pytest.raises(ConfigError, match="only with it"):
        init_engine("torch_ddp", DistContext(), TRAIN_CONF, False, deepspeed_config=str(bad))
    with pytest.raises(ConfigError, match="only with it"):
        init_engine("deepspeed", DistContext(), TRAIN_CONF, False)


def test_shard_file_names():
    assert expected_shard_files("/m", "epoch_1", 2, 0, False) == ["/m/epoch_1/mp_rank_00_model_states.pt"]
    assert expected_shard_files("/m", "epoch_1", 2, 2, True) == [
        "/m/epoch_1/mp_rank_00_model_states.pt",
        "/m/epoch_1/bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt",
        "/m/epoch_1/bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt"]
    assert expected_shard_files("/m", "t", 2, 3, False)[:2] == [
        "/m/t/zero_pp_rank_0_mp_rank_00_model_states.pt", "/m/t/zero_pp_rank_1_mp_rank_00_model_states.pt"]


def test_monitored_barrier_join_refuses_zero_accumulation():
    monitored = dataclasses.replace(TRAIN_CONF, join_mode="monitored_barrier")
    with pytest.raises(ConfigError, match="join_mode flag"):
        check_deepspeed_config({"zero_optimization": {"stage": 2}}, monitored, STATIC)
    # accum_grad 1, ZeRO-0 or the flag join are fine.
    check_deepspeed_config({"zero_optimization": {"stage": 2}}, dataclasses.replace(monitored, accum_grad=1), STATIC)
    check_deepspeed_config({"zero_optimization": {"stage": 0}}, monitored, STATIC)
    check_deepspeed_config({"zero_optimization": {"stage": 2}}, TRAIN_CONF, STATIC)


def test_compile_goes_with_zero_0_1_2_not_3():
    compiled = dataclasses.replace(TRAIN_CONF, compile=True)
    for stage in (0, 1, 2):
        check_deepspeed_config({"zero_optimization": {"stage": stage}}, compiled, STATIC)
    with pytest.raises(ConfigError, match="ZeRO stage 3 with train_conf.compile true is not supported"):
        check_deepspeed_config({"zero_optimization": {"stage": 3}}, compiled, STATIC)
