"""One rank of the ``max_train_minutes`` test: TinyCTC on real tiny_fsdd batches, 4 batches an epoch, under clocks
that the loader advances by 1 s per batch (so an epoch takes 4 s of them, whatever the machine), with
``max_train_minutes`` = 10 s and ``max_epoch`` 10. Rank 1's clock runs an hour ahead and 5 times as fast: deciding
on its own it would stop after epoch 0 while rank 0 trains on, and the job would hang in the next all-reduce.

    worker_time_bound.py OUT_DIR MAX_TRAIN_MINUTES
"""

import json
import logging
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tiny_ctc import executor_for, make_batch, prepared_ddp_engine, utterances  # noqa: E402

from toolkit.distributed.context import destroy_distributed, init_distributed  # noqa: E402
from toolkit.distributed.join import FlagJoin  # noqa: E402
from toolkit.engine.train_conf import resolve_train_conf  # noqa: E402

NUM_BATCHES, BATCH_SIZE = 4, 4
out_dir, max_train_minutes = sys.argv[1], float(sys.argv[2])
logging.basicConfig(level=logging.INFO)
ctx = init_distributed(timeout_s=30)
torch.manual_seed(0)
utts = utterances()
mine = [make_batch(utts[40 * ctx.rank + BATCH_SIZE * i: 40 * ctx.rank + BATCH_SIZE * (i + 1)])
        for i in range(NUM_BATCHES)]
now = [3600.0 if ctx.rank == 1 else 0.0]
tick = 5.0 if ctx.rank == 1 else 1.0


class TickingLoader:
    def __iter__(self):
        for batch in mine:
            now[0] += tick
            yield batch


train_conf = resolve_train_conf({"max_epoch": 10, "max_train_minutes": max_train_minutes})
engine, _ = prepared_ddp_engine(ctx, train_conf)
join = FlagJoin(ctx.pg_timeout)
executor = executor_for(engine, join, train_conf, out_dir, clock=lambda: now[0])
trained = []
for epoch in executor.epochs():
    executor.train(TickingLoader())
    trained.append(epoch)
with open(os.path.join(out_dir, f"rank{ctx.rank}.json"), "w") as f:
    json.dump({"epochs": trained, "steps": executor.progress.step}, f)
join.close()
destroy_distributed()
