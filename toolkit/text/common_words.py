"""The most frequent words of a language, from wordfreq (Speer, 2022: its English list merges Wikipedia, subtitles,
news, books, web text and social media; data CC BY-SA 4.0), as a prior that gives the word n-gram LM
(:mod:`toolkit.text.kneser_ney`) the words its training transcripts lack."""
from typing import Iterable

import wordfreq

from toolkit.utils.unicode_text import normalize_unicode


def common_words(count: int, alphabet: Iterable[str], upper: bool, language: str = "en") -> dict[str, float]:
    """The ``count`` most frequent words of ``language`` (its wordfreq "large" list) that ``alphabet`` spells, with
    their frequencies: a prior for :func:`toolkit.text.kneser_ney.kneser_ney_arpa`.

    Args:
        count: words to take, >= 1 (fewer when the list runs out).
        alphabet: the characters the words may hold (the transcripts' own); words with any other are skipped.
        upper: upper-case the list's (lower-case) words first, for upper-case transcripts.

    Returns:
        ``{word: frequency}`` (frequency per word of running text, > 0), most frequent first; words in Unicode NFC.

    Raises:
        ValueError: ``count`` < 1.
        LookupError: ``language`` has no wordfreq "large" list.
    """
    if count < 1:
        raise ValueError(f"the number of common words must be >= 1, got {count}")
    allowed = set(alphabet)
    words: dict[str, float] = {}
    for word in wordfreq.iter_wordlist(language, wordlist="large"):
        spelt = normalize_unicode(word.upper() if upper else word)
        if set(spelt) <= allowed and spelt not in words:
            words[spelt] = wordfreq.word_frequency(word, language, wordlist="large")
            if len(words) == count:
                break
    return words
