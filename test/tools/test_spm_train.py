import subprocess
import sys

from toolkit.text.tokenizer import BpeTokenizer

from test.helpers import REPO_ROOT


def test_spm_train_writes_model_and_symbol_table(tmp_path):
    prefix = tmp_path / "bpe" / "lj"
    subprocess.run([sys.executable, str(REPO_ROOT / "tools/spm_train.py"), "--model_type", "bpe", "--vocab_size", "40",
                    str(REPO_ROOT / "corpora/tiny_lj/data/train/text"), str(prefix)], check=True, capture_output=True)
    table = (tmp_path / "bpe" / "lj.units.txt").read_text(encoding="utf-8").splitlines()
    assert len(table) == 42
    assert table[:2] == ["<blank> 0", "<unk> 1"] and table[-1] == "<sos/eos> 41"
    assert all(line.split()[1] == str(i) for i, line in enumerate(table))
    tok = BpeTokenizer(f"{prefix}.model", f"{prefix}.units.txt")
    tokens, ids = tok.tokenize("IN BEING COMPARATIVELY MODERN")
    assert tokens[0].startswith("▁") and 1 not in ids
    assert tok.detokenize(ids)[0] == "IN BEING COMPARATIVELY MODERN"
