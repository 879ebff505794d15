"""Exact mid-epoch resume through ``toolkit.bin.train`` (2 gloo ranks, the real tiny_fsdd pipeline with shuffling,
volume perturbation, dither and SpecAugment, the tiny conformer with dropout): 2 epochs uninterrupted vs the same
job resumed in fresh processes from its ``step_8`` checkpoint (epoch 1, after 3 of its 5 batches). The resumed
job's ``epoch_1`` checkpoint must equal the uninterrupted one bit for bit: parameters, Adam state, scheduler, and
the epoch's YAML (train loss and utterances summed over both halves of the epoch, skip counts, LR, CV loss)."""

from toolkit.utils.checkpoint import load_checkpoint

from .workers.recipe_data import assert_same_epoch_1, uninterrupted_and_resumed


def test_ddp_mid_epoch_resume_is_bit_identical(tmp_path):
    full, resumed = uninterrupted_and_resumed(tmp_path)
    assert_same_epoch_1(full, resumed)
    state = load_checkpoint(str(resumed / "epoch_1.pt"))
    assert state["optimizer"]["state"] and state["scheduler"]["last_epoch"] == 10


def test_ddp_mid_epoch_resume_with_compiled_layers_is_bit_identical(tmp_path):
    # train_conf.compile: the resumed job compiles its layers again and must still continue the run bit for bit
    full, resumed = uninterrupted_and_resumed(tmp_path, "--override_config", "train_conf.compile true")
    assert_same_epoch_1(full, resumed)
