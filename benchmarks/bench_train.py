#!/usr/bin/env python3
"""Training speed of a config on the shipped speech: input frames/s, the step split, peak memory, time to the first
step, and the model's FLOPs per frame against a matrix-multiply rate measured in the same run.

1. Data (the package's own data preparation, as the recipe's stages 0-3 make it): the union of the training sets of
   ``--corpora`` under ``--corpus_dir``, shuffled with ``--seed``; the first ``--num_utts`` make the training list
   (their audio re-encoded once as 16-bit FLAC, as stage 3 does, unless ``--audio_format keep``), the first
   ``--cv_utts`` of the dev sets the CV list; the char symbol table comes from all training transcripts
   (stage 2), the global CMVN from the chosen utterances (stage 1). Written once into ``--work_dir`` and reused
   while its ``data.json`` says the same selection.
2. Training, once per entry of ``--nproc``: ``torchrun --standalone --nproc_per_node=N`` runs this script as a
   worker, which calls the trainer itself, ``toolkit.bin.train.main`` (config, tokenizer, data pipeline and loader
   workers, model, TorchScript check, optimizer, engine, join, checkpointer, tensorboard, Executor), for one epoch
   cut after ``--steps`` optimizer steps (0: the whole epoch). Only ``Executor.train`` is wrapped, to attach the
   clock. 1 process uses all cores as torch threads, N processes 1 thread each (``init_distributed``'s rule).
3. Each optimizer step of each rank is split (``benchmarks/harness.py``) into:

   - data: waiting in the train loader's ``next()`` (the join asks one batch ahead; the first step includes the
     loader worker's start and its first sort buffer);
   - join: the join's per-step collective (``FlagJoin``'s "I have a batch" all-reduce);
   - forward: the wrapped (DDP) model's forward, from forward pre- to post-hook (DDP's buffer broadcast included);
   - backward: ``engine.backward`` less the exposed all-reduce;
   - allreduce: the exposed gradient all-reduce: from the launch of the last gradient bucket (a DDP comm hook:
     torch's default all-reduce hook, timed) to the end of ``engine.backward``; ``allreduce_busy`` is the summed
     duration of every bucket's all-reduce, overlapped with the backward pass;
   - optimizer: ``engine.step`` (gradient clipping, Adam, LR schedule, zero_grad);
   - log: the executor's log line and tensorboard scalars (every ``train_conf.log_interval`` steps);
   - other: the rest of the step (batch to device, loss read-back, statistics, checkpoint checks); ``gc`` is the
     Python garbage collector's share of the whole step.
4. After the epoch, on every rank: peak RSS (``ru_maxrss`` of the rank and of its exited loader workers), then
   (all ranks together, as they trained) the fp32 matmul rate; rank 0 counts the forward+backward FLOPs of a copy of
   the model on the last trained batch (``FlopCounterMode``). FLOPs per input frame x frames/s is the achieved
   rate; divided by the summed matmul rate of the ranks it is the fraction of the machine's ceiling.

Frames are input fbank frames (10 ms, padding excluded); audio seconds = frames x frame shift. Steady figures leave
out the first ``--warmup`` steps; ``epoch_*`` figures include them. On a GPU the clock synchronizes the device
before every reading. Prints a table and writes ``--json``.

Usage:
    python benchmarks/bench_train.py --config benchmarks/conf/conformer_6x256.yaml --num_utts 800 --steps 0 \\
        --nproc 1 2 --work_dir exp/bench_train --json exp/bench_train/result.json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time

WORKER_FLAG = "--worker"
CORPORA = ["speechocean762", "kathleen", "ljspeech", "fsdd"]
DATA_FILES = ("train.list", "cv.list", "units.txt", "global_cmvn")


def get_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="examples/english/s0/conf/train_conformer.yaml", help="training YAML")
    parser.add_argument("--override_config", action="append", default=[], help="passed to the trainer; repeatable")
    parser.add_argument("--corpus_dir", default="corpora")
    parser.add_argument("--corpora", nargs="+", default=CORPORA)
    parser.add_argument("--num_utts", type=int, default=800, help="training utterances (shuffled union)")
    parser.add_argument("--cv_utts", type=int, default=16, help="CV utterances (the epoch's CV pass is not timed)")
    parser.add_argument("--seed", type=int, default=777, help="utterance selection seed")
    parser.add_argument("--audio_format", choices=("keep", "flac", "wav"), default="flac",
                        help="the training list's audio: the corpora's files as they are, or re-encoded once as "
                             "16-bit FLAC/WAV (what the recipe's stage 3 does, --audio_format flac by default)")
    parser.add_argument("--steps", type=int, default=20, help="optimizer steps per run; 0: the whole epoch")
    parser.add_argument("--warmup", type=int, default=1, help="leading steps left out of the steady figures")
    parser.add_argument("--nproc", type=int, nargs="+", default=[1, 2], help="processes per run (one run each)")
    parser.add_argument("--work_dir", default=None, help="data and model dirs (default: a temporary folder)")
    parser.add_argument("--json", default=None, help="write the results here")
    parser.add_argument("--prepare_only", action="store_true", help="write the data files into --work_dir, exit")
    parser.add_argument("--timeout_s", type=float, default=1800.0, help="per training run")
    parser.add_argument("--print_steps", action="store_true", help="also print every step of rank 0")
    parser.add_argument("--profile_steps", type=int, nargs="*", default=[],
                        help="run torch.profiler over these steps (1-based, forward to optimizer step) and write "
                             "each rank's operator table to <run dir>/probe.rank<R>.step<N>.txt")
    parser.add_argument("--flush_denormal", action="store_true",
                        help="torch.set_flush_denormal(True) in the trainer (an experiment: subnormal floats are "
                             "slow on x86 CPUs)")
    return parser.parse_args(argv)


# 1. data ------------------------------------------------------------------------------------------------------------

def _corpus_entries(corpus_dir: str, corpora: list[str], split: str) -> list[dict]:
    from toolkit.dataset.data_list import make_raw_list

    entries = []
    for corpus in corpora:
        data = os.path.join(corpus_dir, corpus, "data", split)
        found, unmatched = make_raw_list(os.path.join(data, "wav.scp"), os.path.join(data, "text"),
                                         os.path.abspath(os.path.join(corpus_dir, corpus)))
        if unmatched:
            raise SystemExit(f"{data}: {len(unmatched)} keys in only one of wav.scp and text, e.g. {unmatched[0]}")
        entries += found
    return entries


def prepare_data(args: argparse.Namespace, work_dir: str) -> dict:
    """The data files of the selection (paths by name in ``DATA_FILES``), written unless already there."""
    from toolkit.dataset.cmvn_stats import compute_stats
    from toolkit.dataset.data_list import reencode_audio, write_raw_list
    from toolkit.text.tokenizer import write_symbol_table
    from toolkit.text.units import collect_char_units
    from toolkit.train_config import read_config

    work_dir = os.path.abspath(work_dir)
    paths = {name: os.path.join(work_dir, name) for name in DATA_FILES}
    conf = read_config(args.config, args.override_config).dataset_conf
    fbank = {"num_mel_bins": conf.fbank_conf.num_mel_bins, "frame_length": conf.fbank_conf.frame_length,
             "frame_shift": conf.fbank_conf.frame_shift}
    selection = {"corpus_dir": os.path.abspath(args.corpus_dir), "corpora": args.corpora, "num_utts": args.num_utts,
                 "cv_utts": args.cv_utts, "seed": args.seed, "audio_format": args.audio_format, "cmvn_fbank": fbank,
                 "resample_rate": conf.resample_conf.resample_rate}
    manifest = os.path.join(work_dir, "data.json")
    if os.path.exists(manifest) and all(map(os.path.exists, paths.values())):
        with open(manifest, encoding="utf-8") as f:
            if json.load(f) == selection:
                return paths
    os.makedirs(work_dir, exist_ok=True)
    train = _corpus_entries(args.corpus_dir, args.corpora, "train")
    if len(train) < args.num_utts:
        raise SystemExit(f"--num_utts {args.num_utts}: the training sets of {args.corpora} hold only {len(train)}")
    text = os.path.join(work_dir, "train_text")
    with open(text, "w", encoding="utf-8") as f:
        f.writelines(f"{e['key']} {e['txt']}\n" for e in train)
    write_symbol_table(collect_char_units(text), paths["units.txt"])
    random.Random(args.seed).shuffle(train)
    train = train[:args.num_utts]
    if args.audio_format != "keep":
        train, _, skipped_audio = reencode_audio(train, os.path.join(work_dir, "audio"), args.audio_format, 2)
        if skipped_audio:
            raise SystemExit(f"unreadable training audio: {skipped_audio[:3]}")
    write_raw_list(train, paths["train.list"])
    cv = _corpus_entries(args.corpus_dir, args.corpora, "dev")
    random.Random(args.seed).shuffle(cv)
    write_raw_list(cv[:args.cv_utts], paths["cv.list"])
    stats, skipped = compute_stats(train, fbank, conf.resample_conf.resample_rate, 1)
    if skipped:
        print(f"CMVN: skipped {dict(skipped)}", file=sys.stderr)
    with open(paths["global_cmvn"], "w", encoding="utf-8") as f:
        json.dump(stats, f)
    with open(manifest, "w", encoding="utf-8") as f:
        json.dump(selection, f)
    return paths


# 2./3. the worker: the trainer with a clock attached ----------------------------------------------------------------

class _Probe:
    """Attaches a clock to one executor's engine, join, logging and model (see the module docstring, step 3)."""

    def __init__(self, executor, clock, profile_steps: tuple = (), profile_path: str = ""):
        from torch.nn.parallel import DistributedDataParallel

        from harness import AllReduceTimer

        self.clock = clock
        self.profile_steps, self.profile_path = set(profile_steps), profile_path
        self._profiler = None
        self.last_inputs: tuple = ()
        self._forward_start = 0.0
        self._patched = []
        engine, join = executor.engine, executor.join
        model = engine.model
        allreduce = AllReduceTimer(clock)
        if isinstance(model, DistributedDataParallel):
            model.register_comm_hook(None, allreduce.hook)
        self._handles = [model.register_forward_pre_hook(self._pre_forward),
                         model.register_forward_hook(self._post_forward)]
        self._patch(engine, "backward", allreduce.wrap_backward(engine.backward))
        step = engine.step

        def timed_step() -> float:
            with clock.part("optimizer"):
                grad_norm = step()
            clock.end_step()
            self._stop_profiler()
            return grad_norm

        self._patch(engine, "step", timed_step)
        self._patch(executor, "_log_step", self._timed("log", executor._log_step))
        collective = "_all_have" if hasattr(join, "_all_have") else "_barrier"
        self._patch(join, collective, self._timed("join", getattr(join, collective)))

    def _patch(self, obj, name: str, fn) -> None:
        self._patched.append((obj, name))
        setattr(obj, name, fn)  # NOTE: an instance attribute, shadowing the class's method until detach()

    def detach(self) -> None:
        for obj, name in self._patched:
            delattr(obj, name)
        for handle in self._handles:
            handle.remove()

    def _timed(self, part: str, fn):
        def timed(*args, **kwargs):
            with self.clock.part(part):
                return fn(*args, **kwargs)
        return timed

    def _stop_profiler(self) -> None:
        if self._profiler is not None:
            self._profiler.stop()
            with open(f"{self.profile_path}.step{len(self.clock.steps)}.txt", "w", encoding="utf-8") as f:
                f.write(self._profiler.key_averages().table(sort_by="self_cpu_time_total", row_limit=40))
            self._profiler = None

    def _pre_forward(self, module, inputs) -> None:
        if len(self.clock.steps) + 1 in self.profile_steps and self._profiler is None:
            from torch.profiler import ProfilerActivity, profile

            self._profiler = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
            self._profiler.start()
        self.last_inputs = inputs
        self.clock.add_batch(int(inputs[1].sum()), inputs[0].size(0) * inputs[0].size(1), int(inputs[1].numel()))
        self._forward_start = self.clock.now()

    def _post_forward(self, module, inputs, output) -> None:
        self.clock.add("forward", self.clock.now() - self._forward_start)


