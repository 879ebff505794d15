"""One rank of an engine comparison: trains TinyCTC on real tiny_fsdd batches with either engine, optionally saving
or resuming a checkpoint, and writes a JSON report (per-step losses, steps, parameters, step times).

    worker_engine.py OUT_DIR BATCHES_RANK0 BATCHES_RANK1 [--engine deepspeed --stage 2] [--skip N]
        [--save PATH [--save_after N]] [--resume PATH] [--drop_shards]
        [--join_mode monitored_barrier --join_timeout_s S] [--optim sgd --grad_clip 0 --record_bound]
        [--model conformer [--activation_checkpointing]]
        [--engine torch_fsdp [--fsdp_sharding_strategy zero3] [--fsdp_cpu_offload] [--dtype bf16]
         [--fsdp_state_dict_type sharded]]
        [--cv CV_BATCHES_RANK0 CV_BATCHES_RANK1]

``--cv``: after training, cross-validate on each rank's given number of batches (from utterance 20 r on), reported as
``cv_loss`` (reduced over the ranks) and ``cv_utts``.

``--record_bound`` (torch_ddp, ``--model linear --optim sgd``) also reports ``bound``: per parameter element, how far another
engine's result may lie from this one by float32 rounding alone (see :class:`RoundingBound`).

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
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from toolkit.distributed.context import destroy_distributed, init_distributed
from toolkit.distributed.join import init_join
from toolkit.engine import init_engine
from toolkit.engine.train_conf import resolve_train_conf
from toolkit.utils.config_parsing import ConfigError
from toolkit.utils.scheduler import WarmupLR, init_optimizer_and_scheduler

from test.helpers import write_rank_report
from tiny_ctc import TinyConformer, TinyCTC, TinyLinear, executor_for, make_batch, utterances

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
parser.add_argument("--optim", default="adam", choices=("adam", "sgd"))
parser.add_argument("--grad_clip", type=float, default=5.0)
parser.add_argument("--model", default="ctc", choices=("ctc", "linear", "conformer"))
parser.add_argument("--activation_checkpointing", action="store_true", help="--model conformer: checkpoint its layers")
parser.add_argument("--record_bound", action="store_true")
parser.add_argument("--fsdp_sharding_strategy", default=None, choices=("zero2", "zero3"))
parser.add_argument("--fsdp_cpu_offload", action="store_true")
parser.add_argument("--fsdp_state_dict_type", default=None, choices=("full", "sharded"))
parser.add_argument("--dtype", default="fp32", choices=("fp32", "bf16"))
parser.add_argument("--cv", type=int, nargs=2, default=None, help="CV batches of each rank after training")
args = parser.parse_args()

UNIT_ROUNDOFF = 2.0 ** -24  # float32


def gamma(n: int) -> float:
    """Relative error bound of a float32 sum of n + 1 terms in any order, relative to the sum of their absolute
    values (Higham, "Accuracy and Stability of Numerical Algorithms", 2nd ed., 2002, eq. 4.4)."""
    return n * UNIT_ROUNDOFF / (1 - n * UNIT_ROUNDOFF)


class RoundingBound:
    """Per parameter element, how far two engines' parameters can lie apart by float32 rounding alone, for a model
    whose gradient does not depend on its parameters (``TinyLinear``) trained with SGD, when the engines sum the same
    gradient contributions in another order (DDP's buckets vs ZeRO's reduce-scatter; an accumulation summed before
    or after the all-reduce) and compute the clipping norm in another order.

    Each step both engines compute g = sum of the W x A contributions c = grad(loss / A) / W (W ranks, A
    micro-batches; the scalings are powers of two, so exact), each within gamma(W A - 1) sum|c| of the exact sum,
    so within 2 gamma(W A - 1) S of each other (S = sum|c| per element). Clipping scales g by k = clip / (|g| + 1e-6)
    when below 1: the two engines' norms differ by the order of N squares (2 gamma(N + 3) relative, with the square
    root and the division) plus what their g differ by (at most 4 gamma(W A - 1) |S| / |g| relative). The update
    p - lr k g rounds twice per engine: 2 u (|p| + lr k S) between them. No term feeds back into a later gradient,
    so the bound is the sum over the steps.
    """

    def __init__(self, model: torch.nn.Module, world_size: int, accum_grad: int, grad_clip: float):
        self.named = list(model.named_parameters())
        self.gamma = gamma(world_size * accum_grad - 1)
        self.gamma_norm = gamma(sum(p.numel() for _, p in self.named) + 3)
        self.scale = 1.0 / (world_size * accum_grad)
        self.grad_clip = grad_clip
        self.contrib = [torch.zeros_like(p, dtype=torch.float64) for _, p in self.named]  # S of the current step
        self.bound = [torch.zeros_like(p, dtype=torch.float64) for _, p in self.named]

    def add_micro_batch(self, loss: torch.Tensor) -> None:
        """``loss``: the model's loss of one micro-batch (the executor divides it by A before backward)."""
        grads = torch.autograd.grad(loss, [p for _, p in self.named], retain_graph=True)
        for total, grad in zip(self.contrib, grads):
            total += grad.double().abs() * self.scale

    def add_step(self, lr: float, grad_norm: float, params_before: list[torch.Tensor]) -> None:
        """After an optimizer step that used ``lr`` (every rank: sums the contributions over the ranks)."""
        flat = torch.cat([c.flatten() for c in self.contrib])
        dist.all_reduce(flat)
        k, relative = 1.0, 2 * self.gamma + 2 * UNIT_ROUNDOFF
        if 0 < self.grad_clip < grad_norm:
            k = self.grad_clip / (grad_norm + 1e-6)
            relative += 2 * self.gamma_norm + 4 * self.gamma * float(flat.norm()) / grad_norm
        offset = 0
        for bound, contrib, before, (_, param) in zip(self.bound, self.contrib, params_before, self.named):
            summed = flat[offset:offset + contrib.numel()].view_as(contrib)
            offset += contrib.numel()
            larger = torch.maximum(before.abs(), param.detach().double().abs())
            bound += lr * k * relative * summed + 2 * UNIT_ROUNDOFF * larger
            contrib.zero_()

    def report(self) -> dict:
        return {name: b.flatten().tolist() for (name, _), b in zip(self.named, self.bound)}


