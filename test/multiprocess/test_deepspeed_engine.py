"""The deepspeed engine on 2 real gloo ranks (CPU): the same weights as torch_ddp (within the float32 rounding bound of
``worker_engine.RoundingBound``), uneven data, consolidated checkpoints (``--drop_shards``)."""

import os

from toolkit.utils.checkpoint import MODEL_KEY, load_checkpoint

from .workers.launch import train_engine_ranks
from .workers.tiny_ctc import TinyCTC, assert_within_rounding


def test_zero0_fp32_matches_torch_ddp_for_10_steps(tmp_path):
    linear_sgd = ("--model", "linear", "--optim", "sgd")
    ddp = train_engine_ranks(tmp_path / "ddp", "10", "10", *linear_sgd, "--record_bound")
    ds = train_engine_ranks(tmp_path / "ds0", "10", "10", *linear_sgd, "--engine", "deepspeed", "--stage", "0")
    for rank in range(2):
        assert ddp[rank]["steps"] == ds[rank]["steps"] == 10
        assert len(ds[rank]["losses"]) == 10
        assert ds[rank]["losses"][0] == ddp[rank]["losses"][0]  # the same weights before the first step
        assert ds[rank]["lr"] == ddp[rank]["lr"]
    assert ds[0]["params"] == ds[1]["params"]
    assert_within_rounding(ds[0], ddp[0])
    assert ds[0]["losses"][-1] < ds[0]["losses"][0]  # it trained


def test_uneven_data_finishes_with_the_same_step_count_and_drops_shards(tmp_path):
    path = str(tmp_path / "epoch_0.pt")
    r0, r1 = train_engine_ranks(tmp_path, "5", "3", "--engine", "deepspeed", "--stage", "1", "--save", path, "--drop_shards")
    assert r0["steps"] == r1["steps"] == 3
    assert (r0["dropped"], r1["dropped"]) == (2, 0)
    assert r0["params"] == r1["params"]
    # --drop_shards: only the consolidated checkpoint is left, and it holds the trained weights.
    assert os.path.exists(path) and os.path.exists(str(tmp_path / "epoch_0.yaml"))
    assert not os.path.exists(str(tmp_path / "epoch_0"))
    model = TinyCTC()
    model.load_state_dict(load_checkpoint(path)[MODEL_KEY])
    for key, tensor in model.state_dict().items():
        assert tensor.flatten().tolist() == r0["params_at_save"][key]  # a copy of the fp32 weights, bit for bit
