"""The deepspeed engine on 2 real gloo ranks (CPU): same losses as torch_ddp, uneven data, consolidated checkpoints
(``--drop_shards``)."""

import json
import os

import pytest
from toolkit.utils.checkpoint import MODEL_KEY, load_checkpoint

from .launch import run_ranks
from .tiny_ctc import TinyCTC

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "worker_engine.py")


def train(out_dir, *args, timeout=240):
    """Run the worker on 2 ranks; returns both ranks' reports."""
    os.makedirs(out_dir, exist_ok=True)
    proc = run_ranks(WORKER, str(out_dir), *args, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return [json.load(open(os.path.join(out_dir, f"rank{r}.json"))) for r in range(2)]


@pytest.fixture(scope="module")
def ddp_and_zero0(tmp_path_factory):
    base = tmp_path_factory.mktemp("compare")
    return (train(base / "ddp", "10", "10"),
            train(base / "ds0", "10", "10", "--engine", "deepspeed", "--stage", "0"))


def test_zero0_fp32_matches_torch_ddp_for_10_steps(ddp_and_zero0):
    ddp, ds = ddp_and_zero0
    for rank in range(2):
        assert ddp[rank]["steps"] == ds[rank]["steps"] == 10
        assert len(ds[rank]["losses"]) == 10
        assert ds[rank]["losses"] == pytest.approx(ddp[rank]["losses"], abs=1e-5)
        assert ds[rank]["lr"] == pytest.approx(ddp[rank]["lr"], rel=1e-12)
    assert ds[0]["params"] == ds[1]["params"]
    for key, values in ddp[0]["params"].items():
        assert ds[0]["params"][key] == pytest.approx(values, abs=1e-5)
    # Real learning on real speech, not a constant: the loss falls over the 10 steps on both engines.
    assert ds[0]["losses"][-1] < ds[0]["losses"][0]
    ddp_ms = 1000 * sorted(ddp[0]["step_s"])[len(ddp[0]["step_s"]) // 2]
    ds_ms = 1000 * sorted(ds[0]["step_s"])[len(ds[0]["step_s"]) // 2]
    print(f"median step: torch_ddp {ddp_ms:.1f} ms, deepspeed zero0 {ds_ms:.1f} ms")


def test_uneven_data_finishes_with_the_same_step_count_and_drops_shards(tmp_path):
    path = str(tmp_path / "epoch_0.pt")
    r0, r1 = train(tmp_path, "5", "3", "--engine", "deepspeed", "--stage", "1", "--save", path, "--drop_shards")
    assert r0["steps"] == r1["steps"] == 3
    assert (r0["dropped"], r1["dropped"]) == (2, 0)
    assert r0["params"] == r1["params"]
    # --drop_shards: only the consolidated checkpoint is left, and it holds the trained weights.
    assert os.path.exists(path) and os.path.exists(str(tmp_path / "epoch_0.yaml"))
    assert not os.path.exists(str(tmp_path / "epoch_0"))
    model = TinyCTC()
    model.load_state_dict(load_checkpoint(path)[MODEL_KEY])
    for key, tensor in model.state_dict().items():
        assert tensor.flatten().tolist() == pytest.approx(r0["params_at_save"][key], abs=1e-7)
