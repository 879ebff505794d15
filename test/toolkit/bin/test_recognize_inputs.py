"""toolkit.bin.recognize decodes every readable utterance of a test list (issue 45): one longer than the positional
encodings' 5000 stored positions (the long-clip-decode case: 205 s, 5,125 encoder frames) no longer stops the job,
and the transcript is the reference of the score, never an input (the decode-empty-transcript case): an empty one,
one of units outside the dictionary and one over ``token_max_length`` are decoded like the others and scored."""

import json

import numpy as np
import pytest
import soundfile as sf

from toolkit.utils.metrics import score

from test.helpers import REPO_ROOT
from test.multiprocess.workers.recognize_setup import fsdd_test_entries, run_recognize, write_list, write_model

LONG_S = 205.0  # 20,500 fbank frames, 5,125 encoder frames after conv2d: past the 5,000 stored positions
MODES = ["ctc_greedy_search", "attention_rescoring"]


def _long_clip(path) -> dict:
    """The tiny_fsdd clips, repeated with 0.3 s of silence between them, to LONG_S seconds of real speech."""
    entries, pieces, words, total = fsdd_test_entries(), [], [], 0.0
    while total < LONG_S:
        entry = entries[len(words) % len(entries)]
        audio, rate = sf.read(entry["wav"], dtype="float32")
        pieces += [audio, np.zeros(4800, dtype=np.float32)]
        words.append(entry["txt"])
        total += len(audio) / rate + 0.3
    sf.write(path, np.concatenate(pieces), 16000)
    return {"key": "long_clip", "wav": str(path), "txt": " ".join(words)}


# The slow tier: 205 s of audio through the encoder's attention (5,125 x 5,125 scores) takes ~25 s on 2 busy cores.
@pytest.mark.multiprocess
def test_a_long_clip_and_any_transcript_are_decoded_and_scored(tmp_path):
    model = write_model(tmp_path)
    short = fsdd_test_entries()[:3]
    rows = short + [_long_clip(tmp_path / "long.wav"),
                    dict(fsdd_test_entries()[3], key="empty-reference", txt=""),
                    dict(fsdd_test_entries()[4], key="unknown-units", txt="QQQ ZZZ"),
                    dict(fsdd_test_entries()[5], key="many-tokens", txt=" ".join(["SEVEN"] * 60))]
    proc = run_recognize(1, model, write_list(tmp_path / "test.list", rows), tmp_path / "dec", modes=MODES)
    summary = json.loads((tmp_path / "dec" / "decode_summary.json").read_text())
    assert summary["skipped"] == {} and summary["utterances"]["decoded"] == len(rows), proc.stderr[-2000:]
    references = {row["key"]: row["txt"] for row in rows}
    for mode in MODES:
        lines = (tmp_path / "dec" / mode / "text").read_text(encoding="utf-8").splitlines()
        hyps = dict((line.split(" ", 1) + [""])[:2] for line in lines)
        assert list(hyps) == list(references), mode  # every utterance, in the list's order
        assert hyps["long_clip"] and hyps["empty-reference"], mode  # the untrained model says something
        # the counts are those of the written hypotheses: the empty reference's words are insertions
        expected = score(references, hyps, "word").totals
        assert summary["scores"][mode]["word"] == dict(zip("NCSDI", expected.as_tuple())), mode
        alone = score({"empty-reference": ""}, {"empty-reference": hyps["empty-reference"]}, "word").totals
        assert alone.as_tuple() == (0, 0, 0, 0, len(hyps["empty-reference"].split()))
