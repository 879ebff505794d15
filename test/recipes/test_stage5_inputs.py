"""What stage 5 of the recipe decodes with: recognize.py refuses a symbol table that does not fit the model (the
dict-model-mismatch case) or that is itself broken, with one log line and exit status 2, before it writes any
result; so is a word LM KenLM cannot read, and one it can is fused as given; ``run.sh --average_num 0`` decodes the
newest committed epoch by its number."""

import json
import os
import subprocess
import sys

import torch
import yaml

from toolkit.models.registry import init_model
from toolkit.text.tokenizer import write_symbol_table
from toolkit.utils.checkpoint import load_checkpoint, save_checkpoint

from test.helpers import REPO_ROOT

UNITS = list("EFGHINORSTUVWXZ") + ["▁"]  # tiny_fsdd's letters: 19 symbols with <blank>, <unk>, <sos/eos>


def make_model(tmp_path, checkpoint="m.pt"):
    """A random-init tiny conformer with 19 outputs (``checkpoint``), its train.yaml and a 2-utterance tiny_fsdd test
    list, all in ``tmp_path``."""
    write_symbol_table(UNITS, str(tmp_path / "units19.txt"))
    write_symbol_table([u for u in UNITS if u != "X"], str(tmp_path / "units18.txt"))
    (tmp_path / "dup.txt").write_text((tmp_path / "units19.txt").read_text().replace("F 3\n", "F 2\n"))
    conf = yaml.safe_load(open(REPO_ROOT / "examples/english/s0/conf/train_tiny.yaml"))
    conf.update(cmvn=None, output_dim=19, input_dim=80)
    conf["tokenizer_conf"]["symbol_table_path"] = str(tmp_path / "units19.txt")
    conf["encoder_conf"].update(output_size=32, num_blocks=1, linear_units=32)
    conf["decoder_conf"].update(linear_units=32)
    torch.manual_seed(0)
    save_checkpoint(str(tmp_path / checkpoint), {"model": init_model(conf).state_dict()}, {"tag": "x"})
    yaml.safe_dump(conf, open(tmp_path / "train.yaml", "w"))
    with open(tmp_path / "test.list", "w") as f:
        for key in ("theo-0-00", "theo-1-00"):
            wav = str(REPO_ROOT / f"corpora/tiny_fsdd/wav/{key}.wav")
            f.write(json.dumps({"key": key, "wav": wav, "txt": "ZERO"}) + "\n")


def decode(tmp_path, table, *options, result="result", modes=("ctc_greedy_search",)):
    cmd = [sys.executable, "-m", "toolkit.bin.recognize", "--config", str(tmp_path / "train.yaml"),
           "--checkpoint", str(tmp_path / "m.pt"), "--test_data", str(tmp_path / "test.list"),
           "--result_dir", str(tmp_path / f"{result}-{table}"), "--modes", *modes,
           "--override_config", f"tokenizer_conf.symbol_table_path {tmp_path / table}", *options]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=REPO_ROOT,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})


def test_a_table_that_does_not_fit_the_model_is_refused_in_one_line(tmp_path):
    make_model(tmp_path)
    control = decode(tmp_path, "units19.txt")
    assert control.returncode == 0, control.stderr[-2000:]
    assert len((tmp_path / "result-units19.txt" / "ctc_greedy_search" / "text").read_text().splitlines()) == 2
    expected = {"units18.txt": "units18.txt has 18 symbols (<sos/eos> = 17), but the model "
                               f"({tmp_path / 'train.yaml'}) has output_dim 19 (<sos/eos> = 18)",
                "dup.txt": "dup.txt:4: id 2 already on line 3"}
    for table, message in expected.items():
        proc = decode(tmp_path, table)
        assert proc.returncode == 2
        errors = [line for line in proc.stderr.splitlines() if line.strip()]
        assert len(errors) == 1 and " ERROR " in errors[0] and message in errors[0], proc.stderr[-2000:]
        assert not (tmp_path / f"result-{table}").exists()


def test_a_word_lm_is_used_as_given_and_a_file_kenlm_cannot_read_is_refused_in_one_line(tmp_path):
    make_model(tmp_path)
    lm, spelling = tmp_path / "lm.arpa", tmp_path / "spelling.arpa"
    for path, options in ((lm, []), (spelling, ["--spelling", "--order", "4"])):
        subprocess.run([sys.executable, str(REPO_ROOT / "tools/train_ngram_lm.py"), *options,
                        str(REPO_ROOT / "corpora/tiny_fsdd/data/train/text"), str(path)], check=True,
                       capture_output=True, timeout=60)
    modes = ("ctc_prefix_beam_search", "attention_rescoring")
    proc = decode(tmp_path, "units19.txt", "--lm", str(lm), "--lm_weight", "0.7", "--word_bonus", "1",
                  "--oov_penalty", "-10", "--spelling_lm", str(spelling), modes=modes)
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads((tmp_path / "result-units19.txt" / "decode_summary.json").read_text())
    assert summary["lm"] == {"path": str(lm), "lm_weight": 0.7, "word_bonus": 1.0, "oov_penalty": -10.0,
                             "spelling_lm": str(spelling)}
    assert (f"word LM {lm}: 3-gram, weight 0.7, word bonus 1.0, OOV penalty -10.0, spelling LM {spelling}"
            in proc.stderr)
    for mode in modes:
        assert len((tmp_path / "result-units19.txt" / mode / "text").read_text().splitlines()) == 2
    broken = tmp_path / "broken.arpa"
    broken.write_text("not an ARPA file\n")
    proc = decode(tmp_path, "units19.txt", "--lm", str(broken), result="unused")  # greedy search: LM not loaded
    assert proc.returncode == 0 and "not loaded, since none of --modes uses an LM" in proc.stderr, proc.stderr[-2000:]
    proc = decode(tmp_path, "units19.txt", "--lm", str(broken), result="broken", modes=modes)
    errors = [line for line in proc.stderr.splitlines() if " ERROR " in line]
    assert proc.returncode == 2 and len(errors) == 1 and f"--lm {broken}: " in errors[0], proc.stderr[-2000:]
    proc = decode(tmp_path, "units19.txt", "--lm", str(lm), "--spelling_lm", str(broken), result="broken", modes=modes)
    errors = [line for line in proc.stderr.splitlines() if " ERROR " in line]
    assert proc.returncode == 2 and len(errors) == 1 and f"--spelling_lm {broken}: " in errors[0], proc.stderr[-2000:]
    assert not (tmp_path / "broken-units19.txt").exists()


