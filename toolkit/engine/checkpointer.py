"""Checkpoint policy: when to save (epochs, optimizer steps, minutes), what goes in besides the engine's state
(saver hooks), and which old checkpoints to delete (``keep_last_n``).

Every method that saves is collective (every rank calls it at the same optimizer-step boundary); the rules:

* Steps: ``save_interval_steps`` is decided from the optimizer step count, identical on every rank, so it needs no
  collective. Minutes: ``save_interval_minutes`` is decided by global rank 0 alone from its clock and broadcast, so
  ranks whose clocks disagree (other nodes, a slow rank) still save at the same step. A disabled interval (0)
  costs nothing; an enabled minutes interval costs one 1-element broadcast per optimizer step.
* Saver hooks: one registry of objects with ``state_dict``/``load_state_dict``. ``main_process_only=True``
  (default): rank 0's state is stored and every rank loads it. ``False``: every rank's state is gathered to rank 0
  and stored per rank in the same ``.pt``, so the one ``.yaml`` commit marker covers all of them; on load each rank
  takes its own. When the world size changed, a hook registered with ``reshard`` builds each new rank's state
  from all the saved ones; any other is not restored and a warning says so.
* Retention: after a save, between the save's barrier and one more, rank 0 alone deletes the oldest committed
  ``step_*``/``epoch_*`` checkpoints beyond ``keep_last_n``, never the one just written and never the
  ``keep_best_n`` epoch checkpoints with the lowest finite ``cv_loss`` (:func:`rank_by_cv_loss`, the order
  ``average_model.py --val_best`` picks in).
"""

from __future__ import annotations

import logging
import math
import os
import time
from typing import Any, Callable

from toolkit.distributed.collectives import broadcast_from_main, gather_objects
from toolkit.distributed.main_only import check_collective, main_process_only, run_on_main
from toolkit.engine.base import Engine
from toolkit.engine.train_conf import TrainConf
from toolkit.utils.checkpoint import delete_checkpoint, list_checkpoints, load_info

RETAINED_PREFIXES = ("step_", "epoch_")


def rank_by_cv_loss(infos: dict[str, dict]) -> list[str]:
    """The ``epoch_*`` checkpoints of ``infos`` (``{path: its YAML}``) with a finite ``cv_loss``, lowest first (ties
    keep the order of ``infos``). One missing ``cv_loss``, NaN (a diverged CV pass) or inf never ranks: sorting NaN
    among numbers gives no order at all (``sorted`` leaves it wherever it stands, so it can come out "best")."""
    def score(info: dict) -> float | None:
        value = info.get("cv_loss")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            return None
        return float(value)

    scored = [(score(info), path) for path, info in infos.items() if os.path.basename(path).startswith("epoch_")]
    finite = [(value, index, path) for index, (value, path) in enumerate(scored) if value is not None]
    return [path for _, _, path in sorted(finite)]


def checkpoints_to_delete(infos: dict[str, dict], keep_last_n: int, keep_best_n: int, just_written: str) -> list[str]:
    """Which committed checkpoints retention removes, oldest first.

    Args:
        infos: ``{path: its YAML}`` of the ``step_*``/``epoch_*`` checkpoints of one model dir.
        keep_last_n: how many of the newest to keep (by optimizer ``step``; at equal steps an epoch tag counts as
            newer than a step tag); 0 keeps all.
        keep_best_n: also keep this many ``epoch_*`` checkpoints with the lowest finite ``cv_loss``
            (:func:`rank_by_cv_loss`).
        just_written: never deleted, whatever its rank in the order.
    """
    if keep_last_n <= 0:
        return []

    def newness(path: str) -> tuple[int, int]:
        return int(infos[path].get("step", 0)), int(os.path.basename(path).startswith("epoch_"))

    order = sorted(infos, key=newness)
    keep = set(order[-keep_last_n:]) | {just_written}
    keep |= set(rank_by_cv_loss(infos)[:keep_best_n])
    return [path for path in order if path not in keep]


