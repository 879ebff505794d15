import pickle

import pytest

from toolkit.text.tokenizer import (BpeTokenizer, CharTokenizer, check_model_fits_table, init_tokenizer,
                                    read_symbol_table, write_symbol_table)
from toolkit.text.units import collect_char_units, train_sentencepiece
from toolkit.utils.common import UNK_ID
from toolkit.utils.config_parsing import ConfigError

from test.helpers import REPO_ROOT


def transcripts(corpus):
    texts = []
    for split in ("train", "dev", "test"):
        with open(REPO_ROOT / "corpora" / corpus / "data" / split / "text", encoding="utf-8") as f:
            texts += [line.split(maxsplit=1)[1].strip() for line in f]
    return texts


@pytest.fixture(scope="module")
def lj_char_table(tmp_path_factory):
    path = tmp_path_factory.mktemp("dict") / "units.txt"
    write_symbol_table(collect_char_units(str(REPO_ROOT / "corpora/tiny_lj/data/train/text")), str(path))
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
        units.update(collect_char_units(str(REPO_ROOT / "corpora" / corpus / "data" / split / "text")))
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
    table = train_sentencepiece(str(text_file), str(tmp_path / "bpe"), model_type, 60)
    tok = init_tokenizer("bpe", {"bpe_model": str(tmp_path / "bpe.model"), "symbol_table_path": table})
    assert tok.vocab_size() == 62
    copy = pickle.loads(pickle.dumps(tok))  # DataLoader workers may receive it pickled
    for text in transcripts("tiny_lj"):
        tokens, ids = copy.tokenize(text)
        assert UNK_ID not in ids
        assert len(ids) < len(text)  # pieces merge characters
        assert tok.detokenize(ids) == (text, tokens)


REBUILD = "write the table with tools/make_dict.py"


@pytest.mark.parametrize("table, message", [
    ("<blank> 0\n<unk> 1\nA 3\n<sos/eos> 4\n", r"bad.txt: ids must be exactly 0..3, but id 2 is missing"),
    ("<blank> 0\n<unk> 1\nA 2\nB 2\n<sos/eos> 3\n", r"bad.txt:4: id 2 already on line 3"),
    ("<blank> 0\n<unk> 1\nA 2\nA 3\n<sos/eos> 4\n", r"bad.txt:4: symbol 'A' already on line 3"),
    ("<blank> 0\nA 1\n<unk> 2\n<sos/eos> 3\n", r"bad.txt:3: <unk> must have id 1, found 2"),
    ("<blank> 0\n<unk> 1\n<sos/eos> 2\nA 3\n", r"bad.txt:3: <sos/eos> must have id 3 \(the last id\), found 2"),
    ("<blank> 0\n<unk> 1\nA B 2\n<sos/eos> 3\n", r"bad.txt:3: expected 'symbol id', got 'A B 2'"),
    ("<blank> 0\n<unk> 1\nA 2\n", r"bad.txt: no <sos/eos> line"),
])
def test_bad_symbol_tables_are_one_line_config_errors_naming_file_and_line(tmp_path, table, message):
    path = tmp_path / "bad.txt"
    path.write_text(table)
    with pytest.raises(ConfigError, match=message) as err:
        read_symbol_table(str(path))
    assert REBUILD in str(err.value) and "\n" not in str(err.value)


def test_missing_table_and_bad_tokenizer_conf_are_config_errors(tmp_path, lj_char_table):
    with pytest.raises(ConfigError, match="symbol table not found: .*none.txt"):
        read_symbol_table(str(tmp_path / "none.txt"))
    with pytest.raises(ConfigError, match=r"exactly the keys \['bpe_model', 'symbol_table_path'\]"):
        init_tokenizer("bpe", {"symbol_table_path": lj_char_table})
    with pytest.raises(ConfigError, match="cannot load SentencePiece model"):
        init_tokenizer("bpe", {"symbol_table_path": lj_char_table, "bpe_model": str(tmp_path / "none.model")})


def test_literal_unk_is_one_unit_and_never_a_dict_entry(tmp_path):
    """The unk-literal case: make_dict.py on a transcript holding "<unk>", then the char tokenizer."""
    text = tmp_path / "text"
    text.write_text("u1 HELLO <unk> WORLD\nu2 IT IS OKAY\nu3 A<blank>B <sos/eos>\n")
    table = tmp_path / "units.txt"
    write_symbol_table(collect_char_units(str(text)), str(table))
    symbols = set(read_symbol_table(str(table)))
    assert symbols == set("HELOWRDITSKAYB") | {"▁", "<blank>", "<unk>", "<sos/eos>"}  # no < > u n k / s e o
    tok = CharTokenizer(str(table))
    units, ids = tok.tokenize("HELLO <unk> WORLD")
    assert units == list("HELLO") + ["▁", "<unk>", "▁"] + list("WORLD")
    assert ids.count(UNK_ID) == 1 and ids[6] == UNK_ID
    assert tok.detokenize(ids)[0] == "HELLO <unk> WORLD"
    units, ids = tok.tokenize("A<unk>B <blank> <sos/eos>")  # inside a word too; never the blank or end id
    assert units == ["A", "<unk>", "B", "▁", "<blank>", "▁", "<sos/eos>"]
    assert ids == [tok.symbol_table["A"], UNK_ID, tok.symbol_table["B"], tok.symbol_table["▁"], UNK_ID,
                   tok.symbol_table["▁"], UNK_ID]


