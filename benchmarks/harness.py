"""Training-speed measurement: a per-step clock that splits each optimizer step into parts, the summary of such
steps over ranks, peak resident memory, a measured matrix-multiply rate and a model's counted FLOPs; running one
benchmark run as a subprocess, and the side-by-side table of two variants.

The benchmarks' shared module, kept out of the package (the wheel ships no benchmark code): the scripts beside it
import it as ``harness`` (Python finds modules in a script's own folder first). Used by ``benchmarks/bench_train.py``
(this toolkit's trainer) and ``benchmarks/wenet_probe.py`` (the same records from another toolkit's trainer), so
both sides of a comparison are counted by one definition, and by ``benchmarks/bench_vs_wenet.py``,
``benchmarks/bench_ab.py`` and ``benchmarks/bench_decode.py`` (which run and compare them). Only the standard library
and torch are imported here (``wenet_probe.py`` runs it in WeNet's venv).

A step record (one dict per optimizer step and rank) holds seconds per part (:data:`PARTS`), ``wall`` (seconds from
the end of the previous optimizer step to the end of this one; the first step counts from the start of the epoch),
``other`` (``wall`` minus the parts), ``frames`` (input fbank frames, 10 ms each, summed over the step's
utterances, padding excluded), ``padded_frames`` (batch size x longest utterance: what the model computes on),
``utts``, ``page_faults`` (minor page faults of the process during the step: memory touched for the first time),
and informational extras that overlap the parts (``allreduce_busy``: summed duration of the gradient all-reduces,
which run beside the backward pass; ``gc``: Python's garbage collector).
"""

from __future__ import annotations

import contextlib
import gc
import json
import multiprocessing.forkserver
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from collections import Counter
from typing import Callable, Iterable, Iterator, Optional

import torch

# The parts of a step, in the order they happen; ``other`` is the rest of the wall time.
PARTS = ("data", "join", "forward", "backward", "allreduce", "optimizer", "log")
EXTRAS = ("allreduce_busy", "gc")
# The revision name of a repository's files as they are now (:func:`source_tree`).
WORKTREE = "worktree"


class StepClock:
    """Seconds per part inside the current optimizer step, closed by :meth:`end_step`.

    Args:
        sync: called before every clock read (``torch.cuda.synchronize`` on a GPU, so that the parts are device
            time rather than launch time); None on CPU.
    """

    def __init__(self, sync: Optional[Callable[[], None]] = None):
        self.sync = sync
        self.steps: list[dict] = []
        self._parts: Counter = Counter()
        self._frames = self._padded = self._utts = 0
        self._faults = _minor_faults()
        self._last_end = self.now()
        self._gc_start: Optional[float] = None

    def now(self) -> float:
        if self.sync is not None:
            self.sync()
        return time.perf_counter()

    def restart(self) -> None:
        """The current step starts now (call at the start of the epoch)."""
        self._last_end = self.now()
        self._faults = _minor_faults()

    @contextlib.contextmanager
    def part(self, name: str) -> Iterator[None]:
        start = self.now()
        try:
            yield
        finally:
            self._parts[name] += self.now() - start

    def add(self, name: str, seconds: float) -> None:
        self._parts[name] += seconds

    def add_batch(self, frames: int, padded_frames: int, utts: int) -> None:
        self._frames += frames
        self._padded += padded_frames
        self._utts += utts

    def end_step(self) -> dict:
        """Close the current step; returns its record (also appended to :attr:`steps`)."""
        end = self.now()
        faults = _minor_faults()
        wall = end - self._last_end
        record = {"wall": wall, **{p: self._parts[p] for p in PARTS}, **{e: self._parts[e] for e in EXTRAS},
                  "frames": self._frames, "padded_frames": self._padded, "utts": self._utts,
                  "page_faults": faults - self._faults}
        record["other"] = wall - sum(record[p] for p in PARTS)
        self.steps.append(record)
        self._parts, self._frames, self._padded, self._utts = Counter(), 0, 0, 0
        self._last_end, self._faults = end, faults
        return record

    @contextlib.contextmanager
    def counting_gc(self) -> Iterator[None]:
        """Inside, the time Python's garbage collector runs is added to the step's ``gc`` extra."""
        def callback(phase: str, info: dict) -> None:
            if phase == "start":
                self._gc_start = time.perf_counter()
            elif self._gc_start is not None:
                self._parts["gc"] += time.perf_counter() - self._gc_start
                self._gc_start = None

        gc.callbacks.append(callback)
        try:
            yield
        finally:
            gc.callbacks.remove(callback)


