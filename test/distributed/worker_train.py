"""One rank of an engine test: trains TinyCTC on this rank's share of real tiny_fsdd batches, writes a report.

    worker_train.py OUT_DIR BATCHES_RANK0 BATCHES_RANK1 [--accum_grad N] [--sleep_rank1_s S]
"""

import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tiny_ctc import TinyCTC, make_batch, utterances  # noqa: E402

from toolkit.distributed.context import destroy_distributed, init_distributed  # noqa: E402
from toolkit.distributed.join import FlagJoin  # noqa: E402
from toolkit.engine import init_engine  # noqa: E402
from toolkit.engine.executor import TrainProgress, train_one_epoch  # noqa: E402
from toolkit.utils.config import resolve_train_conf  # noqa: E402
from toolkit.utils.scheduler import init_optimizer_and_scheduler  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("out_dir")
parser.add_argument("batches", type=int, nargs="+", help="number of batches of each rank")
parser.add_argument("--batch_size", type=int, default=4)
parser.add_argument("--accum_grad", type=int, default=1)
parser.add_argument("--sleep_rank1_s", type=float, default=0.0)
args = parser.parse_args()

ctx = init_distributed(timeout_s=60)
torch.manual_seed(0)
utts = utterances()
offset = sum(args.batches[: ctx.rank]) * args.batch_size
mine = [make_batch(utts[offset + i * args.batch_size: offset + (i + 1) * args.batch_size])
        for i in range(args.batches[ctx.rank])]


class SlowLoader:
    def __iter__(self):
        for batch in mine:
            if ctx.rank == 1 and args.sleep_rank1_s:
                time.sleep(args.sleep_rank1_s)
            yield batch


train_conf = resolve_train_conf({"train_conf": {"accum_grad": args.accum_grad, "log_interval": 1}})
model = TinyCTC()
optimizer, scheduler = init_optimizer_and_scheduler(model.parameters(), "adam", {"lr": 0.01}, "warmuplr",
                                                    {"warmup_steps": 2})
engine = init_engine("torch_ddp", ctx, train_conf, find_unused_parameters=False)
engine.prepare(model, optimizer, scheduler)
join = FlagJoin()
progress = TrainProgress()
stats = train_one_epoch(engine, join, SlowLoader(), progress, train_conf)
report = {"rank": ctx.rank, "steps": progress.step, "join_steps": join.report.steps,
          "dropped": join.report.dropped, "local_utts": stats.num_utts, "lr": engine.lr,
          "params": [p.detach().flatten().tolist() for p in engine.module.parameters()],
          "exp_avg": [s["exp_avg"].flatten().tolist() for s in optimizer.state.values()]}
reduced = stats.reduce()
report["global_utts"] = reduced.num_utts
report["global_dropped"] = reduced.dropped_batches
with open(os.path.join(args.out_dir, f"rank{ctx.rank}.json"), "w") as f:
    json.dump(report, f)
join.close()
destroy_distributed()
