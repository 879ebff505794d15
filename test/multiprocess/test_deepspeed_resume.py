"""DeepSpeed ZeRO 1, 2 and 3 checkpoints on 2 real gloo ranks: save on every rank, resume in fresh processes (the next
steps' losses equal the uninterrupted run's), the consolidated fp32 ``.pt`` loads and averages like a torch_ddp
one, and missing shard files stop every rank with a message naming them."""

import os
import shutil

import pytest
import torch

from toolkit.bin.average_model import average_checkpoints
from toolkit.bin.average_model import main as average_main
from toolkit.utils.checkpoint import MODEL_KEY, SCHEDULER_KEY, load_checkpoint, load_info

from test.helpers import read_rank_reports

from .workers.launch import WORKERS, run_ranks
from .workers.tiny_ctc import TinyCTC

WORKER = str(WORKERS / "worker_engine.py")


def launch(out_dir, *args):
    os.makedirs(out_dir, exist_ok=True)
    return run_ranks(WORKER, str(out_dir), *args, timeout=240)


@pytest.fixture(scope="module")
def saved_runs(tmp_path_factory):
    """Per ZeRO stage: 5 steps with a save after step 3 (the uninterrupted run), then a resume of that save in
    fresh processes for steps 4-5."""
    runs = {}
    for stage in (1, 2, 3):
        base = tmp_path_factory.mktemp(f"zero{stage}")
        ds = ("--engine", "deepspeed", "--stage", str(stage))
        path = str(base / "full" / "epoch_0.pt")
        proc = launch(base / "full", "5", "5", *ds, "--save", path, "--save_after", "3")
        assert proc.returncode == 0, proc.stderr[-4000:]
        proc = launch(base / "resumed", "5", "5", *ds, "--skip", "3", "--resume", path)
        assert proc.returncode == 0, proc.stderr[-4000:]
        runs[stage] = (base, path, read_rank_reports(base / "full", 2), read_rank_reports(base / "resumed", 2))
    return runs


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_resume_continues_the_uninterrupted_run(saved_runs, stage):
    _, _, full, resumed = saved_runs[stage]
    for rank in range(2):
        assert full[rank]["steps"] == 5 and resumed[rank]["steps"] == 2
        # Same model, Adam moments and LR schedule after the resume, and the same arithmetic: the next steps
        # reproduce the full run bit for bit.
        assert resumed[rank]["losses"] == full[rank]["losses"][3:]
        assert resumed[rank]["lr"] == full[rank]["lr"]
    assert resumed[0]["params"] == full[0]["params"]


def test_consolidated_checkpoint_loads_and_averages(saved_runs, tmp_path):
    paths = []
    for stage, (_, path, full, _) in saved_runs.items():
        state = load_checkpoint(path)
        assert load_info(path)["step"] == 3
        assert state[SCHEDULER_KEY]["last_epoch"] == 3
        model = TinyCTC()
        model.load_state_dict(state[MODEL_KEY])  # strict: the keys and shapes of the trained module
        for key, tensor in model.state_dict().items():
            assert tensor.dtype == torch.float32
            assert tensor.flatten().tolist() == full[0]["params_at_save"][key]  # the fp32 weights, bit for bit
        paths.append(path)
    averaged = average_checkpoints(paths)
    for key, tensor in averaged.items():
        expected = sum(load_checkpoint(p)[MODEL_KEY][key] for p in paths) / len(paths)
        torch.testing.assert_close(tensor, expected)
    dst = str(tmp_path / "avg.pt")
    average_main(["--src_path", os.path.dirname(paths[1]), "--num", "1", "--dst_model", dst])
    torch.testing.assert_close(load_checkpoint(dst)[MODEL_KEY], load_checkpoint(paths[1])[MODEL_KEY])


def test_missing_shard_stops_every_rank(saved_runs):
    base, path, _, _ = saved_runs[2]
    lost = os.path.join(os.path.dirname(path), "epoch_0", "zero_pp_rank_1_mp_rank_00_optim_states.pt")
    os.remove(lost)
    proc = launch(base / "broken", "5", "5", "--engine", "deepspeed", "--stage", "2", "--skip", "3",
                  "--resume", path)
    assert proc.returncode != 0
    for rank in range(2):
        message = open(base / "broken" / f"error_rank{rank}.txt").read()
        assert "cannot resume" in message and lost in message
        assert "rank 0 cannot see" in message and "rank 1 cannot see" in message
    assert not os.path.exists(base / "broken" / "rank0.json")


def _refusal(out_dir) -> list[str]:
    """Each rank's one-line refusal (the worker writes the ConfigError it caught)."""
    messages = [open(out_dir / f"error_rank{rank}.txt").read() for rank in range(2)]
    assert not os.path.exists(out_dir / "rank0.json") and all("\n" not in m for m in messages)
    return messages


@pytest.mark.parametrize("saved,resumed", [(3, 2), (1, 2)])
def test_shards_of_another_zero_stage_stop_every_rank_in_one_line(saved_runs, saved, resumed):
    # The case: stage 3 shards resumed at stage 2 ended in DeepSpeed's traceback (or in a list of "missing" files
    # that were never meant to exist); stage 1 shards, named like stage 2's, were handed to DeepSpeed as they were.
    base, path, _, _ = saved_runs[saved]
    out = base / f"as_stage{resumed}"
    proc = launch(out, "5", "5", "--engine", "deepspeed", "--stage", str(resumed), "--skip", "3", "--resume", path)
    assert proc.returncode != 0, proc.stderr[-4000:]
    for message in _refusal(out):
        assert message.startswith(f"cannot resume {path} with ZeRO stage {resumed} in fp32: its shards were saved "
                                  f"with stage {saved} in fp32 and resume with that setup only"), message


@pytest.mark.parametrize("damaged", ["zero_pp_rank_1_mp_rank_00_optim_states.pt", "mp_rank_00_model_states.pt"])
def test_a_cut_shard_file_stops_every_rank_in_one_line_naming_it(saved_runs, tmp_path, damaged):
    # The case: a shard copied short (a full disk, an interrupted rsync) gave torch's PytorchStreamReader traceback.
    base, path, _, _ = saved_runs[1]
    copy = tmp_path / "exp"
    shutil.copytree(os.path.dirname(path), copy)
    shard = copy / "epoch_0" / damaged
    shard.write_bytes(shard.read_bytes()[:1000])
    proc = launch(tmp_path / "out", "5", "5", "--engine", "deepspeed", "--stage", "1", "--skip", "3", "--resume",
                  str(copy / "epoch_0.pt"))
    assert proc.returncode != 0, proc.stderr[-4000:]
    expected = (f"cannot resume {copy / 'epoch_0.pt'} with its optimizer state: rank 0 reads a cut or non-torch "
                f"file: {shard}; rank 1 reads a cut or non-torch file: {shard}" if "optim" in damaged else
                f"{shard} is not a readable checkpoint (truncated or not a torch save): no zip directory at its "
                f"end, where torch.save writes one")
    assert _refusal(tmp_path / "out") == [expected, expected]