class TimedLoader:
    """``loader`` with the time spent in ``next()`` (and in ``iter()``: the workers' start) counted as the clock's
    ``data``, stopping after ``max_steps`` batches that hold utterances (0: never). ``generator`` is the loader's
    own, for a trainer that reseeds it per epoch. Batches are dicts with a ``keys`` list (both toolkits' batches)."""

    def __init__(self, loader, clock: StepClock, max_steps: int = 0):
        self.loader, self.clock, self.max_steps = loader, clock, max_steps
        self.generator = getattr(loader, "generator", None)

    def __iter__(self) -> Iterator[dict]:
        with self.clock.part("data"):
            it = iter(self.loader)
        served = 0
        while self.max_steps == 0 or served < self.max_steps:
            with self.clock.part("data"):
                batch = next(it, None)
            if batch is None:
                return
            served += len(batch["keys"]) > 0
            yield batch


class AllReduceTimer:
    """Times DDP's gradient all-reduce: :meth:`hook` is torch's default all-reduce comm hook
    (``register_comm_hook(None, timer.hook)``) with each bucket's duration added to ``allreduce_busy``;
    :meth:`wrap_backward` splits a backward call into ``backward`` and ``allreduce``, the exposed all-reduce: from
    the launch of the last bucket (all gradients computed) to the end of the call."""

    def __init__(self, clock: StepClock):
        self.clock = clock
        self._last_launch: Optional[float] = None

    def hook(self, state, bucket):
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

        start = self._last_launch = time.perf_counter()

        def done(fut):
            self.clock.add("allreduce_busy", time.perf_counter() - start)
            return fut.value()

        return allreduce_hook(state, bucket).then(done)

    def wrap_backward(self, backward: Callable) -> Callable:
        def timed_backward(*args, **kwargs):
            self._last_launch = None
            start = self.clock.now()
            result = backward(*args, **kwargs)
            end = self.clock.now()
            exposed = 0.0 if self._last_launch is None else max(0.0, end - self._last_launch)
            self.clock.add("allreduce", exposed)
            self.clock.add("backward", end - start - exposed)
            return result

        return timed_backward


def _minor_faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def summarize_steps(rank_steps: list[list[dict]], frame_shift_s: float, warmup: int) -> dict:
    """Throughput and the mean step split of one run.

    Args:
        rank_steps: the step records of each rank (the ranks step in lock-step, so they hold the same count).
        frame_shift_s: seconds of audio per input frame (0.01 for a 10 ms shift).
        warmup: leading steps left out of the steady-state figures (the first includes the loader's start-up).

    Returns:
        ``steps``, ``steady_steps``; ``frames_per_s`` and ``audio_s_per_s`` (all ranks' frames over the slowest
        rank's wall time of the steady steps) and the same over the whole epoch (``epoch_*``, first step included);
        ``step_s_median``; ``frames_per_step`` (one rank's mean); ``padding_fraction`` (of the padded frames the
        model computed on, the share that is padding); ``split_s``: mean seconds per steady step of
        each part, ``other`` and the extras, averaged over ranks; ``first_step_s`` (rank mean).

    Raises:
        ValueError: no steady step (fewer steps than ``warmup`` + 1).
    """
    steady = [steps[warmup:] for steps in rank_steps]
    if not steady or min(len(s) for s in steady) == 0:
        raise ValueError(f"need more than warmup={warmup} steps, got {[len(s) for s in rank_steps]}")

    def rate(runs: list[list[dict]]) -> float:
        wall = max(sum(s["wall"] for s in steps) for steps in runs)
        return sum(s["frames"] for steps in runs for s in steps) / wall

    keys = PARTS + ("other",) + EXTRAS
    split = {k: statistics.fmean(s[k] for steps in steady for s in steps) for k in keys}
    frames_per_s, epoch_frames_per_s = rate(steady), rate(rank_steps)
    return {"steps": len(rank_steps[0]), "steady_steps": len(steady[0]),
            "frames_per_s": frames_per_s, "audio_s_per_s": frames_per_s * frame_shift_s,
            "epoch_frames_per_s": epoch_frames_per_s, "epoch_audio_s_per_s": epoch_frames_per_s * frame_shift_s,
            "step_s_median": statistics.median(s["wall"] for steps in steady for s in steps),
            "frames_per_step": statistics.fmean(s["frames"] for steps in steady for s in steps),
            "padding_fraction": 1 - sum(s["frames"] for steps in steady for s in steps) / sum(
                s["padded_frames"] for steps in steady for s in steps),
            "first_step_s": statistics.fmean(steps[0]["wall"] for steps in rank_steps), "split_s": split}


