"""DeepSpeed ZeRO stages 1-3 against torch_ddp on 2 real gloo ranks, including the end of an epoch that falls inside
a gradient accumulation: the last micro-batches of the epoch still make an optimizer step on every engine (the join
tells every rank which batch is the last), so no gradient is lost at the epoch end or leaks into the next epoch.
Weights are compared within the float32 rounding bound of ``worker_engine.RoundingBound`` (see
``test_deepspeed_accum.py``)."""

import os

import pytest

from test.helpers import read_rank_reports

from .workers.launch import WORKERS, run_ranks
from .workers.tiny_ctc import assert_within_rounding

WORKER = str(WORKERS / "worker_engine.py")


def train(out_dir, *args):
    """Two 'epochs' of 5 and 4 micro-batches per rank (9 in all), accum_grad 2."""
    os.makedirs(out_dir, exist_ok=True)
    proc = run_ranks(WORKER, str(out_dir), "9", "9", "--accum_grad", "2", "--save_after", "5", "--model", "linear",
                     "--optim", "sgd", "--grad_clip", "0", *args, timeout=300)  # no clipping: it hides a wrong scale
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return read_rank_reports(out_dir, 2)


@pytest.fixture(scope="module")
def ddp(tmp_path_factory):
    return train(tmp_path_factory.mktemp("ddp"), "--record_bound")


def test_torch_ddp_steps_on_the_epochs_last_partial_accumulation(ddp):
    # Epoch 1: micro-batches 1-2, 3-4 and the lone 5th make 3 steps; epoch 2: 6-7, 8-9 make 2.
    assert ddp[0]["steps"] == ddp[1]["steps"] == 5
    assert ddp[0]["params"] == ddp[1]["params"]


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_zero_stage_matches_torch_ddp_across_an_epoch_end_inside_an_accumulation(ddp, tmp_path, stage):
    ds = train(tmp_path, "--engine", "deepspeed", "--stage", str(stage))
    for rank in range(2):
        assert ds[rank]["steps"] == 5
        assert ds[rank]["lr"] == ddp[rank]["lr"]
        assert ds[rank]["losses"][:2] == ddp[rank]["losses"][:2]  # the same weights until the first step
    assert_within_rounding(ds[0], ddp[0])
    assert ds[1]["params"] == ds[0]["params"]
