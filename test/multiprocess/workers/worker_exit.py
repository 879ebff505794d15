"""One rank of the exit test: a library keeps the default group alive past ``destroy_distributed`` (as DeepSpeed
does), the last collective returns, and the process ends at once. The exit status must be 0.

    worker_exit.py
"""

import torch.distributed as dist

from toolkit.distributed.collectives import all_gather_objects
from toolkit.distributed.context import destroy_distributed, init_distributed

init_distributed(timeout_s=30)
kept_alive = dist.group.WORLD  # a reference the way a library holds one: the group's gloo threads live to the exit
assert all_gather_objects(dist.get_rank(), "worker_exit") == [0, 1]
destroy_distributed()
