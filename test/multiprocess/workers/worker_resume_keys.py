"""One rank of a mid-epoch resume on another world size: epoch 0 of the real pipeline (tiny_fsdd raw list, static
batches of 4 planned from sorted runs of 12, 2 loader workers, volume perturbation, dither, SpecAugment) trained by
the real Executor (TinyCTC, torch_ddp, flag join, step checkpoints); writes the keys of every batch it trained (with
the join step) and dropped, and the epoch's reduced statistics.

    worker_resume_keys.py OUT_DIR DATA_LIST UNITS [--save_interval_steps N] [--checkpoint step_N.pt]
"""

import argparse

from toolkit.dataset import build_dataloader, build_dataset
from toolkit.distributed.context import destroy_distributed, init_distributed
from toolkit.distributed.join import FlagJoin
from toolkit.engine.checkpointer import Checkpointer
from toolkit.engine.executor import Executor
from toolkit.engine.position import data_signature
from toolkit.engine.train_conf import resolve_train_conf
from toolkit.text.tokenizer import CharTokenizer

from test.helpers import write_rank_report
from tiny_ctc import prepared_ddp_engine

CONF = {"batch_conf": {"batch_size": 4}, "sort_conf": {"sort_size": 12}, "volume_perturb": True,
        "dataloader_conf": {"num_workers": 2, "prefetch_factor": 2}}

trained, dropped = [], []


class RecordingJoin(FlagJoin):
    """The flag join, noting the keys of each batch it yields (with its step) and of each it drops."""

    def iterate(self, loader, on_empty, on_dropped):
        def drop(batch):
            dropped.extend(batch["keys"])
            on_dropped(batch)

        for batch in super().iterate(loader, on_empty, drop):
            trained.append([self.report.steps, batch["keys"]])
            yield batch


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out_dir")
    parser.add_argument("data_list")
    parser.add_argument("units")
    parser.add_argument("--save_interval_steps", type=int, default=0)
    parser.add_argument("--checkpoint", default=None)
    args = parser.parse_args()

    ctx = init_distributed(timeout_s=120)
    dataset = build_dataset(args.data_list, CharTokenizer(args.units), CONF, rank=ctx.rank, world_size=ctx.world_size)
    train_conf = resolve_train_conf({"max_epoch": 1, "log_interval": 100,
                                     "save_interval_steps": args.save_interval_steps})
    engine, _ = prepared_ddp_engine(ctx, train_conf)
    join = RecordingJoin(ctx.pg_timeout, is_empty=lambda batch: len(batch["keys"]) == 0)
    signature = data_signature(None, args.data_list, CONF, train_conf.accum_grad)
    executor = Executor(engine, join, Checkpointer(engine, args.out_dir, train_conf), train_conf, 0.01, signature)
    if args.checkpoint:
        executor.resume(args.checkpoint, dataset)
    stats = executor.train(build_dataloader(dataset), dataset)
    report = {"trained": trained, "dropped": dropped, "step": executor.progress.step, "utts": stats.num_utts,
              "dropped_utts": stats.dropped_utts, "skipped": sum(stats.skipped.values())}
    write_rank_report(args.out_dir, ctx.rank, report)
    join.close()
    destroy_distributed()


if __name__ == "__main__":  # loader workers run this file's top level again
    main()
