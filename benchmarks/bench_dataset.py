#!/usr/bin/env python3
"""Data pipeline throughput vs. what the default model's training step consumes, on the shipped real speech.

1. Takes the first --num_utts/len(corpora) training utterances of each corpus, writes in a temporary folder a raw
   data.list of the source files, one of the same audio re-encoded as 16-bit FLAC files (the recipe's stage 3,
   ``tools/make_raw_list.py --audio_format flac``), and the same utterances as tar shards
   (``tools/make_shard_list.py``), twice: the source bytes (``--audio_format keep``) and 16-bit FLAC.
2. Pipeline: one process, no loader workers, 1 torch thread (= one DataLoader worker), train mode with every
   processor on (decode, resample, speed perturb, fbank with dither, SpecAugment, shuffle, sort, batching);
   a warm-up pass fills the page cache, then raw and shard are timed.
3. Training: the model of --config (cmvn left out: a per-bin affine, no cost), Adam, 1 thread, forward +
   backward + step on --train_steps real batches of the config's batch_conf, after one warm-up step.
Audio seconds are counted as fbank frames x frame_shift on both sides (after speed perturbation). Prints
utterances/s and audio-s/s of each, and pipeline / training (the pipeline must be >= 10x), per wall second and
per CPU second of this process: on a machine shared with other jobs the wall numbers of both sides shrink
and wobble, while the CPU-time numbers (1 thread) are what an idle core would give.

Usage:
    python benchmarks/bench_dataset.py --corpus_dir corpora --corpora speechocean762 kathleen --num_utts 300 \
        --config examples/english/s0/conf/train_conformer.yaml
"""
import argparse
import dataclasses
import os
import statistics
import tempfile
import time

import torch

from toolkit.dataset import DatasetConf
from toolkit.dataset.data_list import make_raw_list, reencode_audio, write_raw_list
from toolkit.dataset import build_dataloader, build_dataset
from toolkit.dataset.shard import make_shards, write_shard_list
from toolkit.models.registry import init_model
from toolkit.text.tokenizer import CharTokenizer, text_to_char_units, write_symbol_table
from toolkit.train_config import Config, read_config