def test_an_all_empty_decoding_and_lm_settings_without_an_lm_are_reported(tmp_path):
    make_model(tmp_path)
    state = load_checkpoint(str(tmp_path / "m.pt"))
    state["model"]["ctc.ctc_lo.bias"][0] = 1e4  # blank wins every frame: every CTC hypothesis is empty
    save_checkpoint(str(tmp_path / "m.pt"), state, {"tag": "blank"})
    proc = decode(tmp_path, "units19.txt", "--lm_weight", "0.3")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "--lm_weight given without --lm: decoding without LM" in proc.stderr
    assert "ctc_greedy_search: every hypothesis is empty" in proc.stderr
    summary = json.loads((tmp_path / "result-units19.txt" / "decode_summary.json").read_text())
    assert summary["empty_hypotheses"] == {"ctc_greedy_search": 2} and summary["lm"] is None


def test_the_all_empty_hint_is_true_to_the_options_given_and_no_mode_is_one_line(tmp_path):
    make_model(tmp_path)
    state = load_checkpoint(str(tmp_path / "m.pt"))
    state["model"]["ctc.ctc_lo.bias"][0] = 1e4  # blank wins every frame: every CTC hypothesis is empty
    save_checkpoint(str(tmp_path / "m.pt"), state, {"tag": "blank"})
    lm = tmp_path / "lm.arpa"
    subprocess.run([sys.executable, str(REPO_ROOT / "tools/train_ngram_lm.py"),
                    str(REPO_ROOT / "corpora/tiny_fsdd/data/train/text"), str(lm)], check=True, capture_output=True,
                   timeout=60)
    for penalty, hint in (("0", "; or the LM at --lm_weight 0.5: compare a decoding without --lm)"),
                          ("-5", "; with --lm, --oov_penalty -5 then prefers no word to a misspelt one: try "
                                 "--oov_penalty 0)")):
        proc = decode(tmp_path, "units19.txt", "--lm", str(lm), "--oov_penalty", penalty, result=f"penalty{penalty}",
                      modes=("ctc_greedy_search", "ctc_prefix_beam_search"))
        assert proc.returncode == 0, proc.stderr[-2000:]
        lines = [line for line in proc.stderr.splitlines() if "every hypothesis is empty" in line]
        assert len(lines) == 2 and lines[0].endswith("ctc_greedy_search: every hypothesis is empty (a model that "
                                                     "has not learnt to spell yet)"), lines  # no LM in that mode
        assert lines[1].endswith(f"ctc_prefix_beam_search: every hypothesis is empty (a model that has not learnt to "
                                 f"spell yet{hint}"), lines
    for modes in ([""], ["ctc_greedy_search", "beam"]):
        proc = decode(tmp_path, "units19.txt", result="none", modes=modes)
        errors = [line for line in proc.stderr.splitlines() if line.strip()]
        problem = "no mode given" if modes == [""] else "unknown mode(s) ['beam']"
        assert proc.returncode == 2 and len(errors) == 1 and errors[0].endswith(
            f"--modes: {problem}; choose one or more of ['ctc_greedy_search', 'ctc_prefix_beam_search', 'attention', "
            "'attention_rescoring']"), proc.stderr[-2000:]
    assert not (tmp_path / "none-units19.txt").exists()


def test_average_num_0_decodes_the_newest_epoch_by_number(tmp_path):
    """A model dir with "_" in its name once made ``sort -t_`` pick epoch_9 over epoch_10."""
    model_dir = tmp_path / "my_exp_dir"
    model_dir.mkdir()
    make_model(model_dir, "epoch_10.pt")
    save_checkpoint(str(model_dir / "epoch_9.pt"), {"model": {}}, {"epoch": 9})  # decoding it would fail
    save_checkpoint(str(model_dir / "epoch_11.pt"), {"model": {}}, {"epoch": 11})
    os.remove(model_dir / "epoch_11.yaml")  # an unfinished save: never decoded
    data = tmp_path / "data" / "test_fsdd"
    data.mkdir(parents=True)
    os.replace(model_dir / "test.list", data / "data.list")
    (data / "text").write_text("theo-0-00 ZERO\ntheo-1-00 ONE\n")
    proc = subprocess.run(["bash", str(REPO_ROOT / "run.sh"), "--stage", "5", "--stop_stage", "5", "--average_num", "0",
                           "--corpora", "fsdd", "--data", str(tmp_path / "data"), "--dir", str(model_dir),
                           "--decode_modes", "ctc_greedy_search", "--nproc_per_node", "1", "--lm_order", "0"],
                          capture_output=True, text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert f"stage 5: decoding the newest epoch as it is: {model_dir}/epoch_10.pt" in proc.stdout
    assert len((model_dir / "test_fsdd" / "ctc_greedy_search" / "text").read_text().splitlines()) == 2
