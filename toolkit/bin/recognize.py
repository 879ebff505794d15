"""Decode a test set with a trained model, on one process or on every rank of a torchrun job, and score it.

Usage (the recipe's stage 5 runs the torchrun form with ``--decode_nproc_per_node`` ranks):

    torchrun --standalone --nproc_per_node=2 -m toolkit.bin.recognize \\
        --config exp/conformer/train.yaml --checkpoint exp/conformer/avg_3.pt \\
        --test_data data/test_fsdd/data.list --result_dir exp/conformer/test_fsdd \\
        --modes ctc_greedy_search ctc_prefix_beam_search attention attention_rescoring \\
        --beam_size 10 --batch_size 32

    python -m toolkit.bin.recognize ...        # the same options, one rank

The search's settings (beam, weights, LM, chunks; ``--modes``: its ``mode``) and the checkpoint default to the
model dir's ``decode.yaml`` (the recipe's tuned settings, :mod:`toolkit.inference.decode_conf`); an option given
here overrides its key. The model dir is the directory of ``--config``; the files its ``train.yaml`` names (symbol
table, BPE model, CMVN) are read from there (:func:`toolkit.inference.loader.load_asr_model`).

Writes, from global rank 0, per mode ``<result_dir>/<mode>/text`` (``key hyp`` lines in the data.list's order),
``<mode>/wer`` and ``<mode>/cer`` (``N=.. C=.. S=.. D=.. I=..`` and the rate, the format of
``tools/compute_wer.py``), and ``<result_dir>/decode_summary.json`` (utterance counts, skips by reason, audio
seconds, wall time, real-time factor, the LM and its weights, the counts of every mode).

With ``--lm`` (a word n-gram LM, :class:`toolkit.text.ngram_lm.WordNgramLM`), ``ctc_prefix_beam_search`` is fused
with it, and ``attention_rescoring`` rescores that n-best with the LM score kept in the sum; ``ctc_greedy_search``
and ``attention`` do not use it. ``--spelling_lm`` adds a letter n-gram model of words that scores the spelling of the
words the LM lacks.

How the ranks share the work: each rank decodes its own part of the data.list, the training partition of
:mod:`toolkit.dataset.pipeline` (every raw line, or every shard, goes to exactly one rank and loader worker; ranks
may get unequal parts, or none), one encoder pass per batch for all modes. No rank waits for another while
decoding: whole-job progress goes through the store (:mod:`toolkit.distributed.progress`), and the results are
gathered once at the end, de-duplicated by key (a key decoded twice is logged as an error of the partition and
counted in the summary). Scoring uses :mod:`toolkit.utils.metrics`, like ``tools/compute_wer.py``: each rank counts
its own utterances against the data.list's transcripts and the integer counts are summed across ranks, so the
numbers do not depend on the number of ranks. Every readable utterance is decoded, whatever its transcript (empty,
of units outside the dictionary, however long) and its length: the transcript is the reference of the score only.
Utterances the pipeline skips (unreadable audio), and one that runs out of memory alone (``out_of_memory``; a
batch that does is decoded an utterance at a time), are logged with their key, counted by reason and scored as
deletions, so a WER is never computed on a silently shrunk test set.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import time
from collections import Counter

import torch

from toolkit.dataset import DatasetConf, build_dataloader, build_dataset
from toolkit.dataset.conf import BatchConf
from toolkit.dataset.data_list import read_transcripts
from toolkit.distributed.context import destroy_distributed, init_distributed
from toolkit.distributed.gather import JobResults, RankResults, gather_results
from toolkit.distributed.main_only import main_process_only
from toolkit.distributed.metrics import score_across_ranks
from toolkit.distributed.progress import JobProgress
from toolkit.bin.decoding_options import DECODE_OPTIONS, LM_OPTIONS, add_decoding_options, merge_decoding_options
from toolkit.inference.decode_conf import DecodeConf
from toolkit.inference.loader import load_asr_model, load_lm
from toolkit.models.transformer.asr_model import DECODING_METHODS, LM_METHODS, decoding_modes_error
from toolkit.models.transformer.streaming import StreamingDecoder
from toolkit.text.ngram_lm import WordNgramLM
from toolkit.utils.checkpoint import atomic_write
from toolkit.utils.config_parsing import ArgumentParser, ConfigError, exit_on_config_error
from toolkit.utils.metrics import COUNT_NAMES, UNITS, format_report
from toolkit.utils.shutdown import freeze_at_exit
# NOTE: these skips lose utterances before their key is read, so they cannot be scored as deletions here.
UNLISTED_SKIPS = ("bad_line", "missing_shard", "corrupt_shard")


def get_args(argv=None) -> argparse.Namespace:
    parser = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True, help="the model dir's train.yaml")
    parser.add_argument("--override_config", action="append", default=[])
    parser.add_argument("--checkpoint", help="default: the model dir's decode.yaml checkpoint, else its newest "
                                             "epoch_N.pt")
    parser.add_argument("--test_data", required=True, help="data.list of the test set")
    parser.add_argument("--result_dir", required=True)
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--num_threads", type=int, default=0,
                        help="CPU threads per rank (0: torch's default, divided among the ranks of a node)")
    parser.add_argument("--modes", nargs="+", help=f"one or more of {', '.join(DECODING_METHODS)} (default: the "
                                                   f"model dir's decode.yaml mode, else {DecodeConf().mode})")
    parser.add_argument("--simulate_streaming", action="store_true",
                        help="with --decoding_chunk_size N > 0: decode each utterance as a stream, the encoder chunk "
                             "by chunk with its attention and convolution caches and the CTC prefix beam search fed "
                             "after each chunk, then attention rescoring (U2's two passes); the same results as the "
                             "masked decoding, at a live stream's cost")
    add_decoding_options(parser)
    args = parser.parse_args(argv)
    if args.modes is not None:
        args.modes = [mode for value in args.modes for mode in value.split()]  # `--modes ""`: no mode
        error = decoding_modes_error(args.modes)
        if error:
            raise ConfigError(f"--modes: {error}")
    merge_decoding_options(args, DecodeConf())  # the values given, checked before anything is loaded
    return args


def decoding_dataset_conf(conf: DatasetConf, batch_size: int) -> DatasetConf:
    """The training pipeline's features with decoding settings: static batches, original order. The pipeline's
    ``test`` mode filters nothing and never reads the transcript (the reference of the score, not an input)."""
    return dataclasses.replace(conf, batch_conf=BatchConf(batch_type="static", batch_size=batch_size),
                               shuffle=False, sort=False)


def _decode_fitting(model, batch: dict, lm: WordNgramLM | None, args, device: torch.device, skipped: Counter):
    """``(keys, {mode: token ids})`` of ``batch``, decoded whole or, when that runs out of memory, one utterance at a
    time (each utterance decodes the same in any batch); an utterance that does not fit alone is named in the log
    and counted in ``skipped`` under ``out_of_memory`` (scored as deletions), never the end of the job."""
    def decode(feats: torch.Tensor, lengths: torch.Tensor) -> dict:
        if args.simulate_streaming:
            return _decode_streams(model, feats, lengths, lm, args)
        return model.decode(args.modes, feats.to(device), lengths.to(device), beam_size=args.beam_size,
                            ctc_weight=args.ctc_weight, length_penalty=args.length_penalty, lm=lm,
                            reverse_weight=args.reverse_weight, decoding_chunk_size=args.decoding_chunk_size,
                            num_decoding_left_chunks=args.num_decoding_left_chunks)

    try:
        yield batch["keys"], decode(batch["feats"], batch["feats_lengths"])
        return
    except torch.OutOfMemoryError:
        logging.warning("a batch of %d utterances ran out of memory on %s: decoding them one at a time",
                        len(batch["keys"]), device)
    for i, key in enumerate(batch["keys"]):
        length = batch["feats_lengths"][i:i + 1]
        try:
            yield [key], decode(batch["feats"][i:i + 1, :int(length)], length)
        except torch.OutOfMemoryError:
            logging.warning("skipping utterance %s: out_of_memory (%d fbank frames do not fit on %s alone)", key,
                            int(length), device)
            skipped["out_of_memory"] += 1


def _decode_streams(model, feats: torch.Tensor, lengths: torch.Tensor, lm: WordNgramLM | None, args) -> dict:
    """``--simulate_streaming``: each utterance of the batch fed to a :class:`StreamingDecoder` in pieces of one
    chunk window's stride (as live audio would arrive), then finished; ``{mode: token ids per utterance}``."""
    results: dict[str, list[list[int]]] = {mode: [] for mode in args.modes}
    for utterance, length in zip(feats, lengths.tolist()):
        stream = StreamingDecoder(model, args.decoding_chunk_size, args.num_decoding_left_chunks, args.beam_size, lm)
        for start in range(0, length, stream.stride):
            stream.accept(utterance[start:min(start + stream.stride, length)])
        for mode, tokens in stream.finish(args.modes, args.ctc_weight, args.length_penalty,
                                          args.reverse_weight).items():
            results[mode].append(tokens)
    return results


