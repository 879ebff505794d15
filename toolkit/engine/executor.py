"""The epoch loops: train (with gradient accumulation, clipping, mixed precision, join) and cross-validation.

Batches are the dict documented in :mod:`toolkit.dataset.pipeline`; the model is any module called as
``model(feats, feats_lengths, target, target_lengths)`` returning a dict with ``"loss"`` (mean over the batch's
utterances) and optionally ``"excluded"``, bool (B,), the utterances it left out of that mean because their encoder
output is too short for their target (see ``ASRModel.forward``). Statistics are accumulated per rank as sums and
reduced across ranks only after the join block, so the reported epoch loss is the exact utterance-weighted mean over
every rank's data.

Utterances that reach the model but are not trained (or scored, in cross-validation) are logged by key and counted
in the epoch's ``skipped`` counts, so trained + dropped + skipped = offered still holds, in utterances:

* ``too_few_encoder_frames``: the ones the model excluded (e.g. 2 encoder frames for a 10-character target: no CTC
  alignment exists, and ``zero_infinity`` would have scored them 0 silently).
* ``non_finite_loss``: every utterance of a batch whose loss is NaN or infinite. That batch is not added to the loss
  sums, and its gradient is replaced by zeros before it reaches ``.grad`` (so before DDP's or DeepSpeed's gradient
  all-reduce): the other micro-batches of the accumulation and the other ranks' batches still make the step, whose
  gradient is their sum over ``accum_grad`` x world size, the bad batch counting as zero.

A step whose global gradient norm is still non-finite (e.g. an overflow in the backward pass) is skipped by every
engine on every rank, and the LR schedule does not advance (see :meth:`Engine.step`); such steps are counted in
``skipped_steps``.

Tensorboard: every scalar is keyed by the optimizer step (``cv/loss`` and ``train/epoch_loss`` at the epoch's last
step), so a resumed run's ``purge_step`` (see :func:`toolkit.utils.tensorboard_writer.init_summarywriter`) hides
the abandoned run's points of every tag alike.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
import logging
import math
import os
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator

import torch

from toolkit.distributed.collectives import all_gather_objects, all_reduce_sum, broadcast_from_main
from toolkit.distributed.join import FlagJoin, MonitoredBarrierJoin
from toolkit.distributed.main_only import main_process_only
from toolkit.engine.base import Engine
from toolkit.engine.checkpointer import Checkpointer
from toolkit.engine.train_conf import TrainConf
from toolkit.utils.checkpoint import load_info
from toolkit.utils.config_parsing import ConfigError
from toolkit.utils.rng import RngState

MODEL_INPUT_KEYS = ("feats", "feats_lengths", "target", "target_lengths")
NON_FINITE_LOSS = "non_finite_loss"
TOO_FEW_ENCODER_FRAMES = "too_few_encoder_frames"


@dataclass
class TrainProgress:
    """Where training continues; a saver hook (main process only) of every checkpoint.

    After a finished epoch, ``epoch`` is the next one and ``batches_in_epoch`` is 0. Inside an epoch (a ``step_N``
    checkpoint) ``batches_in_epoch`` counts the batches the join has yielded so far (the same on every rank); a
    resume replays the epoch's data order (``data_seed`` + ``epoch``) and skips the batches :class:`EpochPosition`
    says were accounted for.
    """

    epoch: int = 0
    step: int = 0  # optimizer steps taken so far (all epochs)
    batches_in_epoch: int = 0
    data_seed: int = 0  # the dataset's shuffling seed (train_conf.seed)
    epoch_lr: float = 0.0  # the LR when the epoch started (its YAML's ``lr``, also after a mid-epoch resume)
    data_signature: str = ""  # what a mid-epoch resume needs unchanged (see data_signature)

    def state_dict(self) -> dict:
        return dataclasses.asdict(self)

    def load_state_dict(self, state: dict) -> None:
        for key, value in state.items():
            setattr(self, key, value)


@dataclass
class EpochStats:
    """Sums over one epoch (per rank until :meth:`reduce` makes them global)."""

    num_batches: int = 0
    num_utts: int = 0  # utterances in the loss sums
    loss_sum: float = 0.0  # sum over utterances of the per-utterance loss
    audio_s: float = 0.0
    skipped: Counter = field(default_factory=Counter)
    dropped_batches: int = 0  # held by this rank when another rank ran out (see toolkit.distributed.join)
    dropped_utts: int = 0  # utterances in those batches: num_utts + dropped_utts + sum(skipped) = data offered
    skipped_steps: int = 0  # optimizer steps skipped for a non-finite gradient norm (the same on every rank)

    @property
    def loss(self) -> float:
        return self.loss_sum / max(self.num_utts, 1)

    def add(self, batch: dict, loss: float | None, frame_shift_s: float = 0.0,
            excluded: torch.Tensor | None = None) -> None:
        """Count ``batch``, its audio as ``feats_lengths`` frames of ``frame_shift_s`` seconds: ``loss`` None for one
        the model never saw (B=0); a non-finite ``loss`` counts all its utterances as skipped; ``excluded``
        (bool (B,)) marks those the model left out of a finite ``loss``."""
        self.skipped.update(batch.get("num_skipped", {}))
        num_utts = len(batch["keys"])
        if loss is None or num_utts == 0:
            return
        self.num_batches += 1
        self.audio_s += float(batch["feats_lengths"].sum()) * frame_shift_s
        if not math.isfinite(loss):
            self.skipped[NON_FINITE_LOSS] += num_utts
            return
        num_excluded = 0 if excluded is None else int(excluded.sum())
        if num_excluded:
            self.skipped[TOO_FEW_ENCODER_FRAMES] += num_excluded
        self.num_utts += num_utts - num_excluded
        self.loss_sum += loss * (num_utts - num_excluded)

    def add_dropped(self, batch: dict) -> None:
        """A batch the join dropped: its utterances count as dropped, its skip counts still count as skipped."""
        self.skipped.update(batch.get("num_skipped", {}))
        self.dropped_utts += len(batch["keys"])

    def reduce(self) -> "EpochStats":
        """All ranks: sum the statistics over the job (a collective; never call it inside a join block)."""
        sums = all_reduce_sum(torch.tensor([self.num_batches, self.num_utts, self.loss_sum, self.audio_s,
                                            self.dropped_batches, self.dropped_utts], dtype=torch.float64),
                              "EpochStats.reduce")
        skipped = Counter()
        for counter in all_gather_objects(dict(self.skipped), "EpochStats.reduce skipped"):
            skipped.update(counter)
        return EpochStats(num_batches=int(sums[0]), num_utts=int(sums[1]), loss_sum=float(sums[2]),
                          audio_s=float(sums[3]), skipped=skipped, dropped_batches=int(sums[4]),
                          dropped_utts=int(sums[5]), skipped_steps=self.skipped_steps)


def _log_left_out(batch: dict, loss: float, excluded: torch.Tensor | None, where: str) -> None:
    """Name the utterances of a batch that reached the model but are not in the loss sums."""
    if not math.isfinite(loss):
        logging.warning("%s: loss %s is not finite; %s counted as %s, their gradient zeroed: %s", where, loss,
                        len(batch["keys"]), NON_FINITE_LOSS, " ".join(batch["keys"]))
    elif excluded is not None and bool(excluded.any()):
        keys = [key for key, out in zip(batch["keys"], excluded.tolist()) if out]
        logging.warning("%s: encoder output too short for the target (no CTC alignment, or no frame); %d counted "
                        "as %s: %s", where, len(keys), TOO_FEW_ENCODER_FRAMES, " ".join(keys))


@contextlib.contextmanager
def _gradients_zeroed(module: torch.nn.Module) -> Iterator[None]:
    """Inside, every gradient arriving at a parameter of ``module`` is replaced by zeros before it is accumulated
    into ``.grad``, hence before DDP's or DeepSpeed's reduction hooks read it. The backward pass itself still runs,
    so the engines' collectives see the same parameters as for any other batch."""
    handles = [p.register_hook(torch.zeros_like) for p in module.parameters() if p.requires_grad]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


