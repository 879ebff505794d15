"""A tensorboard folder per model dir: two runs whose model dirs share a folder name keep both their curves, and a
resume into the same model dir still purges its own abandoned points."""

import os

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from toolkit.utils.tensorboard_writer import init_summarywriter, run_log_dir


def log(tensorboard_dir, model_dir, purge_step, points):
    writer = init_summarywriter(str(tensorboard_dir), str(model_dir), purge_step=purge_step)
    for step, value in points:
        writer.add_scalar("cv/loss", value, step)
    writer.close()


def curve(run_dir):
    events = EventAccumulator(str(run_dir))
    events.Reload()
    return [(e.step, e.value) for e in events.Scalars("cv/loss")]


def test_two_model_dirs_with_one_folder_name_keep_both_curves(tmp_path):
    # The tensorboard-same-name case: exp/char/conformer (steps 2, 4), then a fresh exp/bpe/conformer (step 2).
    tb = tmp_path / "tensorboard"
    char, bpe = tmp_path / "exp" / "char" / "conformer", tmp_path / "exp" / "bpe" / "conformer"
    log(tb, char, 1, [(2, 1.5), (4, 1.25)])
    log(tb, bpe, 1, [(2, 3.0)])
    assert run_log_dir(str(tb), str(char)) == str(tb / "exp" / "char" / "conformer")
    assert curve(tb / "exp" / "char" / "conformer") == [(2, 1.5), (4, 1.25)]
    assert curve(tb / "exp" / "bpe" / "conformer") == [(2, 3.0)]


def test_a_resume_into_the_same_model_dir_purges_its_own_later_points(tmp_path):
    tb, exp = tmp_path / "tb", tmp_path / "exp"
    log(tb, exp, 1, [(2, 1.5), (4, 1.25), (6, 1.0)])
    log(tb, exp, 3, [(4, 1.125)])  # resumed from step 2: steps 4 and 6 of the abandoned run are hidden
    assert curve(tb / "exp") == [(2, 1.5), (4, 1.125)]


def test_model_dirs_outside_the_tensorboard_dirs_folder_keep_their_whole_path(tmp_path, monkeypatch):
    # One absolute tensorboard dir for two recipes, each with its exp/conformer.
    tb = tmp_path / "shared" / "tb"
    one, two = (tmp_path / recipe / "exp" / "conformer" for recipe in ("recipe1", "recipe2"))
    assert run_log_dir(str(tb), str(one)) == os.path.join(tb, "abs", str(one).lstrip(os.sep))
    assert run_log_dir(str(tb), str(one)) != run_log_dir(str(tb), str(two))
    tb.mkdir(parents=True)
    monkeypatch.chdir(tmp_path / "shared")
    assert run_log_dir("tb", "exp/conformer") == os.path.join("tb", "exp", "conformer")  # relative paths too
    one.parent.mkdir(parents=True)
    os.symlink(one.parent, tmp_path / "shared" / "link")
    assert run_log_dir("tb", "link/conformer") == run_log_dir("tb", str(one))  # one folder, however it is reached
