"""The executor with utterances it cannot use, in one process (a one-rank gloo group) on real tiny_fsdd speech: a
non-finite loss adds a zero gradient and is counted, a non-finite gradient skips the update and the LR step, and
utterances the model excludes are named and counted; trained + skipped = offered throughout. Also the executor's side
of the dataset's resume protocol."""

import dataclasses
import logging
import math
import os

import pytest
import soundfile as sf
import torch
import torch.nn.functional as F

from toolkit.dataset.conf import FbankConf
from toolkit.dataset.processor import compute_fbank
from toolkit.distributed.join import init_join
from toolkit.engine import init_engine
from toolkit.engine.checkpointer import Checkpointer
from toolkit.engine.executor import Executor
from toolkit.engine.train_conf import resolve_train_conf
from toolkit.models.transformer.ctc import min_ctc_frames
from toolkit.utils.config_parsing import ConfigError
from toolkit.utils.scheduler import init_optimizer_and_scheduler

from test.helpers import REPO_ROOT

CORPUS = os.path.join(REPO_ROOT, "corpora", "tiny_fsdd")
UNITS = ["<blank>", "<unk>"] + list("EFGHINORSTUVWXZ")
FBANK = dataclasses.asdict(FbankConf(dither=0.0))


def batch_of(keys: list[str]) -> dict:
    """The pipeline's batch dict for tiny_fsdd train utterances (80-bin fbank, character targets)."""
    texts = dict(line.strip().split(maxsplit=1) for line in open(os.path.join(CORPUS, "data", "train", "text")))
    feats, labels = [], []
    for key in keys:
        audio, rate = sf.read(os.path.join(CORPUS, "wav", f"{key}.wav"), dtype="float32")
        feats.append(compute_fbank({"wav": key, "waveform": audio, "sample_rate": rate}, **FBANK)["feat"])
        labels.append(torch.tensor([UNITS.index(c) for c in texts[key]]))
    return {"keys": keys, "feats": torch.nn.utils.rnn.pad_sequence(feats, batch_first=True),
            "feats_lengths": torch.tensor([len(f) for f in feats]),
            "target": torch.nn.utils.rnn.pad_sequence(labels, batch_first=True, padding_value=-1),
            "target_lengths": torch.tensor([len(t) for t in labels]), "num_skipped": {}}


GOOD = ["george-0-01", "jackson-1-00", "lucas-2-01", "nicolas-3-00"]
OTHER = ["george-1-00", "jackson-2-01", "lucas-3-00", "nicolas-0-01"]


