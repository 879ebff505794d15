"""The epoch loops: train (with gradient accumulation, clipping, mixed precision, join) and cross-validation.

Batches are the dict documented in :mod:`toolkit.dataset.pipeline`; the model is any module called as
``model(feats, feats_lengths, target, target_lengths)`` returning a dict with ``"loss"`` (mean over the batch's
utterances) and optionally ``"excluded"``, bool (B,), the utterances it left out of that mean because their encoder
output is too short for their target (see ``ASRModel.forward``). Statistics (:mod:`toolkit.engine.stats`) are
accumulated per rank as sums and reduced across ranks only after the join block, so the reported epoch loss is the
exact utterance-weighted mean over every rank's data. Where training stands and how the dataset resumes there are in
:mod:`toolkit.engine.position`; the bound ``train_conf.max_train_minutes`` in :mod:`toolkit.engine.time_budget`.

Utterances that reach the model but are not trained (or scored, in cross-validation) are logged by key and counted
in the epoch's ``skipped`` counts, so trained + dropped + skipped = offered still holds, in utterances:

* ``too_few_encoder_frames``: the ones the model excluded (e.g. 2 encoder frames for a 10-character target: no CTC
  alignment exists, and ``zero_infinity`` would have scored them 0 silently).
* ``non_finite_loss``: every utterance of a batch whose loss is NaN or infinite. That batch is not added to the loss
  sums, and its gradient is replaced by zeros before it reaches ``.grad`` (so before the engine's gradient
  reduction; :meth:`Engine.gradients_zeroed`): the other micro-batches of the accumulation and the other ranks'
  batches still make the step, whose gradient is their sum over ``accum_grad`` x world size, the bad batch counting
  as zero.

A step whose global gradient norm is still non-finite (e.g. an overflow in the backward pass) is skipped by every
engine on every rank, and the LR schedule does not advance (see :meth:`Engine.step`); such steps are counted in
``skipped_steps``.

Tensorboard: every scalar is keyed by the optimizer step (``cv/loss`` and ``train/epoch_loss`` at the epoch's last
step), so a resumed run's ``purge_step`` (see :func:`toolkit.utils.tensorboard_writer.init_summarywriter`) hides
the abandoned run's points of every tag alike.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import time
from typing import Callable, Iterable, Iterator

import torch

from toolkit.distributed.join import FlagJoin, MonitoredBarrierJoin
from toolkit.distributed.main_only import main_process_only
from toolkit.engine.base import Engine
from toolkit.engine.checkpointer import Checkpointer
from toolkit.engine.position import EpochPosition, ResumableDataset, TrainProgress
from toolkit.engine.stats import (NON_FINITE_LOSS, TOO_FEW_ENCODER_FRAMES, EpochStats, RunningEpochStats,
                                  TrainingRate)
from toolkit.engine.time_budget import CV_PROBE_UTTS, SAVE_TO_LAST_IO, CvShare, TimeBudget
from toolkit.engine.train_conf import TrainConf
from toolkit.utils.checkpoint import info_path, load_info
from toolkit.utils.config_parsing import ConfigError
from toolkit.utils.rng import RngState

MODEL_INPUT_KEYS = ("feats", "feats_lengths", "target", "target_lengths")


def _log_left_out(batch: dict, loss: float, excluded: torch.Tensor | None, where: str) -> None:
    """Name the utterances of a batch that reached the model but are not in the loss sums."""
    if not math.isfinite(loss):
        logging.warning("%s: loss %s is not finite; %s counted as %s, their gradient zeroed: %s", where, loss,
                        len(batch["keys"]), NON_FINITE_LOSS, " ".join(batch["keys"]))
    elif excluded is not None and bool(excluded.any()):
        keys = [key for key, out in zip(batch["keys"], excluded.tolist()) if out]
        logging.warning("%s: encoder output too short for the target (no CTC alignment, or no frame); %d counted "
                        "as %s: %s", where, len(keys), TOO_FEW_ENCODER_FRAMES, " ".join(keys))


def _to_device(batch: dict, device: torch.device) -> list[torch.Tensor]:
    return [batch[key].to(device, non_blocking=True) for key in MODEL_INPUT_KEYS]


class Executor:
    """Trains and cross-validates the engine's model one epoch at a time, and owns where training stands: the
    :attr:`progress` (epoch, step, batches into the epoch), this rank's :attr:`position` in the epoch and its
    :attr:`running` statistics, the :attr:`time_budget`, resume, logging and ETA.

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
        data_signature: what a mid-epoch resume must find unchanged
            (:func:`~toolkit.engine.position.data_signature`).
        utts_per_epoch: utterances in the training list (all ranks), for the ETA.
        clock: seconds on a monotonic clock, for ``max_train_minutes`` (:class:`TimeBudget`); only global rank 0's
            decides.
        cv_share: the largest rank's share of a CV pass, to which ``max_train_minutes`` scales its CV probe before
            it has measured a CV (:class:`CvShare`; only global rank 0's is read).

    Attributes:
        writer: rank 0's tensorboard ``SummaryWriter`` (None elsewhere, or to log nothing); set it after
            :meth:`resume`, which says from which step on it must purge an abandoned run's points.
        cut_short: whether the last :meth:`train` stopped at the time budget's deadline before the epoch's end.
    """

    def __init__(self, engine: Engine, join: FlagJoin | MonitoredBarrierJoin, checkpointer: Checkpointer,
                 train_conf: TrainConf, frame_shift_s: float, data_signature: str, utts_per_epoch: int = 0,
                 clock: Callable[[], float] = time.monotonic, cv_share: CvShare = CvShare(0)):
        self.engine = engine
        self.join = join
        self.checkpointer = checkpointer
        self.accum_grad = train_conf.accum_grad
        self.log_interval = train_conf.log_interval
        self.max_epoch = train_conf.max_epoch
        self.time_budget = TimeBudget(train_conf.max_train_minutes, clock)
        self.cv_share = cv_share
        self.cut_short = False
        self.frame_shift_s = frame_shift_s
        self.utts_per_rank = -(-utts_per_epoch // engine.ctx.world_size)
        self.writer = None
        self.progress = TrainProgress(data_seed=train_conf.seed, data_signature=data_signature)
        self.running = RunningEpochStats()
        self.position = EpochPosition()
        self._rate = TrainingRate.since(self.running.stats)  # reset by every train()
        checkpointer.register("progress", self.progress)
        checkpointer.register("rng", RngState(), main_process_only=False)
        checkpointer.register("epoch_stats", self.running, main_process_only=False, reshard=RunningEpochStats.reshard)
        checkpointer.register("epoch_position", self.position, main_process_only=False, reshard=EpochPosition.reshard)

    def resume(self, path: str, train_set: ResumableDataset) -> None:
        """Collective: restore the engine and the saver hooks from checkpoint ``path``; :attr:`progress` then says
        where training continues. A mid-epoch checkpoint continues at its next batch, an epoch checkpoint at the
        next epoch. The data seed is the checkpoint's (``train_set`` is given it).

        Raises:
            ConfigError: ``path`` is missing, uncommitted (no ``.yaml`` beside it) or not a training checkpoint,
                holds a model of another shape than the engine's, or stops inside an epoch whose data setup
                (:attr:`TrainProgress.data_signature`) differs from this run's.
        """
        if not os.path.exists(path):
            raise ConfigError(f"--checkpoint {path}: no such file")
        if not os.path.exists(info_path(path)):
            raise ConfigError(f"--checkpoint {path}: no .yaml beside it, so its save never finished (or the .yaml "
                              "was not copied with it)")
        progress = self.progress
        signature, configured_seed = progress.data_signature, progress.data_seed
        restored = self.checkpointer.load(path)
        progress.continue_under(signature, path)
        if "progress" not in restored:  # written before saver hooks existed: continue after its epoch
            info = load_info(path)
            if "epoch" not in info:
                raise ConfigError(f"--checkpoint {path} is not a training checkpoint (no epoch in its .yaml, e.g. an "
                                  "averaged model); resume from an epoch_N.pt or step_N.pt")
            progress.epoch, progress.step = info["epoch"] + 1, info["step"]
        if progress.data_seed != configured_seed:
            logging.warning("%s was trained with data seed %d, the config says %d: keeping the checkpoint's", path,
                            progress.data_seed, configured_seed)
        train_set.set_seed(progress.data_seed)
        logging.info("resumed from %s: epoch %d after %d of its batches, step %d", path, progress.epoch,
                     progress.batches_in_epoch, progress.step)

    def epochs(self, cv_probe: Iterable[dict] = ()) -> Iterator[int]:
        """The epochs left to train (from the resumed one), each set in :attr:`progress` while it runs.

        Collective with ``train_conf.max_train_minutes``, which bounds the run from this call (see
        :mod:`toolkit.engine.time_budget`): first every rank forwards the batches of ``cv_probe`` (a loader over a
        sample of its CV share, :meth:`AsrDataset.sample`; up to :data:`CV_PROBE_UTTS` utterances), which rank 0
        times for the estimate of the first CV; no epoch starts whose loader's start-up would end past the
        budget's deadline.
        A run that still ends past the bound (a CV + save longer than the longest measured or the estimate, or
        alone longer than the bound) says so in a warning.
        """
        first = self.progress.epoch
        budget = self.time_budget
        budget.start(self.checkpointer.last_io_s)
        log = main_process_only(logging.info)
        if budget.bounded:
            log("train_conf.max_train_minutes %g: training stops there, cutting short the epoch in progress, and "
                "keeps the longest CV + save so far for its end, estimated from a probe of the CV until one is "
                "measured (max_epoch %d)", budget.minutes, self.max_epoch)
            started = budget.clock()
            probed = self._forward_only(cv_probe, "CV probe", CV_PROBE_UTTS)
            tail_s = budget.cv_probed(budget.clock() - started, CvShare(probed.offered, probed.audio_s),
                                      self.cv_share)
            log("train_conf.max_train_minutes %g: %d CV utterances probed, CV + save of the largest share (%d "
                "utterances) estimated at %.1f s", budget.minutes, probed.offered, self.cv_share.utts, tail_s)
        for epoch in range(first, self.max_epoch):
            if epoch > first and not budget.next_epoch_fits():
                log("train_conf.max_train_minutes %g: stopping after epoch %d of max_epoch %d: %.1f minutes "
                    "trained, the longest CV + save %.1f s", budget.minutes, epoch - 1, self.max_epoch,
                    budget.minutes_used(), budget.longest_tail_s)
                break
            self.progress.epoch = epoch
            yield epoch
        if budget.overrun_s() > 0:
            main_process_only(logging.warning)(
                "train_conf.max_train_minutes %g: the run ended %.1f s past the bound plus its last step: the last "
                "CV + save took longer than the time kept for it (the longest measured so far, %.1f s, or its "
                "estimate before one was measured)", budget.minutes, budget.overrun_s(), budget.longest_tail_s)

    def train(self, dataloader: Iterable[dict], train_set: ResumableDataset | None = None) -> EpochStats:
        """Train the current epoch (or its rest, after a mid-epoch resume) on this rank's share of the data; every
        rank calls it. Returns the whole epoch's statistics, reduced over the ranks (this rank's own are in
        ``running.stats``).

        With ``train_set`` (the dataset behind ``dataloader``), the set is moved to the epoch and the loader's own
        generator reseeded, so a resumed job replays the same data order and worker seeds. With :attr:`progress`
        inside the epoch, the set leaves out the batches :attr:`position` says were read.

        With ``train_conf.max_train_minutes``, after every optimizer step global rank 0 decides whether its clock
        has reached the deadline (:meth:`TimeBudget.step_past_deadline`, a collective per step); if so, every rank
        ends the epoch at that same step (:attr:`cut_short`), also where a ``step_N`` checkpoint due there would
        end past the deadline, and writes none there (the epoch's own follows). The rest of the epoch, including
        batches the loader or the join already read ahead, is neither trained nor counted.
        """
        progress, engine, join, position = self.progress, self.engine, self.join, self.position
        if progress.batches_in_epoch == 0:
            progress.epoch_lr = engine.lr
            self.running.stats = EpochStats()
            position.batches_read = {}
        else:
            logging.info("resuming epoch %d after its first %d batches", progress.epoch, progress.batches_in_epoch)
        batches = dataloader if train_set is None else self._epoch_of(train_set, dataloader)
        stats = self.running.stats
        model = engine.model
        model.train()
        self._rate = TrainingRate.since(stats)  # what this process trains from here
        self.time_budget.epoch_started()
        micro = 0  # micro-batches since the last optimizer step
        self.cut_short = False
        engine.zero_grad()

        def on_empty(batch: dict) -> None:  # a B=0 batch: only skip counts
            stats.add(batch, None)
            position.add(batch)

        for batch in join.iterate(batches, on_empty=on_empty, on_dropped=stats.add_dropped):
            micro += 1
            progress.batches_in_epoch += 1
            sync = micro == self.accum_grad or join.is_last  # the epoch's last micro-batches still make a step
            with engine.accumulate(sync):
                with engine.autocast():
                    out = model(*_to_device(batch, engine.ctx.device))
                loss = float(out["loss"].detach())
                with contextlib.nullcontext() if math.isfinite(loss) else engine.gradients_zeroed():
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
            save_due = self.checkpointer.step_due(progress.step)
            if self._cut_here(save_due):
                break
            if save_due:
                self.checkpointer.save(f"step_{progress.step}", {
                    "epoch": progress.epoch, "step": progress.step, "batches_in_epoch": progress.batches_in_epoch,
                    "lr": engine.lr, "tag": f"step_{progress.step}"})
        progress.batches_in_epoch = 0
        stats.dropped_batches = join.report.dropped
        engine.zero_grad()  # monitored_barrier mode cannot know the last step: its cut-short accumulation is dropped
        stats = stats.reduce()
        self.time_budget.epoch_trained()
        return stats

    def _cut_here(self, save_due: bool) -> bool:
        """Collective when bounded: whether the time budget cuts the epoch at this step (:attr:`cut_short`), told
        whether a ``step_N`` checkpoint is due here."""
        budget, progress = self.time_budget, self.progress
        saving_s = SAVE_TO_LAST_IO * self.checkpointer.last_io_s if save_due else 0.0
        self.cut_short = budget.step_past_deadline(saving_s)
        if self.cut_short:
            main_process_only(logging.info)(
                "train_conf.max_train_minutes %g: epoch %d cut short after %d batches (step %d), %.1f minutes "
                "trained", budget.minutes, progress.epoch, progress.batches_in_epoch, progress.step,
                budget.minutes_used())
        return self.cut_short

    def _epoch_of(self, train_set: ResumableDataset, dataloader) -> Iterable[dict]:
        """The batches of the current epoch from ``dataloader`` over ``train_set``: the set moved to the epoch (to
        its rest after a mid-epoch resume), the loader's generator reseeded, the set's placeholders dropped."""
        progress = self.progress
        if progress.batches_in_epoch == 0:
            train_set.set_epoch(progress.epoch)
        else:
            train_set.resume_epoch(progress.epoch, self.position.batches_read)
        # NOTE: the loader's own generator, reseeded per epoch, so a resumed job replays the same worker seeds.
        dataloader.generator.manual_seed(progress.data_seed + progress.epoch)
        return train_set.drop_replayed(dataloader)

    @main_process_only
    def _log_step(self, stats: EpochStats, out: dict, loss: float, lr: float, grad_norm: float) -> None:
        progress = self.progress
        now = time.perf_counter()
        parts = [f"epoch {progress.epoch}", f"step {progress.step}", f"loss {loss:.3f}"]
        extra = {key: float(out[key].detach()) for key in ("loss_ctc", "loss_att", "loss_interctc", "th_accuracy")
                 if out.get(key) is not None}
        parts += [f"{key} {value:.3f}" for key, value in extra.items()]
        parts += [f"lr {lr:.3e}", f"grad_norm {grad_norm:.3f}", f"{self._rate.audio_per_s(stats, now):.1f} audio-s/s"]
        eta = self._rate.eta_s(stats, self.utts_per_rank * (self.max_epoch - progress.epoch), now)
        if eta is not None:
            eta = min(eta, self.time_budget.seconds_left())  # max_train_minutes stops before its deadline
            parts.append(f"ETA {eta / 60:.1f} min")
        logging.info(" | ".join(parts))
        if self.writer is not None:
            for key, value in {"loss": loss, "lr": lr, "grad_norm": grad_norm, **extra}.items():
                self.writer.add_scalar(f"train/{key}", value, progress.step)

    def cv(self, dataloader: Iterable[dict]) -> EpochStats:
        """Loss over this rank's share of the CV data, then reduced over all ranks (exact: sums, not averages of
        averages). Every rank calls it. Uses the unwrapped model inside :meth:`Engine.evaluation`, so forwards issue
        no collective and uneven CV shares (even an empty one) need no join. Its loader's start-up is what
        ``max_train_minutes`` expects the next epoch's to take (:meth:`TimeBudget.loader_started`)."""
        return self._forward_only(dataloader, "cross-validation").reduce()

    @torch.no_grad()
    def _forward_only(self, dataloader: Iterable[dict], where: str, max_utts: float = math.inf) -> EpochStats:
        """This rank's loss over the batches of ``dataloader`` (up to the one that reaches ``max_utts`` offered
        utterances), as :meth:`cv` describes; left-out utterances are logged as ``where``'s."""
        engine = self.engine
        model = engine.module
        model.eval()
        stats = EpochStats()
        started = self.time_budget.clock()
        with engine.evaluation():
            for index, batch in enumerate(dataloader):
                if index == 0:  # what the next epoch's loader will take to start (max_train_minutes)
                    self.time_budget.loader_started(started)
                if len(batch["keys"]) == 0:
                    stats.add(batch, None)
                else:
                    with engine.autocast():
                        out = model(*_to_device(batch, engine.ctx.device))
                    loss = float(out["loss"])
                    _log_left_out(batch, loss, out.get("excluded"), where)
                    stats.add(batch, loss, self.frame_shift_s, out.get("excluded"))
                if stats.offered >= max_utts:
                    break
        return stats

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
