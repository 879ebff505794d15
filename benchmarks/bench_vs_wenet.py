#!/usr/bin/env python3
"""This toolkit beside WeNet on one config, one machine, the same utterances, in one run: training frames/s and peak
memory of both and their ratios (ours / WeNet).

Alternating runs, A B A B (``--rounds`` pairs): A is ``benchmarks/bench_train.py`` with ``--config`` (default
``benchmarks/conf/conformer_6x256.yaml``); B is WeNet's own ``wenet/bin/train.py`` with ``--wenet_config`` (default
``../shared/bench/wenet_conformer_6x256.yaml``, WeNet's YAML keys) under ``benchmarks/wenet_probe.py``, which
attaches the same step clock. Both train one epoch of the same ``--num_utts`` shuffled training utterances (with
800 and batch 16: 50 steps) in 1 process under ``torchrun --standalone --nproc_per_node=1``, 1 loader worker, on the
same data files made once by ``bench_train.py --prepare_only`` (raw data.list, char table, global CMVN). WeNet's
YAML is copied into the work folder with those paths, ``<sos>``/``<eos>`` = the table's last id and ``max_epoch`` 1;
WeNet runs with ``--num_workers 1 --prefetch 10`` (as in the reference run). Frames/s counts input frames of the
steady steps (the first left out) over their wall time, the same definition on both sides; peak RSS is the
training process's ``ru_maxrss``.

WeNet setup (done once, outside this repository; none of WeNet's code or text is in this repository):

1. WeNet's source in a folder outside the repository, e.g. ``git clone https://github.com/wenet-e2e/wenet
   /work/wenet`` (commit 0154699, the one of the 2026-11-29 reference run, was measured here).
2. Its own venv (Python 3.11): ``python3 -m venv /work/venv-wenet``, then in it ``pip install torch==2.9.1
   'torchaudio==2.9.*'`` (PyPI's build of torch 2.9.1 is a CUDA build, about 7 GB; it runs on the CPU), and
   ``pip install torch==2.9.1 deepspeed==0.19.8 pyyaml sentencepiece tensorboardX soundfile librosa tiktoken
   langid tqdm`` and ``pip install --no-deps openai-whisper`` (20250625 here; 20231117's source package no longer
   builds with current setuptools). WeNet's train utils import deepspeed and tensorboardX, its utils whisper's
   tokenizer, its data processor langid.
3. Two local edits in WeNet's ``wenet/dataset/processor.py``, because torchaudio 2.9 reads audio only through
   torchcodec and no longer has sox effects: in ``decode_wav``, read the file with ``soundfile.read(path,
   dtype="float32", always_2d=True)`` and transpose it to (channels, samples), instead of ``torchaudio.load``; in
   ``speed_perturb``, ``torchaudio.functional.resample(waveform, round(sample_rate * speed), sample_rate)`` instead
   of the sox speed+rate effect (the same length change, 1/speed). (WeNet's ``tools/compute_cmvn_stats.py`` needs
   the same soundfile change, but this benchmark writes the CMVN file itself.)

Usage:
    python benchmarks/bench_vs_wenet.py --wenet_dir /work/wenet --wenet_python /work/venv-wenet/bin/python \\
        --rounds 2 --work_dir exp/bench_vs_wenet --json exp/bench_vs_wenet/result.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

from harness import fresh_dir, print_side_by_side, run_bench_train, run_logged, summarize_run

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH_TRAIN = os.path.join(REPO, "benchmarks", "bench_train.py")
WENET_PROBE = os.path.join(REPO, "benchmarks", "wenet_probe.py")


def get_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--wenet_dir", required=True, help="WeNet's source (the folder holding wenet/)")
    parser.add_argument("--wenet_python", required=True, help="the python of WeNet's own venv")
    parser.add_argument("--config", default=os.path.join(REPO, "benchmarks", "conf", "conformer_6x256.yaml"))
    parser.add_argument("--wenet_config", default=os.path.join(REPO, "..", "shared", "bench",
                                                               "wenet_conformer_6x256.yaml"))
    parser.add_argument("--override_config", action="append", default=[],
                        help="passed to this toolkit's trainer (not to WeNet); repeatable")
    parser.add_argument("--num_utts", type=int, default=800)
    parser.add_argument("--rounds", type=int, default=2, help="A B pairs")
    parser.add_argument("--work_dir", required=True)
    parser.add_argument("--json", default=None)
    parser.add_argument("--timeout_s", type=float, default=1800.0, help="per training run")
    return parser.parse_args()


def write_wenet_config(args: argparse.Namespace, data: dict) -> str:
    """WeNet's YAML with this run's data files; returns its path."""
    import yaml

    with open(args.wenet_config, encoding="utf-8") as f:
        conf = yaml.safe_load(f)
    with open(data["units.txt"], encoding="utf-8") as f:
        last_id = sum(1 for line in f if line.strip()) - 1
    conf["tokenizer_conf"]["symbol_table_path"] = data["units.txt"]
    conf["tokenizer_conf"]["special_tokens"].update({"<sos>": last_id, "<eos>": last_id})
    conf["cmvn_conf"]["cmvn_file"] = data["global_cmvn"]
    conf["max_epoch"] = 1
    path = os.path.join(args.work_dir, "wenet_train.yaml")
    with open(path, "w", encoding="utf-8") as f:
        yaml.safe_dump(conf, f)
    return path


def run_wenet(args: argparse.Namespace, data: dict, wenet_config: str, run_dir: str) -> dict:
    probe_json = os.path.join(run_dir, "probe")
    os.makedirs(os.path.join(run_dir, "model"), exist_ok=True)  # NOTE: WeNet's recipe makes it before training
    cmd = [args.wenet_python, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=1", WENET_PROBE,
           "--probe_json", probe_json, "--",
           "--train_engine", "torch_ddp", "--device", "cpu", "--ddp.dist_backend", "gloo", "--config", wenet_config,
           "--data_type", "raw", "--train_data", data["train.list"], "--cv_data", data["cv.list"],
           "--model_dir", os.path.join(run_dir, "model"), "--tensorboard_dir", os.path.join(run_dir, "tb"),
           "--num_workers", "1", "--prefetch", "10"]
    env = {**os.environ, "PYTHONPATH": os.path.abspath(args.wenet_dir),
           "BENCH_LAUNCH_TIME": repr(time.time())}
    run_logged(cmd, os.path.join(run_dir, "train.log"), args.timeout_s, env, cwd=REPO)
    with open(f"{probe_json}.rank0.json", encoding="utf-8") as f:
        rank0 = json.load(f)
    return summarize_run([rank0], conf_frame_shift_s(wenet_config), 1)


def conf_frame_shift_s(wenet_config: str) -> float:
    import yaml

    with open(wenet_config, encoding="utf-8") as f:
        return yaml.safe_load(f)["dataset_conf"]["fbank_conf"]["frame_shift"] / 1000


def main() -> None:
    args = get_args()
    os.makedirs(args.work_dir, exist_ok=True)
    # 1. one set of data files for both toolkits
    prep = subprocess.run([sys.executable, BENCH_TRAIN, "--config", args.config, "--num_utts", str(args.num_utts),
                           "--work_dir", args.work_dir, "--prepare_only"], capture_output=True, text=True, cwd=REPO,
                          check=True)
    data = json.loads(prep.stdout.strip().splitlines()[-1])
    wenet_config = write_wenet_config(args, data)
    # 2. A B A B
    rounds = []
    for i in range(args.rounds):
        result = {}
        for side in ("ours", "wenet"):
            run_dir = fresh_dir(os.path.join(args.work_dir, f"r{i + 1}_{side}"))
            result[side] = (run_bench_train(BENCH_TRAIN, args.config, args.num_utts, args.work_dir, run_dir,
                                            args.override_config, timeout_s=args.timeout_s)
                            if side == "ours" else run_wenet(args, data, wenet_config, run_dir))
            print(f"round {i + 1} {side}: {result[side]['frames_per_s']:,.0f} frames/s, peak RSS "
                  f"{result[side]['peak_rss_mib'][0]:,.0f} MiB", flush=True)
        rounds.append(result)
    # 3. the table and the ratios
    ratios = print_side_by_side(rounds)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"config": args.config, "wenet_config": args.wenet_config, "num_utts": args.num_utts,
                       "rounds": rounds, "ratios": ratios}, f, indent=1)


if __name__ == "__main__":
    main()