def decode_share(model, loader, tokenizer, lm: WordNgramLM | None, args, device: torch.device,
                 progress: JobProgress) -> RankResults:
    """Decode every batch of this rank's loader with all ``args.modes``; counts each utterance (decoded or
    skipped) into ``progress``. A clip too short for a single encoder frame (under 7 fbank frames, and not
    padded by ``dataset_conf.pad_conf``) decodes to the empty hypothesis in every mode (``ASRModel.decode``); it is
    named and counted under ``no_encoder_frame``. A batch that runs out of memory is decoded an utterance at a time
    (:func:`_decode_fitting`)."""
    results = RankResults(hyps={mode: [] for mode in args.modes})
    skipped: Counter = Counter()
    for batch in loader:
        skipped.update(batch["num_skipped"])
        if batch["keys"]:  # NOTE: a B=0 batch only carries skip counts
            frames = model.encoder.output_lengths(batch["feats_lengths"]).tolist()
            for key in [key for key, n in zip(batch["keys"], frames) if n == 0]:
                logging.warning("%s: under 7 fbank frames, no encoder frame: empty hypothesis", key)
                results.no_encoder_frame += 1
            for keys, hyps in _decode_fitting(model, batch, lm, args, device, skipped):
                for mode, token_ids in hyps.items():
                    results.hyps[mode] += [tokenizer.detokenize(ids)[0] for ids in token_ids]
                results.keys += keys
            results.num_frames += int(batch["feats_lengths"].sum())
            results.padding_s += batch["padding_s"]
        progress.add(len(batch["keys"]) + sum(batch["num_skipped"].values()))
    results.skipped = dict(skipped)
    return results


