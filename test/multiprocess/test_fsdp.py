"""The torch_fsdp engine (FSDP2) on 2 real gloo ranks (CPU): the same training as torch_ddp (within the float32
rounding bound of ``worker_engine.RoundingBound``; the tiny conformer with its blocks sharded, both sharding
strategies, across an accumulation boundary and the epoch's cut-short last accumulation), CV on uneven shares,
consolidated checkpoints that resume in either engine with their optimizer state and on 3 ranks, sharded (DCP)
checkpoints that resume from their shards on 2 and 3 ranks and refuse a missing shard, and the trainer's exact
mid-epoch resume."""

import os
import shutil

import pytest

from toolkit.utils.checkpoint import MODEL_KEY, OPTIMIZER_KEY, load_checkpoint

from test.helpers import read_rank_reports

from .workers.launch import WORKERS, run_ranks, train_engine_ranks
from .workers.recipe_data import assert_same_epoch_1, uninterrupted_and_resumed
from .workers.tiny_ctc import assert_within_rounding

WORKER = str(WORKERS / "worker_engine.py")
FSDP = ("--engine", "torch_fsdp")



def test_fsdp_matches_torch_ddp_within_the_rounding_bound(tmp_path):
    # 10 micro-batches per rank, accum_grad 2 (5 steps), the linear score and SGD: a gradient summed wrongly or
    # scaled by another factor (world size, accumulation, clipping) would show in full
    linear_sgd = ("--model", "linear", "--optim", "sgd", "--accum_grad", "2")
    ddp = train_engine_ranks(tmp_path / "ddp", "10", "10", *linear_sgd, "--record_bound")
    fsdp = train_engine_ranks(tmp_path / "fsdp", "10", "10", *linear_sgd, *FSDP, "--fsdp_sharding_strategy", "zero3")
    for rank in range(2):
        assert ddp[rank]["steps"] == fsdp[rank]["steps"] == 5
        assert fsdp[rank]["losses"][0] == ddp[rank]["losses"][0]
        assert fsdp[rank]["lr"] == ddp[rank]["lr"]
    assert fsdp[0]["params"] == fsdp[1]["params"]
    assert_within_rounding(fsdp[0], ddp[0])


@pytest.fixture(scope="module")
def conformer_ddp(tmp_path_factory):
    """torch_ddp on the tiny conformer: 8 micro-batches per rank with accum_grad 3 (steps after 3, 6 and the epoch's
    last 2), Adam, then CV on 3 batches of rank 0 and none of rank 1."""
    return train_engine_ranks(tmp_path_factory.mktemp("ddp"), "8", "8", "--model", "conformer", "--accum_grad", "3",
                 "--cv", "3", "0")


@pytest.mark.parametrize("options", [("--fsdp_sharding_strategy", "zero2"), ("--fsdp_sharding_strategy", "zero3"),
                                     ("--fsdp_sharding_strategy", "zero3", "--activation_checkpointing")],
                         ids=["zero2", "zero3", "zero3-activation-checkpointing"])
def test_sharded_conformer_blocks_train_as_torch_ddp(conformer_ddp, tmp_path, options):
    fsdp = train_engine_ranks(tmp_path, "8", "8", "--model", "conformer", "--accum_grad", "3", "--cv", "3", "0", *FSDP, *options)
    ddp = conformer_ddp
    for rank in range(2):
        assert fsdp[rank]["steps"] == ddp[rank]["steps"] == 3
        assert fsdp[rank]["losses"] == pytest.approx(ddp[rank]["losses"], rel=1e-6)
        assert fsdp[rank]["cv_loss"] == pytest.approx(ddp[rank]["cv_loss"], rel=1e-5)
        assert fsdp[rank]["cv_utts"] == ddp[rank]["cv_utts"] == 12
    assert fsdp[0]["params"] == fsdp[1]["params"]
    # Adam divides by the root of its second moment, so a gradient's last-bit rounding moves a weight more where
    # that gradient is tiny; measured 8.8e-5 at most after 3 steps of lr <= 0.01 (2026-12-07)
    assert max(abs(a - b) for key, values in ddp[0]["params"].items()
               for a, b in zip(values, fsdp[0]["params"][key])) < 1e-3


def test_uneven_data_finishes_with_the_same_step_count(tmp_path):
    # rank 0 has 5 batches, rank 1 has 3: the join stops both after 3 (FSDP's all-gathers need every rank)
    r0, r1 = train_engine_ranks(tmp_path, "5", "3", "--model", "conformer", *FSDP, "--fsdp_sharding_strategy", "zero3")
    assert r0["steps"] == r1["steps"] == 3
    assert (r0["dropped"], r1["dropped"]) == (2, 0)
    assert r0["params"] == r1["params"]


