"""The word n-gram LM tests' fixture: an LM estimated from given sentences, which the estimation tests
(test_kneser_ney.py) check through KenLM and the query tests (test_ngram_lm.py) decode with."""
import kenlm
import pytest

from toolkit.text.kneser_ney import kneser_ney_arpa


@pytest.fixture
def estimated_lm(tmp_path):
    """``make(sentences, order, name="lm.arpa", prior=None) -> (kenlm.Model, path)``: the ARPA file
    :func:`kneser_ney_arpa` estimates from ``sentences``, written to ``tmp_path / name`` and loaded by KenLM."""
    def make(sentences, order, name="lm.arpa", prior=None):
        path = tmp_path / name
        path.write_text(kneser_ney_arpa(sentences, order, prior), encoding="utf-8")
        return kenlm.Model(str(path)), path

    return make
