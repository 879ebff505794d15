"""Reading a data.list outside the pipeline (toolkit/dataset/data_list.py)."""
import json

from toolkit.dataset.data_list import make_raw_list, read_transcripts
from toolkit.dataset.shard import write_shard

from test.helpers import REPO_ROOT

FSDD = REPO_ROOT / "corpora/tiny_fsdd"


def test_read_transcripts_in_input_order_raw_and_shard(tmp_path):
    split = FSDD / "data" / "test"
    entries = make_raw_list(str(split / "wav.scp"), str(split / "text"), str(FSDD))[0][:5]
    raw = tmp_path / "raw.list"
    raw.write_text(json.dumps(entries[3]) + "\nnot json\n" + "".join(json.dumps(e) + "\n" for e in entries[:3])
                   + json.dumps(entries[3]) + "\n")
    pairs = [(e["key"], e["txt"]) for e in entries]
    assert read_transcripts(str(raw), "raw") == [pairs[3], *pairs[:3], pairs[3]]  # repeats kept, bad line left out
    shards = [str(tmp_path / name) for name in ("b.tar", "missing.tar", "empty.tar", "a.tar")]
    write_shard(entries[3:], shards[0])
    write_shard([], shards[2])
    write_shard(entries[:3], shards[3])
    (tmp_path / "shards.list").write_text("".join(p + "\n" for p in shards))
    assert read_transcripts(str(tmp_path / "shards.list"), "shard") == pairs[3:] + pairs[:3]
