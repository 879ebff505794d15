"""One rank of a failure test: both ranks train TinyCTC (torch_ddp, flag join) on real tiny_fsdd batches; after 2
steps rank 1's data loader either raises or blocks forever, while rank 0 goes on to the next step.

    worker_failure.py OUT_DIR {raise,hang} --pg_timeout_s S

Writes ``rank1_failed_at.txt`` (wall-clock time when rank 1 broke) and, if rank 0 lives to see an error,
``rank0_error.json`` (when, the exception type and message).
"""

import argparse
import json
import os
import time

import torch

from toolkit.distributed.context import destroy_distributed, init_distributed
from toolkit.distributed.join import init_join
from toolkit.engine.train_conf import resolve_train_conf

from tiny_ctc import executor_for, make_batch, prepared_ddp_engine, utterances

parser = argparse.ArgumentParser()
parser.add_argument("out_dir")
parser.add_argument("failure", choices=("raise", "hang"))
parser.add_argument("--pg_timeout_s", type=float, required=True)
args = parser.parse_args()

ctx = init_distributed(timeout_s=args.pg_timeout_s)
torch.manual_seed(0)
utts = utterances()
mine = [make_batch(utts[40 * ctx.rank + 4 * i: 40 * ctx.rank + 4 * (i + 1)]) for i in range(6)]


def loader():
    for i, batch in enumerate(mine):
        if ctx.rank == 1 and i == 2:
            with open(os.path.join(args.out_dir, "rank1_failed_at.txt"), "w") as f:
                f.write(repr(time.time()))
            if args.failure == "raise":
                raise ValueError("rank 1 broke on purpose")
            while True:  # blocked, not dead: a stuck read, a deadlocked worker
                time.sleep(3600)
        yield batch


train_conf = resolve_train_conf({"log_interval": 1})
engine, _ = prepared_ddp_engine(ctx, train_conf)
join = init_join(ctx, train_conf.join_mode, train_conf.join_timeout_s)
executor = executor_for(engine, join, train_conf, args.out_dir)
progress = executor.progress
try:
    executor.train(loader())
except Exception as e:
    if ctx.rank == 0:
        with open(os.path.join(args.out_dir, "rank0_error.json"), "w") as f:
            json.dump({"at": time.time(), "steps": progress.step, "type": type(e).__name__, "message": str(e)}, f)
    raise
join.close()
destroy_distributed()