def _empty_hint(args, mode: str) -> str:
    """What else can empty every hypothesis of ``mode``, true to the options given: the LM's OOV penalty if one was
    given, else the LM itself; nothing for a mode that does not use the LM."""
    if not (args.lm and mode in LM_METHODS):
        return ""
    if args.oov_penalty < 0:
        return (f"; with --lm, --oov_penalty {args.oov_penalty:g} then prefers no word to a misspelt one: try "
                "--oov_penalty 0")
    return f"; or the LM at --lm_weight {args.lm_weight:g}: compare a decoding without --lm"


@main_process_only
def summarize(args, job: JobResults, listed: list, references: dict, scores: dict, audio_s: float,
              wall_s: float, progress: JobProgress) -> dict:
    """Rank 0: the content of ``decode_summary.json``; logs what needs attention (repeats, skips, unscored)."""
    missing = [key for key in references if key not in job.owner]
    extra = [key for key in job.owner if key not in references]
    if job.repeated:
        logging.error("%d decoding(s) repeated an utterance already decoded (the partition must give each "
                      "utterance to one rank; or the data.list lists a key twice); kept the first: %s",
                      sum(job.repeated.values()), sorted(job.repeated)[:10])
    if job.skipped:
        logging.warning("skipped utterances by reason: %s (scored as deletions)", job.skipped)
    if job.no_encoder_frame:
        logging.warning("%d utterance(s) too short for the encoder got an empty hypothesis", job.no_encoder_frame)
    unlisted = {reason: n for reason, n in job.skipped.items() if reason in UNLISTED_SKIPS}
    if unlisted:
        logging.warning("%s: utterances whose key could not be read are missing from the score; score against "
                        "the Kaldi text with tools/compute_wer.py to count them", unlisted)
    if extra:
        logging.warning("%d decoded keys have no reference in %s (ignored): %s", len(extra), args.test_data,
                        extra[:10])
    empty = {mode: sum(1 for text in hyps.values() if not text) for mode, hyps in job.hyps.items()}
    for mode, count in empty.items():
        if job.owner and count == len(job.owner):
            logging.warning("%s: every hypothesis is empty (a model that has not learnt to spell yet%s)", mode,
                            _empty_hint(args, mode))
    return {
        "test_data": args.test_data, "checkpoint": args.checkpoint, "modes": args.modes,
        "search": {"beam_size": args.beam_size, "ctc_weight": args.ctc_weight, "length_penalty": args.length_penalty,
                   "reverse_weight": args.reverse_weight, "decoding_chunk_size": args.decoding_chunk_size,
                   "num_decoding_left_chunks": args.num_decoding_left_chunks},
        "lm": {"path": args.lm, "lm_weight": args.lm_weight, "word_bonus": args.word_bonus,
               "oov_penalty": args.oov_penalty, "spelling_lm": args.spelling_lm or None} if args.lm else None,
        "world_size": len(job.decoded_per_rank),
        "utterances": {"listed": len(listed), "listed_keys": len(references),
                       "decoded": sum(job.decoded_per_rank), "decoded_keys": len(job.owner),
                       "repeated": sum(job.repeated.values()), "without_hypothesis": len(missing),
                       "without_reference": len(extra)},
        "decoded_per_rank": job.decoded_per_rank, "skipped": dict(sorted(job.skipped.items())),
        "no_encoder_frame": job.no_encoder_frame, "empty_hypotheses": empty,
        "audio_s": round(audio_s, 3), "decode_wall_s": round(wall_s, 3),
        "rtf": round(wall_s / audio_s, 5) if audio_s else None,
        "progress_store_adds": {"calls": progress.add_calls, "seconds": round(progress.add_s, 4)},  # rank 0's
        "scores": {mode: {unit: dict(zip(COUNT_NAMES, counts.as_tuple())) for unit, counts in units.items()}
                   for mode, units in scores.items()},
    }


