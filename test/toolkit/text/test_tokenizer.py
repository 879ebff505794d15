import pickle
import sys
from pathlib import Path

import pytest

from toolkit.text.tokenizer import CharTokenizer, init_tokenizer, read_symbol_table, write_symbol_table
from toolkit.utils.common import UNK_ID

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "tools"))
import make_dict  # noqa: E402
import spm_train  # noqa: E402


def transcripts(corpus):
    texts = []
    for split in ("train", "dev", "test"):
        with open(ROOT / "corpora" / corpus / "data" / split / "text", encoding="utf-8") as f:
            texts += [line.split(maxsplit=1)[1].strip() for line in f]
    return texts


@pytest.fixture(scope="module")
def lj_char_table(tmp_path_factory):
    path = tmp_path_factory.mktemp("dict") / "units.txt"
    write_symbol_table(make_dict.collect_units(str(ROOT / "corpora/tiny_lj/data/train/text")), str(path))
    return str(path)


def test_char_tokenize_splits_words_with_boundary_unit(lj_char_table):
    tok = CharTokenizer(lj_char_table)
    table = read_symbol_table(lj_char_table)
    tokens, ids = tok.tokenize("HI  YOU")
    assert tokens == ["H", "I", "▁", "Y", "O", "U"]
    assert ids == [table[t] for t in tokens]
    assert ids[2] == tok.vocab_size() - 2  # "▁" sorts after the letters, just before <sos/eos>
    assert tok.detokenize(ids) == ("HI YOU", tokens)


@pytest.mark.parametrize("corpus", ["tiny_lj", "tiny_fsdd"])
def test_char_round_trip_on_shipped_transcripts(tmp_path, corpus):
    table = tmp_path / "units.txt"
    units = set()
    for split in ("train", "dev", "test"):
        units.update(make_dict.collect_units(str(ROOT / "corpora" / corpus / "data" / split / "text")))
    write_symbol_table(sorted(units), str(table))
    tok = CharTokenizer(str(table))
    for text in transcripts(corpus):
        tokens, ids = tok.tokenize(text)
        assert UNK_ID not in ids
        assert len(ids) == len(text)  # one unit per character, spaces become "▁"
        assert tok.detokenize(ids)[0] == text


def test_unknown_character_maps_to_unk(lj_char_table):
    tok = CharTokenizer(lj_char_table)
    tokens, ids = tok.tokenize("THE Q?")  # tiny_lj train has no Q and no "?"
    assert tokens[-2:] == ["Q", "?"]
    assert ids[-2:] == [UNK_ID, UNK_ID]
    assert UNK_ID not in ids[:-2]


@pytest.mark.parametrize("model_type", ["unigram", "bpe"])
def test_bpe_round_trip_on_shipped_transcripts(tmp_path, model_type):
    text_file = tmp_path / "text"
    text_file.write_text("".join(f"utt{i} {t}\n" for i, t in enumerate(transcripts("tiny_lj"))))
    table = spm_train.train(str(text_file), str(tmp_path / "bpe"), model_type, 60)
    tok = init_tokenizer("bpe", {"bpe_model": str(tmp_path / "bpe.model"), "symbol_table_path": table})
    assert tok.vocab_size() == 62
    copy = pickle.loads(pickle.dumps(tok))  # DataLoader workers may receive it pickled
    for text in transcripts("tiny_lj"):
        tokens, ids = copy.tokenize(text)
        assert UNK_ID not in ids
        assert len(ids) < len(text)  # pieces merge characters
        assert tok.detokenize(ids) == (text, tokens)


def test_read_symbol_table_rejects_bad_tables(tmp_path):
    path = tmp_path / "bad.txt"
    path.write_text("<blank> 0\n<unk> 1\nA 3\n<sos/eos> 4\n")
    with pytest.raises(ValueError, match="ids must be"):
        read_symbol_table(str(path))
    path.write_text("<blank> 0\nA 1\n<unk> 2\n<sos/eos> 3\n")
    with pytest.raises(ValueError, match="<unk> must have id 1"):
        read_symbol_table(str(path))


def test_init_tokenizer_unknown_name_lists_choices(lj_char_table):
    assert isinstance(init_tokenizer("char", {"symbol_table_path": lj_char_table}), CharTokenizer)
    with pytest.raises(ValueError, match=r"\['bpe', 'char'\]"):
        init_tokenizer("word", {"symbol_table_path": lj_char_table})


def test_bpe_maps_unseen_characters_to_unk(tmp_path):
    text_file = tmp_path / "text"
    text_file.write_text("".join(f"utt{i} {t}\n" for i, t in enumerate(transcripts("tiny_lj"))))
    table = spm_train.train(str(text_file), str(tmp_path / "bpe"), "unigram", 60)
    tok = init_tokenizer("bpe", {"bpe_model": str(tmp_path / "bpe.model"), "symbol_table_path": table})
    assert not any("Q" in t or "Z" in t for t in transcripts("tiny_lj"))
    tokens, ids = tok.tokenize("THE QUIZ")
    assert tokens == ["▁THE", "▁", "Q", "U", "I", "Z"]  # a piece the model never saw stays as its surface
    assert [i for t, i in zip(tokens, ids) if t in ("Q", "Z")] == [UNK_ID, UNK_ID]
    assert UNK_ID not in [i for t, i in zip(tokens, ids) if t not in ("Q", "Z")]
    assert tok.tokenize("QZQ")[1] == [tok.symbol_table["▁"], UNK_ID]  # a run of unknowns is one <unk>
    assert tok.detokenize(ids)[0] == "THE <unk>UI<unk>"
