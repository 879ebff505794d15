"""toolkit.bin.recognize on real tiny_fsdd clips: every mode gives each utterance the same text at batch sizes 1 and
2, and a clip under the encoder's 7-frame receptive field decodes to an empty hypothesis, named in the log, instead
of stopping the run (the attention-batch-dependence and short-clip-decode cases)."""

import json
import os
import subprocess
import sys

import pytest
import torch
import yaml

from toolkit.models.registry import init_model
from toolkit.text.tokenizer import write_symbol_table
from toolkit.utils.checkpoint import save_checkpoint

from test.helpers import REPO_ROOT

MODES = ["ctc_greedy_search", "ctc_prefix_beam_search", "attention", "attention_rescoring"]


@pytest.mark.parametrize("bidirectional", [False, True])
def test_every_mode_is_independent_of_the_batch_and_survives_a_short_clip(tmp_path, bidirectional):
    write_symbol_table(list("EFGHINORSTUVWXZ") + ["\u2581"], str(tmp_path / "units.txt"))
    conf = yaml.safe_load(open(os.path.join(REPO_ROOT, "examples", "english", "s0", "conf", "train_tiny.yaml")))
    conf.update(cmvn=None, output_dim=19, input_dim=80)
    conf["tokenizer_conf"]["symbol_table_path"] = str(tmp_path / "units.txt")
    conf["encoder_conf"].update(output_size=32, num_blocks=1, linear_units=32)
    conf["decoder_conf"].update(linear_units=32)
    if bidirectional:  # U2++: attention rescoring adds the right-to-left decoder's score, weighted 0.3
        conf["decoder"] = "bitransformer"
        conf["decoder_conf"]["r_num_blocks"] = 1
        conf["model_conf"]["reverse_weight"] = 0.3
    conf["dataset_conf"]["pad_conf"] = {"min_length": 0}  # the recipe's padding would give the short clip frames
    torch.manual_seed(0)
    model = init_model(conf)
    with torch.no_grad():
        for decoder in model.decoder.modules():
            if hasattr(decoder, "output_layer"):
                decoder.output_layer.bias[18] = -30.0  # an untrained model that rarely says <eos>
    save_checkpoint(str(tmp_path / "m.pt"), {"model": model.state_dict()}, {"tag": "test"})
    yaml.safe_dump(conf, open(tmp_path / "train.yaml", "w"))
    wav = os.path.join(REPO_ROOT, "corpora", "tiny_fsdd", "wav")
    rows = [{"key": "theo-6-00", "wav": f"{wav}/theo-6-00.wav", "txt": "SIX"},
            {"key": "short60ms", "wav": f"{wav}/theo-2-00.wav", "txt": "TWO", "start": 0.1, "end": 0.16},
            {"key": "theo-2-00", "wav": f"{wav}/theo-2-00.wav", "txt": "TWO"}]
    (tmp_path / "test.list").write_text("".join(json.dumps(row) + "\n" for row in rows))
    texts = {}

    def recognize(batch_size: int, *options: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "toolkit.bin.recognize", "--config", str(tmp_path / "train.yaml"), "--checkpoint",
             str(tmp_path / "m.pt"), "--test_data", str(tmp_path / "test.list"), "--result_dir",
             str(tmp_path / f"bs{batch_size}"), "--modes", *MODES, "--beam_size", "4", "--batch_size",
             str(batch_size), *options], capture_output=True, text=True, timeout=300,
            env={**os.environ, "PYTHONPATH": str(REPO_ROOT), "OMP_NUM_THREADS": "1"})

    for batch_size in (1, 2):  # at 2 the 4-frame clip is padded next to the 47-frame one
        proc = recognize(batch_size)
        assert proc.returncode == 0, proc.stderr[-4000:]
        summary = json.load(open(tmp_path / f"bs{batch_size}" / "decode_summary.json"))
        assert summary["search"]["reverse_weight"] == (0.3 if bidirectional else 0.0)
        assert "short60ms: under 7 fbank frames, no encoder frame: empty hypothesis" in proc.stderr
        assert "1 utterance(s) too short for the encoder got an empty hypothesis" in proc.stderr
        texts[batch_size] = {mode: dict(line.rstrip("\n").split(" ", 1)
                                        for line in open(tmp_path / f"bs{batch_size}" / mode / "text"))
                             for mode in MODES}
    assert texts[1] == texts[2]
    for mode in MODES:
        assert texts[1][mode]["short60ms"] == "", mode
        assert texts[1][mode]["theo-6-00"] != "", mode
    # With no <eos> the attention output runs to the utterance's own limit: 11 and 4 encoder frames.
    assert len(texts[1]["attention"]["theo-6-00"]) == 11 and len(texts[1]["attention"]["theo-2-00"]) == 4
    # A right-to-left weight for a model without that decoder: one line, before any decoding.
    if not bidirectional:
        proc = recognize(1, "--reverse_weight", "0.5")
        assert proc.returncode != 0
        assert ("--reverse_weight 0.5: must be in [0, 1], and > 0 only for a model with the bidirectional decoder"
                in proc.stderr.strip().splitlines()[-1])
