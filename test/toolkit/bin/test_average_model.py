import logging
import os
import subprocess
import sys

import pytest
import torch
import yaml

from toolkit.bin.average_model import average_checkpoints, main, select_checkpoints
from toolkit.utils.checkpoint import load_checkpoint, load_info, save_checkpoint
from toolkit.utils.config_parsing import ConfigError
from toolkit.utils.dir_lock import LOCK_FILE, DirLock


def write_epochs(tmp_path, cv_losses):
    for epoch, cv_loss in enumerate(cv_losses):
        state = {"model": {"w": torch.full((2,), float(epoch)), "bn.num_batches_tracked": torch.tensor(epoch)}}
        save_checkpoint(str(tmp_path / f"epoch_{epoch}.pt"), state, {"epoch": epoch, "cv_loss": cv_loss})


def test_val_best_picks_lowest_cv_loss(tmp_path):
    write_epochs(tmp_path, [9.0, 3.0, 5.0, 1.0, 7.0])
    chosen = select_checkpoints(str(tmp_path), 3, val_best=True)
    assert [p.rsplit("/", 1)[1] for p in chosen] == ["epoch_1.pt", "epoch_2.pt", "epoch_3.pt"]
    last = select_checkpoints(str(tmp_path), 2, val_best=False)
    assert [p.rsplit("/", 1)[1] for p in last] == ["epoch_3.pt", "epoch_4.pt"]


def test_average_is_the_mean_and_int_buffers_come_from_the_newest(tmp_path):
    write_epochs(tmp_path, [9.0, 3.0, 5.0, 1.0, 7.0])
    avg = average_checkpoints(select_checkpoints(str(tmp_path), 3, val_best=True))
    assert torch.equal(avg["w"], torch.full((2,), 2.0))  # (1 + 2 + 3) / 3
    assert int(avg["bn.num_batches_tracked"]) == 3


def test_cli_writes_a_committed_checkpoint(tmp_path):
    write_epochs(tmp_path, [2.0, 1.0])
    dst = str(tmp_path / "avg_2.pt")
    main(["--src_path", str(tmp_path), "--num", "2", "--val_best", "--dst_model", dst])
    assert torch.equal(load_checkpoint(dst)["model"]["w"], torch.full((2,), 0.5))
    assert len(load_info(dst)["averaged"]) == 2


KEY = "encoder.proj.weight"


def write_states(tmp_path, states, cv_losses=None):
    """epoch_0..N-1 checkpoints holding ``states`` (model state dicts)."""
    for epoch, state in enumerate(states):
        cv_loss = 3.0 - epoch if cv_losses is None else cv_losses[epoch]
        save_checkpoint(str(tmp_path / f"epoch_{epoch}.pt"), {"model": state}, {"epoch": epoch, "cv_loss": cv_loss})


def sd(x):
    return {KEY: torch.tensor([x, x]), "bn.num_batches_tracked": torch.tensor(int(x) * 1000)}


def average(tmp_path, *extra):
    dst = tmp_path / "avg.pt"
    main(["--src_path", str(tmp_path), "--num", "3", "--dst_model", str(dst), *extra])
    return load_checkpoint(str(dst))["model"]


@pytest.mark.parametrize("states, message", [
    ([{"bn.num_batches_tracked": torch.tensor(1000)}, sd(2.0), sd(3.0)],
     rf"key '{KEY}' is in .*epoch_1.pt but not in .*epoch_0.pt"),
    ([sd(1.0), sd(2.0), {**sd(3.0), "decoder.extra": torch.tensor([9.0])}],
     r"key 'decoder.extra' is in .*epoch_2.pt but not in .*epoch_0.pt"),
    ([{**sd(1.0), KEY: torch.ones(3)}, sd(2.0), sd(3.0)],
     rf"key '{KEY}' is \(2,\) torch.float32 in .*epoch_1.pt but \(3,\) torch.float32 in .*epoch_0.pt"),
    ([sd(1.0), {**sd(2.0), KEY: torch.ones(2, dtype=torch.float64)}, sd(3.0)],
     rf"key '{KEY}' is \(2,\) torch.float64 in .*epoch_1.pt but \(2,\) torch.float32"),
    ([sd(1.0), {**sd(2.0), KEY: torch.tensor([1.0, float("nan")])}, sd(3.0)],
     rf"key '{KEY}' holds NaN or inf in .*epoch_1.pt"),
])
def test_mismatched_or_non_finite_checkpoints_are_refused_naming_the_key(tmp_path, states, message):
    """The average-mismatched-keys case: today these average silently wrong (or end in a traceback)."""
    write_states(tmp_path, states)
    with pytest.raises(ConfigError, match=message):
        average(tmp_path)
    assert not (tmp_path / "avg.pt").exists()


