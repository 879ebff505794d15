#!/usr/bin/env python3
"""What planning a training epoch's batches from the audio headers (world-size independent) does to padding and to
the ranks' spread.

Reads every training utterance's length from its audio header (no decoding; frames of 10 ms at 16 kHz), then
builds one epoch's batches from the lengths alone twice: as each (rank, worker) stream of 2 did before the plan
(positions ``i % 2``, the pipeline's shuffle and rolling sort buffer, then its batching), and as
``toolkit.dataset.planning.plan_batches`` plans them. Prints the frames the model sees (real plus padding) per
real frame for both, and, for each world size, how many lines apart the ranks end the epoch under ``deal_batches``
(what the join drops, at most). ``--num_utts`` draws that many lengths (with replacement) to see another size.

Usage:
    python benchmarks/bench_planned_batches.py --corpus_dir corpora --config examples/english/s0/conf/train_conformer.yaml
    python benchmarks/bench_planned_batches.py --corpus_dir corpora --config examples/english/s0/conf/train_conformer.yaml \\
        --num_utts 100000
"""
import argparse
import dataclasses
import os
import random

import soundfile as sf
import torch

from toolkit.dataset import processor
from toolkit.dataset.planning import deal_batches, plan_batches
from toolkit.train_config import read_config

CORPORA = ["speechocean762", "kathleen", "ljspeech", "fsdd"]


def get_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus_dir", required=True)
    parser.add_argument("--corpora", nargs="+", default=CORPORA)
    parser.add_argument("--config", required=True, help="training YAML (its dataset_conf)")
    parser.add_argument("--num_utts", type=int, default=0, help="draw this many lengths (0: the corpora as they are)")
    parser.add_argument("--max_world_size", type=int, default=16)
    return parser.parse_args()


def frame_counts(corpus_dir: str, corpora: list[str]) -> list[int]:
    """10 ms frames (25 ms window) of every training utterance, from the audio headers, at 16 kHz."""
    frames = []
    for corpus in corpora:
        if not os.path.isdir(os.path.join(corpus_dir, corpus)):
            raise SystemExit(f"--corpus_dir {corpus_dir}: no corpus {corpus} there")
        with open(os.path.join(corpus_dir, corpus, "data", "train", "wav.scp"), encoding="utf-8") as f:
            for line in f:
                info = sf.info(os.path.join(corpus_dir, corpus, line.split()[1]))
                frames.append(max(1, 1 + (info.frames * 16000 // info.samplerate - 400) // 160))
    return frames


def batches(lengths: list[int], conf, rng: random.Random) -> list[list[int]]:
    """The batches (as lengths) the pipeline's shuffle, sort and batching steps make of one stream."""
    samples = ({"feat": torch.empty(n, 0)} for n in lengths)
    samples = processor.shuffle(samples, rng, conf.shuffle_conf.shuffle_size)
    if conf.sort:
        samples = processor.sort(samples, conf.sort_conf.sort_size)
    batch = conf.batch_conf
    if batch.batch_type == "static":
        out = processor.static_batch(samples, batch.batch_size)
    else:
        out = processor.bucket_batch(samples, batch.bucket_boundaries, batch.bucket_batch_sizes)
    return [[s["feat"].size(0) for s in b] for b in out]


def frames_seen(all_batches: list[list[int]]) -> float:
    return sum(len(b) * max(b) for b in all_batches) / sum(sum(b) for b in all_batches)


def main() -> None:
    args = get_args()
    conf = read_config(args.config).dataset_conf
    lengths = frame_counts(args.corpus_dir, args.corpora)
    if args.num_utts:
        lengths = random.Random(0).choices(lengths, k=args.num_utts)
    order = lengths[:]
    random.Random(1).shuffle(order)
    streams = [b for g in range(2) for b in batches(order[g::2], conf, random.Random(g))]
    planned = [[order[i] for i in b] for b in plan_batches(list(range(len(order))), order, conf)]
    sizes = [len(b) for b in planned]
    print(f"{len(order)} utterances, {dataclasses.asdict(conf.batch_conf)}, sort_size {conf.sort_conf.sort_size}")
    print(f"frames seen per real frame: per-worker streams (2) {frames_seen(streams):.3f}, "
          f"{len(sizes)} planned batches {frames_seen(planned):.3f}")
    spread = []
    for world_size in range(1, args.max_world_size + 1):
        loads = [0] * world_size
        for size, rank in zip(sizes, deal_batches(sizes, world_size)):
            loads[rank] += size
        spread.append(f"{world_size}: {max(loads) - min(loads)}")
    print("lines between the ranks' shares, by world size: " + ", ".join(spread))


if __name__ == "__main__":
    main()
