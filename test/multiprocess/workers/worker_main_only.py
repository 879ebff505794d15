"""One rank of the main-only-section tests.

    worker_main_only.py OUT_DIR SCENARIO      SCENARIO: run_on_main | nested | collective_inside
"""

import os
import sys

import torch

from toolkit.distributed.context import destroy_distributed, init_distributed
from toolkit.distributed.main_only import (is_local_main_process, is_main_process, main_process_only,
                                           run_on_main)
from toolkit.engine import init_engine
from toolkit.engine.train_conf import resolve_train_conf
from toolkit.utils.scheduler import init_optimizer_and_scheduler

from test.helpers import write_rank_report
from tiny_ctc import TinyCTC

out_dir, scenario = sys.argv[1], sys.argv[2]
ctx = init_distributed(timeout_s=120)
report = {"rank": ctx.rank, "is_main": is_main_process(), "is_local_main": is_local_main_process()}
shared = os.path.join(out_dir, "prepared.txt")


def prepare():
    with open(shared, "w") as f:
        f.write("prepared by main")
    return "main ran prepare"


def load():
    return open(shared).read()


if scenario == "run_on_main":
    report["result"] = run_on_main(prepare, post_func=load)
elif scenario == "nested":
    @main_process_only
    def inner():
        return "inner"

    @main_process_only
    def outer():
        return "outer+" + inner()

    report["result"] = outer()
elif scenario == "collective_inside":
    train_conf = resolve_train_conf({})
    model = TinyCTC()
    optimizer, scheduler = init_optimizer_and_scheduler(model.parameters(), "adam", {"lr": 0.01}, "warmuplr", {})
    engine = init_engine("torch_ddp", ctx, train_conf, find_unused_parameters=False)
    engine.prepare(model, optimizer, scheduler)

    @main_process_only
    def save_on_main_only():
        engine.save(os.path.join(out_dir, "epoch_0.pt"), {"epoch": 0})

    save_on_main_only()  # raises on rank 0; rank 1 goes on to the barrier and is torn down by torchrun
    torch.distributed.barrier()
write_rank_report(out_dir, ctx.rank, report)
destroy_distributed()
