"""One rank of the shared-model-dir test: each rank is given the path its own node would mount.

    worker_shared_dir.py OUT_DIR DIR_OF_RANK0 DIR_OF_RANK1

Writes ``rank{R}.json``: ``{"ok": true}`` or ``{"error": "<the ConfigError's line>"}``.
"""

import sys

from toolkit.distributed.context import destroy_distributed, init_distributed
from toolkit.distributed.shared_dir import check_shared_dir
from toolkit.utils.config_parsing import ConfigError

from test.helpers import write_rank_report

out_dir, dirs = sys.argv[1], sys.argv[2:]
ctx = init_distributed(timeout_s=30)
try:
    check_shared_dir(dirs[ctx.rank], "--model_dir")
    report = {"ok": True}
except ConfigError as e:
    report = {"error": str(e)}
write_rank_report(out_dir, ctx.rank, report)
destroy_distributed()
