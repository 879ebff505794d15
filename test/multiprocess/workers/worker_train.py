"""One rank of an engine test: trains TinyCTC on this rank's share of real tiny_fsdd batches, writes a report.

    worker_train.py OUT_DIR BATCHES_RANK0 BATCHES_RANK1 [--accum_grad N] [--sleep_rank1_s S]
        [--join_mode monitored_barrier --join_timeout_s S] [--epochs N] [--skipped_per_batch N]

``--skipped_per_batch N`` marks every batch as carrying N utterances the pipeline filtered out (``num_skipped``), so
the report can check that trained + dropped + skipped utterances add up to what the data offered.
"""

import argparse
import time

import torch

from toolkit.distributed.context import destroy_distributed, init_distributed
from toolkit.distributed.join import init_join
from toolkit.engine.train_conf import resolve_train_conf

from test.helpers import write_rank_report
from tiny_ctc import executor_for, make_batch, prepared_ddp_engine, utterances

parser = argparse.ArgumentParser()
parser.add_argument("out_dir")
parser.add_argument("batches", type=int, nargs="+", help="number of batches of each rank")
parser.add_argument("--batch_size", type=int, default=4)
parser.add_argument("--accum_grad", type=int, default=1)
parser.add_argument("--sleep_rank1_s", type=float, default=0.0)
parser.add_argument("--join_mode", default="flag")
parser.add_argument("--join_timeout_s", type=float, default=30.0)
parser.add_argument("--epochs", type=int, default=1, help="train the same batches this many epochs")
parser.add_argument("--skipped_per_batch", type=int, default=0)
args = parser.parse_args()

ctx = init_distributed(timeout_s=60)
torch.manual_seed(0)
utts = utterances()
offset = sum(args.batches[: ctx.rank]) * args.batch_size
mine = [make_batch(utts[offset + i * args.batch_size: offset + (i + 1) * args.batch_size])
        for i in range(args.batches[ctx.rank])]
for batch in mine:
    batch["num_skipped"] = {"too_short": args.skipped_per_batch} if args.skipped_per_batch else {}


class SlowLoader:
    def __iter__(self):
        for batch in mine:
            if ctx.rank == 1 and args.sleep_rank1_s:
                time.sleep(args.sleep_rank1_s)
            yield batch


train_conf = resolve_train_conf({"accum_grad": args.accum_grad, "log_interval": 1, "join_mode": args.join_mode,
                                 "join_timeout_s": args.join_timeout_s})
engine, optimizer = prepared_ddp_engine(ctx, train_conf)
join = init_join(ctx, train_conf.join_mode, train_conf.join_timeout_s)
executor = executor_for(engine, join, train_conf, args.out_dir)
progress = executor.progress
epochs = []  # per epoch: this rank's optimizer steps, join report and reduced statistics
for epoch in range(args.epochs):
    start_step = progress.step
    reduced = executor.train(SlowLoader())
    stats = executor.running.stats  # this rank's own
    epochs.append({"steps": progress.step - start_step, "join_steps": join.report.steps,
                   "dropped": join.report.dropped, "dropped_utts": stats.dropped_utts,
                   "missing_ranks": join.report.missing_ranks, "local_utts": stats.num_utts,
                   "local_skipped": sum(stats.skipped.values()), "global_utts": reduced.num_utts,
                   "global_dropped": reduced.dropped_batches, "global_dropped_utts": reduced.dropped_utts,
                   "global_skipped": sum(reduced.skipped.values())})
offered_utts = len(mine) * (args.batch_size + args.skipped_per_batch)  # per epoch, this rank
report = {"rank": ctx.rank, "steps": progress.step, "offered_utts": offered_utts, "epochs": epochs, "lr": engine.lr,
          "params": [p.detach().flatten().tolist() for p in engine.module.parameters()],
          "exp_avg": [s["exp_avg"].flatten().tolist() for s in optimizer.state.values()],
          **{key: epochs[-1][key] for key in ("join_steps", "dropped", "local_utts", "global_utts", "global_dropped")}}
write_rank_report(args.out_dir, ctx.rank, report)
join.close()
destroy_distributed()