def run_worker(argv: list[str]) -> None:
    """Inside torchrun: ``--probe_json PATH --steps N -- <toolkit.bin.train arguments>``; each rank writes
    ``PATH.rank<R>.json`` (:func:`harness.finish_rank`)."""
    import torch

    import toolkit.bin.train as train
    from harness import StepClock, TimedLoader, finish_rank

    split = argv.index("--")
    parser = argparse.ArgumentParser()
    parser.add_argument("--probe_json", required=True)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--profile_steps", type=int, nargs="*", default=[])
    parser.add_argument("--flush_denormal", action="store_true")
    opts = parser.parse_args(argv[:split])
    if opts.flush_denormal:
        torch.set_flush_denormal(True)
    launch_time = float(os.environ["BENCH_LAUNCH_TIME"])

    class TimedExecutor(train.Executor):
        def train(self, dataloader, train_set=None):
            device = self.engine.ctx.device
            clock = StepClock(torch.cuda.synchronize if device.type == "cuda" else None)
            probe = _Probe(self, clock, opts.profile_steps, f"{opts.probe_json}.rank{self.engine.ctx.rank}")
            train_start = time.time()
            clock.restart()
            try:
                with clock.counting_gc():
                    stats = super().train(TimedLoader(dataloader, clock, opts.steps), train_set)
            finally:
                probe.detach()
            feats, feats_lengths = probe.last_inputs[:2]
            record = finish_rank(clock, self.engine.module, probe.last_inputs,
                                 (int(feats_lengths.sum()), feats.size(0) * feats.size(1)), device, launch_time,
                                 train_start)
            with open(f"{opts.probe_json}.rank{self.engine.ctx.rank}.json", "w", encoding="utf-8") as f:
                json.dump(record, f)
            return stats

    # NOTE: the trainer's own main() builds everything; only the class it trains with is this timed subclass.
    train.Executor = TimedExecutor
    train.main(argv[split + 1:])