class RunningEpochStats:
    """Saver hook (per rank): this rank's unreduced statistics of the epoch in progress, so that an epoch resumed
    from a ``step_N`` checkpoint still reports the whole epoch in its YAML."""

    def __init__(self):
        self.stats = EpochStats()

    def state_dict(self) -> dict:
        # NOTE: not dataclasses.asdict: it rebuilds a Counter from (key, value) pairs, counting the pairs.
        return {f.name: copy.deepcopy(getattr(self.stats, f.name)) for f in dataclasses.fields(EpochStats)}

    def load_state_dict(self, state: dict) -> None:
        self.stats = EpochStats(**state)

    @staticmethod
    def reshard(states: list[dict], rank: int) -> dict:
        """The state of ``rank`` after a resume on another world size: rank 0 takes the sums of every saved rank's
        (so the reduced statistics still cover the whole epoch), the others start from zero; all keep the skipped
        optimizer steps, which are the same on every rank."""
        merged = RunningEpochStats()
        merged.stats.skipped_steps = states[0]["skipped_steps"]
        if rank == 0:
            for state in states:
                for name in ("num_batches", "num_utts", "loss_sum", "audio_s", "dropped_batches", "dropped_utts"):
                    setattr(merged.stats, name, getattr(merged.stats, name) + state[name])
                merged.stats.skipped.update(state["skipped"])
        return merged.state_dict()


