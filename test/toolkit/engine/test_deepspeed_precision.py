"""DeepSpeed bf16: the model autocasts inside DeepSpeed's forward, which on a GPU turns off an autocast entered
outside it (``deepspeed/runtime/torch_autocast.py``). There the recipe's conformer failed on its first step, the
float32 output of CMVN (DeepSpeed keeps buffers in float32) meeting the bf16 weights of the front end (H200,
2026-12-04, ``tools/gpu_check.sh``). Entering a disabled autocast around the call does here what DeepSpeed does
there."""

import json

import torch

from toolkit.engine import init_engine
from toolkit.engine.train_conf import resolve_train_conf
from toolkit.models.transformer.cmvn import GlobalCMVN
from toolkit.utils.scheduler import init_optimizer_and_scheduler

from test.multiprocess.workers.tiny_ctc import TinyConformer, make_batch, utterances


def test_bf16_conformer_with_cmvn_trains_when_deepspeed_turns_the_outer_autocast_off(one_rank, tmp_path):
    batch = make_batch(utterances()[:4])
    frames = torch.cat([f[:n] for f, n in zip(batch["feats"], batch["feats_lengths"])])
    model = TinyConformer()
    model.encoder.global_cmvn = GlobalCMVN(frames.mean(0), frames.std(0).reciprocal())
    ds_config = tmp_path / "ds.json"
    ds_config.write_text(json.dumps({"zero_optimization": {"stage": 2}}))
    engine = init_engine("deepspeed", one_rank, resolve_train_conf({"dtype": "bf16"}), False,
                         deepspeed_config=str(ds_config), micro_batch_size=4)
    optimizer, scheduler = init_optimizer_and_scheduler(model.parameters(), "adam", {"lr": 0.001}, "warmuplr",
                                                        {"warmup_steps": 2})
    wrapped = engine.prepare(model, optimizer, scheduler)
    assert next(engine.module.parameters()).dtype == torch.bfloat16
    assert engine.module.encoder.global_cmvn.mean.dtype == torch.float32
    inputs = [batch[key] for key in ("feats", "feats_lengths", "target", "target_lengths")]
    before = [p.detach().float().clone() for p in engine.module.parameters()]
    with engine.autocast(), torch.autocast("cpu", enabled=False):
        out = wrapped(*inputs)
    assert out["loss"].dtype == torch.float32 and 0.0 < out["loss"].item() < 1e4
    engine.backward(out["loss"])
    grad_norm = engine.step()
    assert 0.0 < grad_norm < float("inf")
    moved = sum(int(not torch.equal(b, p.detach().float())) for b, p in zip(before, engine.module.parameters()))
    assert moved > len(before) // 2