def write_lists(corpus_dir: str, corpora: list, num_utts: int, work_dir: str) -> tuple:
    """Data lists by name (raw, raw-flac, shard-keep, shard-flac) and the char symbol table of the chosen
    utterances."""
    entries = []
    for corpus in corpora:
        data = os.path.join(corpus_dir, corpus, "data", "train")
        corpus_entries, _ = make_raw_list(os.path.join(data, "wav.scp"), os.path.join(data, "text"),
                                          os.path.join(corpus_dir, corpus))
        entries += corpus_entries[:num_utts // len(corpora)]
    lists = {"raw": os.path.join(work_dir, "raw.list")}
    write_raw_list(entries, lists["raw"])
    lists["raw-flac"] = os.path.join(work_dir, "raw-flac.list")
    write_raw_list(reencode_audio(entries, os.path.join(work_dir, "raw-flac"), "flac", 2)[0], lists["raw-flac"])
    for audio_format in ("keep", "flac"):
        paths, _, _, _ = make_shards(entries, os.path.join(work_dir, audio_format), 50, 2, audio_format=audio_format)
        lists[f"shard-{audio_format}"] = os.path.join(work_dir, f"{audio_format}.list")
        write_shard_list(paths, lists[f"shard-{audio_format}"])
    units = sorted({u for e in entries for u in text_to_char_units(e["txt"])})
    table = os.path.join(work_dir, "units.txt")
    write_symbol_table(units, table)
    return lists, table


def bench_pipeline(data_list: str, tokenizer, dataset_conf: DatasetConf) -> dict:
    """One training-mode pass in this process; returns utts, audio_s, wall_s and the rates."""
    dataset = build_dataset(data_list, tokenizer, dataset_conf, mode="train")
    start, cpu_start = time.perf_counter(), time.process_time()
    utts = frames = 0
    for batch in build_dataloader(dataset):
        utts += len(batch["keys"])
        frames += int(batch["feats_lengths"].sum())
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    audio_s = frames * dataset_conf.fbank_conf.frame_shift_s
    return {"utts": utts, "audio_s": audio_s, "wall_s": wall, "cpu_s": cpu, "utts_per_s": utts / wall,
            "audio_s_per_s": audio_s / wall, "audio_s_per_cpu_s": audio_s / cpu}


def bench_training(config: Config, vocab_size: int, batches: list) -> dict:
    """Seconds per optimizer step of the config's model over ``batches`` (the first one is a warm-up)."""
    torch.manual_seed(0)
    model = init_model(config, config.input_dim, vocab_size)
    model.train()
    optimizer = torch.optim.Adam(model.parameters(), lr=config.optim_conf["lr"])
    times, cpu_times, audio = [], [], []
    for batch in batches:
        start, cpu_start = time.perf_counter(), time.process_time()
        loss = model(batch["feats"], batch["feats_lengths"], batch["target"], batch["target_lengths"])["loss"]
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        times.append(time.perf_counter() - start)
        cpu_times.append(time.process_time() - cpu_start)
        audio.append(float(batch["feats_lengths"].sum()) * config.dataset_conf.fbank_conf.frame_shift_s)
    step_s = statistics.median(times[1:])
    audio_per_step = statistics.median(audio[1:])
    params = sum(p.numel() for p in model.parameters())
    return {"params": params, "step_s": step_s, "audio_s_per_step": audio_per_step,
            "audio_s_per_s": sum(audio[1:]) / sum(times[1:]), "audio_s_per_cpu_s": sum(audio[1:]) / sum(cpu_times[1:])}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus_dir", default="corpora")
    parser.add_argument("--corpora", nargs="+", default=["speechocean762", "kathleen"])
    parser.add_argument("--num_utts", type=int, default=300)
    parser.add_argument("--config", default="examples/english/s0/conf/train_conformer.yaml")
    parser.add_argument("--train_steps", type=int, default=6, help="timed steps (plus one warm-up)")
    args = parser.parse_args()
    # 1. one thread everywhere: the pipeline number is per loader worker, the training number per process
    torch.set_num_threads(1)
    # the model without CMVN (a per-bin affine, no cost), its data in this process
    config = read_config(args.config, ["cmvn null", "dataset_conf.dataloader_conf.num_workers 0"])
    with tempfile.TemporaryDirectory() as work_dir:
        lists, table = write_lists(args.corpus_dir, args.corpora, args.num_utts, work_dir)
        tokenizer = CharTokenizer(table)
        # 2. the full pipeline, every processor on
        conf = dataclasses.replace(config.dataset_conf, speed_perturb=True, spec_aug=True)
        bench_pipeline(lists["raw"], tokenizer, conf)  # warm the page cache
        results = {name: bench_pipeline(path, tokenizer, dataclasses.replace(conf, data_type=name.split("-")[0]))
                   for name, path in lists.items()}
        # 3. training consumption on real batches of the recipe's own batching
        train_set = build_dataset(lists["raw"], tokenizer, config.dataset_conf, mode="train")
        loader = build_dataloader(train_set)
        batches = [b for _, b in zip(range(args.train_steps + 1), loader)]
    training = bench_training(config, tokenizer.vocab_size(), batches)
    # 4. report
    for data_type, r in results.items():
        print(f"pipeline {data_type:10s}: {r['utts']} utts, {r['audio_s']:.0f} audio-s in {r['wall_s']:.1f} s wall "
              f"({r['cpu_s']:.1f} s CPU): {r['utts_per_s']:.1f} utts/s, {r['audio_s_per_s']:.0f} audio-s/s, "
              f"{r['audio_s_per_cpu_s']:.0f} audio-s/CPU-s per worker")
    print(f"training: {training['params'] / 1e6:.1f} M params, {training['step_s']:.2f} s/step (median), "
          f"{training['audio_s_per_step']:.0f} audio-s/step, {training['audio_s_per_s']:.1f} audio-s/s, "
          f"{training['audio_s_per_cpu_s']:.1f} audio-s/CPU-s (1 thread)")
    for data_type, r in results.items():
        for unit, key in (("wall", "audio_s_per_s"), ("CPU", "audio_s_per_cpu_s")):
            ratio = r[key] / training[key]
            verdict = "meets" if ratio >= 10 else "BELOW"
            print(f"ratio {data_type} ({unit} time): {ratio:.1f}x ({verdict} the 10x target)")


if __name__ == "__main__":
    main()