class FrameCTC(torch.nn.Module):
    """A per-frame CTC model that follows ASRModel's contract: ``loss`` is the mean over the utterances it does not
    exclude (those with fewer frames than CTC needs), ``excluded`` flags them."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.out = torch.nn.Linear(80, len(UNITS))
        self.overflow_backward = False

    def forward(self, feats, feats_lengths, target, target_lengths):
        hidden = self.out(feats / 10)
        if self.overflow_backward:
            hidden.register_hook(lambda grad: torch.full_like(grad, math.inf))  # an overflowing backward
        excluded = feats_lengths < min_ctc_frames(target, target_lengths)
        per_utt = F.ctc_loss(hidden.log_softmax(-1).transpose(0, 1), target.clamp(min=0), feats_lengths,
                             target_lengths.masked_fill(excluded, 0), reduction="none")
        loss = per_utt.masked_fill(excluded, 0.0).sum() / (~excluded).sum().clamp(min=1)
        return {"loss": loss, "excluded": excluded}


def executor_of(ctx, model, tmp_path, accum_grad=1, seed=777) -> Executor:
    """An Executor training ``model`` under torch_ddp (Adam, lr 0.01, 2 warm-up steps), 10 ms frames, data seed
    ``seed``."""
    conf = resolve_train_conf({"accum_grad": accum_grad, "log_interval": 1, "seed": seed})
    optimizer, scheduler = init_optimizer_and_scheduler(model.parameters(), "adam", {"lr": 0.01}, "warmuplr",
                                                        {"warmup_steps": 2})
    engine = init_engine("torch_ddp", ctx, conf, find_unused_parameters=False)
    engine.prepare(model, optimizer, scheduler)
    join = init_join(ctx, conf.join_mode, conf.join_timeout_s)
    return Executor(engine, join, Checkpointer(engine, str(tmp_path), conf), conf, 0.01, "test")


def train(ctx, model, batches, tmp_path, accum_grad=1):
    """One epoch of ``batches`` under torch_ddp; returns (engine, stats, progress, gradients seen at each step)."""
    executor = executor_of(ctx, model, tmp_path, accum_grad)
    engine = executor.engine
    grads, step = [], engine.step

    def recording_step():
        grads.append({name: p.grad.clone() for name, p in engine.module.named_parameters()})
        return step()

    engine.step = recording_step
    stats = executor.train(batches)
    executor.join.close()
    return engine, stats, executor.progress, grads


def with_nan(batch: dict) -> dict:
    feats = batch["feats"].clone()
    feats[2, 10, :5] = math.nan  # as one corrupt file would (the pipeline now skips those; a model may still NaN)
    return dict(batch, feats=feats)


def test_a_non_finite_loss_adds_a_zero_gradient_and_is_counted(one_rank, caplog, tmp_path):
    good, bad = batch_of(GOOD), with_nan(batch_of(OTHER))
    with caplog.at_level(logging.WARNING):
        engine, stats, progress, grads = train(one_rank, FrameCTC(), [good, bad], tmp_path, accum_grad=2)
    # The step still happens, with the good micro-batch's gradient alone (over accum_grad 2): nothing is lost but
    # the bad batch, and nothing NaN reaches the weights.
    reference = FrameCTC()
    (reference(*[good[k] for k in ("feats", "feats_lengths", "target", "target_lengths")])["loss"] / 2).backward()
    assert progress.step == 1 and stats.skipped_steps == 0
    for name, p in reference.named_parameters():  # the same arithmetic, plus exact zeros: bit for bit
        assert torch.equal(grads[0][name], p.grad), name
    assert all(torch.isfinite(p).all() for p in engine.module.parameters())
    assert engine.scheduler.last_epoch == 1  # the LR schedule advanced: the update was applied
    assert stats.num_utts == 4 and dict(stats.skipped) == {"non_finite_loss": 4}
    good_loss = float(reference(good["feats"], good["feats_lengths"], good["target"], good["target_lengths"])["loss"].detach())
    assert stats.loss == pytest.approx(good_loss, rel=1e-5)
    assert "non_finite_loss" in caplog.text and " ".join(OTHER) in caplog.text


def test_a_non_finite_gradient_skips_the_update_and_the_lr_step(one_rank, caplog, tmp_path):
    model = FrameCTC()
    model.overflow_backward = True
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    with caplog.at_level(logging.WARNING):
        engine, stats, progress, _ = train(one_rank, model, [batch_of(GOOD)], tmp_path)
    assert progress.step == 1 and stats.skipped_steps == 1
    assert engine.scheduler.last_epoch == 0 and not engine.optimizer.state  # neither the LR nor Adam moved
    for name, p in engine.module.named_parameters():
        assert torch.equal(p.detach(), before[name]), name
    assert stats.num_utts == 4  # the loss was finite: the utterances count as trained, the step as skipped
    assert "update skipped (the LR schedule does not advance)" in caplog.text


def test_excluded_utterances_are_named_counted_and_out_of_the_mean(one_rank, caplog, tmp_path):
    good = batch_of(GOOD)
    short = dict(good, feats_lengths=good["feats_lengths"].clone())
    short["feats_lengths"][1] = 2  # 2 frames for "ONE": no CTC alignment
    with caplog.at_level(logging.WARNING):
        _, stats, _, _ = train(one_rank, FrameCTC(), [short], tmp_path)
    assert stats.num_utts == 3 and dict(stats.skipped) == {"too_few_encoder_frames": 1}
    kept = [0, 2, 3]
    alone = FrameCTC()(good["feats"][kept], good["feats_lengths"][kept], good["target"][kept],
                       good["target_lengths"][kept])
    assert stats.loss == pytest.approx(float(alone["loss"].detach()), rel=1e-5)
    assert "too_few_encoder_frames: jackson-1-00" in caplog.text


def test_cross_validation_leaves_a_non_finite_batch_out_and_counts_it(one_rank, caplog, tmp_path):
    executor = executor_of(one_rank, FrameCTC(), tmp_path)
    good = batch_of(GOOD)
    with caplog.at_level(logging.WARNING):
        stats = executor.cv([good, with_nan(batch_of(OTHER))])
    executor.join.close()
    expected = float(FrameCTC()(good["feats"], good["feats_lengths"], good["target"], good["target_lengths"])["loss"].detach())
    assert math.isfinite(stats.loss) and stats.loss == pytest.approx(expected, rel=1e-5)
    assert stats.num_utts == 4 and dict(stats.skipped) == {"non_finite_loss": 4}
    assert "cross-validation: loss nan is not finite" in caplog.text


class RecordingSet:
    """A ResumableDataset whose loader is given: records what the executor asks of it."""

    def __init__(self):
        self.calls = []

    def set_seed(self, seed):
        self.calls.append(("set_seed", seed))

    def set_epoch(self, epoch):
        self.calls.append(("set_epoch", epoch))

    def resume_epoch(self, epoch, batches_read):
        self.calls.append(("resume_epoch", epoch, dict(batches_read)))

    def drop_replayed(self, batches):
        return (batch for batch in batches if "replayed" not in batch)


class Loader(list):
    """Batches with the DataLoader's own ``generator``."""

    def __init__(self, batches):
        super().__init__(batches)
        self.generator = torch.Generator()


