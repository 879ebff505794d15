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
training continues at the next batch of that epoch, bit-identical to an uninterrupted run).
DeepSpeed ZeRO instead of DDP: add ``--train_engine deepspeed --deepspeed_config conf/ds_stage2.json`` (stage 1/2/3
JSONs in the recipe's conf/; micro batch, accum_grad, grad_clip and dtype come from the YAML).
"""

from __future__ import annotations

import argparse
import json
import logging
import os

import torch

from toolkit.dataset import count_utterances, init_dataset_and_dataloader
from toolkit.dataset.pipeline import resolve_dataset_conf
from toolkit.distributed.context import destroy_distributed, init_distributed
from toolkit.distributed.join import init_join
from toolkit.engine import ENGINE_CHOICES, init_engine
from toolkit.engine.checkpointer import Checkpointer
from toolkit.engine.executor import (RunningEpochStats, TrainProgress, cross_validate, epoch_summary,
                                     require_utterances, train_one_epoch)
from toolkit.models.registry import init_model
from toolkit.models.summary import trace_and_print_model
from toolkit.text.tokenizer import init_tokenizer
from toolkit.utils.checkpoint import load_info
from toolkit.utils.rng import RngState
from toolkit.utils.config import (ConfigError, apply_overrides, check_modify_and_save_config, exit_on_config_error,
                                  fill_train_defaults, load_config)
from toolkit.utils.scheduler import init_optimizer_and_scheduler
from toolkit.utils.summary import init_summarywriter


def get_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True, help="training YAML")
    parser.add_argument("--override_config", action="append", default=[],
                        help='"key.sub value"; repeatable; the key must exist in the config')
    parser.add_argument("--train_data", required=True, help="data.list (JSON lines) of the training set")
    parser.add_argument("--cv_data", required=True, help="data.list of the cross-validation set")
    parser.add_argument("--model_dir", required=True, help="where checkpoints and train.yaml go")
    parser.add_argument("--tensorboard_dir", default="tensorboard")
    parser.add_argument("--checkpoint", default=None, help="resume from this epoch_N.pt, step_N.pt or init.pt")
    parser.add_argument("--train_engine", default="torch_ddp", choices=ENGINE_CHOICES)
    parser.add_argument("--deepspeed_config", default=None, help="DeepSpeed JSON (--train_engine deepspeed only)")
    parser.add_argument("--deepspeed_shards", default="keep", choices=("keep", "drop"),
                        help="deepspeed: keep each checkpoint's ZeRO shard dir (needed to resume) or drop it after "
                             "the consolidated .pt is written")
    parser.add_argument("--pg_timeout_s", type=float, default=1800.0,
                        help="process-group timeout: a collective waiting longer fails instead of hanging")
    return parser.parse_args(argv)


def setup_logging(rank: int | None = None) -> None:
    """Log lines carry the rank once the process group exists (before it, none is known)."""
    where = "" if rank is None else f" rank{rank}"
    logging.basicConfig(level=logging.INFO, force=True, format=f"%(asctime)s{where} %(levelname)s %(message)s")


def resume(checkpointer: Checkpointer, path: str, progress: TrainProgress, train_set) -> None:
    """Restore engine and saver hooks from ``path``; ``progress`` then says where training continues."""
    if not os.path.exists(path):
        raise ConfigError(f"--checkpoint {path}: no such file")
    data_signature = progress.data_signature
    restored = checkpointer.load(path)
    if progress.batches_in_epoch and progress.data_signature != data_signature:
        # NOTE: the consumed batches are skipped by count; other batching, ranks or data would skip other utterances.
        raise ConfigError(f"--checkpoint {path} stops inside epoch {progress.epoch}, but the world size, the data "
                          "list, dataset_conf or accum_grad differ from when it was written, so its position in the "
                          "epoch means other utterances now; resume from the last epoch_N.pt instead")
    if "progress" not in restored:  # written before saver hooks existed: continue after its epoch
        info = load_info(path)
        if "epoch" not in info:
            raise ConfigError(f"--checkpoint {path} is not a training checkpoint (no epoch in its .yaml, e.g. an "
                              "averaged model); resume from an epoch_N.pt or step_N.pt")
        progress.epoch, progress.step = info["epoch"] + 1, info["step"]
    if progress.data_seed != train_set.seed:
        logging.warning("%s was trained with data seed %d, the config says %d: keeping the checkpoint's", path,
                        progress.data_seed, train_set.seed)
        train_set.seed = progress.data_seed
    logging.info("resumed from %s: epoch %d after %d of its batches, step %d", path, progress.epoch,
                 progress.batches_in_epoch, progress.step)


def main(argv=None) -> None:
    args = get_args(argv)
    setup_logging()
    # 1. read the config and apply the command-line overrides (any train_conf key, even one the YAML leaves out)
    configs = fill_train_defaults(load_config(args.config))
    configs["dataset_conf"] = resolve_dataset_conf(configs.get("dataset_conf"))  # likewise for dataset_conf keys
    configs = apply_overrides(configs, args.override_config)
    # 2. process group and rank context (torchrun environment, read once)
    ctx = init_distributed(args.pg_timeout_s)
    setup_logging(ctx.rank)
    # 3. derived keys; rank 0 writes the effective train.yaml
    configs = check_modify_and_save_config(configs, args.model_dir, ctx.is_main)
    train_conf = configs["train_conf"]
    torch.manual_seed(train_conf["seed"])
    # 4. data: every utterance goes to exactly one rank and worker per epoch
    tokenizer = init_tokenizer(configs["tokenizer"], configs["tokenizer_conf"])
    train_set, train_loader, cv_set, cv_loader = init_dataset_and_dataloader(
        args.train_data, args.cv_data, tokenizer, configs["dataset_conf"], ctx.rank, ctx.world_size,
        train_conf["seed"])
    # 5. model
    model = init_model(configs)
    # 6. TorchScript check and parameter count
    trace_and_print_model(model, ctx.is_main)
    # 7. optimizer, scheduler, engine (DDP wrap on CPU or GPU)
    optimizer, scheduler = init_optimizer_and_scheduler(
        model.parameters(), configs["optim"], configs["optim_conf"], configs["scheduler"],
        configs["scheduler_conf"])
    ctc_weight = configs.get("model_conf", {}).get("ctc_weight", 0.3)
    engine = init_engine(args.train_engine, ctx, train_conf, find_unused_parameters=not 0.0 < ctc_weight < 1.0,
                         deepspeed_config=args.deepspeed_config,
                         batch_conf=resolve_dataset_conf(configs["dataset_conf"])["batch_conf"],
                         keep_shards=args.deepspeed_shards == "keep")
    engine.prepare(model, optimizer, scheduler)
    join = init_join(train_conf, is_empty=lambda batch: len(batch["keys"]) == 0)
    # 8. checkpoints (engine state + saver hooks: progress, per-rank RNG and epoch statistics); resume
    progress = TrainProgress(data_seed=train_conf["seed"], data_signature=json.dumps(
        [ctx.world_size, args.train_data, configs["dataset_conf"], train_conf["accum_grad"]], sort_keys=True))
    running = RunningEpochStats()
    checkpointer = Checkpointer(engine, args.model_dir, train_conf)
    checkpointer.register("progress", progress)
    checkpointer.register("rng", RngState(), main_process_only=False)
    checkpointer.register("epoch_stats", running, main_process_only=False)
    if args.checkpoint:
        resume(checkpointer, args.checkpoint, progress, train_set)
    else:  # 9. the initial model, so a run killed in epoch 0 still leaves a loadable model
        checkpointer.save("init", {"epoch": -1, "step": 0, "tag": "init"})
    # 10. tensorboard (rank 0 only); points an abandoned run logged after the resumed step are purged
    writer = init_summarywriter(args.tensorboard_dir, args.model_dir, ctx.is_main, purge_step=progress.step + 1)
    # 11. epochs: train, cross-validate on every rank, save collectively
    max_epoch = train_conf["max_epoch"]
    utts_per_rank = -(-count_utterances(args.train_data, configs["dataset_conf"]) // ctx.world_size)
    for epoch in range(progress.epoch, max_epoch):
        progress.epoch = epoch
        train_set.set_epoch(epoch)
        # NOTE: the loader's own generator, reseeded per epoch, so a resumed job replays the same worker seeds.
        train_loader.generator.manual_seed(progress.data_seed + epoch)
        if progress.batches_in_epoch == 0:
            progress.epoch_lr = engine.lr
        train_stats = train_one_epoch(engine, join, train_loader, progress, train_conf, writer,
                                      utts_per_rank * (max_epoch - epoch), checkpointer, running).reduce()
        require_utterances(train_stats, f"epoch {epoch} trained", args.train_data)
        cv_stats = cross_validate(engine, cv_loader)
        require_utterances(cv_stats, f"epoch {epoch} cross-validated", args.cv_data)
        info = epoch_summary(progress, progress.epoch_lr, train_stats, cv_stats, ctx.is_main, writer)
        progress.epoch = epoch + 1  # what the checkpoint resumes: the next epoch from its start
        checkpointer.save(f"epoch_{epoch}", info)
    if writer is not None:
        writer.close()
    join.close()
    # 12. tear down (gloo may abort at exit without it)
    destroy_distributed()


if __name__ == "__main__":
    exit_on_config_error(main)
