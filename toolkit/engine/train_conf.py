"""``train_conf``: the trainer's typed settings (epochs, accumulation, clipping, precision, checkpoints, join).

Built from the YAML's ``train_conf`` by :func:`resolve_train_conf` (through :func:`toolkit.utils.config_parsing.typed`):
keys it leaves out take the defaults below, an unknown key or a wrongly typed or out-of-range value stops with a
one-line :class:`~toolkit.utils.config_parsing.ConfigError`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal, Optional

from toolkit.distributed.join import JOIN_MODES
from toolkit.utils.config_parsing import fill_defaults, require, typed

PRECISIONS = ("fp32", "bf16", "fp16")
FSDP_SHARDING_STRATEGIES = ("zero2", "zero3")
FSDP_STATE_DICT_TYPES = ("full", "sharded")


@dataclass
class TrainConf:
    """Attributes:
        max_epoch: epochs to train.
        max_train_minutes: also stop training after this many minutes of the run (0 disables): the epoch in
            progress is cut short at the step where global rank 0's clock reaches the bound less the CV + save to
            come (the longest measured so far, estimated before the first), then cross-validated and saved, so that
            the run ends by the bound plus one step, the first epoch included; every rank follows rank 0
            (:mod:`toolkit.engine.time_budget`). For a budget in time on machines whose speed varies
            (as fairseq's ``--stop-time-hours``, which stops at the first update past it).
        accum_grad: micro-batches per optimizer step (gradient accumulation).
        grad_clip: max global L2 norm of the gradients; 0 disables clipping (the norm is still logged).
        log_interval: optimizer steps between log lines and tensorboard points.
        dtype: ``fp32``, ``bf16`` (autocast) or ``fp16`` (GPU only, with loss scaling).
        seed: torch seed and the data shuffle's seed.
        save_interval_steps, save_interval_minutes: also save a ``step_N`` checkpoint every N optimizer steps / M
            minutes of rank 0's clock (0 disables; see :mod:`toolkit.engine.checkpointer`).
        keep_last_n: keep only the newest N ``step_*``/``epoch_*`` checkpoints (0 keeps all) ...
        keep_best_n: ... and never delete the N epochs with the lowest cv_loss (what averaging picks).
        join_mode, join_timeout_s: how ranks with uneven data stop together (:mod:`toolkit.distributed.join`);
            the timeout (seconds) is used by ``monitored_barrier`` only.
        activation_checkpointing: recompute each encoder and decoder layer's activations in the backward pass
            instead of keeping them (less memory, one more forward of the layers; the same loss and gradients).
        compile: ``torch.compile`` the model's repeated blocks (encoder and decoder layers) in place before the
            engine wraps the model (:mod:`toolkit.engine.compile`; off by default: on CPU it does not pay, see
            docs/benchmarks.md).
        fsdp_sharding_strategy: ``--train_engine torch_fsdp`` only (another engine refuses it): ``zero2`` (the
            default when unset: a block's gathered parameters are kept from its forward to its backward, as ZeRO-2)
            or ``zero3`` (freed after the forward and gathered again in the backward, as ZeRO-3: less memory, one
            more all-gather). WeNet's ``--fsdp_sharding_strategy`` and its meaning.
        fsdp_cpu_offload: ``torch_fsdp`` only: keep the sharded parameters, their gradients and the optimizer step
            in CPU memory (FSDP2's ``CPUOffloadPolicy``; a GPU run trades speed for memory, a CPU run gains
            nothing). WeNet's ``--fsdp_cpu_offload``.
        fsdp_state_dict_type: ``torch_fsdp`` only: ``full`` (the default when unset: the optimizer state is gathered
            into the checkpoint's ``.pt`` with the model) or ``sharded`` (each rank writes its slice of the model and
            the optimizer state into the directory ``{tag}/`` with ``torch.distributed.checkpoint``, and only the
            model is gathered into the ``.pt``; such a checkpoint resumes with its optimizer state in torch_fsdp only).
            Accelerate's ``fsdp_state_dict_type`` (FULL_STATE_DICT, SHARDED_STATE_DICT).
    """

    SECTION: ClassVar[str] = "train_conf"
    max_epoch: int = 10
    max_train_minutes: float = 0.0
    accum_grad: int = 1
    grad_clip: float = 5.0
    log_interval: int = 20
    dtype: Literal[PRECISIONS] = "fp32"
    seed: int = 777
    save_interval_steps: int = 0
    save_interval_minutes: float = 0.0
    keep_last_n: int = 0
    keep_best_n: int = 5
    join_mode: Literal[JOIN_MODES] = "flag"
    join_timeout_s: float = 30.0
    activation_checkpointing: bool = False
    compile: bool = False
    fsdp_sharding_strategy: Optional[Literal[FSDP_SHARDING_STRATEGIES]] = None
    fsdp_cpu_offload: Optional[bool] = None
    fsdp_state_dict_type: Optional[Literal[FSDP_STATE_DICT_TYPES]] = None

    def __post_init__(self):
        for key in ("max_epoch", "accum_grad", "log_interval"):
            require(getattr(self, key) >= 1, f"train_conf.{key}", "a positive integer", getattr(self, key))
        for key in ("save_interval_steps", "keep_last_n", "keep_best_n"):
            require(getattr(self, key) >= 0, f"train_conf.{key}", "a non-negative integer (0 disables)",
                    getattr(self, key))
        require(self.grad_clip >= 0, "train_conf.grad_clip", "a non-negative number (0 disables clipping)",
                self.grad_clip)
        require(self.max_train_minutes >= 0, "train_conf.max_train_minutes", "a non-negative number (0 disables)",
                self.max_train_minutes)
        require(self.save_interval_minutes >= 0, "train_conf.save_interval_minutes", "a non-negative number",
                self.save_interval_minutes)
        require(self.join_timeout_s > 0, "train_conf.join_timeout_s", "a positive number of seconds",
                self.join_timeout_s)


def resolve_train_conf(given: Optional[dict]) -> TrainConf:
    """The typed ``train_conf`` from the YAML's dict (None or partial: defaults fill the rest).

    Raises:
        ConfigError: an unknown key (the valid ones are listed), a value of the wrong type (``max_epoch: true``,
            ``grad_clip: nan``), a choice not offered (``dtype``, ``join_mode``) or a value out of range.
    """
    return typed(TrainConf, given, "train_conf")


def fill_train_defaults(given: Optional[dict]) -> dict:
    """``given`` with every key the YAML leaves out set to its default (unchecked), so that an override can set it."""
    return fill_defaults(TrainConf, given)
