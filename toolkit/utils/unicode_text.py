"""The toolkit's one Unicode normalisation of text: NFC (Unicode Standard Annex #15).

The same words can be written as different code points: ``É`` precomposed (U+00C9) or as ``E`` plus a combining
acute accent (U+0301), what an editor, a macOS file system or another tool's normalisation may produce. They render
identically and must count as equal text, so every place where text enters the toolkit passes it through
:func:`normalize_unicode`: Kaldi ``text`` files (:func:`toolkit.utils.kaldi_files.read_table` with ``text=True``),
data.list and shard transcripts, the units ``tools/make_dict.py`` and ``tools/spm_train.py`` learn, both
tokenizers, the word and spelling LM builder, the scorer (WER/CER) and the hypotheses ``toolkit.bin.recognize``
writes. Symbol tables and ARPA files whose symbols are not NFC are refused, since normalised text never reaches them.

NFC, not NFKC: compatibility characters (``ﬁ``, ``²``, full-width letters) are distinct text and stay as written.
"""

import unicodedata

NORMAL_FORM = "NFC"


def normalize_unicode(text: str) -> str:
    """``text`` in Unicode normal form NFC (canonically equivalent sequences become the same code points:
    ``"E\\u0301"`` -> ``"\\u00c9"``); already-normal text, such as ASCII, is returned unchanged."""
    return unicodedata.normalize(NORMAL_FORM, text)


def is_normalized(text: str) -> bool:
    """Whether ``text`` is already in the form :func:`normalize_unicode` gives."""
    return unicodedata.is_normalized(NORMAL_FORM, text)
