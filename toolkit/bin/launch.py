"""torchrun, with a rank's refusal reported once, in one line.

Usage (torchrun's own arguments; the recipe's stages 4 and 5 launch through it):

    python -m toolkit.bin.launch --standalone --nnodes=1 --nproc_per_node=2 -m toolkit.bin.train --config ...
    python -m toolkit.bin.launch --nnodes=2 --rdzv_backend=c10d --rdzv_endpoint=node0:29400 --rdzv_id=job \\
        --nproc_per_node=8 -m toolkit.bin.recognize ...

A rank of ``toolkit.bin.train``/``recognize`` that stops on a :class:`~toolkit.utils.config_parsing.ConfigError`
(the wrong checkpoint, a bad config value: usually every rank at once) writes it to torchrun's error file instead of
logging it (:func:`~toolkit.utils.config_parsing.exit_on_config_error`); this launcher then prints the first failed
rank's one line, ``error: rank R: <message>``, and exits 2, where torchrun prints a ``ChildFailedError`` traceback
and its failure table. Any other failure (a crash, whose traceback the rank printed itself; a rendezvous that never
completes) is reported exactly as torchrun reports it.

Its ranks end with it, however it ends (``kill -9`` included: :func:`toolkit.distributed.context.stop_with_launcher`).
Started by run.sh (``TOOLKIT_STOP_WITH_PARENT=1``), it ends with run.sh too; started otherwise (``nohup``, from a
shell that exits), it outlives its parent.
"""

from __future__ import annotations

import logging
import os

from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.run import parse_args, run

from toolkit.utils.config_parsing import ERROR_PREFIX, ConfigError, exit_on_config_error
from toolkit.utils.worker_start import stop_with_parent


# Set by run.sh: this launcher ends with the recipe that started it, and its ranks with it.
STOP_WITH_PARENT = "TOOLKIT_STOP_WITH_PARENT"


def main(argv=None) -> None:
    if os.environ.pop(STOP_WITH_PARENT, None) == "1":  # popped: the ranks end with this launcher in any case
        stop_with_parent()
    args = parse_args(argv)
    # NOTE: the agent's "failed (exitcode: N) local_rank: R" error line; a crash still gets torchrun's whole report
    logging.getLogger("torch.distributed.elastic.multiprocessing.api").setLevel(logging.CRITICAL)
    try:
        run(args)
    except ChildFailedError as e:
        rank, failure = e.get_first_failure()
        message = failure.message.get("message") if isinstance(failure.message, dict) else failure.message
        if not (isinstance(message, str) and message.startswith(ERROR_PREFIX)):
            raise
        raise ConfigError(f"rank {rank}: {message[len(ERROR_PREFIX):]}") from None


def cli() -> None:
    """The launcher's command: one line and exit status 2 for a rank's ConfigError (torchrun's report otherwise)."""
    exit_on_config_error(main)


if __name__ == "__main__":
    cli()