def peak_rss_mib() -> dict:
    """Peak resident set size in MiB (Linux ``ru_maxrss``, KiB): ``self``, this process; ``children``, the largest
    of its descendants that have exited and been waited for: the DataLoader workers of finished epochs, which are
    children of the loader's forkserver (:func:`toolkit.dataset.loader.loader_context`: a rank's always are). The
    server is stopped first, so that it and the workers it waited for count; call this once no loader is iterated
    any more."""
    # NOTE: multiprocessing has no public call that stops its forkserver (its own tests use this one); a loader
    # iterated later starts a new server.
    multiprocessing.forkserver._forkserver._stop()
    return {"self": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "children": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024}


def matmul_gflops(sizes: tuple = (512, 1024, 2048), min_s: float = 0.3, dtype: torch.dtype = torch.float32,
                  device: torch.device = torch.device("cpu")) -> dict:
    """Measured rate of square matrix products in this process (its torch threads), GFLOP/s by size, counting
    ``2 n^3`` FLOPs per product; each size runs one untimed product, then at least ``min_s`` seconds.

    Returns:
        ``{"by_size": {n: GFLOP/s}, "best": the highest}``.
    """
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    by_size = {}
    for n in sizes:
        a = torch.randn(n, n, dtype=dtype, device=device)
        b = torch.randn(n, n, dtype=dtype, device=device)
        torch.mm(a, b)
        sync()
        reps, start = 0, time.perf_counter()
        while True:
            torch.mm(a, b)
            reps += 1
            sync()
            elapsed = time.perf_counter() - start
            if elapsed >= min_s:
                break
        by_size[n] = 2 * n ** 3 * reps / elapsed / 1e9
    return {"by_size": by_size, "best": max(by_size.values())}


def count_train_flops(model: torch.nn.Module, inputs: tuple, loss_key: str = "loss") -> dict:
    """FLOPs of one forward and backward pass of ``model(*inputs)[loss_key]``, counted by
    ``torch.utils.flop_counter.FlopCounterMode`` from the operators' shapes (matrix products, convolutions and
    attention kernels; element-wise operations count 0). The model's gradients are left set and its activation
    checkpointing is turned off: pass a copy.

    These are the model's FLOPs, as MFU counts them (Chowdhery et al., 2022, PaLM, arXiv:2204.02311, appendix B):
    the forward that activation checkpointing repeats in the backward is work the model does not need, so it is
    not counted.

    Returns:
        ``{"total": FLOPs, "by_module": {child module name: FLOPs}}`` (direct children of ``model``).
    """
    from torch.utils.flop_counter import FlopCounterMode

    if hasattr(model, "set_activation_checkpointing"):
        model.set_activation_checkpointing(False)
    with FlopCounterMode(display=False, depth=2) as counter:
        out = model(*inputs)
        out[loss_key].backward()
    counts = counter.get_flop_counts()
    root = type(model).__name__
    by_module = {name[len(root) + 1:]: sum(ops.values()) for name, ops in counts.items()
                 if name.startswith(root + ".") and "." not in name[len(root) + 1:]}
    return {"total": counter.get_total_flops(), "by_module": by_module}


def finish_rank(clock: StepClock, model: torch.nn.Module, last_inputs: tuple, last_frames: tuple[int, int],
                device: torch.device, launch_time: float, train_start: float) -> dict:
    """This rank's record once its timed epoch is over. Collective: every rank calls it (two barriers on the
    default process group). Peak memory is read first; then all ranks measure the matmul rate together, as they
    trained; then rank 0 counts the FLOPs of a copy of ``model`` (unwrapped, training mode) on ``last_inputs``.

    Args:
        last_inputs: the arguments of the last trained forward; ``last_frames``: its (real, padded) input frames.
        launch_time, train_start: ``time.time()`` when the job was launched and when the epoch started.

    Returns:
        ``rank``, ``world_size``, ``threads``, ``device``, ``params``, ``steps`` (the clock's records),
        ``peak_rss_mib``, ``peak_gpu_mib`` (GPU only), ``launch_to_train_s``, ``launch_to_first_step_s``,
        ``matmul_gflops``, and on rank 0 ``flops`` (:func:`count_train_flops` plus ``batch_frames`` and
        ``batch_padded_frames``).
    """
    import copy

    import torch.distributed as dist

    rank = dist.get_rank()
    record = {"rank": rank, "world_size": dist.get_world_size(), "threads": torch.get_num_threads(),
              "device": str(device), "params": sum(p.numel() for p in model.parameters()),
              "peak_rss_mib": peak_rss_mib(), "steps": clock.steps, "launch_to_train_s": train_start - launch_time,
              "launch_to_first_step_s": train_start - launch_time + clock.steps[0]["wall"]}
    if device.type == "cuda":
        record["peak_gpu_mib"] = torch.cuda.max_memory_allocated(device) / 2 ** 20
    dist.barrier()
    record["matmul_gflops"] = matmul_gflops(device=device)
    dist.barrier()
    if rank == 0:
        record["flops"] = {**count_train_flops(copy.deepcopy(model), last_inputs),
                           "batch_frames": last_frames[0], "batch_padded_frames": last_frames[1]}
    return record


