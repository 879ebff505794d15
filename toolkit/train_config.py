"""The training config's schema (``conf/*.yaml``, saved as ``train.yaml`` in the model dir): read, overridden and
resolved once, by :func:`read_config`, into a :class:`Config` that the trainer, the decoder and the tools pass down
(the mechanics, YAML, overrides and typed sections, are :mod:`toolkit.utils.config_parsing`).

Each section is owned by the code that consumes it: ``train_conf`` by the trainer
(:class:`~toolkit.engine.train_conf.TrainConf`), ``dataset_conf`` by the data pipeline
(:class:`~toolkit.dataset.conf.DatasetConf`); the model sections (``encoder``/``decoder`` + ``*_conf``,
``ctc_conf``, ``model_conf``, ``cmvn``) are checked against the constructors by
:func:`toolkit.models.registry.init_model`,
``tokenizer_conf`` by :func:`toolkit.text.tokenizer.init_tokenizer` and ``optim_conf``/``scheduler_conf`` by
:func:`toolkit.utils.scheduler.init_optimizer_and_scheduler`. The model's input size comes from
``dataset_conf.fbank_conf.num_mel_bins`` and its vocabulary size from the symbol table; ``train.yaml`` records both
as ``input_dim``/``output_dim`` so that a decoder can check the features and the table it is given against the
trained model.

The files a model needs besides its weights (:data:`MODEL_FILES`: symbol table, BPE model, CMVN stats) travel with
the model dir: the trainer copies them there under fixed names and its ``train.yaml`` names those copies by their
absolute paths (:func:`save_model_dir_config`); a decoder takes the file of that name in the dir that holds the
``train.yaml`` first (:func:`resolve_model_files`), so a model dir copied anywhere decodes with its own files, and a
``train.yaml`` copied out of its model dir (to edit it) still finds them.
"""

from __future__ import annotations

import copy
import dataclasses
import os
import shutil
from dataclasses import dataclass, field
from typing import Optional

from toolkit.dataset.conf import DatasetConf, fill_dataset_defaults
from toolkit.engine.train_conf import TrainConf, fill_train_defaults
from toolkit.utils.checkpoint import atomic_write
from toolkit.utils.config_parsing import ConfigError, apply_overrides, load_config, require, save_config, typed

# (section, key) of every path in a config that inference reads, and the name its copy takes in the model dir
MODEL_FILES = {("tokenizer_conf", "symbol_table_path"): "units.txt", ("tokenizer_conf", "bpe_model"): "bpe.model",
               ("cmvn_conf", "cmvn_file"): "global_cmvn"}


@dataclass
class Config:
    """A whole training config, typed. Model, tokenizer and optimizer sections stay mappings of constructor
    keyword arguments (checked where they are used); ``dataset_conf`` and ``train_conf`` are typed sections."""

    encoder: str = "conformer"
    encoder_conf: dict = field(default_factory=dict)
    decoder: str = "transformer"
    decoder_conf: dict = field(default_factory=dict)
    ctc_conf: dict = field(default_factory=dict)
    model_conf: dict = field(default_factory=dict)
    cmvn: Optional[str] = None
    cmvn_conf: dict = field(default_factory=dict)
    tokenizer: str = "char"
    tokenizer_conf: dict = field(default_factory=dict)
    dataset_conf: DatasetConf = field(default_factory=DatasetConf)
    optim: str = "adam"
    optim_conf: dict = field(default_factory=dict)
    scheduler: str = "warmuplr"
    scheduler_conf: dict = field(default_factory=dict)
    train_conf: TrainConf = field(default_factory=TrainConf)
    input_dim: Optional[int] = None  # D, the fbank bins the model reads: always num_mel_bins (checked)
    output_dim: Optional[int] = None  # V, the symbols the trained model predicts (None before training)

    def __post_init__(self):
        bins = self.dataset_conf.fbank_conf.num_mel_bins
        if self.input_dim is None:
            self.input_dim = bins
        require(self.input_dim == bins, "input_dim",
                f"dataset_conf.fbank_conf.num_mel_bins ({bins}): the model was trained on other features",
                self.input_dim)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def save(self, path: str) -> None:
        """Write the resolved config (every default filled in) as YAML: it alone rebuilds the run's model."""
        save_config(self.to_dict(), path)


