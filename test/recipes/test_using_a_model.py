"""What a user does with the model dir ``bash run.sh`` trained (issue 47), on the session's FSDD recipe run
(``fsdd_recipe``): the dir holds every file decoding reads and the recipe's decoding settings (decode.yaml);
``toolkit.load_model(...).transcribe`` gives recognize.py's hypotheses of stage 5 with them; a copy of the dir
elsewhere transcribes the same from the command line; word times fall on the speech of known position."""

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import soundfile as sf
import yaml

import toolkit
from toolkit.dataset.data_list import read_transcripts

from test.helpers import kaldi_entries
from test.multiprocess.workers.recipe_data import ENV

TOLERANCE_S = 0.2
MODES = ("ctc_greedy_search", "attention_rescoring")  # the fixture's --decode_modes


def test_the_model_dir_holds_what_decoding_reads(fsdd_recipe):
    exp = fsdd_recipe.exp
    saved = yaml.safe_load((exp / "train.yaml").read_text())
    assert saved["tokenizer_conf"] == {"symbol_table_path": str(exp / "units.txt")}
    assert saved["cmvn_conf"] == {"cmvn_file": str(exp / "global_cmvn")}
    assert (exp / "units.txt").read_bytes() == (fsdd_recipe.data / "dict" / "units.txt").read_bytes()
    assert (exp / "global_cmvn").read_bytes() == (fsdd_recipe.data / "train" / "global_cmvn").read_bytes()
    decode = yaml.safe_load((exp / "decode.yaml").read_text())
    assert decode == {"checkpoint": "avg_3.pt", "mode": "attention_rescoring", "beam_size": 20, "length_penalty": 2.0,
                      "decoding_chunk_size": -1, "num_decoding_left_chunks": -1, "lm": "lm/lm_3gram.arpa",
                      "lm_weight": 0.3, "word_bonus": 0.5, "oov_penalty": 0,
                      "spelling_lm": "lm/spelling_6gram_30000common.arpa"}
    assert (exp / "lm" / "lm_3gram.arpa").read_bytes() == (fsdd_recipe.data / "lm" / "lm_3gram.arpa").read_bytes()
    summary = json.loads((exp / "test_fsdd" / "decode_summary.json").read_text())  # stage 5 decoded with them
    assert summary["lm"]["lm_weight"] == 0.3 and summary["search"]["beam_size"] == 20
    assert summary["checkpoint"] == str(exp / "avg_3.pt")


def test_transcribe_gives_stage_5s_hypotheses(fsdd_recipe):
    data_list = fsdd_recipe.data / "test_fsdd" / "data.list"
    lines = [json.loads(line) for line in data_list.read_text().splitlines()[:20]]
    assert [key for key, _ in read_transcripts(str(data_list), "raw")[:20]] == [line["key"] for line in lines]
    for mode in MODES:
        model = toolkit.load_model(str(fsdd_recipe.exp), mode=mode)
        expected = dict(line.split(" ", 1) for line in
                        (fsdd_recipe.exp / "test_fsdd" / mode / "text").read_text().splitlines())
        got = {line["key"]: model.transcribe(line["wav"], key=line["key"]).text for line in lines}
        assert got == {key: expected[key] for key in got}, mode


def joined_digits(path, entries: list[dict], silence_s: float = 0.5) -> list[tuple[str, float, float]]:
    """The clips of ``entries`` joined into one file at ``path``, each after ``silence_s`` of low noise (a quiet
    room's, 1e-4 of full scale) and the last followed by it: ``(digit, clip start s, clip end s)`` per clip."""
    rng = np.random.default_rng(0)
    pieces, bounds, t = [], [], 0.0
    for entry in entries:
        audio, rate = sf.read(entry["wav"], dtype="float32")
        pieces += [rng.normal(0, 1e-4, round(silence_s * rate)).astype(np.float32), audio]
        t += silence_s
        bounds.append((entry["txt"], t, t + len(audio) / rate))
        t += len(audio) / rate
    pieces.append(rng.normal(0, 1e-4, round(silence_s * rate)).astype(np.float32))
    sf.write(path, np.concatenate(pieces), rate)
    return bounds


def word_times_off(model, tmp_path, entries: list[dict]) -> list[str]:
    """What is wrong with the word times of ``entries`` joined (:func:`joined_digits`): one line per recognised word
    that is not the n-th clip's place within TOLERANCE_S, or a count of words other than of clips."""
    bounds = joined_digits(tmp_path / "digits.flac", entries)
    words = model.transcribe(tmp_path / "digits.flac").words
    off = [] if len(words) == len(bounds) else [f"{len(words)} words for {len(bounds)} clips: {words}"]
    for word, (digit, start, end) in zip(words, bounds):
        if not start - TOLERANCE_S <= word.start < word.end <= end + TOLERANCE_S:
            off.append(f"{word} is not within {TOLERANCE_S} s of {digit} at {start:.3f}-{end:.3f} s")
    return off


# NOTE: measured 2026-12-07: the recipe's tiny FSDD model cannot place words: trained on single words trimmed to the
# speech, its units hold no word boundary (joined digits come out as one word), and its CTC emits a clip's first
# letters in the first encoder frames whatever the silence before them (FIVE after 0.6 s of silence: F I V at 0-120
# ms), so no word of it is within 0.2 s of its clip. The same check passes on a model of the default recipe's corpora (4,
# u2pp conformer, 20 epochs): six tiny_fsdd clips joined with 0.5 s silences, each of its six words within 0.1 s of
# its clip (the farthest: ONE ending 0.097 s after it).
# The test fails (strict) once the session's recipe model places words, to be turned into a plain assertion then.
@pytest.mark.xfail(strict=True, reason="the FSDD tiny model has no word boundary unit and does not localise letters")
def test_word_times_fall_on_their_clip(fsdd_recipe, tmp_path):
    model = toolkit.load_model(str(fsdd_recipe.exp), mode="ctc_greedy_search")
    assert word_times_off(model, tmp_path, kaldi_entries("tiny_fsdd", "test")[::3][:6]) == []


def test_a_copied_model_dir_transcribes_from_the_command_line(fsdd_recipe, tmp_path):
    copy = tmp_path / "shipped" / "model"
    copy.mkdir(parents=True)
    for name in ("train.yaml", "units.txt", "global_cmvn", "decode.yaml", "lm", "avg_3.pt"):  # avg_3.yaml left out
        (shutil.copytree if (fsdd_recipe.exp / name).is_dir() else shutil.copy)(fsdd_recipe.exp / name, copy / name)
    entries = kaldi_entries("tiny_fsdd", "test")[:4]
    proc = subprocess.run([sys.executable, "-m", "toolkit.bin.transcribe", "--model_dir", "shipped/model",
                           "--format", "jsonl", *[e["wav"] for e in entries]], cwd=tmp_path, capture_output=True,
                          text=True, timeout=300, env=ENV)
    assert proc.returncode == 0, proc.stderr[-2000:]
    warnings = [line for line in proc.stderr.splitlines() if line.startswith("WARNING")]
    assert len(warnings) == 1 and "no avg_3.yaml beside it" in warnings[0], proc.stderr
    model = toolkit.load_model(str(fsdd_recipe.exp))
    for entry, line in zip(entries, proc.stdout.splitlines(), strict=True):
        assert json.loads(line) == model.transcribe(entry["wav"]).to_dict()
    assert not os.path.exists(fsdd_recipe.exp / "shipped")