def test_module_prefix_is_normalised(tmp_path):
    write_states(tmp_path, [{"module." + k: v for k, v in sd(1.0).items()}, sd(2.0), sd(3.0)])
    model = average(tmp_path)
    assert set(model) == set(sd(0.0)) and model[KEY].tolist() == [2.0, 2.0]
    assert int(model["bn.num_batches_tracked"]) == 3000 and model["bn.num_batches_tracked"].dtype == torch.int64


def test_num_below_one_or_above_what_exists_is_refused_unless_allowed(tmp_path, caplog):
    write_states(tmp_path, [sd(1.0), sd(2.0)])
    for num in ("0", "-1"):
        with pytest.raises(ConfigError, match=f"--num must be at least 1, got {num}"):
            main(["--src_path", str(tmp_path), "--num", num, "--val_best", "--dst_model", str(tmp_path / "a.pt")])
    for extra in ((), ("--val_best",)):
        with pytest.raises(ConfigError, match=r"--num 3, but .* holds only 2 committed epoch checkpoint\(s\)"
                                              r"( with a finite cv_loss)?: lower --num, or pass --allow_fewer"):
            average(tmp_path, *extra)
    with caplog.at_level(logging.WARNING):
        model = average(tmp_path, "--allow_fewer")
    assert model[KEY].tolist() == [1.5, 1.5] and "averaging those 2 (--allow_fewer)" in caplog.text
    with pytest.raises(ConfigError, match="no committed epoch_N.pt"):
        select_checkpoints(str(tmp_path / "none"), 1, val_best=False)


def test_non_finite_or_missing_cv_loss_never_ranks(tmp_path, caplog):
    write_epochs(tmp_path, [13.5, float("nan"), 11.0, float("inf"), 12.0])
    info = load_info(str(tmp_path / "epoch_4.pt"))
    del info["cv_loss"]
    save_checkpoint(str(tmp_path / "epoch_4.pt"), load_checkpoint(str(tmp_path / "epoch_4.pt")), info)
    with caplog.at_level(logging.WARNING):
        chosen = select_checkpoints(str(tmp_path), 2, val_best=True)
    assert [os.path.basename(p) for p in chosen] == ["epoch_0.pt", "epoch_2.pt"]
    for epoch, loss in ((1, "nan"), (3, "inf"), (4, "None")):
        assert f"not ranking {tmp_path}/epoch_{epoch}.pt: its cv_loss is {loss}" in caplog.text
    assert [os.path.basename(p) for p in select_checkpoints(str(tmp_path), 1, True)] == ["epoch_2.pt"]
    with pytest.raises(ConfigError, match="holds only 2 committed epoch checkpoint.* with a finite cv_loss"):
        select_checkpoints(str(tmp_path), 3, val_best=True)


def test_newest_epochs_are_chosen_by_number_in_a_dir_with_underscores(tmp_path):
    model_dir = tmp_path / "my_exp_dir"
    model_dir.mkdir()
    for epoch in (2, 9, 10, 11):
        save_checkpoint(str(model_dir / f"epoch_{epoch}.pt"), {"model": sd(float(epoch))}, {"cv_loss": 1.0})
    os.remove(model_dir / "epoch_11.yaml")  # an unfinished save is never chosen
    last = select_checkpoints(str(model_dir), 2, val_best=False)
    assert [os.path.basename(p) for p in last] == ["epoch_9.pt", "epoch_10.pt"]


def test_val_best_refuses_when_retention_may_have_deleted_the_best(tmp_path):
    write_epochs(tmp_path, [9.0, 3.0, 5.0, 1.0, 7.0, 8.0])
    for epoch in (1, 2):  # what keep_last_n deleted, as if they had not been among the keep_best_n best
        os.remove(tmp_path / f"epoch_{epoch}.yaml")
    (tmp_path / "train.yaml").write_text(yaml.safe_dump({"train_conf": {"keep_last_n": 2, "keep_best_n": 2}}))
    with pytest.raises(ConfigError, match=r"epochs \[1, 2\] were deleted .*keep_best_n = 2 best, so the 3 best may "
                                          r"be gone: average --num 2 or fewer"):
        select_checkpoints(str(tmp_path), 3, val_best=True)
    chosen = select_checkpoints(str(tmp_path), 2, val_best=True)
    assert [os.path.basename(p) for p in chosen] == ["epoch_3.pt", "epoch_4.pt"]
    assert len(select_checkpoints(str(tmp_path), 3, val_best=False)) == 3  # the newest epochs are never deleted