class Checkpointer:
    """Saves and restores the engine plus registered saver hooks under ``model_dir``.

    Args:
        engine: a prepared engine (its ``save``/``load`` are collective).
        model_dir: where ``{tag}.pt`` + ``{tag}.yaml`` go.
        train_conf: ``save_interval_steps``, ``save_interval_minutes``, ``keep_last_n``, ``keep_best_n``.
        clock: seconds on a monotonic clock; only global rank 0's is ever read.

    Attributes:
        last_io_s: seconds the last :meth:`save` or :meth:`load` took on this rank's clock (0 before any), what
            ``max_train_minutes`` estimates an epoch's save from (:mod:`toolkit.engine.time_budget`).
    """

    def __init__(self, engine: Engine, model_dir: str, train_conf: TrainConf,
                 clock: Callable[[], float] = time.monotonic):
        self.engine = engine
        self.model_dir = model_dir
        self.interval_steps = train_conf.save_interval_steps
        self.interval_s = 60.0 * train_conf.save_interval_minutes
        self.keep_last_n = train_conf.keep_last_n
        self.keep_best_n = train_conf.keep_best_n
        self.clock = clock
        self._hooks: dict[str, tuple[Any, bool, Callable[[list, int], Any] | None]] = {}
        self._last_save = clock() if engine.ctx.is_main else 0.0
        self.last_io_s = 0.0

    def register(self, name: str, obj: Any, main_process_only: bool = True,
                 reshard: Callable[[list, int], Any] | None = None) -> None:
        """Add a saver hook: ``obj.state_dict()`` is saved under ``name`` and ``obj.load_state_dict`` gets it back.

        ``reshard(states, rank)``, for a per-rank hook: this rank's state from the list of every saved rank's, when
        the checkpoint was written by another number of ranks (without it, such a state is not restored).

        Raises:
            ValueError: ``name`` is already registered. TypeError: ``obj`` lacks ``state_dict``/``load_state_dict``.
        """
        if name in self._hooks:
            raise ValueError(f"saver hook {name!r} is already registered")
        if not (callable(getattr(obj, "state_dict", None)) and callable(getattr(obj, "load_state_dict", None))):
            raise TypeError(f"saver hook {name!r}: {type(obj).__name__} needs state_dict() and load_state_dict()")
        self._hooks[name] = (obj, main_process_only, reshard)

    def step_due(self, step: int) -> bool:
        """Whether to save after optimizer step ``step``. Collective when ``save_interval_minutes`` > 0 (every rank
        calls it at every optimizer step); rank 0's clock decides and the result is broadcast."""
        due = self.interval_steps > 0 and step % self.interval_steps == 0
        if self.interval_s <= 0:
            return due
        if self.engine.ctx.is_main:
            due = due or self.clock() - self._last_save >= self.interval_s
        return broadcast_from_main(due, "Checkpointer.step_due")

    def save(self, tag: str, info: dict[str, Any]) -> str:
        """Collective: save the engine and every hook as ``{model_dir}/{tag}.pt`` (+ ``.yaml``), then apply
        retention. Returns the path written."""
        check_collective("Checkpointer.save")
        started = self.clock()
        path = os.path.join(self.model_dir, f"{tag}.pt")
        extra = self._gather_hook_states()
        self.engine.save(path, info, extra)  # ends in a barrier: the commit marker is on disk for every rank
        if self.engine.ctx.is_main:  # only rank 0's clock decides (step_due)
            self._last_save = self.clock()
        main_process_only(logging.info)("checkpoint: rank %d wrote %s", self.engine.ctx.rank, path)
        if self.keep_last_n > 0 and tag.startswith(RETAINED_PREFIXES):
            run_on_main(self._apply_retention, (path,))  # no rank trains (or loads) on while files are going
        self.last_io_s = self.clock() - started
        return path

    def _gather_hook_states(self) -> dict[str, Any]:
        ctx = self.engine.ctx
        main = {name: hook[0].state_dict() for name, hook in self._hooks.items() if hook[1] and ctx.is_main}
        mine = {name: hook[0].state_dict() for name, hook in self._hooks.items() if not hook[1]}
        per_rank: dict[str, list] = {}
        if mine:
            gathered = gather_objects(mine, "Checkpointer.save hooks")
            if gathered is not None:
                per_rank = {name: [states[name] for states in gathered] for name in mine}
        return {"main": main, "per_rank": per_rank, "world_size": ctx.world_size}

    def _apply_retention(self, just_written: str) -> None:
        paths = [p for prefix in RETAINED_PREFIXES for p in list_checkpoints(self.model_dir, prefix)]
        infos = {p: load_info(p) for p in paths}
        for path in checkpoints_to_delete(infos, self.keep_last_n, self.keep_best_n, just_written):
            removed = delete_checkpoint(path)
            logging.info("checkpoint: rank %d deleted %s", self.engine.ctx.rank, ", ".join(removed))

    def load(self, path: str) -> list[str]:
        """Collective: restore the engine and the hooks from ``path``. Returns the names of the hooks restored
        (a hook missing from the checkpoint, e.g. one written before it was registered, is logged and skipped)."""
        check_collective("Checkpointer.load")
        started = self.clock()
        extra = self.engine.load(path)
        ctx = self.engine.ctx
        restored = []
        for name, (obj, main_only, reshard) in self._hooks.items():
            if main_only:
                state = extra.get("main", {}).get(name)
            else:
                states, state = extra.get("per_rank", {}).get(name), None
                if states is not None and len(states) == ctx.world_size:
                    state = states[ctx.rank]
                elif states is not None and reshard is not None:
                    logging.info("checkpoint %s: %s of %d ranks resharded for %d", path, name, len(states),
                                 ctx.world_size)
                    state = reshard(states, ctx.rank)
                elif states is not None:
                    logging.warning("checkpoint %s: %s was saved by %d ranks, this job has %d; not restored",
                                    path, name, len(states), ctx.world_size)
            if state is None:
                logging.warning("checkpoint %s has no state for saver hook %r; it starts fresh", path, name)
                continue
            obj.load_state_dict(state)
            restored.append(name)
        self.last_io_s = self.clock() - started
        return restored


def save_model(checkpointer: Checkpointer, info: dict[str, Any]) -> str:
    """Collective: save the training state as checkpoint ``info["tag"]`` (``init``, ``epoch_N``) with ``info`` as
    its YAML. Returns the path written."""
    return checkpointer.save(info["tag"], info)
