#!/usr/bin/env python3
"""Before/after of one change to this toolkit, in one run: training frames/s, peak memory and the step split of two
variants, alternating A B A B, and their ratios (B / A).

A variant is a source tree (``--a_rev``/``--b_rev``: a git revision of this repository, checked out once as a
detached worktree under ``--work_dir``, or ``worktree`` for the files as they are now), plus trainer overrides
(``--a_override``/``--b_override``, repeatable) and environment variables (``--a_env``/``--b_env NAME=VALUE``). Each
run is ``benchmarks/bench_train.py`` of that tree with 1 process (``harness.run_bench_train``, as in
``benchmarks/bench_vs_wenet.py``), on one set of data files, so a change of code, of config or of environment is
measured by the same clock as the comparison with WeNet. The history of measured changes is in docs/benchmarks.md.

Usage (a code change: the revision before it against the working tree; a config option: one tree, two overrides):
    python benchmarks/bench_ab.py --a_rev b996be0 --b_rev worktree --rounds 2 --work_dir exp/bench_ab
    python benchmarks/bench_ab.py --b_override "train_conf.activation_checkpointing true" --work_dir exp/bench_ab
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

from harness import WORKTREE, fresh_dir, print_side_by_side, run_bench_train, source_tree

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH_TRAIN = os.path.join(REPO, "benchmarks", "bench_train.py")


def get_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=os.path.join(REPO, "benchmarks", "conf", "conformer_6x256.yaml"))
    parser.add_argument("--num_utts", type=int, default=800)
    parser.add_argument("--rounds", type=int, default=2, help="A B pairs")
    for side in ("a", "b"):
        parser.add_argument(f"--{side}_rev", default=WORKTREE,
                            help=f"variant {side.upper()}'s source: a git revision, or '{WORKTREE}'")
        parser.add_argument(f"--{side}_override", action="append", default=[], help="trainer override; repeatable")
        parser.add_argument(f"--{side}_env", action="append", default=[], help="NAME=VALUE; repeatable")
    parser.add_argument("--work_dir", required=True)
    parser.add_argument("--json", default=None)
    parser.add_argument("--timeout_s", type=float, default=1800.0, help="per training run")
    return parser.parse_args()


def variant(args: argparse.Namespace, side: str) -> dict:
    rev, overrides = getattr(args, f"{side}_rev"), getattr(args, f"{side}_override")
    env = dict(item.split("=", 1) for item in getattr(args, f"{side}_env"))
    label = " ".join([rev, *overrides, *(f"{k}={v}" for k, v in env.items())])
    return {"label": label, "source": source_tree(REPO, rev, args.work_dir), "overrides": overrides, "env": env}


def main() -> None:
    args = get_args()
    os.makedirs(args.work_dir, exist_ok=True)
    subprocess.run([sys.executable, BENCH_TRAIN, "--config", args.config, "--num_utts", str(args.num_utts),
                    "--work_dir", args.work_dir, "--prepare_only"], capture_output=True, cwd=REPO, check=True)
    variants = {side: variant(args, side) for side in ("a", "b")}
    for side, v in variants.items():
        print(f"{side.upper()}: {v['label']} ({v['source']})")
    rounds = []
    for i in range(args.rounds):
        result = {}
        for side, v in variants.items():
            run_dir = fresh_dir(os.path.join(args.work_dir, f"r{i + 1}_{side}"))
            result[side] = run_bench_train(os.path.join(v["source"], "benchmarks", "bench_train.py"), args.config,
                                           args.num_utts, args.work_dir, run_dir, v["overrides"], v["env"],
                                           args.timeout_s)
            print(f"round {i + 1} {side.upper()}: {result[side]['frames_per_s']:,.0f} frames/s, peak RSS "
                  f"{result[side]['peak_rss_mib'][0]:,.0f} MiB", flush=True)
        rounds.append(result)
    ratios = print_side_by_side(rounds, sides=("b", "a"), labels=("B", "A"))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"config": args.config, "num_utts": args.num_utts, "variants": variants, "rounds": rounds,
                       "ratios": ratios}, f, indent=1)


if __name__ == "__main__":
    main()