class EpochPosition:
    """Saver hook (per rank): the batches of the epoch in progress this rank has accounted for (trained, or read for
    their skip counts), by the ``position`` the pipeline gives each batch: ``chunks`` maps a chunk to ``(batches,
    done)``, its first ``batches`` batches, ``done`` once its last one is among them. A resume hands them to the
    dataset (:meth:`~toolkit.dataset.pipeline.AsrDataset.set_epoch`), which leaves them out. A batch without a
    ``position`` (a loader other than the pipeline's, as in engine tests) is not tracked."""

    def __init__(self):
        self.chunks: dict[int, tuple[int, bool]] = {}

    def add(self, batch: dict) -> None:
        if "position" in batch:
            chunk, index, last = batch["position"]
            self.chunks[chunk] = (index + 1, last)

    def state_dict(self) -> dict:
        return {"chunks": dict(self.chunks)}

    def load_state_dict(self, state: dict) -> None:
        self.chunks = dict(state["chunks"])

    @staticmethod
    def reshard(states: list[dict], rank: int) -> dict:
        """Every rank of another world size gets what all saved ranks accounted for (each chunk was read by one)."""
        chunks: dict[int, tuple[int, bool]] = {}
        for state in states:
            for chunk, consumed in state["chunks"].items():
                chunks[chunk] = max(chunks.get(chunk, (0, False)), consumed)
        return {"chunks": chunks}


def data_signature(world_size: int | None, train_data: str, dataset_conf: dict, accum_grad: int) -> str:
    """What a mid-epoch resume must find unchanged (JSON), its position counting batches of that setup:
    ``world_size`` is None where the epoch's batches do not depend on it
    (:attr:`~toolkit.dataset.pipeline.AsrDataset.planned_batching`)."""
    return json.dumps({"world_size": world_size, "train_data": train_data, "dataset_conf": dataset_conf,
                       "accum_grad": accum_grad}, sort_keys=True)


def _why_not_resumable(path: str, epoch: int, saved: str, current: str) -> str | None:
    """None when a checkpoint inside ``epoch`` written with signature ``saved`` can continue under ``current``;
    otherwise the one-line reason."""
    if saved == current:
        return None
    old, new = json.loads(saved) if saved else None, json.loads(current)
    if not isinstance(old, dict):
        why = "it was written by an earlier version, whose epoch order differs"
    else:
        why = ", ".join(key for key in sorted(new) if old.get(key) != new[key]) + " changed since it was written"
        if isinstance(old.get("world_size"), int) and old["world_size"] != new["world_size"]:
            why += (f" (by {old['world_size']} ranks: with shards or dynamic batching each rank reads its own share "
                    "of the epoch)")
    return (f"--checkpoint {path} stops inside epoch {epoch}, but {why}, so its position in the epoch means other "
            "utterances now; resume from the last epoch_N.pt instead")


