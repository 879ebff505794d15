"""Two processes posing as two nodes (torchrun ``--nnodes=2 --nproc_per_node=1`` each, c10d rendezvous on
localhost: RANK 0/1, LOCAL_RANK 0/0) train with ``toolkit.bin.train`` into ONE shared model dir with step
checkpoints and ``keep_last_n``: every checkpoint is written once and deleted at most once, both by global rank 0
(each rank is its node's local main, so "local main writes" would write twice), and the averaging stage still
finds the best epochs."""

import os
import re
import signal
import subprocess
import sys
from collections import Counter

import torch

from toolkit.bin.average_model import main as average_main
from toolkit.utils.checkpoint import load_checkpoint

from test.helpers import REPO_ROOT, free_port

from .workers.recipe_data import ENV, train_args, write_data

# One run: ~30 s on 2 idle cores, several minutes on busy ones. A hang inside a collective fails sooner, at the
# process-group timeout (--pg_timeout_s 300); this bounds everything else.
TIMEOUT_S = 900


def run_two_nodes(args: list[str], log_dir) -> list[str]:
    """Start both "nodes" together; returns each one's stderr. Fails the test on a hang or a non-zero exit."""
    port = free_port()
    procs = []
    for node in range(2):
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", f"--node_rank={node}",
               "--nproc_per_node=1", "--rdzv_backend=c10d", f"--rdzv_endpoint=127.0.0.1:{port}",
               f"--rdzv_id=roles{port}", *args]
        log = open(log_dir / f"node{node}.log", "w")
        # Own session per node, so that a timeout kills torchrun's workers too, not only the launcher.
        procs.append((subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=ENV, cwd=REPO_ROOT,
                                       start_new_session=True), log))
    try:
        codes = [proc.wait(timeout=TIMEOUT_S) for proc, _ in procs]
    finally:
        for proc, log in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            log.close()
    logs = [open(log_dir / f"node{node}.log").read() for node in range(2)]
    assert codes == [0, 0], "\n".join(log[-3000:] for log in logs)
    return logs


def test_two_nodes_write_and_delete_each_checkpoint_once(tmp_path):
    write_data(tmp_path, num_train=32)  # 4 batches of 4 per rank and epoch
    exp = tmp_path / "exp"
    logs = run_two_nodes(train_args(tmp_path, exp, "dataset_conf.batch_conf.batch_size 4", "train_conf.max_epoch 2",
                                    "train_conf.save_interval_steps 2", "train_conf.keep_last_n 2",
                                    "train_conf.keep_best_n 2"), tmp_path)
    text = "".join(logs)
    assert "rank 1/2 (local 0/1)" in text and "rank 0/2 (local 0/1)" in text  # two nodes, one process each
    writes = re.findall(r"checkpoint: rank (\d+) wrote (\S+)", text)
    deletes = re.findall(r"checkpoint: rank (\d+) deleted (.+)", text)
    assert {rank for rank, _ in writes + deletes} == {"0"}
    written = Counter(os.path.basename(path) for _, path in writes)
    assert written == Counter(f"{tag}.pt" for tag in ("init", "step_2", "step_4", "epoch_0", "step_6", "step_8",
                                                       "epoch_1"))
    deleted = Counter(os.path.basename(path) for _, paths in deletes for path in paths.split(", "))
    # Oldest first, the commit marker before the .pt; epoch_0 is older than keep_last_n allows but is one of the
    # keep_best_n epochs by cv_loss.
    assert deleted == Counter(f"step_{n}{ext}" for n in (2, 4, 6) for ext in (".yaml", ".pt"))
    assert sorted(os.listdir(exp)) == sorted(["epoch_0.pt", "epoch_0.yaml", "epoch_1.pt", "epoch_1.yaml",
                                              "init.pt", "init.yaml", "step_8.pt", "step_8.yaml", "tb",
                                              "train.yaml", "units.txt", "global_cmvn"])
    dst = str(tmp_path / "avg_2.pt")
    average_main(["--src_path", str(exp), "--num", "2", "--val_best", "--dst_model", dst])
    # The average of the two kept epochs, value for value (mean in float64, as average_model accumulates).
    averaged = load_checkpoint(dst)["model"]
    epochs = [load_checkpoint(str(exp / f"epoch_{n}.pt"))["model"] for n in (0, 1)]
    assert set(averaged) == set(epochs[0]) == set(epochs[1])
    for key, value in averaged.items():
        if value.is_floating_point():
            expected = ((epochs[0][key].double() + epochs[1][key].double()) / 2).to(value.dtype)
            assert torch.equal(value, expected), key
        else:  # integer buffers come from the newest checkpoint
            assert torch.equal(value, epochs[1][key]), key
    assert not torch.equal(epochs[0]["encoder.embed.out.weight"], epochs[1]["encoder.embed.out.weight"])
