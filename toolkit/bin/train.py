"""Train an ASR model (CTC/attention hybrid) on one CPU, one GPU, or many GPUs and nodes.

Usage (the recipe's stage 4 runs this; 2 CPU processes with gloo, or one per GPU with nccl):

    torchrun --standalone --nproc_per_node=2 -m toolkit.bin.train \\
        --config conf/train_conformer.yaml \\
        --train_data data/train/data.list --cv_data data/dev/data.list \\
        --model_dir exp/conformer --tensorboard_dir tensorboard \\
        --override_config "tokenizer_conf.symbol_table_path data/dict/units.txt" \\
        --override_config "cmvn_conf.cmvn_file data/train/global_cmvn"

Multi-node: ``torchrun --nnodes=$num_nodes --nproc_per_node=8 --rdzv_backend=c10d
--rdzv_endpoint=$HOST_NODE_ADDR --rdzv_id=$job_id -m toolkit.bin.train ...`` on every node.
Resume with ``--checkpoint exp/conformer/epoch_3.pt`` (training continues at epoch 4) or with a mid-epoch
``--checkpoint exp/conformer/step_1200.pt`` (saved with ``train_conf.save_interval_steps``/``save_interval_minutes``;
training continues at the next batch of that epoch, bit-identical to an uninterrupted run). ``--checkpoint auto``
resumes from the newest committed checkpoint in the model dir, so that torchrun's ``--max_restarts`` can restart a
job whose rank died (run.sh ``--max_restarts N``).
A model dir holds one run, and one job at a time (:mod:`toolkit.engine.model_dir`): a fresh start into a dir that holds
an earlier run (its ``train.yaml`` or committed checkpoints) stops in one line unless ``--checkpoint auto`` continues
that run or ``--start_over`` moves it into ``exp/conformer/previous_runs/N/``; a second job on a dir in use stops in
one line. Nothing is written there before every check has passed.
DeepSpeed ZeRO instead of DDP: add ``--train_engine deepspeed --deepspeed_config conf/ds_stage2.json`` (stage 1/2/3
JSONs in the recipe's conf/; micro batch, accum_grad, grad_clip and dtype come from the YAML). PyTorch FSDP2:
``--train_engine torch_fsdp`` (its ``train_conf.fsdp_*`` keys: :mod:`toolkit.engine.torch_fsdp`).

Check only (the recipe runs this before any stage; one process, no rank, no file written):

    python -m toolkit.bin.train --check_only --config conf/train_conformer.yaml --override_config "..." \
        --decode_modes "ctc_prefix_beam_search attention_rescoring" --model_dir exp/conformer

prints ``MAX_EPOCH GPUS LM_USED`` (``train_conf.max_epoch``, the GPUs this node has, 1 if one of the decoding modes
fuses the word LM) and exits 0, or prints one line naming the error and exits 1.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import math
import os
import sys
import zipfile

import torch

from toolkit.dataset import count_utterances, init_dataset_and_dataloader
from toolkit.dataset.loader import build_dataloader
from toolkit.dataset.planning import planned_batching
from toolkit.distributed.context import DistContext, destroy_distributed, init_distributed
from toolkit.distributed.join import init_join
from toolkit.distributed.main_only import main_process_only, run_on_main
from toolkit.engine import ENGINE_CHOICES, Engine, check_engine_args, check_engine_setup, init_engine
from toolkit.engine.checkpointer import Checkpointer, save_model
from toolkit.engine.compile import compile_blocks
from toolkit.engine.executor import Executor
from toolkit.engine.model_dir import claim_model_dir, plan_model_dir
from toolkit.engine.position import data_signature
from toolkit.engine.stats import require_utterances
from toolkit.engine.time_budget import CV_PROBE_UTTS, CvShare
from toolkit.models.checks import check_model
from toolkit.models.registry import init_model
from toolkit.models.transformer.asr_model import DECODING_METHODS, LM_METHODS, decoding_modes_error
from toolkit.text.tokenizer import check_model_fits_table, init_tokenizer
from toolkit.train_config import Config, read_config, save_model_dir_config
from toolkit.utils.checkpoint import MODEL_KEY, check_model_state, load_checkpoint, load_info
from toolkit.utils.config_parsing import ArgumentParser, ConfigError, exit_on_config_error
from toolkit.utils.rng import seed_global_rngs
from toolkit.utils.scheduler import init_optimizer_and_scheduler
from toolkit.utils.shutdown import freeze_at_exit
from toolkit.utils.tensorboard_writer import init_summarywriter


# What a training run needs beside --config, and --check_only does not.
RUN_ARGS = ("train_data", "cv_data", "model_dir")


def get_args(argv=None) -> argparse.Namespace:
    parser = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", help="training YAML (required, but optional with --check_only)")
    parser.add_argument("--override_config", action="append", default=[],
                        help='"key.sub value" (YAML value; a mapping merges into its section); repeatable; the key '
                             "must exist in the config or its section's defaults")
    parser.add_argument("--train_data", help="data.list (JSON lines) of the training set (required)")
    parser.add_argument("--cv_data", help="data.list of the cross-validation set (required)")
    parser.add_argument("--model_dir", help="where checkpoints and train.yaml go (required)")
    parser.add_argument("--tensorboard_dir", default="tensorboard")
    parser.add_argument("--checkpoint", default=None,
                        help="resume from this epoch_N.pt, step_N.pt or init.pt (one of --model_dir: its later "
                             "checkpoints are moved aside); 'auto': from the newest committed epoch_N.pt or step_N.pt "
                             "in --model_dir, if any (what an elastic restart needs)")
    parser.add_argument("--start_over", action="store_true",
                        help="--model_dir holds an earlier run: move it into --model_dir/previous_runs/N/ and start "
                             "this one there (with --checkpoint auto: in the first attempt only; an elastic restart "
                             "continues the run its job started)")
    parser.add_argument("--train_engine", default="torch_ddp", choices=ENGINE_CHOICES)
    parser.add_argument("--deepspeed_config", default=None, help="DeepSpeed JSON (--train_engine deepspeed only)")
    parser.add_argument("--deepspeed_shards", default="keep", choices=("keep", "drop"),
                        help="deepspeed: keep each checkpoint's ZeRO shard dir (needed to resume) or drop it after "
                             "the consolidated .pt is written")
    parser.add_argument("--pg_timeout_s", type=float, default=1800.0,
                        help="process-group timeout: a collective waiting longer fails instead of hanging")
    parser.add_argument("--check_only", action="store_true",
                        help="check --config with the overrides (the optimizer and LR schedule built on a stand-in "
                             "parameter), --decode_modes, what --model_dir holds (with --checkpoint, "
                             "--start_over) and the model of the checkpoint to resume, print MAX_EPOCH GPUS "
                             "LM_USED and exit (MAX_EPOCH 0 without --config); "
                             "nothing is trained or written")
    parser.add_argument("--decode_modes", help="with --check_only: the space-separated decoding modes the trained "
                                               f"model will be decoded with, each one of {list(DECODING_METHODS)}")
    args = parser.parse_args(argv)
    needed = () if args.check_only else ("config", *RUN_ARGS)
    missing = [f"--{name}" for name in needed if getattr(args, name) is None]
    if missing:
        parser.error(f"the following arguments are required: {', '.join(missing)}")
    if args.decode_modes is not None and not args.check_only:
        parser.error("--decode_modes goes with --check_only (toolkit.bin.recognize takes --modes)")
    return args


def check_before_ranks(args: argparse.Namespace, config: Config) -> None:
    """What a rank would refuse late (each rank, under torchrun's traceback), refused in one process before any rank
    or file exists; by ``--check_only`` (so run.sh, before launching) and by :func:`main` itself: ``--train_engine``
    with ``--deepspeed_config`` and its JSON, ``train_conf.dtype`` on this machine's device, that the data lists
    exist and that ``--checkpoint`` (unless ``auto``) is a committed checkpoint (its ``.yaml`` beside it) whose two
    files can be read.

    Raises:
        ConfigError: naming the option or key.
    """
    batch = config.dataset_conf.batch_conf
    check_engine_setup(args.train_engine, args.deepspeed_config, config.train_conf,
                       batch.batch_size if batch.batch_type == "static" else None,
                       "cuda" if torch.cuda.is_available() else "cpu")
    for option in ("train_data", "cv_data"):
        path = getattr(args, option)
        if path is not None and not os.path.isfile(path):
            raise ConfigError(f"--{option} {path}: no such file")
    checkpoint = args.checkpoint
    if checkpoint and checkpoint != "auto":
        committed = checkpoint[:-len(".pt")] + ".yaml" if checkpoint.endswith(".pt") else None
        if not os.path.isfile(checkpoint):
            raise ConfigError(f"--checkpoint {checkpoint}: no such file (--checkpoint auto resumes the newest one in "
                              "the model dir, if any)")
        if committed is None or not os.path.isfile(committed):
            raise ConfigError(f"--checkpoint {checkpoint}: no {os.path.basename(str(committed))} beside it, so it is "
                              "not a committed checkpoint (its save never finished); resume from another one")
        load_checkpoint(checkpoint, mmap=True)  # readable (its weights mapped, not read), and its record
        load_info(checkpoint)


def check_only(args: argparse.Namespace) -> None:
    """``--check_only``: what a run would refuse late, refused before any rank or file exists, in one process start
    (importing torch takes seconds): the config with its overrides (read as step 1 of :func:`main` reads it, the
    optimizer and LR scheduler built as step 5 builds them, on a stand-in parameter; ``max_steps``: any count where
    the trainer will count one; the model built from its sections without CMVN stats, on a stand-in table size), :func:`check_before_ranks` (without ``--config``: ``--train_engine`` with
    ``--deepspeed_config``), the decoding modes the model will be decoded with (the model's own list), and, given
    ``--model_dir``, whether the run it holds lets this one start as ``--checkpoint``/``--start_over`` say
    (:func:`~toolkit.engine.model_dir.plan_model_dir`; whether another job holds it is known only when training
    starts), and the model of the checkpoint to resume against the config's (:func:`check_resume_model`).
    Prints ``MAX_EPOCH GPUS LM_USED``; an error is one line on stderr and exit status 1."""
    lm_used = 0
    if args.decode_modes is not None:
        modes = args.decode_modes.split()
        error = decoding_modes_error(modes)
        if error:
            sys.exit(f"--decode_modes: {error}")
        lm_used = int(any(m in LM_METHODS for m in modes))
    max_epoch = 0
    if args.config is not None:
        try:
            config = read_config(args.config, args.override_config)
            init_optimizer_and_scheduler([torch.nn.Parameter(torch.zeros(1))], config.optim, config.optim_conf,
                                         config.scheduler, config.scheduler_conf,
                                         1 if planned_batching(config.dataset_conf) else None)
            # the model's sections (every encoder_conf key, the streaming ones included), built without the CMVN
            # stats and with a stand-in table size: stages 1 and 2 may not have made them yet
            init_model(dataclasses.replace(config, cmvn=None), vocab_size=config.output_dim or 2)
        except ConfigError as e:
            sys.exit(f"--config/--override_config: {e}")
        max_epoch = config.train_conf.max_epoch
    try:
        if args.config is None:
            check_engine_args(args.train_engine, args.deepspeed_config)
        else:
            check_before_ranks(args, config)
    except ConfigError as e:
        sys.exit(str(e))
    checkpoint = None if args.checkpoint == "auto" else args.checkpoint
    if args.model_dir is not None and os.path.isdir(args.model_dir):
        try:
            checkpoint = plan_model_dir(args.model_dir, args.checkpoint, args.start_over).checkpoint
        except ConfigError as e:
            sys.exit(str(e))
    if args.config is not None and checkpoint:
        try:
            check_resume_model(config, checkpoint)
        except ConfigError as e:
            sys.exit(str(e))
    print(max_epoch, torch.cuda.device_count(), lm_used)


def check_resume_model(config: Config, checkpoint: str) -> None:
    """``--check_only``: the model of ``config`` against the one ``checkpoint`` holds (the ``--checkpoint`` given,
    or the one ``--checkpoint auto`` resumes), refused in the one line a rank's resume gives
    (:func:`~toolkit.utils.checkpoint.check_model_state`): the model built once, in this process, and the checkpoint
    memory-mapped, so only its tensors' shapes are read. Not checked while the symbol table or the CMVN stats that
    the model's size depends on are not there yet (an earlier stage of this run makes them), nor a file that is not
    in torch.save's zip format (a legacy save, or no checkpoint at all): the ranks check then.

    Raises:
        ConfigError: another model (the first key that differs, both shapes), a symbol table that does not fit an
            earlier run's ``output_dim``, or a config that builds no model.
    """
    inputs = [config.tokenizer_conf.get("symbol_table_path"), config.tokenizer_conf.get("bpe_model"),
              config.cmvn_conf.get("cmvn_file") if config.cmvn else None]
    if not all(os.path.isfile(path) for path in inputs if path) or not zipfile.is_zipfile(checkpoint):
        return  # NOTE: not torch.save's zip format (the toolkit's, and mmap's): a rank's load says what it is
    tokenizer = init_tokenizer(config.tokenizer, config.tokenizer_conf)
    model = init_model(dataclasses.replace(config, output_dim=tokenizer.vocab_size()))
    saved = load_checkpoint(checkpoint, mmap=True)[MODEL_KEY]
    check_model_state({key: tuple(value.shape) for key, value in model.state_dict().items()}, saved, checkpoint)


def setup_logging(rank: int | None = None) -> None:
    """Log lines carry the rank once the process group exists (before it, none is known)."""
    where = "" if rank is None else f" rank{rank}"
    logging.basicConfig(level=logging.INFO, force=True, format=f"%(asctime)s{where} %(levelname)s %(message)s")


def wrap_cuda_model(args: argparse.Namespace, ctx: DistContext, config: Config, model: torch.nn.Module,
                    optimizer: torch.optim.Optimizer, scheduler) -> Engine:
    """The engine of ``--train_engine``, holding the model on this rank's device, wrapped for data parallelism
    (DDP, DeepSpeed or FSDP2), with its optimizer and scheduler; with ``train_conf.compile`` the model's blocks are
    compiled in place first (:mod:`toolkit.engine.compile`). WeNet's name, kept: it wraps for whatever device the
    rank has, the CPU too (gloo), not only CUDA."""
    batch = config.dataset_conf.batch_conf
    engine = init_engine(args.train_engine, ctx, config.train_conf, model.has_unused_parameters,
                         deepspeed_config=args.deepspeed_config,
                         micro_batch_size=batch.batch_size if batch.batch_type == "static" else None,
                         keep_shards=args.deepspeed_shards == "keep")
    if config.train_conf.compile:
        blocks = compile_blocks(model)
        main_process_only(logging.info)("train_conf.compile: %d blocks compiled in place (dynamic shapes): %s",
                                        len(blocks), ", ".join(blocks))
    engine.prepare(model, optimizer, scheduler)
    return engine


def main(argv=None) -> None:
    args = get_args(argv)
    if args.check_only:  # the checks alone (the recipe's, before any stage)
        check_only(args)
        return
    setup_logging()
    # 1. the config, resolved once: YAML + --override_config (any key of a typed section, even one the YAML omits);
    # what only a rank would find wrong (engine, dtype on this device, --checkpoint), found now
    config = read_config(args.config, args.override_config)
    check_before_ranks(args, config)
    train_conf = config.train_conf
    # 2. process group and rank context (torchrun environment, read once); the model dir claimed for this job:
    # global rank 0 locks it for the job's life, and the run it holds decides what this one resumes and moves aside
    ctx = init_distributed(args.pg_timeout_s)
    setup_logging(ctx.rank)
    seed_global_rngs(train_conf.seed)
    with claim_model_dir(ctx, args.model_dir, args.checkpoint, args.start_over) as claim:
        if args.checkpoint == "auto":
            logging.info("--checkpoint auto: %s", claim.checkpoint or f"nothing to continue in {args.model_dir}, "
                                                                       "starting")
        # 3. tokenizer (its symbol table gives the vocabulary size) and data: each utterance to one rank and worker
        tokenizer = init_tokenizer(config.tokenizer, config.tokenizer_conf)
        if config.output_dim is not None:  # a train.yaml of an earlier run: its model must fit this table
            check_model_fits_table(tokenizer, config.output_dim, args.config)
        config = dataclasses.replace(config, output_dim=tokenizer.vocab_size())
        train_set, train_loader, cv_set, cv_loader = init_dataset_and_dataloader(
            args.train_data, args.cv_data, tokenizer, config.dataset_conf, ctx.rank, ctx.world_size, train_conf.seed)
        # 4. model (train_conf says whether its layers recompute activations in backward), TorchScript check, size
        model = init_model(config)
        model.set_activation_checkpointing(train_conf.activation_checkpointing)
        check_model(model, log=main_process_only(logging.info))
        # 5. optimizer and LR scheduler (a schedule that ends with the run learns its steps from the planned
        # batches), then the engine: DDP or DeepSpeed on this rank's device
        batches = train_set.batches_per_epoch()
        max_steps = None if batches is None else train_conf.max_epoch * math.ceil(batches / train_conf.accum_grad)
        optimizer, scheduler = init_optimizer_and_scheduler(model.parameters(), config.optim, config.optim_conf,
                                                            config.scheduler, config.scheduler_conf, max_steps)
        engine = wrap_cuda_model(args, ctx, config, model, optimizer, scheduler)
        # 6. the executor (join, checkpoints with its saver hooks); resume: the last checks (the model against the
        # checkpoint, the world size, the data setup of a mid-epoch position)
        join = init_join(ctx, train_conf.join_mode, train_conf.join_timeout_s,
                         is_empty=lambda batch: len(batch["keys"]) == 0)
        signature = data_signature(None if train_set.planned_batching else ctx.world_size, args.train_data,
                                   config.to_dict()["dataset_conf"], train_conf.accum_grad)
        # max_train_minutes times a sample of each rank's CV share, scaled to the largest share (rank 0 decides)
        cv_share = CvShare(*cv_set.largest_share()) if train_conf.max_train_minutes and ctx.is_main else CvShare(0)
        cv_probe = build_dataloader(cv_set.sample(CV_PROBE_UTTS)) if train_conf.max_train_minutes else ()
        executor = Executor(engine, join, Checkpointer(engine, args.model_dir, train_conf), train_conf,
                            config.dataset_conf.fbank_conf.frame_shift_s, signature,
                            count_utterances(args.train_data, config.dataset_conf.data_type), cv_share=cv_share)
        if claim.checkpoint:
            executor.resume(claim.checkpoint, train_set)
        # 7. everything checked, the first writes (rank 0): what the claim moves aside, the effective train.yaml
        # with copies of the files it names (it and they alone rebuild the model for decoding, wherever the dir goes), and a fresh run's initial model (a run killed in epoch 0
        # still leaves a loadable model; its YAML names the job, so that an elastic restart knows its own run)
        run_on_main(claim.move_aside)
        run_on_main(save_model_dir_config, (config, args.model_dir))
        if not claim.checkpoint:
            save_model(executor.checkpointer, {"epoch": -1, "step": 0, "tag": "init", "run_id": ctx.run_id})
        # 8. tensorboard (rank 0); the points an abandoned run logged after the resumed step are purged
        writer = executor.writer = main_process_only(init_summarywriter)(args.tensorboard_dir, args.model_dir,
                                                                         purge_step=executor.progress.step + 1)
        # 9. epochs (max_train_minutes first probes the CV): train, cross-validate on every rank, save collectively
        for epoch in executor.epochs(cv_probe):
            train_stats = executor.train(train_loader, train_set)
            require_utterances(train_stats, f"epoch {epoch} trained", args.train_data)
            cv_stats = executor.cv(cv_loader)
            require_utterances(cv_stats, f"epoch {epoch} cross-validated", args.cv_data)
            save_model(executor.checkpointer, executor.epoch_info(train_stats, cv_stats))
        # 10. tear down (gloo may abort at exit without it); the model dir is unlocked as the claim ends
        if writer is not None:
            writer.close()
        join.close()
        destroy_distributed()


def cli() -> None:
    """The ``toolkit-train`` command: a config error is one log line and exit status 2; the process's exit skips the
    collections of torch's objects (:func:`toolkit.utils.shutdown.freeze_at_exit`)."""
    freeze_at_exit()
    exit_on_config_error(main)


if __name__ == "__main__":
    cli()
