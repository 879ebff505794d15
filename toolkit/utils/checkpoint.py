"""Checkpoint file format: ``{tag}.pt`` (torch state) plus ``{tag}.yaml`` (metadata), written atomically.

Each file is written to a temporary name in the same directory, flushed, fsynced and renamed over the final name,
so a crash at any point leaves either the old file or the new one, never a truncated one. The YAML is written
after the ``.pt`` and is the commit marker: a ``.pt`` without its YAML is an unfinished save and is never listed.

Keys inside ``{tag}.pt`` (named, so a loader never relies on order):
    model:      the model ``state_dict`` (unwrapped, fp32 as trained)
    optimizer:  optimizer ``state_dict``            (absent in averaged/exported models)
    scheduler:  LR scheduler ``state_dict``          (idem)
    scaler:     fp16 ``GradScaler`` ``state_dict``    (only with dtype fp16)
    extra:      saver-hook states (training checkpoints only): ``{"main": {name: state}, "per_rank": {name:
                [state of rank 0, rank 1, ...]}}`` (see :mod:`toolkit.engine.checkpointer`)

Tags: ``epoch_{N}`` after epoch N, ``step_{N}`` after optimizer step N inside an epoch, ``init`` before training.
"""

from __future__ import annotations

import functools
import glob
import logging
import math
import os
import pickle
import re
import secrets
import shutil
import zipfile
from typing import Any, Callable, Mapping

import torch
import yaml

from toolkit.utils.config_parsing import ConfigError

MODEL_KEY = "model"
OPTIMIZER_KEY = "optimizer"
SCHEDULER_KEY = "scheduler"
SCALER_KEY = "scaler"
EXTRA_KEY = "extra"
OPTIMIZER_SHARDS_KEY = "optimizer_shards"  # the shard directory beside the .pt that holds its optimizer state


def atomic_write(path: str, write: Callable[[Any], None], mode: str = "wb",
                 before_replace: Callable[[], None] | None = None) -> None:
    """Call ``write(fileobj)`` on a temporary file beside ``path``, fsync it and rename it to ``path``
    (``before_replace()`` runs once the new content is safely on disk, just before the rename)."""
    directory = os.path.dirname(os.path.abspath(path))
    tmp = os.path.join(directory, f".tmp-{os.path.basename(path)}-{secrets.token_hex(8)}")
    # NOTE: not tempfile.mkstemp, whose file keeps mode 0600 after the rename; created with 0666 here, the kernel
    # applies the user's umask, so teammates and services can read a shared model dir as they can its other files.
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, mode) as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        if before_replace is not None:
            before_replace()
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)  # NOTE: makes the rename itself durable across a power loss.
    finally:
        os.close(dir_fd)


def save_checkpoint(path: str, state: dict[str, Any], info: dict[str, Any]) -> None:
    """Write ``state`` to ``path`` (``.pt``) then ``info`` to the sibling ``.yaml``, each atomically. Overwriting a
    checkpoint removes its old ``.yaml`` once the new ``.pt`` is on disk and before it replaces the old one: a
    failure while writing keeps the old checkpoint whole, and a crash later never leaves new weights beside the
    old metadata looking valid."""
    yaml_path = info_path(path)

    def uncommit() -> None:
        if os.path.exists(yaml_path):
            os.unlink(yaml_path)

    atomic_write(path, lambda f: torch.save(state, f), before_replace=uncommit)
    atomic_write(yaml_path, lambda f: yaml.safe_dump(info, f, sort_keys=False), mode="w")


def info_path(path: str) -> str:
    """The info file ``<name>.yaml`` written beside checkpoint ``<name>.pt``, last, so that it marks a finished save."""
    return re.sub(r"\.pt$", ".yaml", path)


