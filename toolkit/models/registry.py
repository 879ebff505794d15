"""Build an ASRModel from the YAML training config.

Each ``name: value`` entry selects a class and its ``name_conf:`` dict supplies keyword
arguments, checked against the constructor so a typo fails loudly instead of being ignored.
"""
import inspect

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


def init_model(conf, input_dim: int, vocab_size: int) -> ASRModel:
    """Instantiate the model described by the model sections of a training config.

    Args:
        conf: any object with the attributes ``encoder`` (conformer|transformer) and ``encoder_conf``, ``decoder``
            (transformer) and ``decoder_conf``, ``model_conf`` (:class:`ASRModel` keywords: ctc_weight,
            lsm_weight, length_normalized_loss), ``cmvn`` (``global_cmvn`` or None) and ``cmvn_conf``
            (``{cmvn_file}``), e.g. a :class:`toolkit.config.Config`.
        input_dim: D, the fbank bins of the features.
        vocab_size: V, the tokenizer's symbol count (``<sos/eos>`` = V - 1).

    Returns:
        A freshly initialised ASRModel (training mode).

    Raises:
        ConfigError: an unknown encoder/decoder/cmvn name, an unknown ``*_conf`` key (the message lists the valid
            ones), or a missing or unreadable CMVN file.
    """
    global_cmvn = None
    if conf.cmvn is not None:
        if conf.cmvn not in CMVNS:
            raise ConfigError(f"cmvn: unknown name {conf.cmvn!r}; valid: {list(CMVNS)} or null")
        cmvn_file = (conf.cmvn_conf or {}).get("cmvn_file")
        if not cmvn_file:
            raise ConfigError("cmvn: global_cmvn needs cmvn_conf.cmvn_file (tools/compute_cmvn_stats.py writes it), "
                              "or set 'cmvn: null'")
        global_cmvn = GlobalCMVN(*load_global_cmvn(cmvn_file))

    encoder_cls = _lookup("encoder", conf.encoder, ENCODERS)
    encoder = _build("encoder_conf", encoder_cls, conf.encoder_conf, input_dim, global_cmvn=global_cmvn)
    decoder_cls = _lookup("decoder", conf.decoder, DECODERS)
    decoder = _build("decoder_conf", decoder_cls, conf.decoder_conf, vocab_size, encoder.output_size())
    ctc = CTC(vocab_size, encoder.output_size())
    return _build("model_conf", ASRModel, conf.model_conf, vocab_size, encoder, decoder, ctc)


def _build(section: str, cls: type, conf: dict | None, *args, **kwargs):
    """``cls(*args, **kwargs, **conf)``; a value the constructor refuses (its ValueError) is a ConfigError naming
    ``section``."""
    try:
        return cls(*args, **kwargs, **_checked_conf(section, cls, conf))
    except ValueError as e:
        raise ConfigError(f"{section}: {e}") from e