# the runs and the report --------------------------------------------------------------------------------------------

def run_training(args: argparse.Namespace, data: dict, nproc: int, run_dir: str) -> dict:
    """One torchrun job of ``nproc`` ranks; returns its summary (with each rank's record)."""
    from harness import summarize_run

    os.makedirs(run_dir, exist_ok=True)
    probe_json = os.path.join(run_dir, "probe")
    overrides = [f"tokenizer_conf.symbol_table_path {data['units.txt']}", f"cmvn_conf.cmvn_file {data['global_cmvn']}",
                 "dataset_conf.data_type raw", "train_conf.max_epoch 1", *args.override_config]
    train_args = ["--config", args.config, "--train_data", data["train.list"], "--cv_data", data["cv.list"],
                  "--model_dir", os.path.join(run_dir, "model"), "--tensorboard_dir", os.path.join(run_dir, "tb")]
    for override in overrides:
        train_args += ["--override_config", override]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
           os.path.abspath(__file__), WORKER_FLAG, "--probe_json", probe_json, "--steps", str(args.steps),
           "--profile_steps", *map(str, args.profile_steps), *(["--flush_denormal"] if args.flush_denormal else []),
           "--", *train_args]
    log_path = os.path.join(run_dir, "train.log")
    env = {**os.environ, "BENCH_LAUNCH_TIME": repr(time.time())}
    with open(log_path, "w", encoding="utf-8") as log:
        proc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, timeout=args.timeout_s)
    if proc.returncode != 0:
        with open(log_path, encoding="utf-8") as log:
            tail = log.read()[-3000:]
        raise SystemExit(f"training with {nproc} process(es) failed (exit {proc.returncode}); {log_path}:\n{tail}")
    ranks = []
    for rank in range(nproc):
        with open(f"{probe_json}.rank{rank}.json", encoding="utf-8") as f:
            ranks.append(json.load(f))
    return summarize_run(ranks, frame_shift_s(args), args.warmup)


