#!/usr/bin/env python3
"""What activation checkpointing saves and costs on one training step of a config's model, per variant: peak RSS,
step time (wall clock and the process's CPU time, which a shared machine's load disturbs less) and the FLOPs executed
(forward + backward, recomputation included), each variant in a fresh process so that its peak is its own.

Variants: ``none``; ``layers``, each encoder and decoder layer checkpointed (``train_conf.activation_checkpointing``);
``layers+front_end``, the conv2d front end checkpointed too (an experiment, not an option: its first convolution's
output, B x C x T/2 x (D-1)/2 floats, is the model's largest activation, but its second convolution is the model's
most expensive operation, so recomputing the front end costs most of a forward).

The batch is synthetic (standard-normal features standing in for CMVN-normalised fbank, random tokens), ``--batch_size``
utterances of ``--frames`` frames each, so that the worst batch of an epoch can be chosen and measured alone. The
training benchmark (``bench_train.py --override_config train_conf.activation_checkpointing=true``) measures the same
option on a real epoch.

Usage:
    python benchmarks/bench_checkpointing.py --config benchmarks/conf/conformer_6x256.yaml --batch_size 16 \\
        --frames 1100 --json exp/bench_checkpointing.json
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

VARIANTS = ("none", "layers", "layers+front_end")
WORKER_FLAG = "--worker"


def get_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="benchmarks/conf/conformer_6x256.yaml", help="training YAML")
    parser.add_argument("--batch_size", type=int, default=16)
    parser.add_argument("--frames", type=int, default=1100, help="fbank frames (10 ms) of every utterance")
    parser.add_argument("--tokens_per_s", type=float, default=15.0, help="target length: characters per second")
    parser.add_argument("--vocab_size", type=int, default=40, help="output units (a char table's size)")
    parser.add_argument("--steps", type=int, default=3, help="training steps per variant (the first is not timed)")
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS,
                        help="run in this order (repeat names to alternate: none layers none layers)")
    parser.add_argument("--json", default=None, help="write the results here")
    return parser.parse_args(argv)


def run_worker(args: argparse.Namespace, variant: str) -> dict:
    """One variant in this process: ``--steps`` training steps (forward, backward, Adam), then one counted step."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from toolkit.models.activation_checkpointing import checkpointed
    from toolkit.models.registry import init_model
    from toolkit.train_config import read_config

    class CheckpointedFrontEnd(torch.nn.Module):
        def __init__(self, inner: torch.nn.Module):
            super().__init__()
            self.inner = inner

        def forward(self, x, mask):
            return checkpointed(self.inner, x, mask)

        def output_lengths(self, lengths):
            return self.inner.output_lengths(lengths)

    config = read_config(args.config, ["cmvn null"])
    torch.manual_seed(0)
    model = init_model(config, config.dataset_conf.fbank_conf.num_mel_bins, args.vocab_size).train()
    model.set_activation_checkpointing(variant != "none")
    if variant == "layers+front_end":
        model.encoder.embed = CheckpointedFrontEnd(model.encoder.embed)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    tokens = max(1, round(args.frames / 100 * args.tokens_per_s))
    batch = (torch.randn(args.batch_size, args.frames, config.dataset_conf.fbank_conf.num_mel_bins),
             torch.full((args.batch_size,), args.frames),
             torch.randint(2, args.vocab_size - 1, (args.batch_size, tokens)), torch.full((args.batch_size,), tokens))
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    times, cpu_times = [], []
    for _ in range(args.steps):
        start, cpu_start = time.perf_counter(), time.process_time()
        model(*batch)["loss"].backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - start)
        cpu_times.append(time.process_time() - cpu_start)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # before the counted step: it holds more
    with FlopCounterMode(display=False) as counter:
        model(*batch)["loss"].backward()
    return {"variant": variant, "peak_rss_mib": peak, "rss_before_mib": before, "step_s": times,
            "step_s_median": _median(times[1:] or times), "step_cpu_s": cpu_times,
            "step_cpu_s_median": _median(cpu_times[1:] or cpu_times), "gflops": counter.get_total_flops() / 1e9,
            "threads": torch.get_num_threads()}


def _median(values: list[float]) -> float:
    return sorted(values)[len(values) // 2]


def main() -> None:
    if sys.argv[1:2] == [WORKER_FLAG]:
        variant, argv = sys.argv[2], sys.argv[3:]
        print(json.dumps(run_worker(get_args(argv), variant)))
        return
    args = get_args()
    argv = sys.argv[1:]
    results = []
    for variant in args.variants:
        proc = subprocess.run([sys.executable, os.path.abspath(__file__), WORKER_FLAG, variant, *argv],
                              capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise SystemExit(f"variant {variant} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
        results.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    base = results[0]
    print(f"{args.config}: {args.batch_size} x {args.frames} frames, {results[0]['threads']} threads")
    print(f"{'variant':18s}{'peak RSS MiB':>14s}{'':>8s}{'step s':>9s}{'':>8s}{'CPU s':>9s}{'':>8s}{'GFLOP':>9s}")
    for r in results:
        print(f"{r['variant']:18s}{r['peak_rss_mib']:>14,.0f}{r['peak_rss_mib'] / base['peak_rss_mib']:>7.2f}x"
              f"{r['step_s_median']:>9.2f}{r['step_s_median'] / base['step_s_median']:>7.2f}x"
              f"{r['step_cpu_s_median']:>9.2f}{r['step_cpu_s_median'] / base['step_cpu_s_median']:>7.2f}x"
              f"{r['gflops']:>9.1f}")
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"config": args.config, "batch_size": args.batch_size, "frames": args.frames,
                       "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
