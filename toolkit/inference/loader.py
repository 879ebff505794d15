"""One loader of a trained model for every consumer (``recognize.py``, ``toolkit-transcribe``,
:func:`toolkit.load_model`, the export): the model dir's ``train.yaml`` with its files resolved against the dir
(:func:`toolkit.train_config.read_config`), the tokenizer checked against the model, the model with the
checkpoint's weights, the dir's decoding settings (:mod:`toolkit.inference.decode_conf`), and the word LM they name.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import torch

from toolkit.inference.decode_conf import DecodeConf, read_decode_conf
from toolkit.models.registry import filled_conf, init_model
from toolkit.text.ngram_lm import WordNgramLM
from toolkit.text.tokenizer import check_model_fits_table, init_tokenizer
from toolkit.train_config import Config, model_files, read_config
from toolkit.utils.checkpoint import MODEL_KEY, check_model_state, list_checkpoints, load_checkpoint
from toolkit.utils.config_parsing import ConfigError

TRAIN_YAML = "train.yaml"
# The config's sections that decide what the weights compute (dropout aside); the loss weights of model_conf do not.
MODEL_SECTIONS = ("encoder", "encoder_conf", "decoder", "decoder_conf", "ctc_conf", "cmvn", "input_dim", "output_dim")


@dataclass
class LoadedModel:
    """A trained model ready to decode.

    Attributes:
        model_dir: the dir holding ``train.yaml``.
        config: its config, the model files resolved (absolute or from the current directory).
        tokenizer: the char or BPE tokenizer of its symbol table.
        model: the :class:`~toolkit.models.transformer.asr_model.ASRModel` in eval mode, on the device asked.
        checkpoint: the file its weights came from.
        decode_conf: the dir's ``decode.yaml`` (its defaults when absent).
    """

    model_dir: str
    config: Config
    tokenizer: object
    model: torch.nn.Module
    checkpoint: str
    decode_conf: DecodeConf


def config_path_of(model_dir: str) -> str:
    """``model_dir/train.yaml``.

    Raises:
        ConfigError: ``model_dir`` is not a directory, or holds no ``train.yaml`` (one line naming it).
    """
    if not os.path.isdir(model_dir):
        raise ConfigError(f"model dir {model_dir}: no such directory")
    path = os.path.join(model_dir, TRAIN_YAML)
    if not os.path.isfile(path):
        raise ConfigError(f"model dir {model_dir} holds no {TRAIN_YAML} (toolkit.bin.train writes it beside the "
                          "checkpoints): is it the dir of a trained model?")
    return path


def default_checkpoint(model_dir: str, decode_conf: DecodeConf) -> str:
    """The checkpoint to decode when none is given: ``decode.yaml``'s ``checkpoint`` (e.g. ``avg_3.pt``), else the
    newest committed ``epoch_N.pt`` of ``model_dir``.

    Raises:
        ConfigError: neither exists.
    """
    if decode_conf.checkpoint:
        return decode_conf.checkpoint
    epochs = list_checkpoints(model_dir)
    if not epochs:
        raise ConfigError(f"model dir {model_dir}: no checkpoint to decode (no decode.yaml naming one, no committed "
                          "epoch_N.pt with its epoch_N.yaml); give one")
    return epochs[-1]


def load_asr_model(config_path: str, checkpoint: str | None = None, overrides: list[str] = (),
                   device: torch.device | str = "cpu") -> LoadedModel:
    """Load the model of ``config_path`` (a model dir's ``train.yaml``, with ``--override_config`` items).

    Args:
        checkpoint: the weights: a path, or a name in the model dir (``avg_3.pt``); None: :func:`default_checkpoint`.
            A checkpoint without its ``.yaml`` (copied alone) is loaded with one warning line.

    Raises:
        ConfigError: ``device`` is not a torch device or a GPU this torch cannot use, a model file the config names
            is missing, the symbol table does not fit the model, the checkpoint is missing, a directory, unreadable
            or of another model (another tensor shape, or another model in the train.yaml beside it:
            :func:`check_checkpoint_origin`), one line naming the file.
    """
    try:
        device = torch.device(device)
    except RuntimeError as e:
        raise ConfigError(f"device {device}: not a torch device ({e})") from e
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"device {device}: this torch sees no CUDA GPU (torch {torch.__version__}); use cpu")
    model_dir = os.path.dirname(os.path.abspath(config_path))
    config = read_config(config_path, overrides)  # the model files resolved against the model dir
    for (section, key), path in model_files(config).items():
        if not os.path.isfile(path):
            raise ConfigError(f"{config_path}: {section}.{key} {path}: no such file (in {model_dir} or from "
                              f"{os.getcwd()})")
    decode_conf = read_decode_conf(model_dir)
    tokenizer = init_tokenizer(config.tokenizer, config.tokenizer_conf)
    check_model_fits_table(tokenizer, config.output_dim, config_path)
    if checkpoint is None:
        checkpoint = default_checkpoint(model_dir, decode_conf)
    elif not os.path.isfile(checkpoint) and os.path.isfile(os.path.join(model_dir, checkpoint)):
        checkpoint = os.path.join(model_dir, checkpoint)
    if os.path.isdir(checkpoint):
        raise ConfigError(f"checkpoint {checkpoint}: a directory, not a checkpoint file")
    if not os.path.isfile(checkpoint):
        raise ConfigError(f"checkpoint {checkpoint}: no such file (nor in {model_dir})")
    model = init_model(config)
    saved = load_checkpoint(checkpoint, committed=False)[MODEL_KEY]
    check_model_state({key: value.shape for key, value in model.state_dict().items()}, saved,
                      f"checkpoint {checkpoint} ({config_path})")
    check_checkpoint_origin(config, config_path, checkpoint)  # the same shapes, another model?
    model.load_state_dict(saved)
    model.to(device).eval()
    return LoadedModel(model_dir, config, tokenizer, model, checkpoint, decode_conf)


def _model_leaves(config: Config) -> dict[str, object]:
    """``{"encoder_conf.causal": False, ...}``: the :data:`MODEL_SECTIONS` of ``config``, the module confs with their
    constructors' defaults filled in (:func:`toolkit.models.registry.filled_conf`), as dotted keys, dropout rates
    left out."""
    leaves = {}
    for section in MODEL_SECTIONS:
        value = getattr(config, section)
        if section.endswith("_conf"):
            value = filled_conf(section, getattr(config, section[:-len("_conf")], None), value)
            leaves.update({f"{section}.{key}": inner for key, inner in value.items() if "dropout" not in key})
        else:
            leaves[section] = value
    return leaves


def check_checkpoint_origin(config: Config, config_path: str, checkpoint: str) -> None:
    """Refuse a checkpoint trained with another model than ``config``'s when its tensors have the same shapes (a
    causal convolution or dynamic chunks change no shape, only what the weights compute): the ``train.yaml``
    beside ``checkpoint``, when there is one and it is not ``config_path``, must agree on every key of
    :data:`MODEL_SECTIONS` but dropout rates.

    Raises:
        ConfigError: the two configs differ (one line: the first keys that differ, both values).
    """
    origin = os.path.join(os.path.dirname(os.path.abspath(checkpoint)), TRAIN_YAML)
    if not os.path.isfile(origin) or os.path.samefile(origin, config_path):
        return
    ours, theirs = _model_leaves(config), _model_leaves(read_config(origin))
    differ = [key for key in sorted(ours.keys() | theirs.keys()) if ours.get(key) != theirs.get(key)]
    if differ:
        shown = ", ".join(f"{key} {theirs.get(key)!r} there, {ours.get(key)!r} in {config_path}" for key in differ[:3])
        more = f" (and {len(differ) - 3} more)" if len(differ) > 3 else ""
        raise ConfigError(f"checkpoint {checkpoint} was trained with {origin}, another model: {shown}{more}; decode "
                          f"it with its own model dir ({os.path.dirname(origin)})")


def load_lm(tokenizer, path: str, lm_weight: float, word_bonus: float, oov_penalty: float,
            spelling_lm: str = "", prefix: str = "") -> WordNgramLM:
    """The word n-gram LM at ``path`` over ``tokenizer``'s units (:class:`~toolkit.text.ngram_lm.WordNgramLM`).

    Raises:
        ConfigError: it (or ``spelling_lm``) is unreadable or not an LM: one line naming ``{prefix}lm`` (and
            ``{prefix}spelling_lm``) with the paths (``prefix``: ``--`` for a command's options).
    """
    option = f"{prefix}lm"
    spelling = f" / {prefix}spelling_lm {spelling_lm}" if spelling_lm else ""
    try:
        lm = WordNgramLM(path, tokenizer.id_to_symbol, lm_weight, word_bonus, oov_penalty, spelling_lm)
    except UnicodeDecodeError as e:
        raise ConfigError(f"{option} {path}{spelling}: neither an ARPA file nor a KenLM binary") from e
    except (OSError, ValueError) as e:
        raise ConfigError(f"{option} {path}{spelling}: {e}") from e
    logging.info("word LM %s: %d-gram, weight %s, word bonus %s, OOV penalty %s, spelling LM %s", path,
                 lm.model.order, lm_weight, word_bonus, oov_penalty, spelling_lm or "none")
    return lm