def frame_shift_s(args: argparse.Namespace) -> float:
    from toolkit.train_config import read_config

    return read_config(args.config, args.override_config).dataset_conf.fbank_conf.frame_shift_s


def print_table(results: dict, print_steps: bool = False) -> None:
    runs = list(results["runs"].values())
    names = [f"{r['nproc']} proc x {r['threads_per_rank']} thr" for r in runs]
    rows = [("input frames/s", "frames_per_s", "{:,.0f}"), ("audio-s/s", "audio_s_per_s", "{:.1f}"),
            ("epoch frames/s (first step in)", "epoch_frames_per_s", "{:,.0f}"),
            ("step s (median)", "step_s_median", "{:.3f}"), ("first step s", "first_step_s", "{:.2f}")]
    print(f"{results['config']}: {runs[0]['params']:,} parameters, {results['num_utts']} utterances, "
          f"{runs[0]['steps']} steps per run ({runs[0]['steady_steps']} steady)")
    print(f"{'':34s}" + "".join(f"{n:>20s}" for n in names))
    for label, key, fmt in rows:
        print(f"{label:34s}" + "".join(f"{fmt.format(r[key]):>20s}" for r in runs))
    print("step split, ms per step (rank mean):")
    for part in runs[0]["split_s"]:
        print(f"  {part:32s}" + "".join(f"{1000 * r['split_s'][part]:>20.1f}" for r in runs))
    memory = [("peak RSS MiB per rank", "peak_rss_mib"), ("loader worker peak RSS MiB", "loader_peak_rss_mib")]
    for label, key in memory:
        print(f"{label:34s}" + "".join(f"{' / '.join(f'{m:,.0f}' for m in r[key]):>20s}" for r in runs))
    for label, key, fmt in [("launch to first step s", "launch_to_first_step_s", "{:.1f}"),
                            ("FLOPs per frame (fwd+bwd)", "flops_per_frame", "{:.3g}"),
                            ("achieved GFLOP/s", "achieved_gflops", "{:.1f}"),
                            ("matmul GFLOP/s (all ranks)", "matmul_gflops", "{:.1f}"),
                            ("padding share of computed frames", "padding_fraction", "{:.1%}"),
                            ("fraction of matmul ceiling", "ceiling_fraction", "{:.1%}"),
                            ("  real frames only", "useful_ceiling_fraction", "{:.1%}"),
                            ("  fwd+bwd time only", "compute_ceiling_fraction", "{:.1%}")]:
        print(f"{label:34s}" + "".join(f"{fmt.format(r[key]):>20s}" for r in runs))
    for r, name in zip(runs, names):
        steps = r["ranks"][0]["steps"]
        slow = sorted(range(len(steps)), key=lambda i: -steps[i]["wall"] / max(steps[i]["frames"], 1))[:3]
        print(f"{name}, rank 0: slowest steps per frame: " + ", ".join(f"{i + 1} ({_step_line(steps[i])})"
                                                                        for i in slow))
        if print_steps:
            for i, step in enumerate(steps):
                print(f"  step {i + 1:3d}: {_step_line(step)}")


