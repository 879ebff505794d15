import os

import pytest
import torch

from toolkit.utils.checkpoint import (check_model_state, finite_cv_loss, list_checkpoints, load_checkpoint, load_info,
                                      newest_checkpoint, save_checkpoint)
from toolkit.utils.config_parsing import ConfigError


def test_save_then_load_round_trip(tmp_path):
    state = {"model": {"w": torch.arange(6.0).reshape(2, 3)}}
    save_checkpoint(str(tmp_path / "epoch_0.pt"), state, {"epoch": 0, "cv_loss": 1.5})
    loaded = load_checkpoint(str(tmp_path / "epoch_0.pt"))
    assert torch.equal(loaded["model"]["w"], state["model"]["w"])
    assert load_info(str(tmp_path / "epoch_0.pt")) == {"epoch": 0, "cv_loss": 1.5}
    assert [f for f in os.listdir(tmp_path) if f.startswith(".tmp")] == []


def test_a_pt_without_its_yaml_is_an_unfinished_save(tmp_path):
    for epoch in (0, 1, 10, 2):
        save_checkpoint(str(tmp_path / f"epoch_{epoch}.pt"), {"model": {}}, {"epoch": epoch})
    os.unlink(tmp_path / "epoch_2.yaml")  # as if killed between the .pt and the commit marker
    assert [os.path.basename(p) for p in list_checkpoints(str(tmp_path))] == ["epoch_0.pt", "epoch_1.pt",
                                                                              "epoch_10.pt"]
    with pytest.raises(FileNotFoundError, match="never finished"):
        load_checkpoint(str(tmp_path / "epoch_2.pt"))


def test_each_checkpoint_file_is_listed_once_under_its_trainer_name(tmp_path, caplog):
    for epoch in range(4):
        save_checkpoint(str(tmp_path / f"epoch_{epoch}.pt"), {"model": {}}, {"epoch": epoch, "step": 10 * epoch})
    for ext in ("pt", "yaml"):
        os.symlink(f"epoch_3.{ext}", tmp_path / f"epoch_best.{ext}")  # a second name, first in the listing
        os.link(tmp_path / f"epoch_1.{ext}", tmp_path / f"epoch_01.{ext}")  # a hard link, also in the scheme
        os.symlink(f"epoch_2.{ext}", tmp_path / f"epoch_9.{ext}")  # a symbolic link in the scheme
        os.symlink(f"gone.{ext}", tmp_path / f"epoch_7.{ext}")  # dangling: no checkpoint
    (tmp_path / "epoch_copy.pt").write_bytes((tmp_path / "epoch_0.pt").read_bytes())  # a copy under another name
    (tmp_path / "epoch_copy.yaml").write_bytes((tmp_path / "epoch_0.yaml").read_bytes())
    names = [os.path.basename(p) for p in list_checkpoints(str(tmp_path))]
    assert names == ["epoch_0.pt", "epoch_1.pt", "epoch_2.pt", "epoch_3.pt"]
    assert "epoch_3.pt, epoch_best.pt (one file): counted once, as epoch_3.pt" in caplog.text
    assert "epoch_01.pt, epoch_1.pt (one file): counted once, as epoch_1.pt" in caplog.text
    assert "epoch_2.pt, epoch_9.pt (one file): counted once, as epoch_2.pt" in caplog.text
    assert "left out epoch_copy.pt: not named epoch_N.pt" in caplog.text
    assert newest_checkpoint(str(tmp_path)) == str(tmp_path / "epoch_3.pt")


def test_failed_write_keeps_the_previous_file(tmp_path):
    path = str(tmp_path / "epoch_0.pt")
    save_checkpoint(path, {"model": {"w": torch.ones(2)}}, {"epoch": 0})

    class Unpicklable:
        def __reduce__(self):
            raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        save_checkpoint(path, {"model": {"w": Unpicklable()}}, {"epoch": 1})
    assert torch.equal(load_checkpoint(path)["model"]["w"], torch.ones(2))
    assert load_info(path)["epoch"] == 0
    assert [f for f in os.listdir(tmp_path) if f.startswith(".tmp")] == []


