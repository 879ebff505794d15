"""An ``epoch_N.pt`` written by 2 ranks resumes on 1 and on 3 (torch_ddp, real tiny_fsdd pipeline).

What carries over: the weights, the optimizer and the scheduler, which counts optimizer steps (so warmup and decay go
on from the checkpoint's step), and the epoch. What changes: the global batch (ranks x batch_size x accum_grad) and
so the steps per epoch; the per-rank states (RNG, partial statistics) belong to ranks that no longer exist and are
not restored (a warning says so); at an epoch boundary there is nothing partial to lose.
"""

import pytest
import yaml

from toolkit.utils.checkpoint import load_checkpoint

from .recipe_data import TIMEOUT_S, copy_checkpoint, run_standalone, train_args, write_data


@pytest.fixture(scope="module")
def two_rank_epoch_0(tmp_path_factory):
    root = tmp_path_factory.mktemp("world_size")
    write_data(root)
    proc = run_standalone(train_args(root, root / "two", "train_conf.max_epoch 1"), TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return root


@pytest.mark.parametrize("nproc", [1, 3])
def test_an_epoch_checkpoint_resumes_on_another_world_size(two_rank_epoch_0, nproc):
    root = two_rank_epoch_0
    before = yaml.safe_load(open(root / "two" / "epoch_0.yaml"))
    out = root / f"on{nproc}"
    path = copy_checkpoint(root / "two", out, "epoch_0")
    proc = run_standalone(train_args(root, out, "train_conf.max_epoch 2") + ["--checkpoint", path], TIMEOUT_S,
                          nproc=nproc)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert f"was saved by 2 ranks, this job has {nproc}; not restored" in proc.stderr
    after = yaml.safe_load(open(out / "epoch_1.yaml"))
    # every utterance of the list is accounted for in the resumed epoch, on the new number of ranks
    assert after["train_utts"] + after["dropped_utts"] + sum(after["skipped"].values()) == 82
    assert after["epoch"] == 1 and after["step"] > before["step"]
    state = load_checkpoint(str(out / "epoch_1.pt"))
    assert state["scheduler"]["last_epoch"] == after["step"]  # the schedule went on from the checkpoint's step
