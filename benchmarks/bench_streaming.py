#!/usr/bin/env python3
"""Streaming latency of this toolkit's encoder beside WeNet's, on one configuration and the same speech, in one run:
per chunk compute time (median and p95, batch 1, one thread) at chunk 16, 8 and 4 encoder frames; the real-time
factor of chunk-by-chunk encoding against whole-utterance encoding; the algorithmic latency; ours / WeNet's.

Both sides build the conformer encoder of the same ``encoder_conf`` (default: the encoder of
``benchmarks/conf/conformer_6x256.yaml``, the WeNet side-by-side's, made streaming: ``causal``, ``layer_norm`` in
the convolution module, ``use_dynamic_chunk``) with seeded random weights (the time does not depend on them) in
eval mode under ``torch.no_grad`` and ``torch.set_num_threads(1)``, and feed it the same fbank (80 bins, 10 ms, of
the 15 ``corpora/tiny_lj`` utterances, 101 s of speech, computed once by this toolkit) through ``forward_chunk``
with its caches (WeNet's signature on both sides): windows of (C - 1) x 4 + 7 frames every 4 C frames, every left
chunk kept (``num_decoding_left_chunks`` -1, the cache growing as in a live stream). A chunk's time is the wall time
of its ``forward_chunk`` call; the whole-utterance time is one ``forward`` of the utterance at full context. The
first utterance of each pass warms up and is not counted. Each side runs in its own process (its own venv for WeNet),
A B A B for ``--rounds`` pairs, and the table shows the median over rounds.

Algorithmic latency: the audio a chunk needs before its first output exists, the chunk (C x 40 ms) plus the front
end's right context (6 frames, 60 ms) — the same for both sides; compute latency comes on top.

WeNet setup (once, outside this repository; none of WeNet's code or text is in it): its source (commit 0154699 was
measured) with its ``wenet/`` folder's subfolders linked into a folder without WeNet's ``__init__.py`` (which imports
the whole CLI), e.g. ``/work/wenet-shim/wenet/{models,utils,...}``; a venv with ``torch==2.13.0 pyyaml numpy librosa
soundfile tqdm tiktoken`` and ``openai-whisper --no-deps`` (imported by its utils). WeNet's squeezeformer module
imports typing names from ``torch.nn.modules.conv`` that torch 2.13 no longer has; the WeNet side puts them back
before importing (see :func:`build_wenet`).

    python benchmarks/bench_streaming.py --wenet_path /work/wenet-shim --wenet_python /work/venv-wenet/bin/python \\
        --rounds 2 --json exp/bench_streaming.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch
import yaml

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHUNKS = (16, 8, 4)
FRAME_S = 0.01


def get_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=os.path.join(REPO, "benchmarks", "conf", "conformer_6x256.yaml"),
                        help="a YAML whose encoder_conf both sides build (conformer)")
    parser.add_argument("--streaming_conf", default='{"causal": true, "cnn_module_norm": "layer_norm", '
                                                    '"use_dynamic_chunk": true}',
                        help="JSON of encoder_conf keys set over the config's")
    parser.add_argument("--wenet_path", help="folder holding WeNet's wenet package (see the docstring); none: ours "
                                             "alone")
    parser.add_argument("--wenet_python", default=sys.executable, help="the python of WeNet's venv")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--json", help="write the results here")
    # one side's process (run by the driver)
    parser.add_argument("--side", choices=("ours", "wenet"), help=argparse.SUPPRESS)
    parser.add_argument("--feats", help=argparse.SUPPRESS)
    parser.add_argument("--encoder_conf", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    return parser.parse_args()


def prepare_feats(path: str) -> float:
    """The fbank (1, T, 80) of every tiny_lj utterance, in this toolkit's front end, saved to ``path``; returns
    the seconds of speech."""
    # NOTE: this toolkit's modules are imported where its side runs: WeNet's side runs this script in WeNet's venv
    from toolkit.dataset import processor
    from toolkit.dataset.conf import FbankConf

    import soundfile as sf
    wav_dir = os.path.join(REPO, "corpora", "tiny_lj", "wav")
    feats = []
    for name in sorted(os.listdir(wav_dir)):
        audio, rate = sf.read(os.path.join(wav_dir, name), dtype="float32")
        conf = FbankConf(dither=0.0)
        sample = processor.compute_fbank({"waveform": audio, "sample_rate": rate}, conf.num_mel_bins,
                                         conf.frame_length, conf.frame_shift, conf.dither)
        feats.append(torch.as_tensor(sample["feat"])[None])
    torch.save(feats, path)
    return sum(f.size(1) for f in feats) * FRAME_S


def build_ours(input_size: int, conf: dict) -> tuple[torch.nn.Module, int, int]:
    from toolkit.models.transformer.encoder import ConformerEncoder
    encoder = ConformerEncoder(input_size, **conf)
    return encoder, encoder.embed.rate, encoder.embed.receptive_field


def build_wenet(input_size: int, conf: dict) -> tuple[torch.nn.Module, int, int]:
    import typing

    import torch.nn.modules.conv as conv
    conv.Union, conv.Optional, conv.Tensor = typing.Union, typing.Optional, torch.Tensor
    from wenet.models.transformer.encoder import ConformerEncoder
    if conf.get("subsampling_channels") == 0:  # ours: 0 = output_size, WeNet's only choice (it has no such key)
        conf = {key: value for key, value in conf.items() if key != "subsampling_channels"}
    encoder = ConformerEncoder(input_size, **conf)
    return encoder, encoder.embed.subsampling_rate, encoder.embed.right_context + 1


def run_side(args) -> None:
    """One side's measurements, written as JSON to ``args.out``."""
    torch.set_num_threads(1)
    torch.manual_seed(0)
    feats = torch.load(args.feats)
    conf = json.loads(args.encoder_conf)
    build = build_ours if args.side == "ours" else build_wenet
    encoder, rate, context = build(feats[0].size(2), conf)
    encoder.eval()
    result = {"parameters": sum(p.numel() for p in encoder.parameters())}
    with torch.no_grad():
        whole = []
        for index, xs in enumerate(feats):
            start = time.perf_counter()
            encoder(xs, torch.tensor([xs.size(1)]), decoding_chunk_size=0, num_decoding_left_chunks=-1)
            if index > 0:
                whole.append(time.perf_counter() - start)
        result["whole_s"] = sum(whole)
        for chunk in CHUNKS:
            stride, window = rate * chunk, (chunk - 1) * rate + context
            times = []
            for index, xs in enumerate(feats):
                att_cache = cnn_cache = torch.zeros(0, 0, 0, 0)
                offset, mine = 0, []
                for begin in range(0, xs.size(1) - context + 1, stride):
                    start = time.perf_counter()
                    ys, att_cache, cnn_cache = encoder.forward_chunk(xs[:, begin:begin + window], offset, -1,
                                                                     att_cache, cnn_cache)
                    mine.append(time.perf_counter() - start)
                    offset += ys.size(1)
                if index > 0:
                    times += mine
            result[f"chunk{chunk}"] = {"chunks": len(times), "median_ms": 1e3 * statistics.median(times),
                                       "p95_ms": 1e3 * statistics.quantiles(times, n=20)[-1], "total_s": sum(times)}
    with open(args.out, "w") as f:
        json.dump(result, f)


