"""Build an ASRModel from the YAML training config.

Each ``name: value`` entry selects a class and its ``name_conf:`` dict supplies keyword
arguments, checked against the constructor so a typo fails loudly instead of being ignored.
"""
import inspect
from collections.abc import Mapping

from toolkit.models.transformer.asr_model import ASRModel
from toolkit.models.transformer.cmvn import GlobalCMVN, load_global_cmvn
from toolkit.models.transformer.ctc import CTC
from toolkit.models.transformer.decoder import BiTransformerDecoder, TransformerDecoder
from toolkit.models.transformer.encoder import ConformerEncoder, TransformerEncoder
from toolkit.utils.config_parsing import ConfigError

ENCODERS = {"conformer": ConformerEncoder, "transformer": TransformerEncoder}
DECODERS = {"bitransformer": BiTransformerDecoder, "transformer": TransformerDecoder}
CMVNS = ("global_cmvn",)

# Filled in by init_model from other config entries, never from a *_conf dict.
_DERIVED_KWARGS = {"input_size", "global_cmvn", "vocab_size", "odim", "encoder_output_size", "encoder",
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


def filled_conf(section: str, name: str | None, conf: dict | None) -> dict:
    """``conf`` of ``section`` (``encoder_conf``, ``decoder_conf``, ``ctc_conf``) with every constructor default of
    its class (``name`` in :data:`ENCODERS` / :data:`DECODERS`; None for CTC) filled in: two confs build the same
    module exactly when their filled forms are equal.

    Raises:
        ConfigError: an unknown name or key (as :func:`init_model`).
    """
    cls = CTC if section == "ctc_conf" else _lookup(section[:-len("_conf")], name,
                                                    ENCODERS if section == "encoder_conf" else DECODERS)
    given = _checked_conf(section, cls, conf)
    defaults = {key: p.default for key, p in inspect.signature(cls).parameters.items()
                if key not in _DERIVED_KWARGS and p.default is not inspect.Parameter.empty}
    return {**defaults, **given}


def init_model(conf, input_dim: int | None = None, vocab_size: int | None = None) -> ASRModel:
    """Instantiate the model described by the model sections of a training config.

    Args:
        conf: a :class:`toolkit.train_config.Config`, or the config as a plain mapping (a loaded YAML), with
            ``encoder`` (conformer|transformer) and ``encoder_conf``, ``decoder`` (transformer|bitransformer) and
            ``decoder_conf``, ``ctc_conf`` (:class:`CTC` keywords: dropout_rate, upsample), ``model_conf``
            (:class:`ASRModel` keywords: ctc_weight, lsm_weight, length_normalized_loss, interctc_weight,
            reverse_weight), ``cmvn`` (``global_cmvn`` or None) and ``cmvn_conf`` (``{cmvn_file}``).
        input_dim: D, the fbank bins of the features (default: the config's ``input_dim``).
        vocab_size: V, the symbol table's size, ``<sos/eos>`` = V - 1 (default: the config's ``output_dim``).

    Returns:
        A freshly initialised ASRModel (training mode).

    Raises:
        ConfigError: no input or vocabulary size, an unknown encoder/decoder/cmvn name, an unknown ``*_conf`` key
            (the message lists the valid ones), a value a constructor refuses, or a missing or unreadable CMVN file.
    """
    def get(key: str, default=None):
        return conf.get(key, default) if isinstance(conf, Mapping) else getattr(conf, key, default)

    input_dim = get("input_dim") if input_dim is None else input_dim
    vocab_size = get("output_dim") if vocab_size is None else vocab_size
    if input_dim is None or vocab_size is None:
        raise ConfigError("the model needs input_dim (fbank bins) and output_dim (the symbol table's size)")
    global_cmvn = None
    cmvn = get("cmvn")
    if cmvn is not None:
        if cmvn not in CMVNS:
            raise ConfigError(f"cmvn: unknown name {cmvn!r}; valid: {list(CMVNS)} or null")
        cmvn_file = (get("cmvn_conf") or {}).get("cmvn_file")
        if not cmvn_file:
            raise ConfigError("cmvn: global_cmvn needs cmvn_conf.cmvn_file (tools/compute_cmvn_stats.py writes it), "
                              "or set 'cmvn: null'")
        global_cmvn = GlobalCMVN(*load_global_cmvn(cmvn_file))

    encoder_cls = _lookup("encoder", get("encoder", "conformer"), ENCODERS)
    encoder = _build("encoder_conf", encoder_cls, get("encoder_conf"), input_dim, global_cmvn=global_cmvn)
    decoder_cls = _lookup("decoder", get("decoder", "transformer"), DECODERS)
    decoder = _build("decoder_conf", decoder_cls, get("decoder_conf"), vocab_size, encoder.output_size())
    ctc = _build("ctc_conf", CTC, get("ctc_conf"), vocab_size, encoder.output_size())
    return _build("model_conf", ASRModel, get("model_conf"), vocab_size, encoder, decoder, ctc)


def _build(section: str, cls: type, conf: dict | None, *args, **kwargs):
    """``cls(*args, **kwargs, **conf)``; a value the constructor refuses (its ValueError) is a ConfigError naming
    ``section``."""
    conf = _checked_conf(section, cls, conf)  # its ConfigError already names the section
    try:
        return cls(*args, **kwargs, **conf)
    except ValueError as e:
        raise ConfigError(f"{section}: {e}") from e
