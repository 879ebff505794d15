"""One Unicode normalisation (NFC) wherever text enters: the same words written precomposed (NFC) and decomposed
(NFD: base letter + combining mark) are the same text to the scorer, the tokenizers, the tools that learn units and
LMs, and the readers of data lists, shards and Kaldi files (the unicode-wer case)."""
import json
import os
import subprocess
import sys
import tarfile
import unicodedata

import pytest

from toolkit.dataset.data_list import make_raw_list, read_transcripts
from toolkit.dataset.processor import parse_raw
from toolkit.distributed.metrics import score_across_ranks
from toolkit.text.kneser_ney import write_kneser_ney_arpa
from toolkit.text.ngram_lm import WordNgramLM
from toolkit.text.tokenizer import CharTokenizer, init_tokenizer, read_symbol_table, units_to_text
from toolkit.text.units import collect_char_units, train_sentencepiece
from toolkit.utils.common import UNK_ID
from toolkit.utils.config_parsing import ConfigError
from toolkit.utils.kaldi_files import read_table
from toolkit.utils.metrics import ErrorCounts, score
from toolkit.utils.unicode_text import normalize_unicode

from test.helpers import REPO_ROOT

# É = E + U+0301, Ğ = G + U+0306, İ = I + U+0307, Ü = U + U+0308, Ş = S + U+0327 in NFD
TEXTS = {"u1": "CAFÉ OLÉ", "u2": "ĞÜZEL ŞEHİR"}
NFC = {k: unicodedata.normalize("NFC", t) for k, t in TEXTS.items()}
NFD = {k: unicodedata.normalize("NFD", t) for k, t in TEXTS.items()}


def write_text(path, texts):
    path.write_text("".join(f"{k} {t}\n" for k, t in texts.items()), encoding="utf-8")
    return str(path)


def run_tool(name, *args):
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    return subprocess.run([sys.executable, str(REPO_ROOT / "tools" / name), *map(str, args)], capture_output=True,
                          text=True, timeout=120, env=env)


def test_the_forms_differ_as_code_points_and_normalise_to_one():
    assert all(NFC[k] != NFD[k] and len(NFD[k]) > len(NFC[k]) for k in TEXTS)
    assert [normalize_unicode(NFD[k]) for k in TEXTS] == [NFC[k] for k in TEXTS]
    assert normalize_unicode("ﬁ²") == "ﬁ²"  # NFC, not NFKC: compatibility characters stay as written


def test_the_scorer_counts_no_error_between_the_forms():
    assert score(NFC, NFD, "word").totals == ErrorCounts(N=4, C=4)
    assert score(NFC, NFD, "char").totals == ErrorCounts(N=19, C=19)
    counts = score_across_ranks(NFC, {"ctc_greedy_search": NFD}, {k: 0 for k in NFD})["ctc_greedy_search"]
    assert counts == {"word": ErrorCounts(N=4, C=4), "char": ErrorCounts(N=19, C=19)}


@pytest.mark.parametrize("extra, report", [([], "WER 0.00 % [ 0 / 4 ]"), (["--cer"], "CER 0.00 % [ 0 / 19 ]")])
def test_compute_wer_scores_the_forms_as_equal(tmp_path, extra, report):
    run = run_tool("compute_wer.py", write_text(tmp_path / "ref", NFC), write_text(tmp_path / "hyp", NFD), *extra)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip().splitlines()[-1] == report


def test_make_dict_learns_the_same_table_from_either_form_and_no_combining_mark(tmp_path):
    tables = []
    for name, texts in (("nfc", NFC), ("nfd", NFD)):
        out = tmp_path / f"units_{name}.txt"
        assert run_tool("make_dict.py", write_text(tmp_path / f"text_{name}", texts), out).returncode == 0
        tables.append(out.read_text(encoding="utf-8"))
    assert tables[0] == tables[1]
    assert len(tables[0].splitlines()) == 18 and not any(unicodedata.combining(c) for c in tables[1])


def test_the_char_tokenizer_maps_either_form_to_the_same_ids_and_back_to_nfc(tmp_path):
    table = tmp_path / "units.txt"
    assert run_tool("make_dict.py", write_text(tmp_path / "text", NFC), table).returncode == 0
    tok = CharTokenizer(str(table))
    for key in TEXTS:
        units, ids = tok.tokenize(NFD[key])
        assert (units, ids) == tok.tokenize(NFC[key]) and UNK_ID not in ids
        assert tok.detokenize(ids)[0] == NFC[key]
    assert units_to_text(["E", "\u0301", "▁", "O"]) == "\u00c9 O"  # a mark emitted as a unit of its own composes


