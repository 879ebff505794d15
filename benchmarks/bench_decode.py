#!/usr/bin/env python3
"""Decoding speed of ``toolkit.bin.recognize`` per decoding mode, between rank counts or source revisions: wall time,
real-time factor and the speed-up over the first variant.

A variant is a source revision (``--revs``: git revisions of this repository, each checked out once as a detached
worktree under ``--out_dir``, or ``worktree`` for the files as they are now) with a rank count (``--ranks``). Every
(repeat, variant, mode) is one ``torchrun --standalone --nproc_per_node=R -m toolkit.bin.recognize`` job with one
mode, that revision's folder first on ``PYTHONPATH``, run in the order A B A B (the variants alternate inside each
repeat), so that load from other jobs on a shared machine falls on every side. Prints each run, then per mode and
variant the median decoding time with its spread (min-max over repeats), the real-time factor (decoding seconds per
audio second) and the speed-up over the first variant, and whether every variant wrote the same ``<mode>/text``
bytes (a faster search that decodes otherwise shows here).

Decoding time is ``decode_wall_s`` of ``decode_summary.json``: from the first batch to the last rank's end, the same
clock for any rank count; "job" time is the whole torchrun process (start, model load, gather, scoring, writing).
Audio seconds are fbank frames x frame shift. Threads: torchrun gives 1 rank all cores and N ranks 1 thread each
(``OMP_NUM_THREADS=1``) unless ``--num_threads`` is set. ``--recognize_args`` adds options to every job (the
recipe's LM, say).

    python benchmarks/bench_decode.py --config exp/conformer/train.yaml --checkpoint exp/conformer/epoch_0.pt \\
        --test_data data/test_speechocean762/data.list --out_dir /tmp/bench_decode --ranks 1 2 --repeats 2 \\
        --modes ctc_greedy_search ctc_prefix_beam_search attention attention_rescoring
    python benchmarks/bench_decode.py ... --revs 88c0744 worktree --ranks 2 --modes ctc_prefix_beam_search \\
        --beam_size 20 --recognize_args "--lm data/lm/lm_3gram.arpa --lm_weight 0.35 --word_bonus 0.5"
"""
import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import time

from harness import WORKTREE, source_env, source_tree

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_once(args, source: str, ranks: int, mode: str, result_dir: str) -> dict:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}",
           "-m", "toolkit.bin.recognize", "--config", args.config, "--checkpoint", args.checkpoint,
           "--test_data", args.test_data, "--result_dir", result_dir, "--modes", mode,
           "--beam_size", str(args.beam_size), "--batch_size", str(args.batch_size),
           "--num_threads", str(args.num_threads), *shlex.split(args.recognize_args)]
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout_s, env=source_env(source))
    job_s = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"bench_decode.py: {' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
    with open(os.path.join(result_dir, "decode_summary.json"), encoding="utf-8") as f:
        summary = json.load(f)
    with open(os.path.join(result_dir, mode, "text"), "rb") as f:
        text = f.read()
    return {"job_s": job_s, "decode_s": summary["decode_wall_s"], "audio_s": summary["audio_s"], "text": text,
            "utts": summary["utterances"]["decoded"], "store_adds": summary["progress_store_adds"]}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True, help="the model dir's train.yaml")
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--test_data", required=True)
    parser.add_argument("--out_dir", required=True, help="decoding outputs go to OUT_DIR/r<repeat>_<ranks>ranks")
    parser.add_argument("--modes", nargs="+", default=["ctc_greedy_search", "attention_rescoring"])
    parser.add_argument("--ranks", nargs="+", type=int, default=[1, 2])
    parser.add_argument("--revs", nargs="+", default=[WORKTREE],
                        help=f"git revisions of this repository to compare, or '{WORKTREE}' (the files as they are)")
    parser.add_argument("--recognize_args", default="", help="more recognize.py options for every job, one string")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--beam_size", type=int, default=10)
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--num_threads", type=int, default=0, help="per rank; 0: torchrun's default")
    parser.add_argument("--timeout_s", type=float, default=3600.0, help="per job")
    args = parser.parse_args(argv)
    variants = [(rev, ranks) for rev in args.revs for ranks in args.ranks]
    sources = {rev: source_tree(REPO, rev, args.out_dir) for rev in args.revs}
    name = {(rev, ranks): f"{rev}/{ranks}" for rev, ranks in variants}
    runs = {}
    print(f"{'repeat':>6} {'rev/ranks':>16} {'mode':<24} {'job s':>8} {'decode s':>9} {'audio s':>8} {'RTF':>8} "
          f"{'store adds (rank 0)':>22}")
    for repeat in range(args.repeats):
        for rev, ranks in variants:
            for mode in args.modes:
                result_dir = os.path.join(args.out_dir, f"r{repeat}_{rev}_{ranks}ranks")
                r = run_once(args, sources[rev], ranks, mode, result_dir)
                runs.setdefault((mode, (rev, ranks)), []).append(r)
                adds = r["store_adds"]
                print(f"{repeat:>6} {name[rev, ranks]:>16} {mode:<24} {r['job_s']:>8.1f} {r['decode_s']:>9.1f} "
                      f"{r['audio_s']:>8.0f} {r['decode_s'] / r['audio_s']:>8.4f} "
                      f"{adds['calls']:>6} in {1000 * adds['seconds']:>7.1f} ms", flush=True)
    print(f"\n{'mode':<24} {'rev/ranks':>16} {'decode s median [min-max]':>26} {'RTF':>8} {'job s':>7} "
          f"{'speed-up':>8}  same text as {name[variants[0]]}")
    for mode in args.modes:
        first = runs[(mode, variants[0])]
        base = statistics.median(r["decode_s"] for r in first)
        for variant in variants:
            rs = runs[(mode, variant)]
            decode = [r["decode_s"] for r in rs]
            same = all(r["text"] == first[0]["text"] for r in rs)
            print(f"{mode:<24} {name[variant]:>16} {statistics.median(decode):>9.1f} [{min(decode):.1f}-"
                  f"{max(decode):.1f}]{'':>6} {statistics.median(decode) / rs[0]['audio_s']:>8.4f} "
                  f"{statistics.median(r['job_s'] for r in rs):>7.1f} {base / statistics.median(decode):>8.2f}  "
                  f"{'yes' if same else 'NO'}")

if __name__ == "__main__":
    main()
