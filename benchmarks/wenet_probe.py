#!/usr/bin/env python3
"""WeNet's trainer with this toolkit's step clock attached: the WeNet side of ``benchmarks/bench_vs_wenet.py``.

Runs in WeNet's own venv, with WeNet's source on ``PYTHONPATH`` (only ``benchmarks/harness.py``, found in this
script's folder, torch and the standard library are imported from here), under torchrun, as bench_vs_wenet.py
launches it:

    PYTHONPATH=<wenet_dir> BENCH_LAUNCH_TIME=<time.time()> <wenet python> -m torch.distributed.run \\
        --standalone --nproc_per_node=1 benchmarks/wenet_probe.py --probe_json PATH -- <wenet/bin/train.py args>

WeNet's code is not changed by this script: it calls WeNet's ``main()`` after wrapping names that WeNet's trainer
looks up at call time, with the same clock and the same parts as ``benchmarks/bench_train.py``
(:mod:`harness`):

- the train loader returned by ``init_dataset_and_dataloader``: ``data`` (time in ``next()``);
- ``wrap_cuda_model``: the DDP model gets the timed default all-reduce comm hook;
- ``batch_forward``: ``forward`` (DDP's join-mode check, which WeNet's ``model.join()`` context adds to every
  forward, is inside it), and the batch's input frames (``feats_lengths``);
- ``batch_backward``: ``backward`` and the exposed ``allreduce``;
- ``update_parameter_and_lr``: ``optimizer`` (clip, Adam, zero_grad, LR schedule); its end closes the step;
- ``log_per_step``: ``log``;
- ``Executor.train``: after its epoch, :func:`harness.finish_rank` writes ``PATH.rank<R>.json``
  (peak RSS, the matmul rate, the FLOPs of a copy of the model on the last trained batch).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


def get_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                     usage="%(prog)s --probe_json PATH -- <wenet/bin/train.py arguments>")
    parser.add_argument("--probe_json", required=True, help="each rank writes PATH.rank<R>.json")
    split = argv.index("--") if "--" in argv else len(argv)
    return parser.parse_args(argv[:split]), argv[split + 1:]


def main() -> None:
    args, wenet_argv = get_args(sys.argv[1:])
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    import wenet.bin.train as wenet_train
    import wenet.utils.executor as wenet_executor
    from harness import AllReduceTimer, StepClock, TimedLoader, finish_rank

    clock = StepClock()
    allreduce = AllReduceTimer(clock)
    last = {}
    init_data, wrap_model = wenet_train.init_dataset_and_dataloader, wenet_train.wrap_cuda_model
    forward, backward = wenet_executor.batch_forward, wenet_executor.batch_backward
    update, log, train = (wenet_executor.update_parameter_and_lr, wenet_executor.log_per_step,
                          wenet_executor.Executor.train)

    def timed_init_data(*a, **k):
        train_set, cv_set, train_loader, cv_loader = init_data(*a, **k)
        return train_set, cv_set, TimedLoader(train_loader, clock), cv_loader

    def timed_wrap_model(*a, **k):
        model, device = wrap_model(*a, **k)
        if isinstance(model, DistributedDataParallel):
            model.register_comm_hook(None, allreduce.hook)
        return model, device

    def timed_forward(model, batch, scaler, info_dict, device):
        lengths, padded = batch["feats_lengths"], batch["feats"].shape[0] * batch["feats"].shape[1]
        clock.add_batch(int(lengths.sum()), padded, int(lengths.numel()))
        last.update(inputs=(batch, device), frames=(int(lengths.sum()), padded))
        with clock.part("forward"):
            return forward(model, batch, scaler, info_dict, device)

    def timed_update(*a, **k):
        with clock.part("optimizer"):
            info_dict = update(*a, **k)
        clock.end_step()
        return info_dict

    def timed_log(*a, **k):
        with clock.part("log"):
            return log(*a, **k)

    def timed_train(self, model, *rest, **k):
        launch_time = float(os.environ["BENCH_LAUNCH_TIME"])
        train_start = time.time()
        clock.restart()
        with clock.counting_gc():
            train(self, model, *rest, **k)
        module = model.module if isinstance(model, DistributedDataParallel) else model
        record = finish_rank(clock, module, last["inputs"], last["frames"], torch.device(self.device), launch_time,
                             train_start)
        with open(f"{args.probe_json}.rank{dist.get_rank()}.json", "w", encoding="utf-8") as f:
            json.dump(record, f)

    wenet_train.init_dataset_and_dataloader = timed_init_data
    wenet_train.wrap_cuda_model = timed_wrap_model
    wenet_executor.batch_forward = timed_forward
    wenet_executor.batch_backward = allreduce.wrap_backward(backward)
    wenet_executor.update_parameter_and_lr = timed_update
    wenet_executor.log_per_step = timed_log
    wenet_executor.Executor.train = timed_train
    sys.argv = [wenet_train.__file__, *wenet_argv]
    wenet_train.main()


if __name__ == "__main__":
    main()
