"""A user's own script that iterates the loader with workers, in each shape a script comes in (the shared cases
loader-script-shapes and nan-audio): each reads its batches, or stops at once with one line saying what to do;
never the loader's "DataLoader worker (pid(s) ...) exited unexpectedly". One subprocess per shape, with a timeout."""
import json
import subprocess
import sys

import numpy as np
import pytest
import soundfile as sf

from test.helpers import REPO_ROOT
from test.toolkit.dataset.test_loader import FSDD, fsdd_list

TIMEOUT_S = 120  # one shape: a few seconds on 2 idle cores; a hang fails here

# What a user writes to look at the batches, as the nan-audio case did: no `if __name__ == "__main__":`, the
# loader's former import path, and a tokenizer of the script's own (letters A-Z -> ids 2..27) or the toolkit's.
OWN_TOKENIZER = """
class Tok:
    def tokenize(self, text):
        units = [c for c in text if c != " "]
        return units, [2 + ord(c) - ord("A") for c in units]
tok = Tok()
"""
TOOLKIT_TOKENIZER = "from toolkit.text.tokenizer import CharTokenizer\ntok = CharTokenizer({units!r})\n"
# what a notebook's kernel has (ipykernel's heartbeat and IOPub threads): another Python thread, alive
NOTEBOOK_THREADS = ("import threading\n"
                    "threading.Thread(target=threading.Event().wait, name=\"heartbeat\", daemon=True).start()\n")
BODY = """
import json
import torch
from toolkit.dataset.pipeline import build_dataloader, build_dataset
{tokenizer}
conf = {{"sort": False, "dataloader_conf": {{"num_workers": 2, "prefetch_factor": 2}}}}
keys, skipped, finite = [], {{}}, True
loader = build_dataloader(build_dataset({data_list!r}, tok, conf, mode="cv"))
for batch in loader:
    keys += batch["keys"]
    finite = finite and bool(torch.isfinite(batch["feats"]).all())
    for reason, count in batch["num_skipped"].items():
        skipped[reason] = skipped.get(reason, 0) + count
print(json.dumps({{"keys": sorted(keys), "skipped": skipped, "finite": finite,
                  "start_method": loader.multiprocessing_context.get_start_method()}}))
"""


@pytest.fixture(scope="module")
def data(tmp_path_factory, tokenizer):
    """A CV list of 3 tiny_fsdd utterances and a float WAV of the first holding 10 NaN samples (the nan-audio case):
    ``(data_list, the 3 keys sorted, the symbol table's path)``."""
    folder = tmp_path_factory.mktemp("shapes")
    data_list, keys = fsdd_list(folder, 3)
    lines = open(data_list).read().splitlines()
    speech, rate = sf.read(FSDD / json.loads(lines[0])["wav"], dtype="float32")
    speech[2000:2010] = np.nan
    sf.write(folder / "nan.wav", speech, rate, subtype="FLOAT")
    with open(data_list, "a") as f:
        f.write(json.dumps({"key": "nan-tone", "wav": str(folder / "nan.wav"), "txt": "ONE"}) + "\n")
    return data_list, sorted(keys), tokenizer.symbol_table_path


def run_shape(shape: str, code: str, tmp_path) -> subprocess.CompletedProcess:
    """``code`` run as ``shape``: a script file, piped into ``python -``, or ``python -c``, from the project root."""
    if shape == "file":
        script = tmp_path / "look_at_batches.py"
        script.write_text(code)
        cmd, stdin = [sys.executable, str(script)], None
    else:
        cmd, stdin = ([sys.executable, "-"], code) if shape == "stdin" else ([sys.executable, "-c", code], None)
    proc = subprocess.run(cmd, input=stdin, capture_output=True, text=True, timeout=TIMEOUT_S, cwd=REPO_ROOT)
    assert "exited unexpectedly" not in proc.stderr, proc.stderr[-3000:]
    return proc


@pytest.mark.parametrize("shape, tokenizer_code, threads, start_method", [
    ("file", OWN_TOKENIZER, "", "fork"),  # no __main__ guard (the nan-audio case)
    ("stdin", OWN_TOKENIZER, "", "fork"),
    ("-c", OWN_TOKENIZER, "", "fork"),
    ("-c", TOOLKIT_TOKENIZER, "", "fork"),
    ("-c", TOOLKIT_TOKENIZER, NOTEBOOK_THREADS, "forkserver"),  # a notebook with the toolkit's classes only
], ids=["file-no-guard-own-class", "stdin-own-class", "c-own-class", "c-toolkit-class", "notebook-toolkit-class"])
def test_a_script_reads_its_batches_in_any_shape(data, tmp_path, shape, tokenizer_code, threads, start_method):
    data_list, keys, units = data
    code = threads + BODY.format(tokenizer=tokenizer_code.format(units=units), data_list=data_list)
    proc = run_shape(shape, code, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout) == {"keys": keys, "skipped": {"non_finite_audio": 1}, "finite": True,
                                       "start_method": start_method}


