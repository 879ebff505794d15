"""Training configuration: YAML loading, typed command-line overrides and validation.

A config is the plain dict read from ``conf/*.yaml`` (WeNet layout: ``name:`` paired with ``name_conf:``).
Overrides follow ``--override_config "train_conf.max_epoch 3"`` (or ``train_conf.max_epoch=3``): the value is
parsed to the type of the value it replaces, and a key that does not exist is an error that lists the keys valid at
that level, so a typo never silently trains with the default.
"""

from __future__ import annotations

import copy
import math
import os
from typing import Any

import yaml

# NOTE: the trainer's own section; model/dataset sections are validated by the code that consumes them.
TRAIN_CONF_DEFAULTS: dict[str, Any] = {
    "max_epoch": 10,
    "accum_grad": 1,
    "grad_clip": 5.0,
    "log_interval": 20,
    "dtype": "fp32",
    "seed": 777,
    # NOTE: checkpoint policy (toolkit/engine/checkpointer.py); 0 disables an interval / keeps everything.
    "save_interval_steps": 0,
    "save_interval_minutes": 0.0,
    "keep_last_n": 0,
    "keep_best_n": 5,  # epoch checkpoints with the lowest cv_loss that keep_last_n never deletes (average_model)
    # NOTE: uneven data across ranks (toolkit/distributed/join.py); the timeout is used by monitored_barrier only.
    "join_mode": "flag",
    "join_timeout_s": 30.0,
}
DTYPE_CHOICES = ("fp32", "bf16", "fp16")
JOIN_MODE_CHOICES = ("flag", "monitored_barrier")


class ConfigError(ValueError):
    """A config file or override names a key or value that does not exist; the message says what to fix."""


def exit_on_config_error(main) -> None:
    """Run a command-line ``main()``; a :class:`ConfigError` becomes one logged line and exit status 2 instead of a
    traceback (the message already says what to fix)."""
    import logging
    import sys

    try:
        main()
    except ConfigError as e:
        logging.error("%s", e)
        sys.exit(2)


def load_config(path: str) -> dict:
    """Read a YAML config file into a dict.

    Raises:
        ConfigError: the file is missing, is not valid YAML, or is not a mapping at top level.
    """
    try:
        with open(path, encoding="utf-8") as f:
            config = yaml.safe_load(f)
    except FileNotFoundError as e:
        raise ConfigError(f"config file not found: {path}") from e
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {e}") from e
    if not isinstance(config, dict):
        raise ConfigError(f"{path}: top level must be a mapping of keys, got {type(config).__name__}")
    return config


def _parse_like(old: Any, text: str, key: str) -> Any:
    """Parse ``text`` into the type of ``old`` (bool before int: ``True`` is an int in Python)."""
    if isinstance(old, bool):
        lowered = text.strip().lower()
        if lowered in ("true", "1", "yes"):
            return True
        if lowered in ("false", "0", "no"):
            return False
        raise ConfigError(f"override {key}: expected true/false, got {text!r}")
    if isinstance(old, int):
        try:
            return int(text)
        except ValueError as e:
            raise ConfigError(f"override {key}: expected an integer, got {text!r}") from e
    if isinstance(old, float):
        try:
            return float(text)
        except ValueError as e:
            raise ConfigError(f"override {key}: expected a number, got {text!r}") from e
    if isinstance(old, str):
        return text
    # None, lists and mappings: YAML syntax ("[1, 2]", "{a: 1}", "null", "0.5").
    value = yaml.safe_load(text)
    for kind in (dict, list):
        if isinstance(old, kind) and not isinstance(value, kind):
            raise ConfigError(f"override {key}: expected a YAML {kind.__name__} like the value it replaces, "
                              f"got {text!r}")
    return value


def apply_overrides(config: dict, overrides: list[str]) -> dict:
    """Return a copy of ``config`` with each ``"a.b.c value"`` (or ``"a.b.c=value"``) override applied.

    Raises:
        ConfigError: malformed override, unknown key (the message lists the valid keys at that level), or a value
            that cannot be parsed as the type of the value it replaces.
    """
    config = copy.deepcopy(config)
    for item in overrides:
        item = item.strip()
        parts = item.split(None, 1)
        if len(parts) == 1 and "=" in item:
            parts = item.split("=", 1)
        if len(parts) != 2:
            raise ConfigError(f"override {item!r}: expected 'key.sub value' or 'key.sub=value'")
        dotted, text = parts[0], parts[1].strip()
        node = config
        names = dotted.split(".")
        for depth, name in enumerate(names):
            if not isinstance(node, dict) or name not in node:
                where = ".".join(names[:depth]) or "top level"
                valid = sorted(node) if isinstance(node, dict) else []
                raise ConfigError(f"override {dotted!r}: unknown key {name!r} at {where}; valid keys: {valid}")
            if depth == len(names) - 1:
                node[name] = _parse_like(node[name], text, dotted)
            else:
                node = node[name]
    return config


def fill_train_defaults(config: dict) -> dict:
    """A copy of ``config`` whose ``train_conf`` has every key of :data:`TRAIN_CONF_DEFAULTS` (values are checked
    later, by :func:`resolve_train_conf`), so that an override can set a key the YAML leaves out.

    Raises:
        ConfigError: ``train_conf`` is not a mapping.
    """
    given = config.get("train_conf") or {}
    if not isinstance(given, dict):
        raise ConfigError(f"train_conf must be a mapping of keys, got {given!r}")
    return {**config, "train_conf": {**TRAIN_CONF_DEFAULTS, **given}}