def test_a_crash_while_overwriting_never_pairs_new_weights_with_the_old_metadata(tmp_path, monkeypatch):
    import toolkit.utils.checkpoint as checkpoint

    path = str(tmp_path / "epoch_3.pt")
    save_checkpoint(path, {"model": {"w": torch.ones(2)}}, {"epoch": 3, "cv_loss": 9.0})
    writes = []

    def crash_at_the_yaml(target, write, mode="wb", before_replace=None):
        writes.append(os.path.basename(target))
        if target.endswith(".yaml"):
            raise KeyboardInterrupt("killed before the commit marker")
        real_atomic_write(target, write, mode, before_replace)

    real_atomic_write = checkpoint.atomic_write
    monkeypatch.setattr(checkpoint, "atomic_write", crash_at_the_yaml)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(path, {"model": {"w": torch.zeros(2)}}, {"epoch": 3, "cv_loss": 4.0})
    assert writes == ["epoch_3.pt", "epoch_3.yaml"]
    assert list_checkpoints(str(tmp_path)) == []  # the new weights are not committed, and nothing claims they are
    with pytest.raises(FileNotFoundError, match="never finished"):
        load_checkpoint(path)


def test_only_a_finite_cv_loss_ranks():
    assert finite_cv_loss({"cv_loss": 1.5}) == 1.5 and finite_cv_loss({"cv_loss": 2}) == 2.0
    for bad in (float("nan"), float("inf"), float("-inf"), None, "nan", True):
        assert finite_cv_loss({"cv_loss": bad}) is None
    assert finite_cv_loss({}) is None


@pytest.mark.parametrize("umask, expected", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_checkpoint_files_honour_the_umask(tmp_path, umask, expected):
    # A shared model dir: a teammate or a service must read checkpoints as they read the dir's other files.
    old = os.umask(umask)
    try:
        save_checkpoint(str(tmp_path / "epoch_0.pt"), {"model": {"w": torch.ones(2)}}, {"epoch": 0})
        with open(tmp_path / "plain.txt", "w") as f:
            f.write("x")
    finally:
        os.umask(old)
    for name in ("epoch_0.pt", "epoch_0.yaml", "plain.txt"):
        assert os.stat(tmp_path / name).st_mode & 0o777 == expected, name
    assert sorted(os.listdir(tmp_path)) == ["epoch_0.pt", "epoch_0.yaml", "plain.txt"]  # no temporary file left


def test_the_newest_checkpoint_is_the_furthest_committed_step(tmp_path):
    def save(tag, step):
        save_checkpoint(str(tmp_path / f"{tag}.pt"), {"model": {}}, {"step": step, "tag": tag})

    assert newest_checkpoint(str(tmp_path)) is None
    save("init", 0)
    assert newest_checkpoint(str(tmp_path)) is None  # nothing trained yet: a restart starts over
    save("epoch_0", 5)
    save("step_4", 4)
    assert newest_checkpoint(str(tmp_path)) == str(tmp_path / "epoch_0.pt")
    save("step_8", 8)
    save("epoch_1", 10)
    save("step_10", 10)  # the epoch's last step: the epoch checkpoint also holds its cross-validation
    assert newest_checkpoint(str(tmp_path)) == str(tmp_path / "epoch_1.pt")
    save("step_12", 12)
    (tmp_path / "step_12.yaml").unlink()  # uncommitted: a save the crash interrupted
    save("epoch_9", 9)  # ordered by the steps trained, not by the number in the name
    assert newest_checkpoint(str(tmp_path)) == str(tmp_path / "epoch_1.pt")


def test_a_model_state_that_does_not_fit_is_named_by_its_first_differing_key_in_one_line():
    shapes = {"embed.weight": (64, 80), "embed.bias": (64,), "out.weight": (10, 64)}
    fits = {"embed.weight": torch.zeros(64, 80), "embed.bias": torch.zeros(64), "out.weight": torch.zeros(10, 64)}
    check_model_state(shapes, fits, "m.pt")
    wider = {"embed.weight": torch.zeros(96, 80), "embed.bias": torch.zeros(96), "out.weight": torch.zeros(10, 96)}
    with pytest.raises(ConfigError, match=r"^m\.pt holds another model than this config's: embed\.weight is \(96, 80\) "
                                          r"in the checkpoint, \(64, 80\) in this config's model \(3 keys differ\); "
                                          r"use the config it was trained with \(the train\.yaml beside it\)$"):
        check_model_state(shapes, wider, "m.pt")
    fewer_blocks = {key: value for key, value in fits.items() if key != "embed.bias"}
    with pytest.raises(ConfigError, match=r"holds another model than this config's: embed\.bias \(64,\) is not in "
                                          r"the checkpoint; use"):
        check_model_state(shapes, fewer_blocks, "m.pt")
    more_blocks = {**fits, "extra.weight": torch.zeros(3, 3)}
    with pytest.raises(ConfigError, match=r"the checkpoint's extra\.weight \(3, 3\) is not in this config's model; "):
        check_model_state(shapes, more_blocks, "m.pt")