def test_cli_error_is_one_line_and_exit_2(tmp_path):
    write_states(tmp_path, [{"bn.num_batches_tracked": torch.tensor(1000)}, sd(2.0), sd(3.0)])
    proc = subprocess.run([sys.executable, "-m", "toolkit.bin.average_model", "--src_path", str(tmp_path), "--num",
                           "3", "--dst_model", str(tmp_path / "avg.pt")], capture_output=True, text=True, timeout=120)
    errors = [line for line in proc.stderr.splitlines() if " ERROR " in line]
    assert proc.returncode == 2 and len(errors) == 1 and f"key '{KEY}' is in" in errors[0], proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "avg.pt").exists()


@pytest.mark.parametrize("link", [os.symlink, os.link], ids=["symlink", "hard_link"])
def test_a_checkpoint_reached_under_two_names_is_averaged_once(tmp_path, link, caplog):
    """The average-symlinked-epoch case: epoch_best.pt/.yaml as a second name of epoch_3 must not weigh twice."""
    write_epochs(tmp_path, [4.0, 3.0, 2.0, 1.0])
    for ext in ("pt", "yaml"):
        link(f"epoch_3.{ext}" if link is os.symlink else tmp_path / f"epoch_3.{ext}", tmp_path / f"epoch_best.{ext}")
    dst = str(tmp_path / "avg.pt")
    with caplog.at_level(logging.INFO):
        main(["--src_path", str(tmp_path), "--num", "2", "--val_best", "--dst_model", dst])
    assert torch.equal(load_checkpoint(dst)["model"]["w"], torch.full((2,), 2.5))  # epochs 2 and 3, once each
    assert load_info(dst)["averaged"] == [str(tmp_path / "epoch_2.pt"), str(tmp_path / "epoch_3.pt")]
    assert "epoch_3.pt, epoch_best.pt (one file): counted once, as epoch_3.pt" in caplog.text


@pytest.mark.parametrize("record, reason", [(b"\xff\xfe\x00garbage", "'utf-8' codec can't decode byte 0xff"),
                                            (b"epoch: [1, 2\n", "while parsing a flow sequence"),
                                            (b"- 1\n- 2\n", "it holds a list, not a mapping")])
def test_a_damaged_checkpoint_record_is_one_line_naming_it(tmp_path, record, reason):
    write_epochs(tmp_path, [3.0, 2.0])
    (tmp_path / "epoch_1.yaml").write_bytes(record)
    with pytest.raises(ConfigError) as refusal:
        main(["--src_path", str(tmp_path), "--num", "2", "--val_best", "--dst_model", str(tmp_path / "avg.pt")])
    message = str(refusal.value)
    assert message.startswith(f"{tmp_path / 'epoch_1.yaml'} is not a readable checkpoint record: ")
    assert "\n" not in message and reason in message and not (tmp_path / "avg.pt").exists()


def test_averaging_is_refused_while_a_training_job_holds_the_model_dir(tmp_path):
    # the holder is this test process; the averaging runs in its own, as run.sh's stage 5 does
    write_epochs(tmp_path, [2.0, 1.0])
    training = DirLock(str(tmp_path), {"command": "training", "host": "node0", "pid": os.getpid(), "since": "now"})
    assert training.acquire() is None
    cmd = [sys.executable, "-m", "toolkit.bin.average_model", "--src_path", str(tmp_path), "--num", "2",
           "--dst_model", str(tmp_path / "avg_2.pt")]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
        assert (f"--src_path {tmp_path} is in use by a training job (pid {os.getpid()} on node0, since now): average "
                "its epochs once it has ended") in proc.stderr
        assert not (tmp_path / "avg_2.pt").exists()
    finally:
        training.release()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert torch.equal(load_checkpoint(str(tmp_path / "avg_2.pt"))["model"]["w"], torch.full((2,), 0.5))
    assert not (tmp_path / LOCK_FILE).exists()  # released as it ended
