"""Config parsing, the mechanics: YAML loading, command-line overrides, and typed sections built from plain dicts (the
training config's schema, its sections and their owners, is :mod:`toolkit.train_config`).

A config is read from ``conf/*.yaml`` (WeNet layout: ``name:`` paired with ``name_conf:``). Each section that the
toolkit owns is a dataclass declared by the code that consumes it (``train_conf``: :mod:`toolkit.engine.train_conf`,
``dataset_conf``: :mod:`toolkit.dataset.conf`, ...); :func:`typed` builds it from the YAML's dict, checking every key
and the type of every value, so a typo or a wrongly typed value (``spec_aug: "false"``, ``max_epoch: true``) stops
the run with one line naming the key, instead of training with something else.

Overrides (``--override_config "train_conf.max_epoch 3"`` or ``"train_conf.max_epoch=3"``) are applied to the plain
dict before the sections are built (:func:`apply_overrides`): the value is YAML (``null`` and ``~`` are None, ``[1,
2]`` a list, ``{a: 1}`` a mapping merged into the section it replaces), and the key must exist, so an override never
silently adds a key that nothing reads.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import logging
import math
import os
import sys
import time
import types
import typing
from typing import Any, Callable, Literal, TypeVar, Union

import yaml

T = TypeVar("T")


class ConfigError(ValueError):
    """A config file, override or command-line value is wrong; the message says which and what to do."""


def exit_on_config_error(main: Callable[[], None]) -> None:
    """Run a command-line ``main()``; a :class:`ConfigError` (and so a bad option of an :class:`ArgumentParser`)
    becomes one line and exit status 2 instead of a traceback (the message already says what to fix).

    A rank under torchrun does not log it: it writes it to torchrun's error file (``TORCHELASTIC_ERROR_FILE``),
    and the launcher reports it once for the job (``toolkit.bin.launch`` as one line; plain torchrun as the
    "traceback" of its failure summary), instead of once per rank."""
    try:
        main()
    except ConfigError as e:
        error_file = os.environ.get("TORCHELASTIC_ERROR_FILE")
        if error_file:
            with open(error_file, "w", encoding="utf-8") as f:  # torchrun's ErrorHandler format, one line inside
                json.dump({"message": {"message": f"{ERROR_PREFIX}{e}", "extraInfo": {
                    "py_callstack": str(e), "timestamp": str(int(time.time()))}}}, f)
        elif logging.getLogger().handlers:  # the command's log format (time, rank)
            logging.error("%s", e)
        else:  # before the command set up logging (its options): the line alone
            print(f"error: {e}", file=sys.stderr)
        sys.exit(2)


# How a rank's error file marks a ConfigError, for the launcher to report it as one line.
ERROR_PREFIX = "ConfigError: "


class ArgumentParser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` whose errors (an unknown option, an invalid choice, a missing argument) raise a
    one-line :class:`ConfigError` (``train.py: argument --train_engine: invalid choice: 'x' (choose from
    'torch_ddp', 'deepspeed')``) instead of printing the usage block: run ``main()`` through
    :func:`exit_on_config_error`."""

    def error(self, message: str):
        raise ConfigError(f"{self.prog}: {message} (see --help)")


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
        raise ConfigError(f"{path}: not valid YAML: {' '.join(str(e).split())}") from e
    if not isinstance(config, dict):
        raise ConfigError(f"{path}: top level must be a mapping of keys, got {type(config).__name__}")
    return config


def save_config(config: dict, path: str) -> None:
    """Write ``config`` as YAML (keys in insertion order) to ``path``."""
    with open(path, "w", encoding="utf-8") as f:
        yaml.safe_dump(config, f, sort_keys=False, allow_unicode=True)


def _parse_override(old: Any, text: str, key: str) -> Any:
    """The YAML value of ``text``, checked against the kind of value it replaces (the sections' own types are
    checked later, by :func:`typed`)."""
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigError(f"override {key}: {text!r} is not valid YAML ({' '.join(str(e).split()[:8])} ...)") from e
    if value is None or old is None:
        return value
    if isinstance(old, dict):
        if not isinstance(value, dict):
            raise ConfigError(f"override {key}: expected a YAML mapping like {{a: 1}}, got {text!r}")
        return _merge(old, value)
    if isinstance(old, str) and not isinstance(value, (dict, list)):
        return text  # "123" or "true" for a string key stays the text the user typed
    kinds = {bool: (bool,), int: (int,), float: (int, float), list: (list,)}
    for kind, accepted in kinds.items():
        if isinstance(old, kind):
            if not isinstance(value, accepted) or (kind is not bool and isinstance(value, bool)):
                name = {bool: "true or false", int: "an integer", float: "a number", list: "a YAML list"}[kind]
                raise ConfigError(f"override {key}: expected {name} like the value it replaces, got {text!r}")
            return float(value) if kind is float else value
    return value