def read_config(path: str, overrides: list[str] = ()) -> Config:
    """Read ``path``, apply the ``--override_config`` items, and resolve every section once; the paths of
    :data:`MODEL_FILES` name the files of ``path``'s directory when it holds them (a model dir's train.yaml), else
    they are kept as written (:func:`resolve_model_files`).

    Every key of :class:`Config` and of the typed sections can be overridden even when the YAML leaves it out; a
    mapping value is merged into the section it replaces (see :func:`toolkit.utils.config_parsing.apply_overrides`).

    Raises:
        ConfigError: the file is missing or not YAML, an override is malformed or names an unknown key, or a key
            or value of a section is wrong (one line naming it).
    """
    given = load_config(path)
    raw = {**Config().to_dict(), "input_dim": None, **given,
           "dataset_conf": fill_dataset_defaults(given.get("dataset_conf")),
           "train_conf": fill_train_defaults(given.get("train_conf"))}
    return resolve_model_files(typed(Config, apply_overrides(raw, list(overrides)), ""),
                               os.path.dirname(os.path.abspath(path)))


def model_files(config: Config) -> dict[tuple[str, str], str]:
    """``{(section, key): path}`` of the :data:`MODEL_FILES` that ``config``'s model reads (the CMVN file only with
    ``cmvn`` set)."""
    used = {}
    for section, key in MODEL_FILES:
        path = getattr(config, section).get(key)
        if path and (section != "cmvn_conf" or config.cmvn is not None):
            used[section, key] = path
    return used


def save_model_dir_config(config: Config, model_dir: str) -> None:
    """Copy the config's :data:`MODEL_FILES` into ``model_dir`` (each atomically, under its fixed name) and write
    ``model_dir/train.yaml`` naming those copies by their absolute paths: the dir then holds everything inference
    needs besides the decoding settings (``decode.yaml``, written by the recipe).

    Raises:
        ConfigError: a model file named by the config does not exist.
    """
    saved = copy.deepcopy(config.to_dict())
    for (section, key), source in model_files(config).items():
        name = MODEL_FILES[section, key]
        if not os.path.isfile(source):
            raise ConfigError(f"{section}.{key} {source}: no such file")
        target = os.path.join(model_dir, name)
        if not (os.path.exists(target) and os.path.samefile(source, target)):
            with open(source, "rb") as src:
                atomic_write(target, lambda f: shutil.copyfileobj(src, f))
        saved[section][key] = os.path.abspath(target)
    save_config(saved, os.path.join(model_dir, "train.yaml"))


def resolve_model_files(config: Config, config_dir: str) -> Config:
    """``config`` (read from a file in ``config_dir``) with each path of :data:`MODEL_FILES` resolved:

    - an absolute path with the file's fixed name (``/old/exp/units.txt``, as :func:`save_model_dir_config` writes it) names
      the file of that name in ``config_dir`` when there is one (a model dir copied elsewhere decodes with its own
      files), else the path itself when it exists (a train.yaml copied out of its model dir), else the file in
      ``config_dir`` (so that the error names where the model dir lacks it);
    - another relative path names the file in ``config_dir`` when it is there, else it is kept as written, relative
      to the current directory (a recipe's ``conf/*.yaml`` with paths relative to the recipe dir, or a train.yaml
      written before model dirs held their files), and so is an error about it.
    """
    resolved = copy.deepcopy(config)
    for (section, key), path in model_files(config).items():
        conf = getattr(resolved, section)
        if os.path.isabs(path) and os.path.basename(path) == MODEL_FILES[section, key]:
            inside = os.path.join(config_dir, MODEL_FILES[section, key])
            conf[key] = path if os.path.exists(path) and not os.path.exists(inside) else inside
        elif not os.path.isabs(path):
            inside = os.path.join(config_dir, path)
            conf[key] = inside if os.path.exists(inside) else path
    return resolved
