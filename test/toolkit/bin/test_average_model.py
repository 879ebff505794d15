import torch

from toolkit.bin.average_model import average_checkpoints, main, select_checkpoints
from toolkit.utils.checkpoint import load_checkpoint, load_info, save_checkpoint


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