def test_the_bpe_tokenizer_and_its_training_treat_the_forms_alike(tmp_path):
    texts = {f"{k}-{i}": t for i in range(20) for k, t in NFD.items()}  # SentencePiece needs some text
    table = train_sentencepiece(write_text(tmp_path / "text", texts), str(tmp_path / "bpe"), "unigram", 16)
    tok = init_tokenizer("bpe", {"bpe_model": str(tmp_path / "bpe.model"), "symbol_table_path": table})
    assert all(normalize_unicode(unit) == unit for unit in tok.symbol_table)
    for key in TEXTS:
        units, ids = tok.tokenize(NFD[key])
        assert (units, ids) == tok.tokenize(NFC[key]) and UNK_ID not in ids
        assert tok.detokenize(ids)[0] == NFC[key]


def test_a_symbol_table_not_in_nfc_is_refused_naming_file_and_line(tmp_path):
    path = tmp_path / "units.txt"
    path.write_text("<blank> 0\n<unk> 1\n▁CAFE\u0301 2\n<sos/eos> 3\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"units.txt:3: symbol '▁CAFE\u0301' is not in Unicode NFC") as err:
        read_symbol_table(str(path))
    assert "\n" not in str(err.value)


def test_the_lm_builder_writes_nfc_words_and_an_nfd_arpa_is_refused(tmp_path):
    arpas = []
    for name, texts in (("nfc", NFC), ("nfd", NFD)):
        arpas.append(tmp_path / f"{name}.arpa")
        write_kneser_ney_arpa(write_text(tmp_path / f"text_{name}", texts), str(arpas[-1]), 2)
    assert arpas[0].read_bytes() == arpas[1].read_bytes()
    nfd_arpa = tmp_path / "decomposed.arpa"
    nfd_arpa.write_text(unicodedata.normalize("NFD", arpas[0].read_text(encoding="utf-8")), encoding="utf-8")
    units = dict(enumerate(["<blank>", "<unk>", "▁"] + sorted(set("".join(NFC.values())) - {" "}) + ["<sos/eos>"]))
    lm = WordNgramLM(str(arpas[0]), units, 0.5, 0.0)
    assert "CAFÉ" in lm.vocabulary
    with pytest.raises(ValueError, match=r"4 of the LM's words are not in Unicode NFC \(e.g. 'CAFE\u0301'\)"):
        WordNgramLM(str(nfd_arpa), units, 0.5, 0.0)


def test_kaldi_text_data_lists_and_shards_are_read_in_nfc_and_paths_kept(tmp_path):
    decomposed_path = unicodedata.normalize("NFD", "/data/É.wav")
    (tmp_path / "wav.scp").write_text(f"u1 {decomposed_path}\nu2 /data/b.wav\n", encoding="utf-8")
    text = write_text(tmp_path / "text", NFD)
    assert read_table(text, text=True) == NFC and read_table(text) == NFD
    entries, _ = make_raw_list(str(tmp_path / "wav.scp"), text)
    assert [e["txt"] for e in entries] == list(NFC.values()) and entries[0]["wav"] == decomposed_path
    line = json.dumps({"key": "u1", "wav": "a.wav", "txt": NFD["u1"]}, ensure_ascii=False)
    assert parse_raw({"line": line})["txt"] == NFC["u1"]
    (tmp_path / "data.list").write_text(line + "\n", encoding="utf-8")
    assert read_transcripts(str(tmp_path / "data.list"), "raw") == [("u1", NFC["u1"])]
    shard = tmp_path / "shard.tar"
    with tarfile.open(shard, "w") as tar:
        member = tmp_path / "u1.txt"
        member.write_text(NFD["u1"], encoding="utf-8")
        tar.add(member, arcname="u1.txt")
    (tmp_path / "shard.list").write_text(json.dumps({"shard": str(shard), "num_utts": 1}) + "\n")
    assert read_transcripts(str(tmp_path / "shard.list"), "shard") == [("u1", NFC["u1"])]
    assert collect_char_units(text) == collect_char_units(write_text(tmp_path / "text_nfc", NFC))