def main() -> None:
    args = get_args()
    if args.side:
        run_side(args)
        return
    with open(args.config) as f:
        conf = yaml.safe_load(f)["encoder_conf"]
    conf.update(json.loads(args.streaming_conf))
    work = tempfile.mkdtemp(prefix="bench_streaming-")
    feats_path = os.path.join(work, "feats.pt")
    speech_s = prepare_feats(feats_path)
    counted_s = speech_s - torch.load(feats_path)[0].size(1) * FRAME_S  # the warm-up utterance is not counted
    sides = {"ours": (sys.executable, dict(os.environ))}
    if args.wenet_path:
        sides["wenet"] = (args.wenet_python, {**os.environ, "PYTHONPATH": args.wenet_path})
    runs = {side: [] for side in sides}
    for round_ in range(args.rounds):
        for side, (python, env) in sides.items():
            out = os.path.join(work, f"{side}{round_}.json")
            subprocess.run([python, os.path.abspath(__file__), "--side", side, "--feats", feats_path,
                            "--encoder_conf", json.dumps(conf), "--out", out], env=env, check=True, timeout=1800)
            with open(out) as f:
                runs[side].append(json.load(f))
    table = {}
    for side, results in runs.items():
        row = {"parameters": results[0]["parameters"],
               "whole_rtf": statistics.median(r["whole_s"] for r in results) / counted_s}
        for chunk in CHUNKS:
            key = f"chunk{chunk}"
            row[key] = {name: statistics.median(r[key][name] for r in results)
                        for name in ("median_ms", "p95_ms", "total_s")}
            row[key]["rtf"] = row[key].pop("total_s") / counted_s
            row[key]["rtf_vs_whole"] = row[key]["rtf"] / row["whole_rtf"]
            row[key]["algorithmic_latency_ms"] = 1e3 * (chunk * 4 + 6) * FRAME_S
        table[side] = row
    print(f"{counted_s:.1f} s of speech (tiny_lj, the first utterance warming up), {args.rounds} rounds, 1 thread; "
          f"encoder {json.dumps(conf)}")
    for side, row in table.items():
        print(f"{side}: {row['parameters']:,} parameters; whole-utterance RTF {row['whole_rtf']:.4f}")
    print(f"{'chunk':>5} {'latency':>8} | " + " | ".join(f"{side:>6} median / p95 ms, RTF (x whole)" for side in table)
          + (" | ours / wenet median" if "wenet" in table else ""))
    for chunk in CHUNKS:
        key = f"chunk{chunk}"
        cells = [f"{row[key]['median_ms']:6.2f} / {row[key]['p95_ms']:6.2f}, {row[key]['rtf']:.4f} "
                 f"({row[key]['rtf_vs_whole']:.2f}x)" for row in table.values()]
        line = f"{chunk:>5} {table['ours'][key]['algorithmic_latency_ms']:>6.0f}ms | " + " | ".join(cells)
        if "wenet" in table:
            line += f" | {table['ours'][key]['median_ms'] / table['wenet'][key]['median_ms']:.2f}x"
        print(line)
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump({"speech_s": counted_s, "rounds": args.rounds, "encoder_conf": conf, "sides": table}, f,
                      indent=1)


if __name__ == "__main__":
    main()