def _step_line(step: dict) -> str:
    from harness import PARTS

    parts = " ".join(f"{p} {step[p]:.2f}" for p in (*PARTS, "other", "gc") if step[p] >= 0.005)
    return (f"{step['wall']:.2f} s, {step['frames']} frames ({step['padded_frames']} padded), "
            f"{step['page_faults']} page faults: {parts}")


def main() -> None:
    if WORKER_FLAG in sys.argv[1:2]:
        run_worker(sys.argv[2:])
        return
    args = get_args()
    if args.prepare_only and not args.work_dir:
        raise SystemExit("--prepare_only needs --work_dir (the files are for a later run)")
    with tempfile.TemporaryDirectory() as tmp:
        work_dir = args.work_dir or tmp
        data = prepare_data(args, os.path.join(work_dir, "data"))
        if args.prepare_only:
            print(json.dumps(data))
            return
        runs = {}
        for i, nproc in enumerate(args.nproc):
            runs[f"{i}:{nproc}"] = run_training(args, data, nproc, os.path.join(work_dir, f"run{i}_nproc{nproc}"))
    results = {"config": args.config, "overrides": args.override_config, "num_utts": args.num_utts,
               "corpora": args.corpora, "seed": args.seed, "warmup": args.warmup, "runs": runs}
    print_table(results, args.print_steps)
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
