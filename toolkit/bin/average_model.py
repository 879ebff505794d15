"""Average the parameters of several epoch checkpoints (the usual last step before decoding).

Usage:

    python -m toolkit.bin.average_model --src_path exp/conformer --num 3 --val_best \\
        --dst_model exp/conformer/avg_3.pt

``--val_best`` picks the ``num`` checkpoints with the lowest ``cv_loss`` in their ``epoch_N.yaml``; a checkpoint
whose ``cv_loss`` is missing, NaN or infinite never ranks (it is named in a warning). Otherwise the last ``num``
epochs by number. Only committed checkpoints (with their YAML) are considered, each file once under its
``epoch_N.pt`` name (:func:`toolkit.utils.checkpoint.list_checkpoints`): a second name of a checkpoint (a symbolic
or hard link such as ``epoch_best.pt -> epoch_3.pt``) or a copy under another name never weighs twice; the log
names the names merged or left out.

Refused with one error line (exit status 2), nothing written:

* ``--src_path`` in use by a training job (its lock, :mod:`toolkit.engine.model_dir`): its epochs are still being
  written; average once it has ended (a training job started while averaging runs is refused in turn);
* ``--num`` below 1, or fewer than ``num`` checkpoints to pick from, unless ``--allow_fewer`` (then a warning says
  how many are averaged);
* ``--val_best`` when retention deleted epochs (``train_conf.keep_last_n`` in the model dir's ``train.yaml``) and
  keeps fewer than ``num`` best ones (``keep_best_n``): the ``num`` best may be gone;
* checkpoints whose keys, shapes or dtypes differ (the message names the key and both files), or a floating tensor
  holding NaN or inf (names the key and file).

Keys saved from a wrapped model (every key starts with ``module.``, as a DDP-wrapped ``state_dict`` has) are
normalised by dropping that prefix, so they average with unwrapped checkpoints (the toolkit itself saves the
unwrapped model). Integer buffers (e.g. BatchNorm's ``num_batches_tracked``) and non-tensor entries are taken from
the newest selected checkpoint instead of being averaged.
"""

from __future__ import annotations

import argparse
import logging
import os
from typing import Any

import torch
import yaml

from toolkit.engine.model_dir import lock_for_averaging
from toolkit.utils.checkpoint import (MODEL_KEY, checkpoint_number, finite_cv_loss, list_checkpoints,
                                      load_checkpoint, load_info, save_checkpoint)
from toolkit.utils.config_parsing import ArgumentParser, ConfigError, exit_on_config_error
from toolkit.utils.shutdown import freeze_at_exit

logger = logging.getLogger(__name__)
WRAPPER_PREFIX = "module."


def _check_retention(src_path: str, paths: list[str], num: int) -> None:
    """Refuse ``--val_best --num`` when retention deleted epochs and kept fewer than ``num`` best ones."""
    epochs = {checkpoint_number(p) for p in paths}
    deleted = sorted(set(range(max(epochs) + 1)) - epochs)
    config = os.path.join(src_path, "train.yaml")
    if not deleted or not os.path.isfile(config):
        return
    with open(config, encoding="utf-8") as f:
        keep_best_n = ((yaml.safe_load(f) or {}).get("train_conf") or {}).get("keep_best_n")
    if isinstance(keep_best_n, int) and keep_best_n < num:
        raise ConfigError(f"{src_path}: epochs {deleted} were deleted and {config} keeps only the "
                          f"train_conf.keep_best_n = {keep_best_n} best, so the {num} best may be gone: average "
                          f"--num {keep_best_n} or fewer, or train with keep_best_n >= {num}")


def select_checkpoints(src_path: str, num: int, val_best: bool, allow_fewer: bool = False) -> list[str]:
    """Paths of the checkpoints to average, oldest first.

    Args:
        src_path: model dir holding ``epoch_N.pt`` + ``epoch_N.yaml``.
        num: how many to average (>= 1).
        val_best: the ``num`` with the lowest finite ``cv_loss`` instead of the ``num`` newest epochs.
        allow_fewer: average the ones there are when fewer than ``num`` qualify (with a warning).

    Raises:
        ConfigError: ``num`` < 1, no committed checkpoint, fewer than ``num`` to pick from (without
            ``allow_fewer``), or deleted best epochs (see the module docstring).
    """
    if num < 1:
        raise ConfigError(f"--num must be at least 1, got {num} (to decode one epoch as it is, give its epoch_N.pt "
                          f"to recognize.py)")
    paths = list_checkpoints(src_path)
    if not paths:
        raise ConfigError(f"no committed epoch_N.pt (with epoch_N.yaml) in {src_path}")
    if val_best:
        _check_retention(src_path, paths, num)
        losses = {p: finite_cv_loss(load_info(p)) for p in paths}
        for path, loss in losses.items():
            if loss is None:
                logger.warning("not ranking %s: its cv_loss is %s (missing, NaN or infinite)", path,
                               load_info(path).get("cv_loss"))
        ranked = sorted((loss, p) for p, loss in losses.items() if loss is not None)
        chosen = {p for _, p in ranked[:num]}
        candidates = [p for p in paths if p in chosen]
    else:
        candidates = paths[-num:]
    if len(candidates) < num:
        shortfall = (f"--num {num}, but {src_path} holds only {len(candidates)} committed epoch checkpoint(s)"
                     f"{' with a finite cv_loss' if val_best else ''}")
        if not allow_fewer:
            raise ConfigError(f"{shortfall}: lower --num, or pass --allow_fewer to average those")
        logger.warning("%s: averaging those %d (--allow_fewer)", shortfall, len(candidates))
    return candidates


