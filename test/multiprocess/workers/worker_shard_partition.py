"""One rank of the shard partition test: reads its share of a shard data.list with 2 loader workers for 2 epochs
and writes, on rank 0, every rank's keys per epoch.

    worker_shard_partition.py SHARD_LIST UNITS_TXT OUT_JSON
"""

import json
import logging
import sys

import torch.distributed as dist

from toolkit.dataset import build_dataloader, build_dataset, resolve_dataset_conf
from toolkit.distributed.context import destroy_distributed, init_distributed
from toolkit.text.tokenizer import CharTokenizer

def main() -> None:
    shard_list, units, out_json = sys.argv[1:4]
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s %(message)s")
    ctx = init_distributed(timeout_s=60)
    conf = resolve_dataset_conf({"data_type": "shard", "shuffle_conf": {"shuffle_size": 4},
                                 "sort_conf": {"sort_size": 4},
                                 "batch_conf": {"batch_type": "dynamic", "max_frames_in_batch": 600},
                                 "dataloader_conf": {"num_workers": 2, "prefetch_factor": 2}})
    dataset = build_dataset(shard_list, CharTokenizer(units), conf, rank=ctx.rank, world_size=ctx.world_size)
    loader = build_dataloader(dataset)
    report = []
    for epoch in range(2):
        dataset.set_epoch(epoch)
        keys, skipped = [], {}
        for batch in loader:
            keys += batch["keys"]
            for reason, n in batch["num_skipped"].items():
                skipped[reason] = skipped.get(reason, 0) + n
        gathered = [None] * ctx.world_size
        dist.all_gather_object(gathered, {"keys": keys, "skipped": skipped})
        report.append(gathered)
    if ctx.rank == 0:
        with open(out_json, "w", encoding="utf-8") as f:
            json.dump(report, f)
    destroy_distributed()


if __name__ == "__main__":  # loader workers run this file's top level again
    main()
