"""Ranks of the JobProgress tests.

    worker_job_progress.py count    # each rank adds rank+1 units 3 times; rank 0 prints the job's total
    worker_job_progress.py fail     # rank 1 raises inside the block and then stays alive without finishing
"""

import sys
import time

from toolkit.distributed.context import destroy_distributed, init_distributed
from toolkit.distributed.progress import JobProgress

ctx = init_distributed(timeout_s=60)
if sys.argv[1] == "count":
    with JobProgress(total=3 * sum(range(1, ctx.world_size + 1)), desc="units", poll_s=0.05) as progress:
        for _ in range(3):
            progress.add(ctx.rank + 1)
            time.sleep(0.2 * ctx.rank)  # uneven speeds: rank 0 finishes first and waits for the others
    print(f"rank {ctx.rank} done: {progress.done()} units, {progress.add_calls} adds")
else:
    try:
        with JobProgress(total=2, poll_s=0.05) as progress:
            progress.add(1)
            if ctx.rank == 1:
                raise ValueError("rank 1 fails on purpose")
    except ValueError:
        time.sleep(60)  # NOTE: alive, so only the store can tell rank 0 (torchrun would otherwise stop it)
destroy_distributed()