def _to_device(batch: dict, device: torch.device) -> list[torch.Tensor]:
    return [batch[key].to(device, non_blocking=True) for key in MODEL_INPUT_KEYS]


class Executor:
    """Trains and cross-validates the engine's model one epoch at a time, and owns where training stands: the
    progress (epoch, step, position inside the epoch), the epoch's running statistics, resume, logging and ETA.

    Its state travels in every checkpoint as saver hooks of ``checkpointer``: ``progress`` (main process),
    ``rng``, ``epoch_stats`` and ``epoch_position`` (per rank), so that a ``step_N`` checkpoint resumes
    bit-identically on the world size that wrote it, and, where the epoch's batches do not depend on the world size,
    with every utterance of the epoch trained once on another.

    Args:
        engine: a prepared engine.
        join: keeps the ranks in lock-step; every rank takes the same number of steps.
        checkpointer: saves ``step_N`` checkpoints when due, and the epoch's at :func:`save_model`.
        train_conf: ``accum_grad``, ``log_interval``, ``max_epoch``, ``max_train_minutes``, ``seed`` (the data
            seed).
        frame_shift_s: seconds per feature frame (``dataset_conf.fbank_conf.frame_shift``), for audio seconds.
        data_signature: what a mid-epoch resume must find unchanged (:func:`data_signature`).
        utts_per_epoch: utterances in the training list (all ranks), for the ETA.
        clock: seconds on a monotonic clock, for ``max_train_minutes``; only global rank 0's decides.

    Attributes:
        writer: rank 0's tensorboard ``SummaryWriter`` (None elsewhere, or to log nothing); set it after
            :meth:`resume`, which says from which step on it must purge an abandoned run's points.
    """

    def __init__(self, engine: Engine, join: FlagJoin | MonitoredBarrierJoin, checkpointer: Checkpointer,
                 train_conf: TrainConf, frame_shift_s: float, data_signature: str, utts_per_epoch: int = 0,
                 clock: Callable[[], float] = time.monotonic):
        self.engine = engine
        self.join = join
        self.checkpointer = checkpointer
        self.accum_grad = train_conf.accum_grad
        self.log_interval = train_conf.log_interval
        self.max_epoch = train_conf.max_epoch
        self.max_train_s = 60.0 * train_conf.max_train_minutes
        self.clock = clock
        # Rank 0's clock (set by epochs()): when the run started, when its training steps must stop so that the
        # last epoch's CV and save still end within max_train_minutes, and when this rank's last train() ended.
        self._started = self._train_ended = clock()
        self._deadline = math.inf
        self.cut_short = False  # whether the last train() stopped at the deadline before the epoch's end
        self.frame_shift_s = frame_shift_s
        self.utts_per_rank = -(-utts_per_epoch // engine.ctx.world_size)
        self.writer = None
        self.progress = TrainProgress(data_seed=train_conf.seed, data_signature=data_signature)
        self.running = RunningEpochStats()
        self.position = EpochPosition()
        checkpointer.register("progress", self.progress)
        checkpointer.register("rng", RngState(), main_process_only=False)
        checkpointer.register("epoch_stats", self.running, main_process_only=False, reshard=RunningEpochStats.reshard)
        checkpointer.register("epoch_position", self.position, main_process_only=False, reshard=EpochPosition.reshard)

    def resume(self, path: str, train_set) -> None:
        """Collective: restore the engine and the saver hooks from checkpoint ``path``; :attr:`progress` then says
        where training continues. A mid-epoch checkpoint continues at its next batch, an epoch checkpoint at the
        next epoch. The data seed is the checkpoint's (``train_set.seed`` is set to it).

        Raises:
            ConfigError: ``path`` is missing or not a training checkpoint, or stops inside an epoch whose data
                setup (:attr:`TrainProgress.data_signature`) differs from this run's.
        """
        if not os.path.exists(path):
            raise ConfigError(f"--checkpoint {path}: no such file")
        signature = self.progress.data_signature
        restored = self.checkpointer.load(path)
        progress = self.progress
        refusal = progress.batches_in_epoch and _why_not_resumable(path, progress.epoch, progress.data_signature,
                                                                    signature)
        if refusal:
            raise ConfigError(refusal)
        progress.data_signature = signature  # this run's setup: what its own step checkpoints will stand for
        if "progress" not in restored:  # written before saver hooks existed: continue after its epoch
            info = load_info(path)
            if "epoch" not in info:
                raise ConfigError(f"--checkpoint {path} is not a training checkpoint (no epoch in its .yaml, e.g. an "
                                  "averaged model); resume from an epoch_N.pt or step_N.pt")
            progress.epoch, progress.step = info["epoch"] + 1, info["step"]
        if progress.data_seed != train_set.seed:
            logging.warning("%s was trained with data seed %d, the config says %d: keeping the checkpoint's", path,
                            progress.data_seed, train_set.seed)
            train_set.seed = progress.data_seed
        logging.info("resumed from %s: epoch %d after %d of its batches, step %d", path, progress.epoch,
                     progress.batches_in_epoch, progress.step)

    def epochs(self) -> Iterator[int]:
        """The epochs left to train (from the resumed one), each set in :attr:`progress` while it runs.

        Collective with ``train_conf.max_train_minutes`` (M > 0), which bounds the run from this call: training
        steps stop at M minutes less the longest CV + save so far (the time from the end of a :meth:`train` to the
        next epoch), so that the epoch in progress is cut short there (see :meth:`train`) and its CV and save still
        end by M; no epoch starts past that point. Global rank 0's clock decides and broadcasts every decision, so
        ranks whose clocks disagree stop together. The bound is this process's: a resumed job has M minutes again.
        """
        first = self.progress.epoch
        bounded = self.max_train_s > 0
        self._started = self._train_ended = self.clock()
        self._deadline = self._started + self.max_train_s if bounded else math.inf
        log = main_process_only(logging.info)
        if bounded:
            log("train_conf.max_train_minutes %g: training stops there, cutting short the epoch in progress, and "
                "keeps the longest CV + save so far for its end (max_epoch %d)", self.max_train_s / 60,
                self.max_epoch)
        tail = 0.0  # the longest CV + save so far
        for epoch in range(first, self.max_epoch):
            if epoch > first and bounded:
                now = self.clock()
                tail = max(tail, now - self._train_ended)
                self._deadline = self._started + self.max_train_s - tail
                if broadcast_from_main(now >= self._deadline, "Executor.epochs"):
                    log("train_conf.max_train_minutes %g: stopping after epoch %d of max_epoch %d: %.1f minutes "
                        "trained, the longest CV + save %.1f s", self.max_train_s / 60, epoch - 1, self.max_epoch,
                        (now - self._started) / 60, tail)
                    return
            self.progress.epoch = epoch
            yield epoch

    def train(self, dataloader: Iterable[dict], train_set=None) -> EpochStats:
        """Train the current epoch (or its rest, after a mid-epoch resume) on this rank's share of the data; every
        rank calls it. Returns the whole epoch's statistics, reduced over the ranks (this rank's own are in
        ``running.stats``).

        With ``train_set`` (the :class:`~toolkit.dataset.pipeline.AsrDataset` behind ``dataloader``), the set is
        moved to the epoch and the loader's own generator reseeded, so a resumed job replays the same data order
        and worker seeds. With :attr:`progress` inside the epoch, the set leaves out the batches
        :attr:`position` says were accounted for.

        With ``train_conf.max_train_minutes``, after every optimizer step global rank 0 broadcasts whether its clock
        has reached the deadline that :meth:`epochs` set (a collective per step); if so, every rank ends the epoch
        at that same step (:attr:`cut_short`). The rest of the epoch, including batches the loader or the join
        already read ahead, is neither trained nor counted.
        """
        progress, engine, join, position = self.progress, self.engine, self.join, self.position
        if progress.batches_in_epoch == 0:
            progress.epoch_lr = engine.lr
            self.running.stats = EpochStats()
            position.chunks = {}
        else:
            logging.info("resuming epoch %d after its first %d batches", progress.epoch, progress.batches_in_epoch)
        if train_set is not None:
            train_set.set_epoch(progress.epoch, position.chunks)
            # NOTE: the loader's own generator, reseeded per epoch, so a resumed job replays the same worker seeds.
            dataloader.generator.manual_seed(progress.data_seed + progress.epoch)
        dataloader = (batch for batch in dataloader if "replayed" not in batch)
        stats = self.running.stats
        model = engine.model
        model.train()
        self._clock = (time.perf_counter(), stats.audio_s, stats.num_utts)  # what this process trains from here
        micro = 0  # micro-batches since the last optimizer step
        self.cut_short = False
        engine.zero_grad()

        def on_empty(batch: dict) -> None:  # a B=0 batch: only skip counts
            stats.add(batch, None)
            position.add(batch)

        for batch in join.iterate(dataloader, on_empty=on_empty, on_dropped=stats.add_dropped):
            micro += 1
            progress.batches_in_epoch += 1
            sync = micro == self.accum_grad or join.is_last  # the epoch's last micro-batches still make a step
            with engine.accumulate(sync):
                with engine.autocast():
                    out = model(*_to_device(batch, engine.ctx.device))
                loss = float(out["loss"].detach())
                with contextlib.nullcontext() if math.isfinite(loss) else _gradients_zeroed(engine.module):
                    engine.backward(out["loss"] / self.accum_grad)
            _log_left_out(batch, loss, out.get("excluded"), f"epoch {progress.epoch} step {progress.step + 1}")
            stats.add(batch, loss, self.frame_shift_s, out.get("excluded"))
            position.add(batch)
            if not sync:
                continue
            micro = 0
            lr = engine.lr
            grad_norm = engine.step()
            progress.step += 1
            if not math.isfinite(grad_norm):
                stats.skipped_steps += 1
                logging.warning("step %d: non-finite grad_norm %s, update skipped (the LR schedule does not "
                                "advance)", progress.step, grad_norm)
            if progress.step % self.log_interval == 0:
                self._log_step(stats, out, loss, lr, grad_norm)
            # NOTE: only here, at an optimizer-step boundary: a checkpoint never holds half an accumulation.
            if self.checkpointer.step_due(progress.step):
                self.checkpointer.save(f"step_{progress.step}", {
                    "epoch": progress.epoch, "step": progress.step, "batches_in_epoch": progress.batches_in_epoch,
                    "lr": engine.lr, "tag": f"step_{progress.step}"})
            if self.max_train_s > 0 and broadcast_from_main(self.clock() >= self._deadline, "Executor.train"):
                self.cut_short = True
                main_process_only(logging.info)(
                    "train_conf.max_train_minutes %g: epoch %d cut short after %d batches (step %d), %.1f minutes "
                    "trained", self.max_train_s / 60, progress.epoch, progress.batches_in_epoch, progress.step,
                    (self.clock() - self._started) / 60)
                break
        progress.batches_in_epoch = 0
        stats.dropped_batches = join.report.dropped
        engine.zero_grad()  # monitored_barrier mode cannot know the last step: its cut-short accumulation is dropped
        stats = stats.reduce()
        self._train_ended = self.clock()
        return stats

    @main_process_only
    def _log_step(self, stats: EpochStats, out: dict, loss: float, lr: float, grad_norm: float) -> None:
        progress = self.progress
        started, audio_before, utts_before = self._clock
        elapsed = time.perf_counter() - started
        parts = [f"epoch {progress.epoch}", f"step {progress.step}", f"loss {loss:.3f}"]
        extra = {key: float(out[key].detach()) for key in ("loss_ctc", "loss_att", "loss_interctc", "th_accuracy")
                 if out.get(key) is not None}
        parts += [f"{key} {value:.3f}" for key, value in extra.items()]
        throughput = (stats.audio_s - audio_before) / max(elapsed, 1e-9)
        parts += [f"lr {lr:.3e}", f"grad_norm {grad_norm:.3f}", f"{throughput:.1f} audio-s/s"]
        utts_total = self.utts_per_rank * (self.max_epoch - progress.epoch)
        if utts_total > stats.num_utts > utts_before:
            eta = elapsed / (stats.num_utts - utts_before) * (utts_total - stats.num_utts)
            eta = min(eta, self._deadline - self.clock())  # max_train_minutes stops before its deadline
            parts.append(f"ETA {eta / 60:.1f} min")
        logging.info(" | ".join(parts))
        if self.writer is not None:
            for key, value in {"loss": loss, "lr": lr, "grad_norm": grad_norm, **extra}.items():
                self.writer.add_scalar(f"train/{key}", value, progress.step)

    @torch.no_grad()
    def cv(self, dataloader) -> EpochStats:
        """Loss over this rank's share of the CV data, then reduced over all ranks (exact: sums, not averages of
        averages). Every rank calls it. Uses the unwrapped model inside :meth:`Engine.evaluation`, so forwards issue
        no collective and uneven CV shares (even an empty one) need no join."""
        engine = self.engine
        model = engine.module
        model.eval()
        stats = EpochStats()
        with engine.evaluation():
            for batch in dataloader:
                if len(batch["keys"]) == 0:
                    stats.add(batch, None)
                    continue
                with engine.autocast():
                    out = model(*_to_device(batch, engine.ctx.device))
                loss = float(out["loss"])
                _log_left_out(batch, loss, out.get("excluded"), "cross-validation")
                stats.add(batch, loss, self.frame_shift_s, out.get("excluded"))
        return stats.reduce()

    def epoch_info(self, train: EpochStats, cv: EpochStats) -> dict:
        """The finished epoch's metadata (its checkpoint's YAML), logged on the main process and written to
        tensorboard; :attr:`progress` moves on to the next epoch. ``train`` and ``cv`` are reduced over the ranks."""
        progress = self.progress
        info = {"epoch": progress.epoch, "step": progress.step, "lr": progress.epoch_lr, "cv_loss": cv.loss,
                "train_loss": train.loss, "train_utts": train.num_utts, "cv_utts": cv.num_utts,
                "skipped": dict(train.skipped), "cv_skipped": dict(cv.skipped),
                "dropped_batches": train.dropped_batches, "dropped_utts": train.dropped_utts,
                "skipped_steps": train.skipped_steps, "cut_short": self.cut_short, "tag": f"epoch_{progress.epoch}"}
        self._log_epoch(info)
        progress.epoch += 1  # what the checkpoint resumes: the next epoch from its start
        return info

    @main_process_only
    def _log_epoch(self, info: dict) -> None:
        logging.info("epoch %d done: step %d, train_loss %.3f (%d utts), cv_loss %.3f (%d utts), dropped batches %d "
                     "(%d utts), skipped utts train %s cv %s, skipped steps %d", info["epoch"], info["step"],
                     info["train_loss"], info["train_utts"], info["cv_loss"], info["cv_utts"],
                     info["dropped_batches"], info["dropped_utts"], info["skipped"], info["cv_skipped"],
                     info["skipped_steps"])
        if self.writer is not None:
            self.writer.add_scalar("cv/loss", info["cv_loss"], info["step"])
            self.writer.add_scalar("train/epoch_loss", info["train_loss"], info["step"])
            self.writer.flush()


def require_utterances(stats: EpochStats, what: str, data_list: str) -> None:
    """Stop every rank (they hold the same reduced ``stats``) when a pass used no utterance at all: a model
    "trained" or scored on nothing must not produce checkpoints, a CV loss of 0 or a successful exit.

    Raises:
        ConfigError: naming ``data_list`` and where its utterances went (dropped at the join, skipped by reason).
    """
    if stats.num_utts > 0:
        return
    raise ConfigError(f"{what} no utterance of {data_list}: {stats.dropped_utts} dropped at the join "
                      f"({stats.dropped_batches} batches), skipped {dict(stats.skipped)}; check the data list and "
                      "data_type, and with shards make more shards than ranks x loader workers")
