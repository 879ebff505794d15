"""Export a trained model to ONNX for onnxruntime and sherpa-onnx, and prove the files against torch.

Usage:

    toolkit-export --model_dir exp/conformer --checkpoint avg_3.pt --out_dir exp/conformer/onnx [--int8]
    python -m toolkit.bin.export ...        # the same options

Writes ``model.onnx`` (fbank -> CTC log-probabilities, global CMVN inside), ``decoder.onnx`` (attention rescoring),
``tokens.txt`` and, for a streaming model (``encoder_conf.use_dynamic_chunk`` or ``static_chunk_size``),
``model-streaming.onnx`` (one chunk with its attention and convolution caches), under sherpa-onnx's names for WeNet
CTC models (:mod:`toolkit.export.onnx`); ``--int8`` adds ``*.int8.onnx`` copies. Then checks them before it reports
success (:mod:`toolkit.export.check`): ``onnx.checker``, and onnxruntime against torch within rtol 1e-3 / atol
1e-4 on real audio (``--check_audio``; default: shipped recordings of ``corpora/``), whole utterances and chunk by
chunk. Exit status 0: every file written and every check passed; 1: a check failed (named in one line); 2: bad input
(one line).

Decode the files with sherpa-onnx: ``sherpa_onnx.OfflineRecognizer.from_wenet_ctc(model=".../model.onnx",
tokens=".../tokens.txt")`` (streaming: ``OnlineRecognizer.from_wenet_ctc`` on ``model-streaming.onnx``); see
docs/export.md.
"""
from __future__ import annotations

import argparse
import glob
import logging
import os
import sys

from toolkit.export.check import ExportCheckError, audio_features, check_export
from toolkit.export.graphs import streaming_error
from toolkit.export.onnx import export_model
from toolkit.inference.loader import config_path_of, load_asr_model
from toolkit.utils.config_parsing import ArgumentParser, ConfigError, exit_on_config_error
from toolkit.utils.shutdown import freeze_at_exit

# The shipped recordings a check runs on by default: three LJ Speech sentences (long enough for many chunks) and two
# FSDD digits (shorter than one second), from the checkout's corpora/.
_CORPORA = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "corpora")
DEFAULT_CHECK_AUDIO = (sorted(glob.glob(os.path.join(_CORPORA, "tiny_lj", "wav", "*.wav")))[:3]
                       + sorted(glob.glob(os.path.join(_CORPORA, "tiny_fsdd", "wav", "*.wav")))[:2])


def get_args(argv=None) -> argparse.Namespace:
    parser = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model_dir", required=True, help="the model dir (its train.yaml)")
    parser.add_argument("--checkpoint", help="a checkpoint path, or a file name in --model_dir; default: the one "
                                             "decode.yaml names (the recipe's avg_N.pt), else the newest epoch")
    parser.add_argument("--out_dir", required=True, help="where the ONNX files and tokens.txt go")
    parser.add_argument("--int8", action="store_true", help="also write int8 copies (onnxruntime quantize_dynamic)")
    parser.add_argument("--streaming", choices=["auto", "true", "false"], default="auto",
                        help="write model-streaming.onnx: auto (default) for a model trained for streaming")
    parser.add_argument("--chunk_size", type=int, default=16,
                        help="encoder frames per chunk the streaming file is traced and checked at (any runs)")
    parser.add_argument("--num_left_chunks", type=int, default=4,
                        help="left chunks of attention cache it is traced and checked at (sherpa-onnx's default 4)")
    parser.add_argument("--check_audio", nargs="+", default=DEFAULT_CHECK_AUDIO,
                        help="audio files the checks run on (default: shipped corpora/ recordings)")
    return parser.parse_args(argv)


def main(argv=None) -> None:
    args = get_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", force=True)
    for name in ("onnxscript", "onnx_ir"):  # the exporter's graph passes log each rewrite at INFO
        logging.getLogger(name).setLevel(logging.WARNING)
    if os.path.exists(args.out_dir) and not os.path.isdir(args.out_dir):
        raise ConfigError(f"--out_dir {args.out_dir}: not a directory")
    # 1. the model, and whether it streams
    loaded = load_asr_model(config_path_of(args.model_dir), args.checkpoint)
    config, tokenizer, model = loaded.config, loaded.tokenizer, loaded.model
    error = streaming_error(model)
    if args.streaming == "true" and error:
        raise ConfigError(f"--streaming true: {error}")
    streaming = args.streaming == "true" or (args.streaming == "auto" and not error)
    # 2. the check audio's features, before the slow export (a bad file stops here)
    if not args.check_audio:
        raise ConfigError("--check_audio: no audio files (corpora/ is not beside this toolkit: name some)")
    try:
        feats = [audio_features(path, config.dataset_conf) for path in args.check_audio]
    except ValueError as e:
        raise ConfigError(f"--check_audio {e}") from e
    # 3. the files
    try:
        files = export_model(model, tokenizer, config.input_dim, args.out_dir, streaming, args.chunk_size,
                             args.num_left_chunks, args.int8)
    except ValueError as e:
        raise ConfigError(f"--chunk_size/--num_left_chunks: {e}") from e
    except OSError as e:
        raise ConfigError(f"--out_dir {args.out_dir}: {e.strerror or e}") from e
    # 4. the checks; success is reported only after all of them
    try:
        for line in check_export(model, files, feats, config.input_dim, args.chunk_size, args.num_left_chunks):
            logging.info("check passed: %s", line)
    except ExportCheckError as e:
        logging.error("export check failed: %s", e)
        sys.exit(1)
    logging.info("exported and checked: %s", ", ".join(os.path.basename(p) for p in files.values()))


def cli() -> None:
    """The ``toolkit-export`` command: a bad option or input is one line and exit status 2."""
    freeze_at_exit()
    exit_on_config_error(main)


if __name__ == "__main__":
    cli()
