#!/usr/bin/env python3
"""Real-time factor and WER of one exported model in four runtimes, on the same test set, in one run: torch
(``recognize.py``'s path: the decoding pipeline's features, ``ASRModel.decode`` with ``ctc_greedy_search``),
onnxruntime fp32 and int8 (the same features, ``model.onnx`` / ``model.int8.onnx``, greedy CTC search), and
sherpa-onnx (its own feature extraction and greedy search, offline ``model.onnx``; also its int8 file and its
streaming recognizer on ``model-streaming.onnx`` when the export has it).

Every runtime decodes one utterance at a time on one thread (``torch.set_num_threads(1)``, onnxruntime's
``intra_op_num_threads`` 1, sherpa-onnx's ``num_threads`` 1). A runtime's time is the wall time from the audio file
to the text (reading, resampling, padding a short clip as the model's ``dataset_conf.pad_conf`` says, features,
network, search), summed over the utterances; RTF = that time / the audio's duration (the padding not counted). The
first utterance warms each runtime up and is decoded again in the count. WER by :mod:`toolkit.utils.metrics`
against the data.list's transcripts, as ``recognize.py`` scores. sherpa-onnx runs with the training fbank options
(``toolkit.export.sherpa``, ``fbank="training"``); its offline WeNet recognizer dithers (1.0 on the 16-bit scale,
set by sherpa-onnx), so its WER moves by a few words between runs.

    python benchmarks/bench_runtime.py --model_dir exp/conformer --checkpoint avg_3.pt \\
        --onnx_dir exp/conformer/onnx --test_data data/test_ljspeech/data.list --json exp/bench_runtime.json
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch

from toolkit.dataset import processor
from toolkit.export import sherpa
from toolkit.inference.loader import config_path_of, load_asr_model
from toolkit.models.transformer.search import ctc_greedy_search
from toolkit.utils.metrics import score


def get_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model_dir", required=True)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--onnx_dir", required=True, help="toolkit-export's --out_dir (run with --int8)")
    parser.add_argument("--test_data", required=True, help="data.list (key, wav, txt)")
    parser.add_argument("--chunk_size", type=int, default=16, help="sherpa-onnx streaming: encoder frames per chunk")
    parser.add_argument("--num_left_chunks", type=int, default=4, help="sherpa-onnx streaming: left chunks")
    parser.add_argument("--max_utts", type=int, default=0, help="the first N utterances only (0: all)")
    parser.add_argument("--json", default="", help="write the table here too")
    return parser.parse_args()


def features(entry: dict, dataset_conf) -> torch.Tensor:
    """float32 (T, D) fbank of a data.list entry as the decoding pipeline computes it (resampled, short clips padded
    per ``pad_conf``, dither 0)."""
    sample = processor.resample(processor.read_audio(dict(entry)), dataset_conf.resample_conf.resample_rate)
    if dataset_conf.pad_conf.min_length > 0:
        sample = processor.pad_short(sample, dataset_conf.fbank_conf.frame_shift, dataset_conf.pad_conf.min_length)
    fbank = dict(vars(dataset_conf.fbank_conf), dither=0.0)
    return processor.compute_fbank(sample, **fbank)["feat"]


def runtimes(args, config, tokenizer, model) -> dict:
    """``{name: transcribe(entry) -> text}`` for every runtime the export allows."""
    import onnxruntime as ort

    conf = config.dataset_conf

    def torch_greedy(entry: dict) -> str:
        feat = features(entry, conf)
        with torch.no_grad():
            ids = model.decode(["ctc_greedy_search"], feat.unsqueeze(0), torch.tensor([feat.size(0)]))
        return tokenizer.detokenize(ids["ctc_greedy_search"][0])[0]

    def onnxruntime_greedy(path: str):
        options = ort.SessionOptions()
        options.intra_op_num_threads = options.inter_op_num_threads = 1
        session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])

        def run(entry: dict) -> str:
            feat = features(entry, conf)
            log_probs, lens, _ = session.run(None, {"x": feat.unsqueeze(0).numpy(),
                                                    "x_lens": torch.tensor([feat.size(0)]).numpy()})
            return tokenizer.detokenize(ctc_greedy_search(torch.from_numpy(log_probs), torch.from_numpy(lens))[0])[0]
        return run

    def with_sherpa(recognizer, transcribe):
        def run(entry: dict) -> str:
            samples, rate = sherpa.read_wave(entry["wav"], entry["key"], conf.pad_conf.min_length,
                                             conf.fbank_conf.frame_shift)
            return transcribe(recognizer, samples, rate)
        return run

    onnx_dir = args.onnx_dir
    table = {"torch": torch_greedy,
             "onnxruntime fp32": onnxruntime_greedy(os.path.join(onnx_dir, "model.onnx")),
             "onnxruntime int8": onnxruntime_greedy(os.path.join(onnx_dir, "model.int8.onnx")),
             "sherpa-onnx": with_sherpa(sherpa.offline_recognizer(onnx_dir, fbank="training"),
                                        sherpa.transcribe_offline),
             "sherpa-onnx int8": with_sherpa(sherpa.offline_recognizer(onnx_dir, int8=True, fbank="training"),
                                             sherpa.transcribe_offline)}
    if os.path.isfile(os.path.join(onnx_dir, "model-streaming.onnx")):
        name = f"sherpa-onnx streaming (chunk {args.chunk_size}, {args.num_left_chunks} left)"
        table[name] = with_sherpa(sherpa.online_recognizer(onnx_dir, args.chunk_size, args.num_left_chunks,
                                                           fbank="training"), sherpa.transcribe_online)
    return table


def main() -> None:
    args = get_args()
    torch.set_num_threads(1)
    # 1. the model, the test set and its audio duration
    loaded = load_asr_model(config_path_of(args.model_dir), args.checkpoint)
    config, tokenizer, model = loaded.config, loaded.tokenizer, loaded.model
    with open(args.test_data, encoding="utf-8") as f:
        entries = [json.loads(line) for line in f if line.strip()]
    entries = entries[:args.max_utts] if args.max_utts > 0 else entries
    audio_s = sum(processor.audio_seconds(json.dumps(e)) for e in entries)
    references = {e["key"]: e["txt"] for e in entries}
    # 2. each runtime: warm up on the first utterance, then every utterance timed
    rows = {}
    for name, transcribe in runtimes(args, config, tokenizer, model).items():
        transcribe(entries[0])
        start = time.perf_counter()
        hyps = {e["key"]: transcribe(e) for e in entries}
        seconds = time.perf_counter() - start
        totals = score(references, hyps).totals
        rows[name] = {"rtf": seconds / audio_s, "wer": totals.error_rate, "errors": totals.errors, "words": totals.N}
    # 3. the table
    print(f"{args.test_data}: {len(entries)} utterances, {audio_s:.1f} s of audio; one thread, one utterance at a time")
    print(f"| {'runtime':<42} | {'RTF':>7} | {'WER %':>6} | errors / words |")
    print(f"|{'-' * 44}|{'-' * 9}|{'-' * 8}|----------------|")
    for name, row in rows.items():
        print(f"| {name:<42} | {row['rtf']:7.4f} | {row['wer']:6.2f} | {row['errors']:>6} / {row['words']:<5} |")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"test_data": args.test_data, "utterances": len(entries), "audio_s": audio_s, "rows": rows},
                      f, indent=1)


if __name__ == "__main__":
    main()