def _merge(old: dict, new: dict) -> dict:
    """``old`` with ``new``'s keys replaced (mappings merged recursively), so that overriding a whole section keeps
    the YAML's values of the keys it does not name."""
    merged = copy.deepcopy(old)
    for key, value in new.items():
        if isinstance(merged.get(key), dict) and isinstance(value, dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def apply_overrides(config: dict, overrides: list[str]) -> dict:
    """Return a copy of ``config`` with each ``"a.b.c value"`` (or ``"a.b.c=value"``) override applied.

    Raises:
        ConfigError: malformed override or YAML value, unknown key (the message lists the valid keys at that level),
            or a value of another kind than the one it replaces (a number for a mapping, text for an integer).
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
                hint = f" (those set here; a key the section takes that is not set: '{where} {{{name}: value}}')"
                raise ConfigError(f"override {dotted!r}: unknown key {name!r} at {where}; valid keys: {valid}"
                                  + (hint if depth else ""))
            if depth == len(names) - 1:
                node[name] = _parse_override(node[name], text, dotted)
            else:
                node = node[name]
    return config


def defaults_of(cls: type) -> dict:
    """The default values of dataclass ``cls`` as a plain dict (nested sections as dicts)."""
    return dataclasses.asdict(cls())


def fill_defaults(cls: type, given: Any) -> Any:
    """``given`` (a section's dict from the YAML) with every key of ``cls`` that it leaves out set to its default,
    recursively, so that an override can set a key the YAML does not mention. Nothing is checked here (see
    :func:`typed`); a non-dict ``given`` is returned as it is."""
    if given is None:
        given = {}
    if not isinstance(given, dict):
        return given
    filled = dict(given)
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        sub = hints[f.name]
        if f.name not in filled:
            default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
            filled[f.name] = dataclasses.asdict(default) if dataclasses.is_dataclass(default) else default
        elif dataclasses.is_dataclass(sub):
            filled[f.name] = fill_defaults(sub, filled[f.name])
    return filled


def _describe(value: Any) -> str:
    return f"{value!r} ({type(value).__name__})"


def _check(hint: Any, value: Any, where: str) -> Any:
    """``value`` converted to and checked against the annotation ``hint``."""
    origin = typing.get_origin(hint)
    if origin in (Union, types.UnionType):
        options = typing.get_args(hint)
        if value is None and type(None) in options:
            return None
        errors = []
        for option in options:
            if option is type(None):
                continue
            try:
                return _check(option, value, where)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(errors[0] if len(errors) == 1 else f"{where}: {_describe(value)} fits none of {options}")
    if origin is Literal:
        choices = typing.get_args(hint)
        if value not in choices or isinstance(value, bool):
            raise ConfigError(f"{where}: {value!r} is not one of {list(choices)}")
        return value
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where}: expected a list, got {_describe(value)}")
        (item,) = typing.get_args(hint)[:1]
        return [_check(item, v, f"{where}[{i}]") for i, v in enumerate(value)]
    if origin is dict or hint is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a mapping, got {_describe(value)}")
        return dict(value)
    if dataclasses.is_dataclass(hint):
        return typed(hint, value, where)
    if hint is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: expected true or false, got {_describe(value)}")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where}: expected an integer, got {_describe(value)}")
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ConfigError(f"{where}: expected a finite number, got {_describe(value)}")
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where}: expected a string, got {_describe(value)}")
        return value
    if hint is Any:
        return value
    raise TypeError(f"{where}: unsupported annotation {hint!r}")


def typed(cls: type[T], given: Any, where: str) -> T:
    """Build dataclass ``cls`` from the dict ``given`` (None: all defaults), checking each key and value.

    Keys ``given`` leaves out take the field's default; nested dataclass fields are built recursively; ``bool``
    takes only true/false, ``int`` only integers (not booleans), ``float`` only finite numbers, ``Literal[...]`` only
    its choices. After the types, the dataclass's own ``__post_init__`` checks ranges.

    Raises:
        ConfigError: ``given`` is not a mapping, has a key ``cls`` lacks (the valid ones are listed), or a value of
            the wrong type or range (the message names ``where.key``).
    """
    if given is None:
        given = {}
    if isinstance(given, cls):
        return given
    if not isinstance(given, dict):
        raise ConfigError(f"{where or 'the config'} must be a mapping of keys, got {_describe(given)}")
    names = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(given) - set(names))
    if unknown:
        raise ConfigError(f"{where or 'the config'}: unknown keys {unknown}; valid keys: {sorted(names)}")
    hints = typing.get_type_hints(cls)
    return cls(**{key: _check(hints[key], value, f"{where}.{key}" if where else key) for key, value in given.items()})


def require(condition: bool, where: str, what: str, value: Any) -> None:
    """For ``__post_init__`` range checks: raise ``ConfigError("{where} must be {what}, got {value!r}")`` unless
    ``condition``."""
    if not condition:
        raise ConfigError(f"{where} must be {what}, got {value!r}")
