"""One rank of an engine comparison: trains TinyCTC on real tiny_fsdd batches with either engine, optionally saving
or resuming a checkpoint, and writes a JSON report (per-step losses, steps, parameters, step times).

    worker_engine.py OUT_DIR BATCHES_RANK0 BATCHES_RANK1 [--engine deepspeed --stage 2] [--skip N]
        [--save PATH [--save_after N]] [--resume PATH] [--drop_shards]
        [--join_mode monitored_barrier --join_timeout_s S]

Batch ``i`` of rank ``r`` is always the same utterances (from utterance ``40 r + batch_size i`` on, wrapping around
the 80 training utterances), whatever the batch counts, so a resumed run with ``--skip`` sees exactly the batches
an uninterrupted run saw next.
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
from toolkit.distributed.join import init_join  # noqa: E402
from toolkit.engine import init_engine  # noqa: E402
from toolkit.engine.executor import TrainProgress, train_one_epoch  # noqa: E402
from toolkit.utils.config import resolve_train_conf  # noqa: E402
from toolkit.utils.scheduler import init_optimizer_and_scheduler  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("out_dir")
parser.add_argument("batches", type=int, nargs="+", help="number of batches of each rank (before --skip)")
parser.add_argument("--engine", default="torch_ddp")
parser.add_argument("--stage", type=int, default=0, help="ZeRO stage (deepspeed)")
parser.add_argument("--batch_size", type=int, default=4)
parser.add_argument("--accum_grad", type=int, default=1)
parser.add_argument("--skip", type=int, default=0, help="leave out each rank's first N batches (after a resume)")
parser.add_argument("--save", default=None, help="engine.save to this .pt (after --save_after batches)")
parser.add_argument("--save_after", type=int, default=None, help="save after this many batches, then go on")
parser.add_argument("--resume", default=None, help="engine.load from this .pt before training")
parser.add_argument("--drop_shards", action="store_true")
parser.add_argument("--join_mode", default="flag")
parser.add_argument("--join_timeout_s", type=float, default=30.0)
args = parser.parse_args()


class RecordingCTC(TinyCTC):
    """TinyCTC that remembers each training forward's loss and the wall time between calls."""

    def __init__(self):
        super().__init__()
        self.losses, self.times = [], []

    def forward(self, *inputs):
        out = super().forward(*inputs)
        if self.training:
            self.losses.append(float(out["loss"].detach()))
            self.times.append(time.perf_counter())
        return out


ctx = init_distributed(timeout_s=90)
torch.manual_seed(0)
utts = utterances()
offset = 40 * ctx.rank
mine = [make_batch([utts[(offset + i * args.batch_size + j) % len(utts)] for j in range(args.batch_size)])
        for i in range(args.skip, args.batches[ctx.rank])]
train_conf = resolve_train_conf({"train_conf": {"log_interval": 1, "grad_clip": 5.0,
                                                 "accum_grad": args.accum_grad, "join_mode": args.join_mode,
                                                 "join_timeout_s": args.join_timeout_s}})
ds_config = os.path.join(args.out_dir, "ds_config.json")
if ctx.is_main:
    with open(ds_config, "w") as f:
        json.dump({"zero_optimization": {"stage": args.stage}, "steps_per_print": 1_000_000}, f)
torch.distributed.barrier()
model = RecordingCTC()
optimizer, scheduler = init_optimizer_and_scheduler(model.parameters(), "adam", {"lr": 0.01}, "warmuplr",
                                                    {"warmup_steps": 2})
is_ds = args.engine == "deepspeed"
engine = init_engine(args.engine, ctx, train_conf, find_unused_parameters=False,
                     deepspeed_config=ds_config if is_ds else None,
                     batch_conf={"batch_type": "static", "batch_size": args.batch_size},
                     keep_shards=not args.drop_shards)
engine.prepare(model, optimizer, scheduler)
report = {"rank": ctx.rank}
if args.resume:
    try:
        engine.load(args.resume)
    except FileNotFoundError as e:
        with open(os.path.join(args.out_dir, f"error_rank{ctx.rank}.txt"), "w") as f:
            f.write(str(e))
        destroy_distributed()
        sys.exit(3)
join = init_join(train_conf)
progress = TrainProgress()
split = len(mine) if args.save_after is None else args.save_after
first = train_one_epoch(engine, join, mine[:split], progress, train_conf)
dropped = join.report.dropped
if args.save:
    engine.save(args.save, {"epoch": 0, "step": progress.step, "tag": "test"})
    report["params_at_save"] = {k: v.float().flatten().tolist() for k, v in engine.module.state_dict().items()}
second = train_one_epoch(engine, join, mine[split:], progress, train_conf)
report.update({"steps": progress.step, "dropped": dropped + join.report.dropped,
               "dropped_utts": first.dropped_utts + second.dropped_utts,
               "local_utts": first.num_utts + second.num_utts, "losses": model.losses,
               "step_s": [b - a for a, b in zip(model.times, model.times[1:])], "lr": engine.lr,
               "params": {k: v.float().flatten().tolist() for k, v in engine.module.state_dict().items()}})
with open(os.path.join(args.out_dir, f"rank{ctx.rank}.json"), "w") as f:
    json.dump(report, f)
join.close()
destroy_distributed()
