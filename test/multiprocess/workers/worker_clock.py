"""One rank of the minutes-interval test: TinyCTC on real tiny_fsdd batches (0.3 s of data loading each) with
``save_interval_minutes`` = 2 s, where rank 1's clock runs one hour ahead (a node with a skewed clock). Only rank 0's
clock may decide; rank 1 reading its own would save at step 1 alone and the job would hang in the save.

    worker_clock.py OUT_DIR
"""

import sys
import time

import torch

from toolkit.distributed.context import destroy_distributed, init_distributed
from toolkit.distributed.join import FlagJoin
from toolkit.engine import init_engine
from toolkit.engine.checkpointer import Checkpointer
from toolkit.engine.train_conf import resolve_train_conf
from toolkit.utils.scheduler import init_optimizer_and_scheduler

from test.helpers import write_rank_report
from tiny_ctc import TinyCTC, executor_for, make_batch, utterances

NUM_BATCHES, BATCH_SIZE, LOAD_S = 10, 4, 0.3
out_dir = sys.argv[1]
ctx = init_distributed(timeout_s=30)
torch.manual_seed(0)
utts = utterances()
mine = [make_batch(utts[40 * ctx.rank + BATCH_SIZE * i: 40 * ctx.rank + BATCH_SIZE * (i + 1)])
        for i in range(NUM_BATCHES)]


class SlowLoader:
    def __iter__(self):
        for batch in mine:
            time.sleep(LOAD_S)
            yield batch


class RecordingCheckpointer(Checkpointer):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.tags = []

    def save(self, tag, info):
        self.tags.append(tag)
        return super().save(tag, info)


train_conf = resolve_train_conf({"log_interval": 1, "save_interval_minutes": 2.0 / 60})
model = TinyCTC()
optimizer, scheduler = init_optimizer_and_scheduler(model.parameters(), "adam", {"lr": 0.01}, "warmuplr",
                                                    {"warmup_steps": 2})
engine = init_engine("torch_ddp", ctx, train_conf, find_unused_parameters=False)
engine.prepare(model, optimizer, scheduler)
skewed = (lambda: time.monotonic() + 3600.0) if ctx.rank == 1 else time.monotonic
checkpointer = RecordingCheckpointer(engine, out_dir, train_conf, clock=skewed)
join = FlagJoin(ctx.pg_timeout)
executor = executor_for(engine, join, train_conf, out_dir, checkpointer)
executor.train(SlowLoader())
write_rank_report(out_dir, ctx.rank, {"steps": executor.progress.step, "saved": checkpointer.tags})
join.close()
destroy_distributed()
