"""The rank context: the launcher's environment is read in one place, a plain ``python`` run is a one-process group
on the same code path, the group is torn down at the end, and every checkpoint load maps to the CPU."""

import ast
import glob
import os
import subprocess
import sys

from test.helpers import REPO_ROOT

LAUNCHER_VARIABLES = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"}


def sources():
    for path in glob.glob(os.path.join(REPO_ROOT, "toolkit", "**", "*.py"), recursive=True):
        yield os.path.relpath(path, REPO_ROOT), ast.parse(open(path, encoding="utf-8").read())


def test_only_the_context_reads_the_launcher_environment():
    readers = set()
    for path, tree in sources():
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and node.value in LAUNCHER_VARIABLES:
                readers.add(path)
    assert readers == {os.path.join("toolkit", "distributed", "context.py")}


def test_every_torch_load_maps_to_the_cpu():
    loads = []
    for path, tree in sources():
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "load" \
                    and getattr(node.func.value, "id", "") == "torch":
                location = {k.arg: k.value for k in node.keywords}.get("map_location")
                loads.append((path, node.lineno, getattr(location, "value", None)))
    assert loads and all(location == "cpu" for _, _, location in loads), loads


def test_plain_python_is_a_one_process_group_torn_down_at_the_end(tmp_path):
    # One process, no launcher variables at all: the same code path as torchrun's ranks, and no group left over.
    code = ("import os, torch.distributed as dist\n"
            "from toolkit.distributed.context import destroy_distributed, init_distributed\n"
            "ctx = init_distributed(timeout_s=30)\n"
            "print(ctx.rank, ctx.world_size, ctx.local_rank, dist.is_initialized(), dist.get_world_size(),\n"
            "      os.environ['LOCAL_RANK'], int(ctx.pg_timeout.total_seconds()))\n"
            "destroy_distributed()\n"
            "print(dist.is_initialized())\n")
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARIABLES}
    env["PYTHONPATH"] = str(REPO_ROOT)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["0", "1", "0", "True", "1", "0", "30", "False"]
