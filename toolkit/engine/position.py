"""Where training stands, and the dataset's side of resuming there.

* :class:`TrainProgress` (main process): the epoch, the optimizer step, the batches of the epoch the join has
  yielded, the data seed, and the data setup a mid-epoch position counts in (:func:`data_signature`).
* :class:`EpochPosition` (per rank): which batches of the epoch in progress this rank has read, by part of the
  epoch's partition.
* :class:`ResumableDataset`: what a training set does for the executor so that a resumed epoch replays the
  interrupted one (``toolkit.dataset.pipeline.AsrDataset`` implements it; the engine never imports the dataset).

An epoch's data is partitioned into numbered **parts**, each read by one loader worker of one rank: a planned batch
in planned batching, otherwise one global worker's share of the lines. Each batch dict carries ``position``,
``[part, index, last]``: its index among its part's batches, and whether it is the part's last.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Iterable, Iterator, Mapping, Protocol, runtime_checkable

from toolkit.utils.config_parsing import ConfigError

# {part: (batches, done)}: the part's first ``batches`` batches were read, ``done`` once its last one is among them
BatchesRead = Mapping[int, tuple[int, bool]]


@runtime_checkable
class ResumableDataset(Protocol):
    """A training set the executor moves through epochs and resumes inside one, bit-identically.

    Its batches carry ``position`` (see the module docstring); the executor counts them in an
    :class:`EpochPosition` that every checkpoint keeps.
    """

    def set_seed(self, seed: int) -> None:
        """Shuffle and augment every later pass with data seed ``seed`` (a resumed run keeps its checkpoint's)."""

    def set_epoch(self, epoch: int) -> None:
        """The next pass reads epoch ``epoch`` (its order and augmentation depend on the seed and ``epoch``) from its
        start."""

    def resume_epoch(self, epoch: int, batches_read: BatchesRead) -> None:
        """The next pass reads epoch ``epoch`` without the batches ``batches_read`` says were read. Each of those
        still takes its place in the loader's order, as a placeholder that :meth:`drop_replayed` removes, so that
        the loader's round robin over its workers yields the rest in the interrupted pass's order."""

    def drop_replayed(self, batches: Iterable[dict]) -> Iterator[dict]:
        """``batches`` (from a loader over this set) without the placeholders of :meth:`resume_epoch`."""


@dataclass
class TrainProgress:
    """Where training continues; a saver hook (main process only) of every checkpoint.

    After a finished epoch, ``epoch`` is the next one and ``batches_in_epoch`` is 0. Inside an epoch (a ``step_N``
    checkpoint) ``batches_in_epoch`` counts the batches the join has yielded so far (the same on every rank); a
    resume replays the epoch's data order (``data_seed`` + ``epoch``) and skips the batches :class:`EpochPosition`
    says were read.
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

    def continue_under(self, signature: str, path: str) -> None:
        """After loading checkpoint ``path``: go on under this run's data setup ``signature``
        (:func:`data_signature`), which this run's own step checkpoints will stand for.

        Raises:
            ConfigError: the checkpoint stops inside an epoch and was written under another setup, so its position
                in the epoch means other utterances now.
        """
        if self.batches_in_epoch and self.data_signature != signature:
            raise ConfigError(f"--checkpoint {path} stops inside epoch {self.epoch}, but "
                              f"{_what_changed(self.data_signature, signature)}, so its position in the epoch means "
                              "other utterances now; resume from the last epoch_N.pt instead")
        self.data_signature = signature


def data_signature(world_size: int | None, train_data: str, dataset_conf: dict, accum_grad: int) -> str:
    """What a mid-epoch resume must find unchanged (JSON), its position counting batches of that setup:
    ``world_size`` is None where the epoch's batches do not depend on it (the dataset's planned batching)."""
    return json.dumps({"world_size": world_size, "train_data": train_data, "dataset_conf": dataset_conf,
                       "accum_grad": accum_grad}, sort_keys=True)


def _what_changed(saved: str, current: str) -> str:
    """Why a position counted under signature ``saved`` means other batches under ``current``, in a few words."""
    old, new = json.loads(saved) if saved else None, json.loads(current)
    if not isinstance(old, dict):
        return "it was written by an earlier version, whose epoch order differs"
    why = ", ".join(key for key in sorted(new) if old.get(key) != new[key]) + " changed since it was written"
    if isinstance(old.get("world_size"), int) and old["world_size"] != new["world_size"]:
        why += (f" (by {old['world_size']} ranks: with shards or dynamic batching each rank reads its own share "
                "of the epoch)")
    return why


class EpochPosition:
    """Saver hook (per rank): the batches of the epoch in progress this rank has read (trained, or read for their
    skip counts), by the ``position`` the dataset gives each batch. :attr:`batches_read` maps a part of the epoch
    (a planned batch, or a share; see the module docstring) to ``(batches, done)``: its first ``batches`` batches
    were read, ``done`` once its last one is among them. A resume hands them to
    :meth:`ResumableDataset.resume_epoch`. A batch without a ``position`` (a loader other than the dataset's, as in
    engine tests) is not tracked."""

    def __init__(self):
        self.batches_read: dict[int, tuple[int, bool]] = {}

    def add(self, batch: dict) -> None:
        if "position" in batch:
            part, index, last = batch["position"]
            self.batches_read[part] = (index + 1, last)

    def state_dict(self) -> dict:
        return {"batches_read": dict(self.batches_read)}

    def load_state_dict(self, state: dict) -> None:
        self.batches_read = dict(_batches_read(state))

    @staticmethod
    def reshard(states: list[dict], rank: int) -> dict:
        """Every rank of another world size gets what all saved ranks read (each part was read by one)."""
        merged: dict[int, tuple[int, bool]] = {}
        for state in states:
            for part, read in _batches_read(state).items():
                merged[part] = max(merged.get(part, (0, False)), read)
        return {"batches_read": merged}


def _batches_read(state: dict) -> BatchesRead:
    # NOTE: checkpoints written before the executor was split into stats/position/time_budget name it "chunks".
    return state["batches_read"] if "batches_read" in state else state["chunks"]
