"""Real batches for engine tests: 80-bin fbank of the tiny_fsdd recordings and their transcripts as characters.

The model is a deliberately small CTC model (two linear layers) so that engine tests run in seconds; the engine
never sees anything but ``model(feats, feats_lengths, target, target_lengths) -> {"loss": ...}``. ``TinyConformer`` is
the recipe's tiny conformer, for tests of what the model's layers do under an engine.
"""

import kaldi_native_fbank as knf
import numpy as np
import soundfile as sf
import torch
import torch.nn.functional as F

from toolkit.models.registry import init_model
from toolkit.models.transformer.asr_model import ASRModel
from toolkit.train_config import read_config

from test.helpers import REPO_ROOT, kaldi_entries

UNITS = ["<blank>", "<unk>"] + list("EFGHINORSTUVWXZ") + ["<sos/eos>"]


def fbank(path: str) -> torch.Tensor:
    audio, rate = sf.read(path, dtype="float32")
    opts = knf.FbankOptions()
    opts.frame_opts.dither = 0.0
    opts.mel_opts.num_bins = 80
    computer = knf.OnlineFbank(opts)
    computer.accept_waveform(rate, (audio * 32768).tolist())
    computer.input_finished()
    return torch.from_numpy(np.stack([computer.get_frame(i) for i in range(computer.num_frames_ready)]))


def utterances(split: str = "train") -> list[tuple[str, torch.Tensor, list[int]]]:
    """(key, feats (T, 80), token ids) for every utterance of tiny_fsdd's ``split``, sorted by key."""
    return [(e["key"], fbank(e["wav"]), [UNITS.index(c) for c in e["txt"]]) for e in kaldi_entries("tiny_fsdd", split)]


def make_batch(utts) -> dict:
    feats = torch.nn.utils.rnn.pad_sequence([u[1] for u in utts], batch_first=True)
    target = torch.nn.utils.rnn.pad_sequence([torch.tensor(u[2]) for u in utts], batch_first=True, padding_value=-1)
    return {"keys": [u[0] for u in utts], "feats": feats,
            "feats_lengths": torch.tensor([len(u[1]) for u in utts]), "target": target,
            "target_lengths": torch.tensor([len(u[2]) for u in utts]), "num_skipped": {}}


class TinyCTC(torch.nn.Module):
    def __init__(self, dim: int = 80, hidden: int = 64):
        super().__init__()
        self.hidden = torch.nn.Linear(dim, hidden)
        self.out = torch.nn.Linear(hidden, len(UNITS))

    def forward(self, feats, feats_lengths, target, target_lengths):
        log_probs = self.out(torch.relu(self.hidden(feats / 10))).log_softmax(-1)  # (B, T, V)
        loss = F.ctc_loss(log_probs.transpose(0, 1), target.clamp(min=0), feats_lengths, target_lengths,
                          reduction="sum", zero_infinity=True) / feats.size(0)
        return {"loss": loss}


class TinyLinear(torch.nn.Module):
    """A score linear in its parameters, for comparing engines: the loss is the batch mean of each utterance's
    frame-averaged ``w . feats / 10 + b``. Its gradient depends on the data alone (no curvature), so an SGD step's
    rounding never feeds back into a later gradient, and two engines' results can differ only by the float32
    rounding that ``worker_engine.RoundingBound`` bounds. The engine under test still has to group the right
    micro-batches into each step, scale them right and step the scheduler and the clipping right."""

    def __init__(self, dim: int = 80):
        super().__init__()
        self.score = torch.nn.Linear(dim, 1)

    def forward(self, feats, feats_lengths, target, target_lengths):
        valid = torch.arange(feats.size(1)).unsqueeze(0) < feats_lengths.unsqueeze(1)  # (B, T)
        frames = self.score(feats / 10).squeeze(2) * valid  # (B, T)
        return {"loss": (frames.sum(1) / feats_lengths).mean()}


class TinyConformer(ASRModel):
    """The recipe's tiny conformer (``train_tiny.yaml``: 2 blocks x 96, dropout 0.1, one decoder block) over UNITS,
    without CMVN."""

    def __init__(self):
        config = read_config(str(REPO_ROOT / "examples/english/s0/conf/train_tiny.yaml"), ["cmvn null"])
        parts = init_model(config, 80, len(UNITS))
        super().__init__(len(UNITS), parts.encoder, parts.decoder, parts.ctc, **config.model_conf)


def prepared_ddp_engine(ctx, train_conf: dict):
    """TinyCTC under the torch_ddp engine with Adam (lr 0.01, 2 warm-up steps): ``(engine, optimizer)``."""
    from toolkit.engine import init_engine
    from toolkit.utils.scheduler import init_optimizer_and_scheduler

    model = TinyCTC()
    optimizer, scheduler = init_optimizer_and_scheduler(model.parameters(), "adam", {"lr": 0.01}, "warmuplr",
                                                        {"warmup_steps": 2})
    engine = init_engine("torch_ddp", ctx, train_conf, find_unused_parameters=False)
    engine.prepare(model, optimizer, scheduler)
    return engine, optimizer


def assert_within_rounding(report: dict, reference: dict) -> None:
    """Every parameter element of a worker ``report`` lies within the rounding bound of the ``reference`` run
    (``worker_engine.py --record_bound``), and that bound is far below what training moved the parameters, so that
    a real difference (a gradient scaled by another factor, a micro-batch in another step) cannot hide inside it."""
    for key, values in reference["params"].items():
        for i, (value, expected, limit) in enumerate(zip(report["params"][key], values, reference["bound"][key])):
            assert abs(value - expected) <= limit, f"{key}[{i}]: {value} vs {expected}, rounding bound {limit:.3g}"
    assert max(max(b) for b in reference["bound"].values()) < 1e-3 * reference["moved"]


def executor_for(engine, join, train_conf, out_dir: str, checkpointer=None, **executor_kwargs):
    """An :class:`~toolkit.engine.executor.Executor` over ``engine`` for worker scripts that feed it lists of
    batches (10 ms frames; with no checkpointer given, one in ``out_dir`` that only saves when asked;
    ``executor_kwargs`` such as ``clock`` go to the Executor)."""
    from toolkit.engine.checkpointer import Checkpointer
    from toolkit.engine.executor import Executor

    checkpointer = checkpointer or Checkpointer(engine, out_dir, train_conf)
    return Executor(engine, join, checkpointer, train_conf, frame_shift_s=0.01, data_signature="test",
                    **executor_kwargs)