def test_bf16_parameters_with_cpu_offload_train_as_torch_ddp_under_autocast(tmp_path):
    # bf16 here gathers bf16 weights (and autocasts), torch_ddp autocasts fp32 weights: the same model in another
    # rounding; measured 2026-12-07: losses within 0.09 %, CV loss within 0.03 %
    conformer_bf16 = ("8", "8", "--model", "conformer", "--accum_grad", "3", "--cv", "3", "0", "--dtype", "bf16")
    ddp = train_engine_ranks(tmp_path / "ddp", *conformer_bf16)
    fsdp = train_engine_ranks(tmp_path / "fsdp", *conformer_bf16, *FSDP, "--fsdp_cpu_offload")
    for rank in range(2):
        assert fsdp[rank]["steps"] == 3
        assert fsdp[rank]["losses"] == pytest.approx(ddp[rank]["losses"], rel=3e-3)
        assert fsdp[rank]["cv_loss"] == pytest.approx(ddp[rank]["cv_loss"], rel=1e-3)
    assert fsdp[0]["params"] == fsdp[1]["params"]
    assert fsdp[0]["param_dtypes"] == ["torch.float32"]  # the shards Adam updates stay fp32


@pytest.fixture(scope="module")
def fsdp_saved(tmp_path_factory):
    """torch_fsdp (zero3) on TinyCTC: 5 steps, the checkpoint saved after step 3 (the uninterrupted run)."""
    base = tmp_path_factory.mktemp("fsdp_saved")
    path = str(base / "epoch_0.pt")
    full = train_engine_ranks(base, "5", "5", *FSDP, "--fsdp_sharding_strategy", "zero3", "--save", path, "--save_after", "3")
    return path, full


@pytest.mark.parametrize("engine", ["torch_fsdp", "torch_ddp"])
def test_fsdp_checkpoint_resumes_in_either_engine(fsdp_saved, tmp_path, engine):
    path, full = fsdp_saved
    resumed = train_engine_ranks(tmp_path, "5", "5", "--engine", engine, "--skip", "3", "--resume", path)
    for rank in range(2):
        assert resumed[rank]["steps"] == 2
        # the model, Adam's moments and the LR schedule restored: the next two steps are the full run's (the
        # same arithmetic in torch_fsdp: bit for bit)
        if engine == "torch_fsdp":
            assert resumed[rank]["losses"] == full[rank]["losses"][3:]
        assert resumed[rank]["losses"] == pytest.approx(full[rank]["losses"][3:], rel=1e-6)
        assert resumed[rank]["lr"] == full[rank]["lr"]
    state = load_checkpoint(path)
    for key, value in state[MODEL_KEY].items():
        assert value.flatten().tolist() == full[0]["params_at_save"][key]  # the gathered weights, bit for bit
    optim = state[OPTIMIZER_KEY]  # torch's own layout: parameters numbered in the optimizer's order
    assert sorted(optim["state"]) == list(range(len(state[MODEL_KEY])))
    assert [len(group["params"]) for group in optim["param_groups"]] == [len(state[MODEL_KEY])]
    assert int(optim["state"][0]["step"]) == 3


def test_fsdp_checkpoint_resumes_on_3_ranks(fsdp_saved, tmp_path):
    # the consolidated file is resharded by whoever loads it: 3 ranks (slices of uneven size) take it up
    path, full = fsdp_saved
    proc = run_ranks(WORKER, str(tmp_path), "5", "5", "5", *FSDP, "--skip", "3", "--resume", path, nproc=3,
                     timeout=240)
    assert proc.returncode == 0, proc.stderr[-4000:]
    resumed = read_rank_reports(tmp_path, 3)
    # rank 0's next batch is the one the 2-rank run trained next, on the same restored weights
    assert resumed[0]["losses"][0] == full[0]["losses"][3]
    assert all(report["steps"] == 2 and report["lr"] == full[0]["lr"] for report in resumed)
    assert resumed[0]["params"] == resumed[1]["params"] == resumed[2]["params"]


@pytest.fixture(scope="module")
def fsdp_sharded(tmp_path_factory):
    """As :func:`fsdp_saved` with ``fsdp_state_dict_type: sharded`` (the optimizer state only in ``epoch_0/``)."""
    base = tmp_path_factory.mktemp("fsdp_sharded")
    path = str(base / "epoch_0.pt")
    full = train_engine_ranks(base, "5", "5", *FSDP, "--fsdp_sharding_strategy", "zero3", "--fsdp_state_dict_type", "sharded",
                 "--save", path, "--save_after", "3")
    return path, full


