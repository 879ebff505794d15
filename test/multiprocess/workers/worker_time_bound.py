"""One rank of the ``max_train_minutes`` test: TinyCTC on real tiny_fsdd batches, 4 batches an epoch, under clocks
that the loader advances by 1 s per batch it reads and a stand-in for CV by 1 s after each epoch (so an epoch takes
5 s of them, whatever the machine), with ``max_epoch`` 10, and a CV probe of one batch that is the whole CV share (so the
first epoch's estimate is the probe's 1 s). Rank 1's clock runs an hour ahead and 5 times as fast:
deciding on its own it would stop at its first step while rank 0 trains on, and the job would hang in the next
all-reduce. Writes the epochs trained, with the optimizer steps after each and whether it was cut short, and its
clock when the run ended.

    worker_time_bound.py OUT_DIR MAX_TRAIN_MINUTES JOIN_MODE
"""

import logging
import sys

import torch

from toolkit.distributed.context import destroy_distributed, init_distributed
from toolkit.distributed.join import FlagJoin, MonitoredBarrierJoin
from toolkit.engine.time_budget import CvShare
from toolkit.engine.train_conf import resolve_train_conf

from test.helpers import write_rank_report
from tiny_ctc import executor_for, make_batch, prepared_ddp_engine, utterances

NUM_BATCHES, BATCH_SIZE = 4, 4
out_dir, max_train_minutes, join_mode = sys.argv[1], float(sys.argv[2]), sys.argv[3]
logging.basicConfig(level=logging.INFO)
ctx = init_distributed(timeout_s=30)
torch.manual_seed(0)
utts = utterances()
mine = [make_batch(utts[40 * ctx.rank + BATCH_SIZE * i: 40 * ctx.rank + BATCH_SIZE * (i + 1)])
        for i in range(NUM_BATCHES)]
now = [3600.0 if ctx.rank == 1 else 0.0]
tick = 5.0 if ctx.rank == 1 else 1.0


class TickingLoader:
    def __init__(self, batches):
        self.batches = batches

    def __iter__(self):
        for batch in self.batches:
            now[0] += tick
            yield batch


train_conf = resolve_train_conf({"max_epoch": 10, "max_train_minutes": max_train_minutes})
engine, _ = prepared_ddp_engine(ctx, train_conf)
join = FlagJoin(ctx.pg_timeout) if join_mode == "flag" else MonitoredBarrierJoin(ctx.pg_timeout, timeout_s=10)
executor = executor_for(engine, join, train_conf, out_dir, clock=lambda: now[0], cv_share=CvShare(BATCH_SIZE))
trained = []
for epoch in executor.epochs(TickingLoader(mine[:1])):
    executor.train(TickingLoader(mine))
    now[0] += tick  # cross-validation and the save
    trained.append([epoch, executor.progress.step, executor.cut_short])
write_rank_report(out_dir, ctx.rank, [trained, now[0]])
join.close()
destroy_distributed()
