"""Decode a test set with a trained model; writes ``<result_dir>/<mode>/text`` (``key hyp`` per line).

Usage:

    python -m toolkit.bin.recognize --config exp/conformer/train.yaml --checkpoint exp/conformer/avg_3.pt \\
        --test_data data/test_fsdd/data.list --result_dir exp/conformer/test_fsdd \\
        --modes ctc_greedy_search ctc_prefix_beam_search attention attention_rescoring \\
        --beam_size 10 --batch_size 32

Every mode shares one encoder pass per batch. Utterances the data pipeline skips (unreadable audio, unknown
characters) are logged with their key and counted; the scorer then counts them as deletions, so a WER is never
computed on a silently shrunk test set.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
from collections import Counter

import torch
from tqdm import tqdm

from toolkit.config import read_config
from toolkit.dataset import DatasetConf, build_dataloader, build_dataset
from toolkit.dataset.conf import BatchConf, FilterConf, TokenizeConf
from toolkit.models.registry import init_model
from toolkit.models.transformer.asr_model import DECODING_METHODS
from toolkit.text.tokenizer import check_model_fits_table, init_tokenizer
from toolkit.utils.checkpoint import MODEL_KEY, load_checkpoint
from toolkit.utils.config import exit_on_config_error


def get_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True, help="the model dir's train.yaml")
    parser.add_argument("--override_config", action="append", default=[])
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--test_data", required=True, help="data.list of the test set")
    parser.add_argument("--result_dir", required=True)
    parser.add_argument("--modes", nargs="+", default=["attention_rescoring"], choices=DECODING_METHODS)
    parser.add_argument("--beam_size", type=int, default=10)
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--ctc_weight", type=float, default=0.5, help="CTC weight in attention rescoring")
    parser.add_argument("--length_penalty", type=float, default=0.0,
                        help="score bonus per output token in attention and attention_rescoring (> 0 favours "
                             "longer outputs); attention then ranks by score per decoding step (GNMT-style length "
                             "normalisation, so an early <eos> does not win at wide beams)")
    parser.add_argument("--num_threads", type=int, default=0, help="CPU threads (0: torch default)")
    return parser.parse_args(argv)


def test_dataset_conf(conf: DatasetConf, batch_size: int) -> DatasetConf:
    """The training pipeline's features with decoding settings: nothing filtered out, static batches, original
    order."""
    # NOTE: a test transcript may hold characters the training dictionary lacks; the audio is still decoded and
    # the scorer compares against the original text (max_unk_ratio 1).
    return dataclasses.replace(
        conf, batch_conf=BatchConf(batch_type="static", batch_size=batch_size),
        filter_conf=FilterConf(max_length=1e9, min_length=0, token_max_length=10**9, token_min_length=0,
                               min_output_input_ratio=0.0, max_output_input_ratio=1e9),
        shuffle=False, sort=False, tokenize_conf=TokenizeConf(max_unk_ratio=1.0))


def main(argv=None) -> None:
    args = get_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    if args.num_threads > 0:
        torch.set_num_threads(args.num_threads)
    config = read_config(args.config, args.override_config)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    tokenizer = init_tokenizer(config.tokenizer, config.tokenizer_conf)
    check_model_fits_table(tokenizer, config.output_dim, args.config)
    dataset = build_dataset(args.test_data, tokenizer, test_dataset_conf(config.dataset_conf, args.batch_size),
                            mode="test")
    loader = build_dataloader(dataset)
    model = init_model(config)
    model.load_state_dict(load_checkpoint(args.checkpoint)[MODEL_KEY])
    model.to(device).eval()

    outputs = {}
    for mode in args.modes:
        os.makedirs(os.path.join(args.result_dir, mode), exist_ok=True)
        outputs[mode] = open(os.path.join(args.result_dir, mode, "text"), "w", encoding="utf-8")
    skipped = Counter()
    no_frame = 0
    with open(args.test_data, encoding="utf-8") as f:
        total = sum(1 for line in f if line.strip())
    with torch.no_grad(), tqdm(total=total, unit="utt", desc="decode") as bar:
        for batch in loader:
            skipped.update(batch.get("num_skipped", {}))
            if len(batch["keys"]) == 0:
                continue
            encoder_frames = model.encoder.output_lengths(batch["feats_lengths"]).tolist()
            for key in [key for key, n in zip(batch["keys"], encoder_frames) if n == 0]:
                # NOTE: ASRModel.decode gives such a clip the empty hypothesis in every mode, in any batch.
                logging.warning("%s: under 7 fbank frames, no encoder frame: empty hypothesis", key)
                no_frame += 1
            hyps = model.decode(args.modes, batch["feats"].to(device), batch["feats_lengths"].to(device),
                                beam_size=args.beam_size, ctc_weight=args.ctc_weight,
                                length_penalty=args.length_penalty)
            for mode, token_ids in hyps.items():
                for key, ids in zip(batch["keys"], token_ids):
                    text, _ = tokenizer.detokenize(ids)
                    outputs[mode].write(f"{key} {text}\n")
            bar.update(len(batch["keys"]))
    for out in outputs.values():
        out.close()
    if skipped:
        logging.warning("skipped utterances by reason: %s (scored as deletions)", dict(skipped))
    if no_frame:
        logging.warning("%d utterance(s) too short for the encoder got an empty hypothesis", no_frame)
    logging.info("wrote %s", ", ".join(os.path.join(args.result_dir, mode, "text") for mode in args.modes))


if __name__ == "__main__":
    exit_on_config_error(main)