@pytest.mark.parametrize("nproc", [2, 3])
def test_sharded_checkpoint_resumes_from_its_shards(fsdp_sharded, tmp_path, nproc):
    path, full = fsdp_sharded
    assert sorted(os.listdir(path[:-3])) == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    state = load_checkpoint(path)
    assert OPTIMIZER_KEY not in state  # gathered: the model only, for decoding and averaging
    for key, value in state[MODEL_KEY].items():
        assert value.flatten().tolist() == full[0]["params_at_save"][key]
    proc = run_ranks(WORKER, str(tmp_path), *["5"] * nproc, *FSDP, "--skip", "3", "--resume", path, nproc=nproc,
                     timeout=240)
    assert proc.returncode == 0, proc.stderr[-4000:]
    resumed = read_rank_reports(tmp_path, nproc)
    if nproc == 2:  # Adam's moments came from the shards (fresh ones would take other steps): bit for bit
        assert [report["losses"] for report in resumed] == [report["losses"][3:] for report in full]
        assert resumed[0]["params"] == full[0]["params"]
    else:  # resharded over 3 ranks: rank 0's next batch on the same restored weights
        assert resumed[0]["losses"][0] == full[0]["losses"][3]
    assert all(report["steps"] == 2 and report["lr"] == full[0]["lr"] for report in resumed)


def test_a_missing_shard_stops_every_rank_naming_it(fsdp_sharded, tmp_path):
    path, _ = fsdp_sharded
    copy = tmp_path / "copy"
    shutil.copytree(os.path.dirname(path), copy)
    os.remove(copy / "epoch_0" / "__1_0.distcp")
    proc = run_ranks(WORKER, str(tmp_path), "5", "5", *FSDP, "--skip", "3", "--resume", str(copy / "epoch_0.pt"),
                     timeout=240)
    assert proc.returncode != 0
    for rank in range(2):
        assert (tmp_path / f"error_rank{rank}.txt").read_text() == (
            f"cannot resume {copy / 'epoch_0.pt'} from its shard directory {copy / 'epoch_0'}: "
            "rank 0 cannot see __1_0.distcp; rank 1 cannot see __1_0.distcp")


@pytest.mark.parametrize("engine", ["torch_ddp", "torch_fsdp"])
def test_a_sharded_checkpoint_without_its_shards_is_refused(fsdp_sharded, tmp_path, engine):
    # torch_ddp cannot read the shards, torch_fsdp is given the .pt alone: either would restart Adam silently
    path, _ = fsdp_sharded
    copy = tmp_path / "copy"
    copy.mkdir()
    for suffix in (".pt", ".yaml"):
        shutil.copy(path[:-3] + suffix, copy)
    proc = run_ranks(WORKER, str(tmp_path), "5", "5", "--engine", engine, "--skip", "3", "--resume",
                     str(copy / "epoch_0.pt"), timeout=240)
    assert proc.returncode != 0
    for rank in range(2):
        assert (tmp_path / f"error_rank{rank}.txt").read_text() == (
            f"cannot resume {copy / 'epoch_0.pt'}: its optimizer state is in the shard directory epoch_0/ beside it "
            "(torch_fsdp, fsdp_state_dict_type sharded); resume it with --train_engine torch_fsdp and that directory "
            "in place")


def test_ddp_checkpoint_resumes_in_fsdp(tmp_path):
    path = str(tmp_path / "ddp" / "epoch_0.pt")
    full = train_engine_ranks(tmp_path / "ddp", "5", "5", "--save", path, "--save_after", "3")
    resumed = train_engine_ranks(tmp_path / "fsdp", "5", "5", *FSDP, "--skip", "3", "--resume", path)
    for rank in range(2):
        assert resumed[rank]["losses"] == pytest.approx(full[rank]["losses"][3:], rel=1e-6)
        assert resumed[rank]["lr"] == full[rank]["lr"]
    assert max(abs(a - b) for key, values in full[0]["params"].items()
               for a, b in zip(values, resumed[0]["params"][key])) < 1e-5


@pytest.mark.parametrize("state_dict_type", ["full", "sharded"])
def test_fsdp_mid_epoch_resume_through_the_trainer_is_bit_identical(tmp_path, state_dict_type):
    # the real trainer and pipeline (dropout, SpecAugment, CV on every rank, saver hooks), the tiny conformer's
    # blocks sharded and resharded after forward; sharded: step_8 resumes from its shard directory
    full, resumed = uninterrupted_and_resumed(tmp_path, "--train_engine", "torch_fsdp", "--override_config",
                                              "train_conf.fsdp_sharding_strategy zero3", "--override_config",
                                              f"train_conf.fsdp_state_dict_type {state_dict_type}")
    assert_same_epoch_1(full, resumed)
    state = load_checkpoint(str(resumed / "epoch_1.pt"))
    assert state["scheduler"]["last_epoch"] == 10
    assert (OPTIMIZER_KEY in state) == (state_dict_type == "full")
    assert os.path.isdir(resumed / "step_8") == (state_dict_type == "sharded")