def test_the_executor_moves_the_set_through_epochs_and_resumes_it(one_rank, tmp_path, caplog):
    first, second = dict(batch_of(GOOD), position=[0, 0, False]), dict(batch_of(OTHER), position=[0, 1, True])
    executor = executor_of(one_rank, FrameCTC(), tmp_path)
    train_set, loader = RecordingSet(), Loader([first, {"replayed": True}, second])
    stats = executor.train(loader, train_set)
    assert train_set.calls == [("set_epoch", 0)] and loader.generator.initial_seed() == 777  # seed + epoch 0
    assert stats.num_batches == 2 and executor.position.batches_read == {0: (2, True)}  # the placeholder dropped

    executor.progress.batches_in_epoch = 1  # as a checkpoint after the first batch says
    executor.position.batches_read = {0: (1, False)}
    executor.train(Loader([{"replayed": True}, second]), train_set)
    assert train_set.calls[-1] == ("resume_epoch", 0, {0: (1, False)})
    assert executor.position.batches_read == {0: (2, True)} and executor.progress.step == 3
    path = executor.checkpointer.save("step_3", {"epoch": 0, "step": 3})
    executor.join.close()

    other_seed = executor_of(one_rank, FrameCTC(), tmp_path / "resumed", seed=5)
    with caplog.at_level(logging.WARNING):
        other_seed.resume(path, train_set)
    other_seed.join.close()
    assert train_set.calls[-1] == ("set_seed", 777) and other_seed.progress.data_seed == 777
    assert "trained with data seed 777, the config says 5: keeping the checkpoint's" in caplog.text


def test_a_checkpoint_of_another_model_or_uncommitted_is_refused_in_one_line_before_anything_is_loaded(one_rank,
                                                                                                        tmp_path):
    # The errors-as-tracebacks case (b): torch's load_state_dict error was a traceback listing every key.
    saved = executor_of(one_rank, FrameCTC(), tmp_path)
    path = saved.checkpointer.save("epoch_0", {"epoch": 0, "step": 0})
    saved.join.close()
    narrower = FrameCTC()
    narrower.out = torch.nn.Linear(80, 5)  # the config of another model: 5 outputs, not len(UNITS)
    before = {name: p.detach().clone() for name, p in narrower.named_parameters()}
    executor = executor_of(one_rank, narrower, tmp_path / "resumed")
    with pytest.raises(ConfigError) as refused:
        executor.resume(path, RecordingSet())
    message = str(refused.value)
    assert "\n" not in message and message.startswith(f"{path} holds another model than this config's: ")
    assert f"out.weight is ({len(UNITS)}, 80) in the checkpoint, (5, 80) in this config's model (2 keys differ)" \
        in message
    assert all(torch.equal(p, before[name]) for name, p in executor.engine.module.named_parameters())
    os.unlink(tmp_path / "epoch_0.yaml")  # as a .pt copied without its commit marker
    with pytest.raises(ConfigError, match=r"epoch_0\.pt: no \.yaml beside it, so its save never finished"):
        executor.resume(path, RecordingSet())
    executor.join.close()