class Recording({"ctc": TinyCTC, "linear": TinyLinear, "conformer": TinyConformer}[args.model]):
    """The model under test, remembering each training forward's loss and the wall time between calls."""

    def __init__(self):
        super().__init__()
        self.losses, self.times = [], []

    def forward(self, *inputs):
        out = super().forward(*inputs)
        if self.training:
            self.losses.append(float(out["loss"].detach()))
            self.times.append(time.perf_counter())
            if bound is not None:
                bound.add_micro_batch(out["loss"])
        return out


ctx = init_distributed(timeout_s=90)
torch.manual_seed(0)
utts = utterances()
offset = 40 * ctx.rank
mine = [make_batch([utts[(offset + i * args.batch_size + j) % len(utts)] for j in range(args.batch_size)])
        for i in range(args.skip, args.batches[ctx.rank])]
fsdp_conf = {"fsdp_sharding_strategy": args.fsdp_sharding_strategy} if args.fsdp_sharding_strategy else {}
if args.fsdp_cpu_offload:
    fsdp_conf["fsdp_cpu_offload"] = True
if args.fsdp_state_dict_type:
    fsdp_conf["fsdp_state_dict_type"] = args.fsdp_state_dict_type
train_conf = resolve_train_conf({"log_interval": 1, "grad_clip": args.grad_clip, "accum_grad": args.accum_grad,
                                 "join_mode": args.join_mode, "join_timeout_s": args.join_timeout_s,
                                 "dtype": args.dtype, **fsdp_conf})
