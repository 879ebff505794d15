"""Build an ASRModel from the YAML training config.

Each ``name: value`` entry selects a class and its ``name_conf:`` dict supplies keyword
arguments, checked against the constructor so a typo fails loudly instead of being ignored.
"""
import inspect

import torch

from toolkit.models.transformer.asr_model import ASRModel
from toolkit.models.transformer.cmvn import GlobalCMVN, load_global_cmvn
from toolkit.models.transformer.ctc import CTC
from toolkit.models.transformer.decoder import TransformerDecoder
from toolkit.models.transformer.encoder import ConformerEncoder, TransformerEncoder
from toolkit.utils.config import ConfigError

ENCODERS = {"conformer": ConformerEncoder, "transformer": TransformerEncoder}
DECODERS = {"transformer": TransformerDecoder}
CMVNS = ("global_cmvn",)

# Filled in by init_model from other config entries, never from a *_conf dict.
_DERIVED_KWARGS = {"input_size", "global_cmvn", "vocab_size", "encoder_output_size", "encoder",
                   "decoder", "ctc"}


def _checked_conf(section: str, cls: type, conf: dict | None) -> dict:
    """Return ``conf`` (or {}) after checking every key is a constructor keyword of ``cls``.

    Raises:
        ConfigError: (a ValueError) a key that ``cls`` does not accept, listing the accepted ones.
    """
    conf = dict(conf or {})
    valid = sorted(set(inspect.signature(cls).parameters) - _DERIVED_KWARGS)
    unknown = sorted(set(conf) - set(valid))
    if unknown:
        raise ConfigError(f"{section}: unknown key(s) {unknown} for {cls.__name__}; valid: {valid}")
    return conf


def _lookup(section: str, name: str, table: dict) -> type:
    if name not in table:
        raise ConfigError(f"{section}: unknown name {name!r}; valid: {sorted(table)}")
    return table[name]


def _finite_cmvn(cmvn_file: str) -> GlobalCMVN:
    """Global CMVN from ``cmvn_file``, refused when a bin's mean or inverse std is NaN or infinite (stats summed
    over audio holding NaN samples): every feature, every loss and so every update would be NaN.

    Raises:
        ConfigError: naming the file and the bins.
    """
    mean, istd = load_global_cmvn(cmvn_file)
    bad = (~(torch.isfinite(mean) & torch.isfinite(istd))).nonzero().flatten().tolist()
    if bad:
        raise ConfigError(f"cmvn_conf.cmvn_file {cmvn_file}: NaN or infinite statistics in {len(bad)} of "
                          f"{mean.numel()} bins (first {bad[:5]}); recompute it with tools/compute_cmvn_stats.py, "
                          "which skips audio holding NaN or infinite samples")
    return GlobalCMVN(mean, istd)


def init_model(configs: dict) -> ASRModel:
    """Instantiate the model described by a training config.

    Args:
        configs: dict with ``input_dim`` (fbank bins D), ``output_dim`` (vocabulary size V),
            ``cmvn`` (``global_cmvn`` or None) and ``cmvn_conf: {cmvn_file}``, ``encoder``
            (conformer|transformer) and ``encoder_conf``, ``decoder`` (transformer) and
            ``decoder_conf``, and ``model_conf`` (ctc_weight, lsm_weight,
            length_normalized_loss).

    Returns:
        A freshly initialised ASRModel (training mode).

    Raises:
        ConfigError: unknown encoder/decoder/cmvn name or unknown ``*_conf`` key (the message
            lists the valid ones), or CMVN statistics that are not finite. KeyError: ``input_dim``
            or ``output_dim`` missing. OSError: unreadable CMVN file.
    """
    input_dim = configs["input_dim"]
    vocab_size = configs["output_dim"]
    global_cmvn = None
    cmvn = configs.get("cmvn")
    if cmvn is not None:
        if cmvn not in CMVNS:
            raise ConfigError(f"cmvn: unknown name {cmvn!r}; valid: {list(CMVNS)} or null")
        global_cmvn = _finite_cmvn(configs["cmvn_conf"]["cmvn_file"])

    encoder_cls = _lookup("encoder", configs.get("encoder", "conformer"), ENCODERS)
    encoder = encoder_cls(input_dim, global_cmvn=global_cmvn,
                          **_checked_conf("encoder_conf", encoder_cls,
                                          configs.get("encoder_conf")))
    decoder_cls = _lookup("decoder", configs.get("decoder", "transformer"), DECODERS)
    decoder = decoder_cls(vocab_size, encoder.output_size(),
                          **_checked_conf("decoder_conf", decoder_cls,
                                          configs.get("decoder_conf")))
    ctc = CTC(vocab_size, encoder.output_size())
    model_conf = _checked_conf("model_conf", ASRModel, configs.get("model_conf"))
    return ASRModel(vocab_size, encoder, decoder, ctc, **model_conf)