def resolve_train_conf(config: dict) -> dict:
    """Fill ``train_conf`` with defaults and check every key and choice.

    Raises:
        ConfigError: an unknown ``train_conf`` key (message lists the valid ones), a bad dtype, a non-positive
            ``accum_grad``/``max_epoch``, a ``grad_clip`` that is not a finite number >= 0 (NaN, inf, negative,
            a string), a negative checkpoint interval/retention count, a ``join_mode`` not in
            ``JOIN_MODE_CHOICES`` or a non-positive ``join_timeout_s``.
    """
    given = config.get("train_conf") or {}
    if not isinstance(given, dict):
        raise ConfigError(f"train_conf must be a mapping of keys, got {given!r}")
    unknown = sorted(set(given) - set(TRAIN_CONF_DEFAULTS))
    if unknown:
        raise ConfigError(f"train_conf: unknown keys {unknown}; valid keys: {sorted(TRAIN_CONF_DEFAULTS)}")
    conf = {**TRAIN_CONF_DEFAULTS, **given}
    if conf["dtype"] not in DTYPE_CHOICES:
        raise ConfigError(f"train_conf.dtype: {conf['dtype']!r} is not one of {list(DTYPE_CHOICES)}")
    for key in ("accum_grad", "max_epoch", "log_interval"):
        if not isinstance(conf[key], int) or conf[key] < 1:
            raise ConfigError(f"train_conf.{key} must be a positive integer, got {conf[key]!r}")
    for key in ("save_interval_steps", "keep_last_n", "keep_best_n"):
        if isinstance(conf[key], bool) or not isinstance(conf[key], int) or conf[key] < 0:
            raise ConfigError(f"train_conf.{key} must be a non-negative integer (0 disables), got {conf[key]!r}")
    clip = conf["grad_clip"]
    if isinstance(clip, bool) or not isinstance(clip, (int, float)) or not 0 <= clip < math.inf:
        raise ConfigError(f"train_conf.grad_clip must be a finite number >= 0 (the max global L2 norm of the "
                          f"gradients; 0 disables clipping), got {clip!r}")
    minutes = conf["save_interval_minutes"]
    if isinstance(minutes, bool) or not isinstance(minutes, (int, float)) or not minutes >= 0 or minutes == math.inf:
        raise ConfigError(f"train_conf.save_interval_minutes must be a non-negative number, got {minutes!r}")
    if conf["join_mode"] not in JOIN_MODE_CHOICES:
        raise ConfigError(f"train_conf.join_mode: {conf['join_mode']!r} is not one of {list(JOIN_MODE_CHOICES)}")
    timeout = conf["join_timeout_s"]
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout < math.inf:
        raise ConfigError(f"train_conf.join_timeout_s must be a positive number of seconds, got {timeout!r}")
    return conf


def save_config(config: dict, path: str) -> None:
    """Write ``config`` as YAML (keys in insertion order) to ``path``."""
    with open(path, "w", encoding="utf-8") as f:
        yaml.safe_dump(config, f, sort_keys=False, allow_unicode=True)


def count_symbols(symbol_table_path: str) -> int:
    """Number of units in a ``symbol id`` table (the model's ``output_dim``).

    Raises:
        ConfigError: the file is missing or a line is not ``symbol id``.
    """
    try:
        with open(symbol_table_path, encoding="utf-8") as f:
            lines = [line.split() for line in f if line.strip()]
    except FileNotFoundError as e:
        raise ConfigError(f"symbol table not found: {symbol_table_path} (tokenizer_conf.symbol_table_path)") from e
    for number, fields in enumerate(lines, 1):
        if len(fields) != 2 or not fields[1].isdigit():
            raise ConfigError(f"{symbol_table_path}:{number}: expected 'symbol id', got {' '.join(fields)!r}")
    return len(lines)


def check_modify_and_save_config(config: dict, model_dir: str, is_main: bool) -> dict:
    """Resolve the derived keys and write the effective config to ``model_dir/train.yaml`` (rank 0 only).

    Sets ``output_dim`` from the symbol table, ``input_dim`` from ``dataset_conf.fbank_conf.num_mel_bins`` and fills
    ``train_conf`` with its defaults, so the saved file alone rebuilds the model for decoding.

    Raises:
        ConfigError: a missing section or an invalid ``train_conf`` (see :func:`resolve_train_conf`).
    """
    for section in ("encoder", "decoder", "tokenizer_conf", "dataset_conf"):
        if section not in config:
            raise ConfigError(f"config has no '{section}' section; it is required")
    config = copy.deepcopy(config)
    config["train_conf"] = resolve_train_conf(config)
    config["output_dim"] = count_symbols(config["tokenizer_conf"]["symbol_table_path"])
    config["input_dim"] = config["dataset_conf"].get("fbank_conf", {}).get("num_mel_bins", 80)
    if is_main:
        os.makedirs(model_dir, exist_ok=True)
        save_config(config, os.path.join(model_dir, "train.yaml"))
    return config