@main_process_only
def write_results(result_dir: str, references: dict, job: JobResults, scores: dict, summary: dict) -> None:
    """Rank 0: ``<mode>/text`` in reference order (then any key without a reference), ``<mode>/wer``,
    ``<mode>/cer``, ``decode_summary.json``; each file written atomically."""
    for mode, hyps in job.hyps.items():
        os.makedirs(os.path.join(result_dir, mode), exist_ok=True)
        keys = [key for key in references if key in hyps] + [key for key in hyps if key not in references]
        text = "".join(f"{key} {hyps[key]}\n" for key in keys)
        atomic_write(os.path.join(result_dir, mode, "text"), lambda f: f.write(text.encode("utf-8")))
        for unit, name in zip(UNITS, ("wer", "cer")):
            report = format_report(scores[mode][unit], unit)
            atomic_write(os.path.join(result_dir, mode, name), lambda f: f.write(report.encode("utf-8")))
            logging.info("%s: %s", mode, report.splitlines()[1])
    atomic_write(os.path.join(result_dir, "decode_summary.json"),
                 lambda f: f.write((json.dumps(summary, indent=1) + "\n").encode("utf-8")))
    logging.info("decoded %d utterances (%.1f s of audio) on %d rank(s) in %.1f s: real-time factor %s; wrote %s",
                 summary["utterances"]["decoded"], summary["audio_s"], summary["world_size"],
                 summary["decode_wall_s"], summary["rtf"], result_dir)


