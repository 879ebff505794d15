"""Cross-validation under DeepSpeed ZeRO-3 on 2 real gloo ranks through ``toolkit.bin.train``: with a CV set of
one utterance, rank 1 has no CV batch at all. ZeRO-3 partitions every parameter (persistence threshold 0), so a
forward that gathered them on rank 0 alone would wait for rank 1 until the process-group timeout; the engine's
evaluation context gathers the model once on every rank instead. The CV loss it reports is the loss of the saved
model on that utterance, recomputed here in one process with the same arithmetic (one thread, eval mode, no
dither): bit for bit."""

import json
import os

import pytest
import torch
import yaml

from toolkit.dataset import build_dataloader, build_dataset
from toolkit.models.registry import init_model
from toolkit.text.tokenizer import init_tokenizer
from toolkit.train_config import read_config
from toolkit.utils.checkpoint import MODEL_KEY, load_checkpoint

from test.helpers import REPO_ROOT

from .workers.recipe_data import TIMEOUT_S, run_standalone, train_args, write_data


def test_zero3_cv_with_a_rank_that_has_no_cv_batch(tmp_path):
    write_data(tmp_path)
    first = open(tmp_path / "cv.list").readline()
    (tmp_path / "cv.list").write_text(first)
    stage3 = json.load(open(os.path.join(REPO_ROOT, "examples", "english", "s0", "conf", "ds_stage3.json")))
    stage3["zero_optimization"]["stage3_param_persistence_threshold"] = 0  # partition even the smallest tensors
    stage3_path = tmp_path / "ds_stage3_all.json"
    stage3_path.write_text(json.dumps(stage3))
    model_dir = tmp_path / "zero3"
    args = train_args(tmp_path, model_dir, "train_conf.max_epoch 1")
    # A hang would end at the 60 s process-group timeout (the last --pg_timeout_s wins).
    proc = run_standalone(args + ["--train_engine", "deepspeed", "--deepspeed_config", str(stage3_path),
                                  "--pg_timeout_s", "60"], timeout=TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr[-4000:]
    info = yaml.safe_load(open(model_dir / "epoch_0.yaml"))
    assert info["cv_utts"] == 1

    config = read_config(str(model_dir / "train.yaml"))
    tokenizer = init_tokenizer(config.tokenizer, config.tokenizer_conf)
    model = init_model(config, config.input_dim, tokenizer.vocab_size())
    model.load_state_dict(load_checkpoint(str(model_dir / "epoch_0.pt"))[MODEL_KEY])
    dataset = build_dataset(str(tmp_path / "cv.list"), tokenizer, config.dataset_conf, mode="cv")
    (batch,) = [b for b in build_dataloader(dataset) if b["keys"]]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the ranks ran (OMP_NUM_THREADS=1)
    try:
        with torch.no_grad():
            loss = model.eval()(batch["feats"], batch["feats_lengths"], batch["target"], batch["target_lengths"])
    finally:
        torch.set_num_threads(threads)
    # The run scored it on ZeRO-3's gathered parameters, this on the consolidated checkpoint in another process: the
    # same weights, but float32 kernels may sum in another order (seen 1 ulp apart, 11.769744873 against 11.769743919,
    # for some trained weights). A wrong reduction over the rank with no CV batch would be off by far more (half).
    assert info["cv_loss"] == pytest.approx(float(loss["loss"]), rel=1e-6)