def summarize_run(ranks: list[dict], frame_shift_s: float, warmup: int) -> dict:
    """The figures of one run from its ranks' :func:`finish_rank` records: :func:`summarize_steps` plus memory,
    launch time, and the counted FLOPs against the summed matmul rate of the ranks: ``ceiling_fraction``, the rate
    achieved on padded frames over whole steps; ``useful_ceiling_fraction``, the same for the real frames only;
    ``compute_ceiling_fraction``, padded frames over forward+backward time only (the model code's own
    efficiency)."""
    summary = summarize_steps([r["steps"] for r in ranks], frame_shift_s, warmup)
    flops = ranks[0]["flops"]
    per_frame = flops["total"] / flops["batch_frames"]
    # NOTE: the hardware computes on padded frames too: the rate it achieves is FLOPs per padded frame (of the
    # counted batch; attention's T^2 terms make this an approximation for other lengths) x padded frames/s.
    per_padded_frame = flops["total"] / flops["batch_padded_frames"]
    padded_fraction = 1 - summary["padding_fraction"]
    ceiling = sum(r["matmul_gflops"]["best"] for r in ranks)
    achieved = per_padded_frame * summary["frames_per_s"] / padded_fraction / 1e9
    compute_s = summary["split_s"]["forward"] + summary["split_s"]["backward"]
    summary.update({
        "nproc": len(ranks), "threads_per_rank": ranks[0]["threads"], "params": ranks[0]["params"],
        "peak_rss_mib": [r["peak_rss_mib"]["self"] for r in ranks],
        "loader_peak_rss_mib": [r["peak_rss_mib"]["children"] for r in ranks],
        "peak_gpu_mib": [r.get("peak_gpu_mib") for r in ranks],
        "launch_to_first_step_s": max(r["launch_to_first_step_s"] for r in ranks),
        "launch_to_train_s": max(r["launch_to_train_s"] for r in ranks),
        "flops_per_frame": per_frame, "flops_per_padded_frame": per_padded_frame,
        "flops_by_module": flops["by_module"],
        "matmul_gflops_per_rank": [r["matmul_gflops"] for r in ranks], "matmul_gflops": ceiling,
        "achieved_gflops": achieved, "ceiling_fraction": achieved / ceiling,
        "useful_ceiling_fraction": achieved * padded_fraction / ceiling,
        "compute_ceiling_fraction": per_padded_frame * summary["frames_per_step"] / padded_fraction / compute_s / 1e9
        / (ceiling / len(ranks)),
        "ranks": ranks})
    return summary


def run_logged(cmd: list[str], log_path: str, timeout_s: float, env: Optional[dict] = None,
               cwd: Optional[str] = None) -> None:
    """Run ``cmd`` with its stdout and stderr in ``log_path``; raises ``SystemExit`` naming the command, its exit
    status and the log's tail when it fails (``subprocess.TimeoutExpired`` after ``timeout_s`` seconds)."""
    with open(log_path, "w", encoding="utf-8") as log:
        proc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, timeout=timeout_s, cwd=cwd)
    if proc.returncode != 0:
        with open(log_path, encoding="utf-8") as log:
            raise SystemExit(f"{cmd[:4]} failed (exit {proc.returncode}); {log_path}:\n{log.read()[-3000:]}")


def fresh_dir(path: str) -> str:
    """``path`` as an empty folder (a benchmark run's outputs; WeNet's trainer fails at its end on a model dir that
    already holds a run's ``final.pt``). Returns ``path``."""
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path)
    return path


def source_tree(repo: str, rev: str, work_dir: str) -> str:
    """The folder holding revision ``rev`` of the git repository ``repo`` (made once, as a detached worktree under
    ``work_dir``), or ``repo`` itself for ``rev`` :data:`WORKTREE` (its files as they are now). Raises
    ``subprocess.CalledProcessError`` for a revision git does not know."""
    if rev == WORKTREE:
        return repo
    commit = subprocess.run(["git", "-C", repo, "rev-parse", "--verify", f"{rev}^{{commit}}"], capture_output=True,
                            text=True, check=True).stdout.strip()
    path = os.path.join(os.path.abspath(work_dir), f"src_{commit[:12]}")
    if not os.path.isdir(path):
        subprocess.run(["git", "-C", repo, "worktree", "add", "--detach", path, commit], check=True,
                       capture_output=True)
    return path


