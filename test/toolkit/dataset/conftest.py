"""Fixtures shared by the dataset tests."""

import pytest

from toolkit.text.tokenizer import CharTokenizer, write_symbol_table


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    """A character tokenizer of the upper-case letters, the apostrophe and the word marker, without Q and Z (so an
    utterance of "ZERO" is skipped as ``unknown_token``)."""
    path = tmp_path_factory.mktemp("dict") / "units.txt"
    write_symbol_table(sorted(set("ABCDEFGHIJKLMNOPRSTUVWXY'") | {"▁"}), str(path))
    return CharTokenizer(str(path))
