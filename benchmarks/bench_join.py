#!/usr/bin/env python3
"""Cost of the join per training step, in both modes, against the measured step time of the default model.

Spawns 2 gloo ranks on this machine (torch.multiprocessing, a file store in a temporary folder). Each rank creates
two dedicated gloo groups, as ``toolkit.distributed.join`` does, and times, after ``--warmup`` untimed calls:

- ``flag``: ``--steps`` all-reduces of one int32 with MIN (``FlagJoin``'s per-step collective);
- ``monitored_barrier``: ``--steps`` ``dist.monitored_barrier(wait_all_ranks=True)`` calls (``MonitoredBarrierJoin``).

Prints rank 0's median and 90th-percentile microseconds per call and the median as a share of ``--step_s``
(default 0.18 s: the default recipe's step with 2 CPU ranks, from its training log, 2026-11-30). Both ranks run on
the same host, so this is the loopback cost; across nodes add one network round trip per step.

Usage:
    python benchmarks/bench_join.py --steps 2000 --step_s 0.18
"""
import argparse
import datetime
import os
import statistics
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

WORLD_SIZE = 2


def get_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=2000, help="timed calls per mode")
    parser.add_argument("--warmup", type=int, default=100, help="untimed calls per mode first")
    parser.add_argument("--step_s", type=float, default=0.18,
                        help="training step time in seconds to compare with (default: the default recipe on CPU)")
    return parser.parse_args()


def _time_calls(call, steps: int, warmup: int) -> list[float]:
    """Seconds per call of ``call()`` over ``steps`` calls after ``warmup`` untimed ones."""
    for _ in range(warmup):
        call()
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return times


def _rank(rank: int, store_path: str, args: argparse.Namespace, results) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store_path}", rank=rank, world_size=WORLD_SIZE)
    flag_group = dist.new_group(backend="gloo")
    barrier_group = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=30))
    flag = torch.ones(1, dtype=torch.int32)
    timings = {
        "flag": _time_calls(lambda: dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=flag_group), args.steps,
                            args.warmup),
        "monitored_barrier": _time_calls(
            lambda: dist.monitored_barrier(barrier_group, timeout=datetime.timedelta(seconds=30),
                                           wait_all_ranks=True), args.steps, args.warmup),
    }
    if rank == 0:
        results.put(timings)
    dist.destroy_process_group(flag_group)
    dist.destroy_process_group(barrier_group)
    dist.destroy_process_group()


def main() -> None:
    args = get_args()
    with tempfile.TemporaryDirectory() as tmp:
        context = mp.get_context("spawn")
        results = context.SimpleQueue()
        mp.spawn(_rank, args=(os.path.join(tmp, "store"), args, results), nprocs=WORLD_SIZE)
        timings = results.get()
    print(f"{WORLD_SIZE} gloo ranks on one host, {args.steps} timed calls each; step time {args.step_s:.3f} s")
    for mode, times in timings.items():
        median_us = 1e6 * statistics.median(times)
        p90_us = 1e6 * statistics.quantiles(times, n=10)[-1]
        share = median_us / (1e6 * args.step_s)
        print(f"{mode:18s} median {median_us:8.1f} us/step  p90 {p90_us:8.1f} us  "
              f"= {100 * share:.4f} % of a step (1 : {1 / share:,.0f})")


if __name__ == "__main__":
    main()