def test_literal_unk_is_one_unit_with_a_lowercase_bpe_model(tmp_path):
    text = tmp_path / "text"
    lines = [t.lower() for t in transcripts("tiny_lj")]
    text.write_text("".join(f"utt{i} {t}\n" for i, t in enumerate(lines)) + "extra the <unk> of <unk>\n")
    table = train_sentencepiece(str(text), str(tmp_path / "bpe"), "unigram", 60)
    pieces = set(read_symbol_table(table)) - {"<blank>", "<unk>", "<sos/eos>"}
    assert not [p for p in pieces if "<" in p or ">" in p]  # nothing learned from the literal
    tok = init_tokenizer("bpe", {"bpe_model": str(tmp_path / "bpe.model"), "symbol_table_path": table})
    tokens, ids = tok.tokenize("the <unk> of the")
    assert ids.count(UNK_ID) == 1 and tokens[ids.index(UNK_ID)] == "<unk>"  # not "<" and ">" as two unknowns
    assert tok.detokenize(ids)[0] == "the <unk> of the"
    assert tok.tokenize("the ") == tok.tokenize("the")  # text without a special symbol: SentencePiece alone
    tokens, ids = tok.tokenize("of<unk>the")  # no word boundary is invented around a literal inside a word
    assert tok.detokenize(ids)[0] == "of<unk>the" and ids.count(UNK_ID) == 1


def test_bpe_table_of_another_model_is_refused(tmp_path, lj_char_table):
    text_file = tmp_path / "text"
    text_file.write_text("".join(f"utt{i} {t}\n" for i, t in enumerate(transcripts("tiny_lj"))))
    train_sentencepiece(str(text_file), str(tmp_path / "bpe"), "unigram", 60)
    with pytest.raises(ConfigError, match=r"units.txt does not belong to SentencePiece model .*bpe.model"):
        BpeTokenizer(str(tmp_path / "bpe.model"), lj_char_table)


def test_model_output_dim_must_match_the_table(lj_char_table):
    tok = CharTokenizer(lj_char_table)
    size = tok.vocab_size()
    check_model_fits_table(tok, size, "exp/train.yaml")
    with pytest.raises(ConfigError, match=rf"has {size} symbols \(<sos/eos> = {size - 1}\), but the model "
                                          rf"\(exp/train.yaml\) has output_dim {size + 1} \(<sos/eos> = {size}\)"):
        check_model_fits_table(tok, size + 1, "exp/train.yaml")
    with pytest.raises(ConfigError, match="exp/train.yaml has no output_dim"):
        check_model_fits_table(tok, None, "exp/train.yaml")


def test_init_tokenizer_unknown_name_lists_choices(lj_char_table):
    assert isinstance(init_tokenizer("char", {"symbol_table_path": lj_char_table}), CharTokenizer)
    with pytest.raises(ConfigError, match=r"\['bpe', 'char'\]"):
        init_tokenizer("word", {"symbol_table_path": lj_char_table})


def test_bpe_maps_unseen_characters_to_unk(tmp_path):
    text_file = tmp_path / "text"
    text_file.write_text("".join(f"utt{i} {t}\n" for i, t in enumerate(transcripts("tiny_lj"))))
    table = train_sentencepiece(str(text_file), str(tmp_path / "bpe"), "unigram", 60)
    tok = init_tokenizer("bpe", {"bpe_model": str(tmp_path / "bpe.model"), "symbol_table_path": table})
    assert not any("Q" in t or "Z" in t for t in transcripts("tiny_lj"))
    tokens, ids = tok.tokenize("THE QUIZ")
    assert tokens == ["▁THE", "▁", "Q", "U", "I", "Z"]  # a piece the model never saw stays as its surface
    assert [i for t, i in zip(tokens, ids) if t in ("Q", "Z")] == [UNK_ID, UNK_ID]
    assert UNK_ID not in [i for t, i in zip(tokens, ids) if t not in ("Q", "Z")]
    assert tok.tokenize("QZQ")[1] == [tok.symbol_table["▁"], UNK_ID]  # a run of unknowns is one <unk>
    assert tok.detokenize(ids)[0] == "THE <unk>UI<unk>"