ds_config = os.path.join(args.out_dir, "ds_config.json")
if ctx.is_main:
    with open(ds_config, "w") as f:
        json.dump({"zero_optimization": {"stage": args.stage}, "steps_per_print": 1_000_000,
                   "zero_allow_untested_optimizer": True}, f)
torch.distributed.barrier()
bound = None
model = Recording()
if args.activation_checkpointing:
    model.set_activation_checkpointing(True)
if args.optim == "adam":
    optimizer, scheduler = init_optimizer_and_scheduler(model.parameters(), "adam", {"lr": 0.01}, "warmuplr",
                                                        {"warmup_steps": 2})
else:  # NOTE: SGD's update is linear in the gradient: a loss or gradient scaled wrongly shows in full.
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    scheduler = WarmupLR(optimizer, warmup_steps=2)
is_ds = args.engine == "deepspeed"
engine = init_engine(args.engine, ctx, train_conf, find_unused_parameters=False,
                     deepspeed_config=ds_config if is_ds else None, micro_batch_size=args.batch_size,
                     keep_shards=not args.drop_shards)
engine.prepare(model, optimizer, scheduler)
if args.record_bound:
    assert (args.engine, args.optim, args.model) == ("torch_ddp", "sgd", "linear"), "the bound's assumptions"
    bound = RoundingBound(model, ctx.world_size, args.accum_grad, args.grad_clip)
    initial = [p.detach().double().clone() for p in model.parameters()]
    engine_step = engine.step

    def step_recording_bound():
        lr, before = engine.lr, [p.detach().double().clone() for p in model.parameters()]
        grad_norm = engine_step()
        bound.add_step(lr, grad_norm, before)
        return grad_norm

    engine.step = step_recording_bound
report = {"rank": ctx.rank}
if args.resume:
    try:
        engine.load(args.resume)
    except ConfigError as e:
        with open(os.path.join(args.out_dir, f"error_rank{ctx.rank}.txt"), "w") as f:
            f.write(str(e))
        destroy_distributed()
        sys.exit(3)


def full_params() -> dict[str, list[float]]:
    """The whole model's weights (collective under torch_fsdp: each sharded one is gathered from every rank)."""
    return {key: (value.full_tensor() if isinstance(value, DTensor) else value).float().flatten().tolist()
            for key, value in engine.module.state_dict().items()}


join = init_join(ctx, train_conf.join_mode, train_conf.join_timeout_s)
executor = executor_for(engine, join, train_conf, args.out_dir)
progress = executor.progress
split = len(mine) if args.save_after is None else args.save_after
executor.train(mine[:split])
first = executor.running.stats  # this rank's own statistics
dropped = join.report.dropped
if args.save:
    engine.save(args.save, {"epoch": 0, "step": progress.step, "tag": "test"})
    report["params_at_save"] = full_params()
executor.train(mine[split:])
second = executor.running.stats
report.update({"steps": progress.step, "dropped": dropped + join.report.dropped,
               "dropped_utts": first.dropped_utts + second.dropped_utts,
               "local_utts": first.num_utts + second.num_utts, "losses": model.losses,
               "step_s": [b - a for a, b in zip(model.times, model.times[1:])], "lr": engine.lr,
               "params": full_params(), "param_dtypes": sorted({str(p.dtype) for p in engine.module.parameters()})})
if args.cv:
    cv = executor.cv([make_batch([utts[(20 * ctx.rank + args.batch_size * i + j) % len(utts)]
                                  for j in range(args.batch_size)]) for i in range(args.cv[ctx.rank])])
    report.update({"cv_loss": cv.loss, "cv_utts": cv.num_utts})
if bound is not None:
    report["bound"] = bound.report()
    report["moved"] = max(float((p.detach().double() - p0).abs().max()) for p, p0 in zip(model.parameters(), initial))
write_rank_report(args.out_dir, ctx.rank, report)
join.close()
destroy_distributed()
