"""Transcribe audio files with a trained model: no transcript needed, no score computed.

Usage:

    toolkit-transcribe --model_dir exp/conformer rec1.wav rec2.flac          # "key text" lines
    toolkit-transcribe --model_dir exp/conformer --format jsonl data/test/wav.scp   # words with times, confidence
    toolkit-transcribe --model_dir exp/u2pp_conformer --streaming rec1.wav   # partial results as chunks run
    python -m toolkit.bin.transcribe ...                                      # the same

Inputs are audio files in any format and at any rate libsndfile reads (channels averaged, resampled to the model's
rate), or Kaldi ``wav.scp`` files (a name ending in ``.scp``: ``key path`` lines; relative paths are relative to
``--wav_root`` when given). The key printed is the wav.scp key, or the file name without its extension.

Output on stdout, one line per recording: ``key text``; with ``--format jsonl``, a JSON object ``{"key", "text",
"words": [{"word", "start", "end", "confidence"}], "confidence", "partial"}`` (times in seconds from the start of
the file, from the CTC alignment; see :mod:`toolkit.inference.transcriber`). With ``--streaming`` (a model trained
with ``use_dynamic_chunk`` or ``static_chunk_size``) each partial result is printed as it changes, ``key (partial)
text`` or a JSON object with ``"partial": true``, before the final line.

The decoding settings are the model dir's ``decode.yaml`` (written by the recipe; checkpoint, mode, beam, LM and its
weights, ...), each overridden by the option of the same name. A recording that cannot be transcribed (missing,
unreadable, empty, a directory, a sample rate the model cannot take) is one ``error:`` line on stderr naming it,
and is skipped; the others are transcribed, and the exit status is then 1. A model dir that cannot be loaded is one
line and exit status 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import sys

import torch

from toolkit.bin.decoding_options import add_decoding_options, merge_decoding_options
from toolkit.inference.decode_conf import DecodeConf
from toolkit.inference.loader import config_path_of, load_asr_model
from toolkit.inference.transcriber import AudioError, Transcriber, Transcript, key_of
from toolkit.models.transformer.asr_model import DECODING_METHODS
from toolkit.utils.config_parsing import ArgumentParser, ConfigError, exit_on_config_error
from toolkit.utils.kaldi_files import read_table
from toolkit.utils.shutdown import freeze_at_exit


def get_args(argv=None) -> argparse.Namespace:
    parser = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model_dir", required=True, help="the trained model's dir (train.yaml, checkpoints, "
                                                           "decode.yaml)")
    parser.add_argument("--checkpoint", help="a path, or a name in --model_dir (default: decode.yaml's checkpoint, "
                                             "else the newest epoch_N.pt)")
    parser.add_argument("--mode", choices=DECODING_METHODS, help="decoding method (default: decode.yaml's)")
    parser.add_argument("--format", choices=("text", "jsonl"), default="text")
    parser.add_argument("--streaming", action="store_true",
                        help="decode chunk by chunk, printing partial results (chunk: --decoding_chunk_size, else "
                             "decode.yaml's streaming_chunk_size)")
    parser.add_argument("--wav_root", help="the directory relative paths of a wav.scp are relative to")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--num_threads", type=int, default=0, help="CPU threads (0: torch's default)")
    add_decoding_options(parser)
    parser.add_argument("inputs", nargs="+", metavar="AUDIO_OR_WAV_SCP")
    args = parser.parse_intermixed_args(argv)
    merge_decoding_options(args, DecodeConf())  # the values given, checked before the model is loaded
    return args


def recordings(inputs: list[str], wav_root: str | None):
    """``(key, path)`` of every input, in order: an audio file as itself, a ``.scp`` file's lines; a ``.scp`` that
    cannot be read is ``(its path, AudioError)``."""
    for name in inputs:
        if not name.endswith(".scp"):
            yield key_of(name), name
            continue
        try:
            table = read_table(name)
        except (OSError, ValueError) as e:
            yield name, AudioError(f"{name}: not a readable wav.scp ({e})")
            continue
        for key, path in table.items():
            yield key, os.path.join(wav_root, path) if wav_root and not os.path.isabs(path) else path


def format_result(result: Transcript, output: str) -> str:
    if output == "jsonl":
        return json.dumps(result.to_dict(), ensure_ascii=False)
    return f"{result.key}{' (partial)' if result.partial else ''} {result.text}".rstrip()


def main(argv=None) -> int:
    args = get_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s: %(message)s", force=True)
    if args.num_threads > 0:
        torch.set_num_threads(args.num_threads)
    # 1. the model and its decoding settings, the options given overriding decode.yaml's
    loaded = load_asr_model(config_path_of(args.model_dir), args.checkpoint, device=args.device)
    decode_conf = merge_decoding_options(args, loaded.decode_conf)
    if args.mode:
        decode_conf = dataclasses.replace(decode_conf, mode=args.mode)
    transcriber = Transcriber(loaded, decode_conf)
    if args.streaming and not transcriber.streaming:
        raise ConfigError(f"--streaming: {args.model_dir} was trained with full context (encoder_conf has neither "
                          "use_dynamic_chunk nor static_chunk_size): it cannot stream; transcribe without --streaming")
    # 2. each recording: its line(s), or one error line and on to the next
    failed = total = 0
    for key, path in recordings(args.inputs, args.wav_root):
        total += 1
        try:
            if isinstance(path, AudioError):
                raise path
            results = transcriber.stream(path, key=key, decoding_chunk_size=args.decoding_chunk_size) \
                if args.streaming else [transcriber.transcribe(path, key=key)]
            for result in results:
                print(format_result(result, args.format), flush=True)
        except AudioError as e:
            failed += 1
            print(f"error: {e}", file=sys.stderr, flush=True)
    # 3. the exit status says whether every recording was transcribed
    if failed:
        print(f"error: {failed} of {total} recordings not transcribed (the error lines above name them)",
              file=sys.stderr)
    return 1 if failed else 0


def cli() -> None:
    """The ``toolkit-transcribe`` command: exit status 0 when every recording was transcribed, 1 when some were
    not (each named on stderr), 2 for a model dir or option that cannot be used (one line)."""
    freeze_at_exit()
    status = 0

    def run() -> None:
        nonlocal status
        status = main()

    exit_on_config_error(run)
    sys.exit(status)


if __name__ == "__main__":
    cli()
