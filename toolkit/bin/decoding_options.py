"""The search's command-line options, shared by ``recognize.py`` and ``toolkit-transcribe``: each defaults to the
model dir's ``decode.yaml`` (:mod:`toolkit.inference.decode_conf`), else to :class:`DecodeConf`'s default, and a
value given on the command line overrides it."""

from __future__ import annotations

import argparse
import dataclasses

from toolkit.inference.decode_conf import DecodeConf
from toolkit.utils.config_parsing import ConfigError

LM_OPTIONS = ("lm_weight", "word_bonus", "oov_penalty", "spelling_lm")
DECODE_OPTIONS = ("beam_size", "ctc_weight", "reverse_weight", "length_penalty", "lm", *LM_OPTIONS,
                  "decoding_chunk_size", "num_decoding_left_chunks")


def add_decoding_options(parser: argparse.ArgumentParser) -> None:
    """``--beam_size``, ``--ctc_weight``, ... (:data:`DECODE_OPTIONS`), each None unless given."""
    defaults = DecodeConf()
    parser.add_argument("--beam_size", type=int, help=f"default {defaults.beam_size}")
    parser.add_argument("--ctc_weight", type=float,
                        help=f"CTC weight in attention rescoring (default {defaults.ctc_weight})")
    parser.add_argument("--reverse_weight", type=float,
                        help="weight of the right-to-left decoder's score in attention rescoring, in [0, 1] "
                             "(decoder: bitransformer only; default: the model's model_conf.reverse_weight)")
    parser.add_argument("--length_penalty", type=float,
                        help="added to a hypothesis' log-probability per token, in attention (on top of its length "
                             "normalisation) and attention rescoring; > 0 favours longer outputs (default "
                             f"{defaults.length_penalty})")
    parser.add_argument("--lm",
                        help="word n-gram LM (ARPA, or a KenLM binary with --oov_penalty 0; e.g. from "
                             "tools/train_ngram_lm.py) fused into ctc_prefix_beam_search and so into "
                             "attention_rescoring's n-best; empty: none")
    parser.add_argument("--lm_weight", type=float, help=f"with --lm: weight of its natural-log score (default "
                                                        f"{defaults.lm_weight})")
    parser.add_argument("--word_bonus", type=float, help=f"with --lm: added per word of a hypothesis (default "
                                                         f"{defaults.word_bonus})")
    parser.add_argument("--oov_penalty", type=float,
                        help="with --lm: added per word outside the LM's vocabulary, and to a prefix from the moment "
                             f"its last word begins no word of the LM (<= 0; default {defaults.oov_penalty}: off)")
    parser.add_argument("--spelling_lm",
                        help="with --lm (ARPA): letter n-gram LM of words (tools/train_ngram_lm.py --spelling) that "
                             "scores the spelling of each word outside the LM's vocabulary, on top of its <unk> "
                             "probability and --oov_penalty; empty: none")
    parser.add_argument("--decoding_chunk_size", type=int,
                        help="encoder self-attention in chunks of N > 0 encoder frames (40 ms each after conv2d), as "
                             "a stream would see them (masked over the whole utterance); -1: full context (default "
                             f"{defaults.decoding_chunk_size})")
    parser.add_argument("--num_decoding_left_chunks", type=int,
                        help="with --decoding_chunk_size N > 0: chunks to the left each chunk sees, >= 0; -1: all")


def merge_decoding_options(args: argparse.Namespace, decode_conf: DecodeConf) -> DecodeConf:
    """``decode_conf`` with each of :data:`DECODE_OPTIONS` given on the command line (not None) in its place.

    Raises:
        ConfigError: a value out of range (:class:`DecodeConf`'s check, naming the option).
    """
    given = {name: getattr(args, name) for name in DECODE_OPTIONS if getattr(args, name) is not None}
    try:
        return dataclasses.replace(decode_conf, **given)
    except ConfigError as e:
        raise ConfigError(f"--{e}") from e
