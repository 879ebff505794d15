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


def test_a_vocabulary_size_the_text_cannot_fill_is_one_line_saying_which_it_allows(tmp_path):
    # The run.sh --nbpe 300 fault on a small corpus: SentencePiece's traceback in stage 2.
    text = tmp_path / "text"
    text.write_text("a HELLO WORLD\nb SIX SEVEN\nc ONE TWO THREE\n", encoding="utf-8")

    def spm_train(vocab_size):
        return subprocess.run([sys.executable, str(REPO_ROOT / "tools/spm_train.py"), "--vocab_size", str(vocab_size),
                               str(text), str(tmp_path / "bpe")], capture_output=True, text=True, timeout=120)

    for vocab_size, message in ((300, f"--vocab_size 300: the transcripts of {text} allow at most 18 unigram pieces; "
                                      "pass --vocab_size 18 or less (run.sh: --nbpe)"),
                                (5, f"--vocab_size 5: the transcripts of {text} hold 14 characters, so it needs at "
                                    "least 15 pieces (they and <unk>); pass --vocab_size 15 or more (run.sh: --nbpe)")):
        proc = spm_train(vocab_size)
        assert proc.returncode == 2 and proc.stderr == f"error: {message}\n", proc.stderr
    assert spm_train(18).returncode == 0