def main(argv=None) -> None:
    args = get_args(argv)
    # 1. process group and rank context (torchrun environment, read once; one rank without torchrun)
    ctx = init_distributed()
    logging.basicConfig(level=logging.INFO, force=True,
                        format=f"%(asctime)s rank{ctx.rank} %(levelname)s %(message)s")
    if args.num_threads > 0:
        torch.set_num_threads(args.num_threads)
    # 2. the model dir's decoding settings (decode.yaml) under the options given; the config, tokenizer (it must
    # fit the model) and the model with the checkpoint's weights, before any data or LM is read: a checkpoint of
    # another config stops here, in one line
    for option, path in (("--checkpoint", args.checkpoint), ("--test_data", args.test_data), ("--lm", args.lm),
                         ("--spelling_lm", args.spelling_lm)):
        if path and not os.path.isfile(path):
            raise ConfigError(f"{option} {path}: no such file")
    loaded = load_asr_model(args.config, args.checkpoint, args.override_config, ctx.device)
    config, tokenizer, model, args.checkpoint = loaded.config, loaded.tokenizer, loaded.model, loaded.checkpoint
    given_lm_options = [f"--{name}" for name in LM_OPTIONS if getattr(args, name) is not None]
    decode_conf = merge_decoding_options(args, loaded.decode_conf)
    for name in DECODE_OPTIONS:
        setattr(args, name, getattr(decode_conf, name))
    if args.modes is None:
        args.modes = [decode_conf.mode]
    if args.simulate_streaming and args.decoding_chunk_size < 1:
        raise ConfigError(f"--simulate_streaming needs --decoding_chunk_size > 0 (encoder frames per chunk), got "
                          f"{args.decoding_chunk_size}")
    # 3. the options checked against the model
    try:  # the encoder's own check (a time-reduced encoder has no chunks), before any data is read
        model.encoder.attention_mask(torch.ones(1, 1, 1, dtype=torch.bool), args.decoding_chunk_size,
                                     args.num_decoding_left_chunks)
    except ValueError as e:
        raise ConfigError(f"--decoding_chunk_size {args.decoding_chunk_size}: {e}") from e
    if args.simulate_streaming:  # a stream of one window of silence: the encoder's refusals, in one line
        try:
            stream = StreamingDecoder(model, args.decoding_chunk_size, args.num_decoding_left_chunks)
            stream.accept(torch.zeros(stream.window, config.input_dim))
        except ValueError as e:
            raise ConfigError(f"--simulate_streaming: {e}") from e
    untrained = model.encoder.untrained_chunk_note(args.decoding_chunk_size)
    if untrained:
        logging.warning("--decoding_chunk_size %d: %s", args.decoding_chunk_size, untrained)
    try:  # checked once here, so that a bad weight stops the job before it decodes anything
        args.reverse_weight = model.rescoring_reverse_weight(args.reverse_weight)
    except ValueError as e:
        raise ConfigError(f"--reverse_weight {args.reverse_weight}: must be in [0, 1], and > 0 only for a model with "
                          f"the bidirectional decoder (decoder: bitransformer); {args.config} has "
                          f"decoder: {config.decoder}") from e
    # 4. the LM; this rank's share of the test set; every rank reads the references (key order)
    lm = None
    if given_lm_options and not args.lm:
        logging.warning("%s given without --lm: decoding without LM", "/".join(given_lm_options))
    if args.lm and not any(mode in LM_METHODS for mode in args.modes):
        logging.warning("--lm %s: not loaded, since none of --modes uses an LM (only %s do)", args.lm,
                        " and ".join(LM_METHODS))
        args.lm = ""
    if args.lm:
        lm = load_lm(tokenizer, args.lm, args.lm_weight, args.word_bonus, args.oov_penalty, args.spelling_lm, "--")
    dataset_conf = decoding_dataset_conf(config.dataset_conf, args.batch_size)
    dataset = build_dataset(args.test_data, tokenizer, dataset_conf, mode="test", rank=ctx.rank,
                            world_size=ctx.world_size)
    loader = build_dataloader(dataset)
    listed = read_transcripts(args.test_data, dataset_conf.data_type)
    references: dict[str, str] = {}
    for key, text in listed:
        references.setdefault(key, text)
    # 5. decode this rank's share; the bar on rank 0 counts every rank's utterances
    start = time.perf_counter()
    with JobProgress(total=len(listed), desc="decode", unit="utt") as progress, torch.no_grad():
        local = decode_share(model, loader, tokenizer, lm, args, ctx.device, progress)
    wall_s = time.perf_counter() - start  # until the last rank finished
    # 6. gather once; de-duplicate by key; every rank scores its own utterances, counts summed across ranks
    job = gather_results(local)
    if sum(job.decoded_per_rank) == 0:  # every rank knows it: the job is gathered on all
        raise ConfigError(f"--test_data {args.test_data}: not one utterance was decoded (of {len(listed)} listed; "
                          "the warnings above say why each was skipped); is it a data.list of this data_type?")
    scores = score_across_ranks(references, job.hyps, job.owner)
    audio_s = job.num_frames * dataset_conf.fbank_conf.frame_shift_s - job.padding_s  # the real audio
    # 7. rank 0 writes the texts, the scores and the summary
    summary = summarize(args, job, listed, references, scores, audio_s, wall_s, progress)
    write_results(args.result_dir, references, job, scores, summary)
    destroy_distributed()


def cli() -> None:
    """The ``toolkit-recognize`` command: a config error is one log line and exit status 2; the process's exit skips the
    collections of torch's objects (:func:`toolkit.utils.shutdown.freeze_at_exit`)."""
    freeze_at_exit()
    exit_on_config_error(main)


if __name__ == "__main__":
    cli()