def load_checkpoint(path: str, mmap: bool = False, committed: bool = True) -> dict[str, Any]:
    """Load a checkpoint written by :func:`save_checkpoint` onto the CPU (``mmap``: memory-mapped, so that a
    tensor's data is read only when used, e.g. to check shapes). ``committed=False`` (inference: a model copied
    without its ``.yaml``) loads a ``.pt`` that has no ``.yaml`` beside it, with one warning line saying so; resuming
    training keeps the default, which refuses it.

    Raises:
        FileNotFoundError: ``path`` is missing, or (``committed``) its ``.yaml`` is (an interrupted save).
        ConfigError: ``path`` is not a readable checkpoint: truncated, not a torch save (``torch.save`` writes a zip
            archive), not a dict or without a ``model`` entry; one line naming the file and the reason.
    """
    yaml_path = info_path(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: no such checkpoint")
    if not os.path.exists(yaml_path):
        if committed:
            raise FileNotFoundError(f"{path}: no {os.path.basename(yaml_path)} beside it, so the save never finished")
        logging.getLogger(__name__).warning("%s: no %s beside it (copied without it, or a save that never finished): "
                                            "loading it anyway", path, os.path.basename(yaml_path))
    state = read_torch_file(path, mmap)
    if not isinstance(state, dict):
        raise ConfigError(f"{path} {UNREADABLE}: it holds a {type(state).__name__}, not a dict")
    if MODEL_KEY not in state:
        raise ConfigError(f"{path} {UNREADABLE}: no '{MODEL_KEY}' entry; keys are {sorted(map(str, state))}")
    return state


UNREADABLE = "is not a readable checkpoint (truncated or not a torch save)"


def read_torch_file(path: str, mmap: bool = False) -> Any:
    """What ``torch.save`` wrote at ``path`` (a checkpoint, a DeepSpeed shard), loaded onto the CPU.

    Raises:
        ConfigError: ``path`` is cut short or not a torch save (``torch.save`` writes a zip archive): one line,
            ``<path> is not a readable checkpoint (truncated or not a torch save): <reason>``.
    """
    # NOTE: checked first, since torch's own errors for these (a cut file, random bytes) differ with mmap and read
    # as internal errors ("PytorchStreamReader failed ..."; "mmap can only be used with files saved with ...")
    if not zipfile.is_zipfile(path):
        raise ConfigError(f"{path} {UNREADABLE}: no zip directory at its end, where torch.save writes one")
    try:
        return torch.load(path, map_location="cpu", weights_only=False, mmap=mmap)
    except (RuntimeError, pickle.UnpicklingError, EOFError, ValueError, zipfile.BadZipFile) as e:
        raise ConfigError(f"{path} {UNREADABLE}: {str(e).splitlines()[0] if str(e) else type(e).__name__}") from e


def check_model_state(shapes: Mapping[str, tuple[int, ...]], saved: Mapping[str, Any], path: str) -> None:
    """Refuse in one line a checkpoint whose model ``saved`` (its ``state_dict``) a model with the parameter and
    buffer shapes ``shapes`` (``{key: shape}`` of the model's ``state_dict``) cannot load, instead of torch's
    ``load_state_dict`` error (a traceback with a line per key).

    Raises:
        ConfigError: naming the first key, in the model's order, that is missing from ``saved`` or has another
            shape there (both shapes), else the first key of ``saved`` the model lacks, and how many keys differ.
    """
    differ = []
    for key, shape in shapes.items():
        if key not in saved:
            differ.append(f"{key} {tuple(shape)} is not in the checkpoint")
        elif tuple(saved[key].shape) != tuple(shape):
            differ.append(f"{key} is {tuple(saved[key].shape)} in the checkpoint, {tuple(shape)} in this config's "
                          "model")
    differ += [f"the checkpoint's {key} {tuple(saved[key].shape)} is not in this config's model"
               for key in saved if key not in shapes]
    if differ:
        more = f" ({len(differ)} keys differ)" if len(differ) > 1 else ""
        raise ConfigError(f"{path} holds another model than this config's: {differ[0]}{more}; use the config it was "
                          "trained with (the train.yaml beside it)")


def load_info(path: str) -> dict[str, Any]:
    """Read the metadata YAML of checkpoint ``path`` (``x.pt`` or ``x.yaml``).

    Raises:
        OSError: the YAML cannot be read.
        ConfigError: it is not UTF-8 YAML holding a mapping (cut short, overwritten): one line naming it.
    """
    yaml_path = info_path(path)
    try:
        with open(yaml_path, encoding="utf-8") as f:
            info = yaml.safe_load(f)
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        raise ConfigError(f"{yaml_path} is not a readable checkpoint record: {' '.join(str(e).split())}") from e
    if info is not None and not isinstance(info, dict):
        raise ConfigError(f"{yaml_path} is not a readable checkpoint record: it holds a {type(info).__name__}, "
                          "not a mapping")
    return info or {}


def finite_cv_loss(info: dict[str, Any]) -> float | None:
    """The ``cv_loss`` of a checkpoint's YAML (:func:`load_info`) as a float, or None when it is missing, not a
    number, NaN or infinite: such a checkpoint never ranks among the best (``--val_best``, ``keep_best_n``)."""
    value = info.get("cv_loss")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def checkpoint_number(path: str) -> int:
    """The number in a checkpoint's name (``exp/epoch_10.pt`` -> 10), or -1 when it has none."""
    m = re.search(r"(\d+)\.pt$", path)
    return int(m.group(1)) if m else -1


@functools.lru_cache(maxsize=None)
def _warn_once(message: str) -> None:
    # NOTE: retention lists the model dir at every save; one line per process says it.
    logging.getLogger(__name__).warning(message)


def list_checkpoints(model_dir: str, prefix: str = "epoch_") -> list[str]:
    """Committed checkpoints ``<prefix>N.pt`` (those with their ``.yaml``) in ``model_dir``, sorted by N, each file
    once (use one prefix per call: ``epoch_3`` and ``step_3`` are different counters).

    What averaging, retention and ``--checkpoint auto`` select from, so a file counts once whatever its names: only
    the names the trainer writes (``<prefix>`` + a number without leading zeros) are listed, so another name
    (``epoch_best.pt``, a copy or a link marking an epoch) is left out; and names of one file (a symbolic or a hard link: the same device and
    inode, links followed) are listed once, under the name that is not a symbolic link (the lowest N among equals).
    Either is logged once, naming the files.
    """
    scheme = re.compile(re.escape(prefix) + r"(0|[1-9][0-9]*)\.pt")
    by_file: dict[tuple[int, int], list[str]] = {}
    for path in sorted(glob.glob(os.path.join(glob.escape(model_dir), glob.escape(prefix) + "*.pt"))):
        try:
            st = os.stat(path)  # NOTE: follows a symbolic link; a dangling one is no checkpoint
        except FileNotFoundError:
            continue
        if os.path.exists(info_path(path)):
            by_file.setdefault((st.st_dev, st.st_ino), []).append(path)
    listed = []
    for names in by_file.values():
        in_scheme = sorted((p for p in names if scheme.fullmatch(os.path.basename(p))),
                           key=lambda p: (os.path.islink(p), checkpoint_number(p)))
        listed += in_scheme[:1]
        shown = ", ".join(os.path.basename(p) for p in names) + (" (one file)" if len(names) > 1 else "")
        if not in_scheme:
            _warn_once(f"{model_dir}: left out {shown}: not named {prefix}N.pt as the trainer names checkpoints")
        elif len(names) > 1:
            _warn_once(f"{model_dir}: {shown}: counted once, as {os.path.basename(in_scheme[0])}")
    return sorted(listed, key=checkpoint_number)


def newest_checkpoint(model_dir: str) -> str | None:
    """The committed ``epoch_N.pt`` or ``step_N.pt`` in ``model_dir`` that training reached last, or None (each file
    once, as :func:`list_checkpoints` lists them).

    Ordered by the optimizer step in its ``.yaml``; at the same step the epoch checkpoint wins (it also holds the
    epoch's cross-validation: a step checkpoint at the epoch's last step still has that to do).
    """
    candidates = list_checkpoints(model_dir, "epoch_") + list_checkpoints(model_dir, "step_")
    return max(candidates, key=lambda p: (load_info(p).get("step", -1), os.path.basename(p).startswith("epoch_")),
               default=None)


def delete_checkpoint(path: str) -> list[str]:
    """Remove checkpoint ``path``: its ``.yaml`` (the commit marker) first, so a crash half-way leaves an
    uncommitted ``.pt`` that loaders ignore, then the ``.pt`` and the shard directory ``{tag}/`` beside it
    (DeepSpeed's, torch_fsdp's sharded checkpoints). Files already gone are no error. Returns the paths removed.
    """
    removed = []
    yaml_path = info_path(path)
    for file in (yaml_path, path):
        try:
            os.unlink(file)
        except FileNotFoundError:
            continue
        removed.append(file)
    shard_dir = path[: -len(".pt")]
    if os.path.isdir(shard_dir):
        shutil.rmtree(shard_dir)
        removed.append(shard_dir)
    return removed
