#!/usr/bin/env python3
"""Decoding speed of ``toolkit.bin.recognize`` on 1 vs N ranks, per decoding mode: wall time and real-time factor.

Every (repeat, rank count, mode) is one ``torchrun --standalone --nproc_per_node=R -m toolkit.bin.recognize`` job
with one mode, run in the order A B A B (the rank counts alternate inside each repeat), so that load from other
jobs on a shared machine falls on both sides. Prints each run, then per mode and rank count the median decoding
time with its spread (min-max over repeats), the real-time factor (decoding seconds per audio second) and the
speed-up over the first rank count, and whether every rank count wrote the same ``<mode>/text`` bytes.

Decoding time is ``decode_wall_s`` of ``decode_summary.json``: from the first batch to the last rank's end, the same
clock for any rank count; "job" time is the whole torchrun process (start, model load, gather, scoring, writing).
Audio seconds are fbank frames x frame shift. Threads: torchrun gives 1 rank all cores and N ranks 1 thread each
(``OMP_NUM_THREADS=1``) unless ``--num_threads`` is set.

    python benchmarks/bench_decode.py --config exp/conformer/train.yaml --checkpoint exp/conformer/epoch_0.pt \\
        --test_data data/test_speechocean762/data.list --out_dir /tmp/bench_decode --ranks 1 2 --repeats 2 \\
        --modes ctc_greedy_search ctc_prefix_beam_search attention attention_rescoring
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time


def run_once(args, ranks: int, mode: str, result_dir: str) -> dict:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}",
           "-m", "toolkit.bin.recognize", "--config", args.config, "--checkpoint", args.checkpoint,
           "--test_data", args.test_data, "--result_dir", result_dir, "--modes", mode,
           "--beam_size", str(args.beam_size), "--batch_size", str(args.batch_size),
           "--num_threads", str(args.num_threads)]
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout_s)
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
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--beam_size", type=int, default=10)
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--num_threads", type=int, default=0, help="per rank; 0: torchrun's default")
    parser.add_argument("--timeout_s", type=float, default=3600.0, help="per job")
    args = parser.parse_args(argv)
    runs = {}
    print(f"{'repeat':>6} {'ranks':>5} {'mode':<24} {'job s':>8} {'decode s':>9} {'audio s':>8} {'RTF':>8} "
          f"{'store adds (rank 0)':>22}")
    for repeat in range(args.repeats):
        for ranks in args.ranks:
            for mode in args.modes:
                r = run_once(args, ranks, mode, os.path.join(args.out_dir, f"r{repeat}_{ranks}ranks"))
                runs.setdefault((mode, ranks), []).append(r)
                adds = r["store_adds"]
                print(f"{repeat:>6} {ranks:>5} {mode:<24} {r['job_s']:>8.1f} {r['decode_s']:>9.1f} "
                      f"{r['audio_s']:>8.0f} {r['decode_s'] / r['audio_s']:>8.4f} "
                      f"{adds['calls']:>6} in {1000 * adds['seconds']:>7.1f} ms", flush=True)
    print(f"\n{'mode':<24} {'ranks':>5} {'decode s median [min-max]':>26} {'RTF':>8} {'job s':>7} "
          f"{'speed-up':>8}  same text as {args.ranks[0]} rank(s)")
    for mode in args.modes:
        base = statistics.median(r["decode_s"] for r in runs[(mode, args.ranks[0])])
        for ranks in args.ranks:
            rs = runs[(mode, ranks)]
            decode = [r["decode_s"] for r in rs]
            same = all(r["text"] == runs[(mode, args.ranks[0])][0]["text"] for r in rs)
            print(f"{mode:<24} {ranks:>5} {statistics.median(decode):>9.1f} [{min(decode):.1f}-{max(decode):.1f}]"
                  f"{'':>6} {statistics.median(decode) / rs[0]['audio_s']:>8.4f} "
                  f"{statistics.median(r['job_s'] for r in rs):>7.1f} {base / statistics.median(decode):>8.2f}  "
                  f"{'yes' if same else 'NO'}")


if __name__ == "__main__":
    main()