def _model_state(path: str) -> dict[str, Any]:
    """The model ``state_dict`` of ``path`` with a wrapper's ``module.`` prefix dropped."""
    state = load_checkpoint(path)[MODEL_KEY]
    if state and all(key.startswith(WRAPPER_PREFIX) for key in state):
        logger.info("%s: keys saved from a wrapped model; dropping their %r prefix", path, WRAPPER_PREFIX)
        state = {key[len(WRAPPER_PREFIX):]: value for key, value in state.items()}
    return state


def _check_layout(ref_path: str, ref: dict[str, Any], path: str, state: dict[str, Any]) -> None:
    """Refuse ``state`` unless it has ``ref``'s keys, shapes and dtypes, and finite floating values."""
    for key in sorted(ref.keys() ^ state.keys()):
        has, lacks = (ref_path, path) if key in ref else (path, ref_path)
        raise ConfigError(f"key {key!r} is in {has} but not in {lacks}: checkpoints of different models cannot be "
                          f"averaged")
    for key, value in state.items():
        other = ref[key]
        if isinstance(value, torch.Tensor) and isinstance(other, torch.Tensor):
            same = other.shape == value.shape and other.dtype == value.dtype
        else:
            same = type(value) is type(other)
        if not same:
            raise ConfigError(f"key {key!r} is {_describe(value)} in {path} but {_describe(other)} in {ref_path}: "
                              f"checkpoints of different models cannot be averaged")
        if isinstance(value, torch.Tensor) and value.is_floating_point() and not bool(torch.isfinite(value).all()):
            raise ConfigError(f"key {key!r} holds NaN or inf in {path}: leave that checkpoint out (--val_best "
                              f"never ranks an epoch whose cv_loss is not finite)")


def _describe(value: Any) -> str:
    return f"{tuple(value.shape)} {value.dtype}" if isinstance(value, torch.Tensor) else type(value).__name__


def average_checkpoints(paths: list[str]) -> dict[str, Any]:
    """Element-wise mean of the floating tensors of ``paths``' model state dicts (accumulated in float64, returned
    in their dtype); every other entry is the newest's (the last path's). Reads one checkpoint at a time.

    Raises:
        ConfigError: keys, shapes or dtypes differ between the checkpoints, or a floating tensor is not finite.
    """
    ref = _model_state(paths[0])
    total: dict[str, torch.Tensor] = {}
    newest: dict[str, Any] = {}
    for path in paths:
        newest = ref if path == paths[0] else _model_state(path)
        _check_layout(paths[0], ref, path, newest)
        for key, value in newest.items():
            if isinstance(value, torch.Tensor) and value.is_floating_point():
                total[key] = total.get(key, 0) + value.to(torch.float64)
    return {key: (total[key] / len(paths)).to(value.dtype) if key in total else value
            for key, value in newest.items()}


def main(argv=None) -> None:
    parser = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--src_path", required=True, help="model dir holding epoch_N.pt + epoch_N.yaml")
    parser.add_argument("--dst_model", required=True, help="output .pt (a .yaml listing the sources is written too)")
    parser.add_argument("--num", type=int, default=5, help="how many checkpoints to average (>= 1)")
    parser.add_argument("--val_best", action="store_true", help="pick by lowest cv_loss instead of the last ones")
    parser.add_argument("--allow_fewer", action="store_true",
                        help="average the checkpoints there are when fewer than --num qualify (else an error)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    if not os.path.isdir(args.src_path):
        raise ConfigError(f"--src_path {args.src_path}: no such directory")
    # 1. the model dir, locked: not while a training job writes its epochs (nor a training job while averaging)
    lock = lock_for_averaging(args.src_path)
    try:
        # 2. choose the checkpoints
        paths = select_checkpoints(args.src_path, args.num, args.val_best, args.allow_fewer)
        for path in paths:
            logger.info("averaging %s (cv_loss %s)", path, load_info(path).get("cv_loss"))
        # 3. average (checks keys, shapes, dtypes and finiteness first), 4. write
        averaged = average_checkpoints(paths)
        save_checkpoint(args.dst_model, {MODEL_KEY: averaged},
                        {"averaged": paths, "val_best": args.val_best, "tag": "average"})
        logger.info("wrote %s from %d checkpoints", args.dst_model, len(paths))
    finally:
        if lock is not None:
            lock.release()


def cli() -> None:
    """The ``toolkit-average-model`` command: a config error is one log line and exit status 2; the process's exit
    skips the collections of torch's objects (:func:`toolkit.utils.shutdown.freeze_at_exit`)."""
    freeze_at_exit()
    exit_on_config_error(main)


if __name__ == "__main__":
    cli()
