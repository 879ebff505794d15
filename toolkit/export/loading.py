"""A trained model from its model dir, for the export (``recognize.py`` main's steps 2-3: config, tokenizer, model,
checkpoint)."""
from __future__ import annotations

import os

from toolkit.models.registry import init_model
from toolkit.text.tokenizer import check_model_fits_table, init_tokenizer
from toolkit.train_config import read_config
from toolkit.utils.checkpoint import MODEL_KEY, check_model_state, load_checkpoint
from toolkit.utils.config_parsing import ConfigError


def load_model_dir(model_dir: str, checkpoint: str):
    """``(config, tokenizer, model)``: ``model_dir/train.yaml``, its tokenizer, and the model in eval mode on the
    CPU with ``checkpoint``'s weights (a path, or a file name in ``model_dir``).

    Raises:
        ConfigError: no ``train.yaml``, no such checkpoint or a directory in its place, a tokenizer that does not fit the model, or a
            checkpoint of another model (one line each).
    """
    config_path = os.path.join(model_dir, "train.yaml")
    if not os.path.isfile(config_path):
        raise ConfigError(f"--model_dir {model_dir}: no train.yaml")
    if not os.path.isfile(checkpoint) and os.path.isfile(os.path.join(model_dir, checkpoint)):
        checkpoint = os.path.join(model_dir, checkpoint)
    if os.path.isdir(checkpoint):
        raise ConfigError(f"--checkpoint {checkpoint}: a directory, not a checkpoint file")
    if not os.path.isfile(checkpoint):
        raise ConfigError(f"--checkpoint {checkpoint}: no such file")
    config = read_config(config_path)
    tokenizer = init_tokenizer(config.tokenizer, config.tokenizer_conf)
    check_model_fits_table(tokenizer, config.output_dim, config_path)
    model = init_model(config)
    try:
        saved = load_checkpoint(checkpoint)[MODEL_KEY]
    except FileNotFoundError as e:
        raise ConfigError(f"--checkpoint {e}") from e
    check_model_state({key: value.shape for key, value in model.state_dict().items()}, saved,
                      f"--checkpoint {checkpoint} (--model_dir {model_dir})")
    model.load_state_dict(saved)
    return config, tokenizer, model.eval()
