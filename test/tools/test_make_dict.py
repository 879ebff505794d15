import json
import subprocess
import sys
from pathlib import Path

from test.helpers import REPO_ROOT


def run_tool(name, *args):
    return subprocess.run([sys.executable, str(REPO_ROOT / "tools" / name), *map(str, args)], capture_output=True,
                          text=True, check=True, cwd="/")


def test_make_dict_on_tiny_fsdd(tmp_path):
    out = tmp_path / "dict" / "units.txt"
    run_tool("make_dict.py", REPO_ROOT / "corpora/tiny_fsdd/data/train/text", out)
    units = list("EFGHINORSTUVWXZ") + ["▁"]  # letters of ZERO..NINE, then the word boundary
    expected = ["<blank>", "<unk>"] + units + ["<sos/eos>"]
    assert out.read_text(encoding="utf-8").splitlines() == [f"{s} {i}" for i, s in enumerate(expected)]


def test_make_raw_list_reports_and_skips_unmatched_keys(tmp_path):
    (tmp_path / "wav.scp").write_text("a wav/a.wav\nb /abs/b.wav\nonly-wav wav/c.wav\n")
    (tmp_path / "text").write_text("b TWO WORDS\na ONE\nonly-text THREE\n")
    out = tmp_path / "data.list"
    run = run_tool("make_raw_list.py", "--wav_root", "corpora/x", tmp_path / "wav.scp", tmp_path / "text", out)
    assert "only-text" in run.stderr and "only-wav" in run.stderr
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert lines == [{"key": "a", "wav": "corpora/x/wav/a.wav", "txt": "ONE"},
                     {"key": "b", "wav": "/abs/b.wav", "txt": "TWO WORDS"}]


def test_make_raw_list_real_corpus_paths_exist(tmp_path):
    data = REPO_ROOT / "corpora/tiny_lj/data/dev"
    out = tmp_path / "dev.list"
    run_tool("make_raw_list.py", "--wav_root", REPO_ROOT / "corpora/tiny_lj", data / "wav.scp", data / "text", out)
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(lines) == 3 and all(Path(e["wav"]).is_file() for e in lines)
    assert lines[0]["txt"] == (data / "text").read_text().splitlines()[0].split(" ", 1)[1]