def test_the_documented_form_reads_its_batches_beside_other_threads(data, tmp_path):
    # A script file with the guard and its own class: from the forkserver (another thread runs), which imports the
    # class by running the script's top level again.
    data_list, keys, _ = data
    body = BODY.format(tokenizer=OWN_TOKENIZER, data_list=data_list)
    head, _, rest = body.partition("conf = ")
    code = NOTEBOOK_THREADS + head + 'if __name__ == "__main__":\n' + "".join(
        "    " + line + "\n" for line in ("conf = " + rest).splitlines())
    proc = run_shape("file", code, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout)["keys"] == keys and json.loads(proc.stdout)["start_method"] == "forkserver"


@pytest.mark.parametrize("shape, tokenizer_code, says", [
    ("-c", OWN_TOKENIZER, "a worker cannot import Tok, defined in __main__ (python -c, or a notebook): define it in a "
                          "module file and import it from there, or set dataset_conf.dataloader_conf.num_workers: 0"),
    ("file", TOOLKIT_TOKENIZER, "which starts the workers again: put the code that starts them under "
                                "`if __name__ == \"__main__\":`, or set dataset_conf.dataloader_conf.num_workers: 0"),
    ("stdin", TOOLKIT_TOKENIZER, "a worker runs the main script again, which has no file (<stdin>): save the script "
                                 "to a file and run that, or set dataset_conf.dataloader_conf.num_workers: 0"),
], ids=["notebook-own-class", "threads-file-no-guard", "threads-stdin"])
def test_a_shape_the_forkserver_cannot_serve_stops_at_once_with_one_line(data, tmp_path, shape, tokenizer_code,
                                                                         says):
    # Another Python thread runs (a notebook's kernel), so a fork could hang: the workers would start from the
    # forkserver, and these shapes would end in the worker's crash. They stop before any worker starts.
    data_list, _, units = data
    code = NOTEBOOK_THREADS + BODY.format(tokenizer=tokenizer_code.format(units=units), data_list=data_list)
    proc = run_shape(shape, code, tmp_path)
    last = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode == 1 and proc.stdout == ""
    assert last.startswith("toolkit.utils.worker_start.WorkerStartError: loader workers start from a forkserver "
                           "here, not forked, because this process runs other Python threads (heartbeat), beside "
                           "which a fork can hang, and ") and last.endswith(says), last


# The toolkit's process pools (tools/make_shard_list.py's, make_raw_list.py's, compute_cmvn_stats.py's) start
# their processes the same way.
SHARDS = """
import json
from toolkit.dataset.data_list import read_lines
from toolkit.dataset.shard import make_shards
entries = [json.loads(line) for line in read_lines({data_list!r})]
paths, reused, written, skipped = make_shards(entries, {shard_dir!r}, 2, 2)
print(json.dumps([len(paths), reused, written, skipped]))
"""


@pytest.mark.parametrize("threads", ["", NOTEBOOK_THREADS], ids=["forked", "forkserver"])
def test_a_process_pool_works_in_a_script_without_a_file(data, tmp_path, threads):
    data_list, _, _ = data
    code = threads + SHARDS.format(data_list=data_list, shard_dir=str(tmp_path / "shards"))
    proc = run_shape("-c", code, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout) == [2, 0, 4, []]  # 2 shards of the 4 utterances (a shard keeps a file's bytes)
    assert len(list((tmp_path / "shards").glob("shards_*.tar"))) == 2


def test_a_process_pool_stops_at_once_with_one_line_where_the_forkserver_cannot_serve(data, tmp_path):
    data_list, _, _ = data
    code = NOTEBOOK_THREADS + SHARDS.format(data_list=data_list, shard_dir=str(tmp_path / "shards"))
    proc = run_shape("stdin", code, tmp_path)
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr.strip().splitlines()[-1].endswith(
        "make_shards' processes start from a forkserver here, not forked, because this process runs other Python "
        "threads (heartbeat), beside which a fork can hang, and a worker runs the main script again, which has no "
        "file (<stdin>): save the script to a file and run that, or use one (--num_workers 1)")
    assert not (tmp_path / "shards").exists() or not list((tmp_path / "shards").glob("*.tar"))