def source_env(source: str, env: Optional[dict] = None) -> dict:
    """The environment that runs the toolkit of the checkout ``source`` (its folder first on ``PYTHONPATH``,
    ahead of an installed copy; ``PYTHONSAFEPATH`` keeps the working directory off the module search path, where a
    recipe's ``toolkit`` link would win), with ``env`` added."""
    return {**os.environ, **(env or {}), "PYTHONSAFEPATH": "1",
            "PYTHONPATH": os.pathsep.join([source, os.environ.get("PYTHONPATH", "")])}


def run_bench_train(bench_train: str, config: str, num_utts: int, work_dir: str, run_dir: str,
                    overrides: Iterable[str] = (), env: Optional[dict] = None, timeout_s: float = 1800.0) -> dict:
    """One run of 1 process of the script ``bench_train`` (``benchmarks/bench_train.py`` of a checkout of this
    repository, whose folder and ``benchmarks/`` folder go first on ``PYTHONPATH`` so that checkout runs its own
    code and harness) on the data files it prepared in ``work_dir``, with trainer ``overrides`` and ``env`` added;
    its log and JSON go to ``run_dir``. Returns the run's summary (:func:`summarize_run`)."""
    scripts = os.path.dirname(os.path.abspath(bench_train))
    source = os.path.dirname(scripts)
    # NOTE: PYTHONSAFEPATH (source_env) keeps the script's own folder off the search path too, where its harness is.
    run_env = source_env(source, env)
    run_env["PYTHONPATH"] = os.pathsep.join([scripts, run_env["PYTHONPATH"]])
    out = os.path.join(run_dir, "result.json")
    cmd = [sys.executable, bench_train, "--config", config, "--num_utts", str(num_utts), "--steps", "0",
           "--nproc", "1", "--work_dir", work_dir, "--json", out, "--timeout_s", str(timeout_s)]
    for override in overrides:
        cmd += ["--override_config", override]
    run_logged(cmd, os.path.join(run_dir, "bench.log"), timeout_s + 600, run_env, cwd=source)
    with open(out, encoding="utf-8") as f:
        return next(iter(json.load(f)["runs"].values()))


def print_side_by_side(rounds: list[dict], sides: tuple[str, str] = ("ours", "wenet"),
                       labels: tuple[str, str] = ("ours", "WeNet")) -> dict:
    """Print the per-round figures of the two ``sides`` (keys of each round, values :func:`summarize_run`
    summaries) and the ratios of their means (first / second); returns the ratios by summary key."""
    rows = [("input frames/s", "frames_per_s", "{:,.0f}"), ("audio-s/s", "audio_s_per_s", "{:.1f}"),
            ("epoch frames/s (first step in)", "epoch_frames_per_s", "{:,.0f}"),
            ("step s (median)", "step_s_median", "{:.3f}"),
            ("launch to first step s", "launch_to_first_step_s", "{:.1f}"),
            ("padding share of computed frames", "padding_fraction", "{:.1%}"),
            ("fraction of matmul ceiling", "ceiling_fraction", "{:.1%}"), ("peak RSS MiB", "peak_rss_mib", "{:,.0f}")]
    first, second = (rounds[0][side] for side in sides)
    print(f"{labels[0]}: {first['params']:,} parameters, {first['steps']} steps per run; "
          f"{labels[1]}: {second['params']:,}, {second['steps']}")
    names = [f"{label} r{i + 1}" for i in range(len(rounds)) for label in labels]
    runs = [r[side] for r in rounds for side in sides]
    ratio_name = f"{labels[0]}/{labels[1]}"
    width = max(12, max(map(len, names + [ratio_name])) + 2)
    print(f"{'':32s}" + "".join(f"{n:>{width}s}" for n in names) + f"{ratio_name:>{width}s}")
    ratios = {}
    for label, key, fmt in rows:
        values = [r[key][0] if isinstance(r[key], list) else r[key] for r in runs]
        ratios[key] = statistics.fmean(values[0::2]) / statistics.fmean(values[1::2])
        print(f"{label:32s}" + "".join(f"{fmt.format(v):>{width}s}" for v in values)
              + f"{ratios[key]:>{width - 1}.2f}x")
    print("step split, ms per step:")
    for part in runs[0]["split_s"]:
        print(f"  {part:30s}" + "".join(f"{1000 * r['split_s'][part]:>{width}.1f}" for r in runs))
    return ratios
