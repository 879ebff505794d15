"""One rank of the non-finite comparison: trains TinyCTC on real tiny_fsdd batches through the executor with either
engine, with one batch whose loss is NaN and one whose backward overflows, and writes a JSON report.

    worker_non_finite.py OUT_DIR [--engine deepspeed --stage 2 | --engine torch_fsdp] [--accum_grad 2]
        [--nan RANK:BATCH] [--overflow RANK:BATCH]

``--nan``: that rank's batch gets NaN features (its loss is NaN). ``--overflow``: that rank's batch has a finite loss
but an infinite gradient. Each rank trains 8 batches of 4 utterances (rank r from utterance 40 r on).
"""

import argparse
import json
import math
import os

import torch
import torch.nn.functional as F
from torch.distributed.tensor import DTensor

from toolkit.distributed.context import destroy_distributed, init_distributed
from toolkit.distributed.join import init_join
from toolkit.engine import init_engine
from toolkit.engine.train_conf import resolve_train_conf
from toolkit.utils.scheduler import init_optimizer_and_scheduler

from test.helpers import write_rank_report
from tiny_ctc import TinyCTC, executor_for, make_batch, utterances

OVERFLOW_MARK = 12345.0  # a feature value that makes OverflowingCTC's backward infinite

parser = argparse.ArgumentParser()
parser.add_argument("out_dir")
parser.add_argument("--engine", default="torch_ddp")
parser.add_argument("--stage", type=int, default=0, help="ZeRO stage (deepspeed)")
parser.add_argument("--accum_grad", type=int, default=1)
parser.add_argument("--nan", default=None, help="RANK:BATCH whose features are NaN")
parser.add_argument("--overflow", default=None, help="RANK:BATCH whose gradient is infinite")
args = parser.parse_args()


class OverflowingCTC(TinyCTC):
    """TinyCTC whose backward overflows (hidden layer) on a batch carrying OVERFLOW_MARK; records every training
    loss."""

    def __init__(self):
        super().__init__()
        self.losses = []

    def forward(self, feats, feats_lengths, target, target_lengths):
        overflow = bool((feats == OVERFLOW_MARK).any())
        hidden = torch.relu(self.hidden(feats.masked_fill(feats == OVERFLOW_MARK, 0.0) / 10))
        if overflow:
            hidden.register_hook(lambda grad: torch.full_like(grad, math.inf))  # an overflowing backward
        log_probs = self.out(hidden).log_softmax(-1)  # (B, T, V)
        loss = F.ctc_loss(log_probs.transpose(0, 1), target.clamp(min=0), feats_lengths, target_lengths,
                          reduction="sum", zero_infinity=True) / feats.size(0)
        self.losses.append(float(loss.detach()))
        return {"loss": loss}


def poisoned(spec: str | None, rank: int) -> int | None:
    if spec is None or int(spec.split(":")[0]) != rank:
        return None
    return int(spec.split(":")[1])


ctx = init_distributed(timeout_s=90)
torch.manual_seed(0)
utts = utterances()
batches = [make_batch(utts[40 * ctx.rank + 4 * i: 40 * ctx.rank + 4 * i + 4]) for i in range(8)]
nan_batch, overflow_batch = poisoned(args.nan, ctx.rank), poisoned(args.overflow, ctx.rank)
if nan_batch is not None:
    batches[nan_batch]["feats"][1, 3, :4] = math.nan
if overflow_batch is not None:
    batches[overflow_batch]["feats"][0, 0, 0] = OVERFLOW_MARK
train_conf = resolve_train_conf({"log_interval": 1, "grad_clip": 5.0, "accum_grad": args.accum_grad})
ds_config = os.path.join(args.out_dir, "ds_config.json")
if ctx.is_main:
    with open(ds_config, "w") as f:
        json.dump({"zero_optimization": {"stage": args.stage}, "steps_per_print": 1_000_000}, f)
torch.distributed.barrier()
model = OverflowingCTC()
optimizer, scheduler = init_optimizer_and_scheduler(model.parameters(), "adam", {"lr": 0.01}, "warmuplr",
                                                    {"warmup_steps": 2})
is_ds = args.engine == "deepspeed"
engine = init_engine(args.engine, ctx, train_conf, find_unused_parameters=False,
                     deepspeed_config=ds_config if is_ds else None, micro_batch_size=4)
engine.prepare(model, optimizer, scheduler)
join = init_join(ctx, train_conf.join_mode, train_conf.join_timeout_s)
executor = executor_for(engine, join, train_conf, args.out_dir)
progress = executor.progress
executor.train(batches)
stats = executor.running.stats  # this rank's own
adam_steps = sorted({int(state["step"]) for state in optimizer.state.values()})
report = {"rank": ctx.rank, "steps": progress.step, "skipped_steps": stats.skipped_steps,
          "skipped": dict(stats.skipped), "num_utts": stats.num_utts, "loss_sum": stats.loss_sum,
          "lr": engine.lr, "scheduler_steps": scheduler.last_epoch, "adam_steps": adam_steps,
          "losses": model.losses,
          "params": {k: (v.full_tensor() if isinstance(v, DTensor) else v).float().flatten().tolist()
                     for k, v in engine.module.state_dict().items()}}
write_rank_report(args.out_dir, ctx.rank, report)
join.close()
destroy_distributed()
