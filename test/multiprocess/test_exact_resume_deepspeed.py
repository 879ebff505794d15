"""Exact mid-epoch resume with ``--train_engine deepspeed`` (ZeRO-2, 2 gloo ranks, the real tiny_fsdd pipeline and
the tiny conformer): the job resumed from a copy of ``step_8`` (its ``.pt``, ``.yaml`` and ZeRO shard dir) in
fresh processes ends epoch 1 bit-identical to the uninterrupted job: consolidated model, scheduler, epoch YAML,
and each rank's shard of the Adam state."""

import os

import pytest
import torch

from .workers.recipe_data import assert_bit_identical, assert_same_epoch_1, deepspeed_args, uninterrupted_and_resumed


@pytest.mark.parametrize("stage", [2])
def test_deepspeed_mid_epoch_resume_is_bit_identical(tmp_path, stage):
    full, resumed = uninterrupted_and_resumed(tmp_path, *deepspeed_args(stage))
    assert_same_epoch_1(full, resumed)
    shards = sorted(f for f in os.listdir(full / "epoch_1") if "optim_states" in f)
    assert len(shards) == 2  # one ZeRO partition of the Adam state per rank
    for name in shards + ["mp_rank_00_model_states.pt"]:
        a = torch.load(full / "epoch_1" / name, map_location="cpu", weights_only=False)
        b = torch.load(resumed / "epoch_1" / name, map_location="cpu", weights_only=False)
        key = "optimizer_state_dict" if "optim" in name else "module"
        assert_bit_identical(a[key], b[key], name)
