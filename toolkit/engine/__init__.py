"""Training engines behind one interface; :func:`init_engine` is the only place that reads ``train_engine``."""

from __future__ import annotations

from toolkit.distributed.context import DistContext
from toolkit.engine.base import Engine, check_dtype
from toolkit.engine.deepspeed import DeepSpeedEngine, check_deepspeed_config, load_deepspeed_config
from toolkit.engine.torch_ddp import TorchDDPEngine
from toolkit.engine.torch_fsdp import TorchFSDPEngine, check_fsdp_conf
from toolkit.engine.train_conf import TrainConf
from toolkit.utils.config_parsing import ConfigError

ENGINE_CHOICES = ("torch_ddp", "deepspeed", "torch_fsdp")

__all__ = ["ENGINE_CHOICES", "Engine", "check_engine_args", "check_engine_setup", "init_engine"]


def check_engine_args(train_engine: str, deepspeed_config: str | None) -> None:
    """Raises ConfigError unless ``--deepspeed_config`` is given exactly when ``--train_engine`` is ``deepspeed``."""
    if (train_engine == "deepspeed") != (deepspeed_config is not None):
        raise ConfigError("--deepspeed_config goes with --train_engine deepspeed, and only with it "
                          f"(got --train_engine {train_engine}, --deepspeed_config {deepspeed_config})")


def check_engine_setup(train_engine: str, deepspeed_config: str | None, train_conf: TrainConf,
                       micro_batch_size: int | None, device_type: str) -> None:
    """What :func:`init_engine` refuses on every rank, checked in one process before any rank starts (the trainer's
    ``--check_only`` and its first step): :func:`check_engine_args`, the DeepSpeed JSON against the YAML,
    ``train_conf.dtype`` on ``device_type`` (``"cuda"`` or ``"cpu"``: the ranks' device), and the ``fsdp_*`` keys
    (:func:`~toolkit.engine.torch_fsdp.check_fsdp_conf`).

    Raises:
        ConfigError: naming the option or key and what to do.
    """
    check_engine_args(train_engine, deepspeed_config)
    check_fsdp_conf(train_engine, train_conf)
    check_dtype(train_conf.dtype, device_type)
    if train_engine == "deepspeed":
        check_deepspeed_config(load_deepspeed_config(deepspeed_config), train_conf, micro_batch_size,
                               deepspeed_config)


def init_engine(train_engine: str, ctx: DistContext, train_conf: TrainConf, find_unused_parameters: bool,
                deepspeed_config: str | None = None, micro_batch_size: int | None = None,
                keep_shards: bool = True) -> Engine:
    """Create the engine named by ``--train_engine``.

    Args:
        deepspeed_config: path of the DeepSpeed JSON (``deepspeed`` only; required there).
        micro_batch_size: ``dataset_conf.batch_conf.batch_size`` with static batches, None with dynamic or bucket
            batches (``deepspeed``: checked against the JSON's micro batch size).
        keep_shards: ``deepspeed``: keep the ZeRO shard directory of each checkpoint (see DeepSpeedEngine).

    Raises:
        ValueError: an unknown engine name (the message lists the valid ones).
        ConfigError: ``--deepspeed_config`` missing for ``deepspeed`` or given to another engine, the JSON
            disagrees with the YAML, or a ``train_conf`` key does not fit the engine
            (:func:`~toolkit.engine.torch_fsdp.check_fsdp_conf`).
    """
    if train_engine not in ENGINE_CHOICES:
        raise ValueError(f"--train_engine {train_engine!r} is not one of {list(ENGINE_CHOICES)}")
    check_engine_args(train_engine, deepspeed_config)
    check_fsdp_conf(train_engine, train_conf)
    if train_engine == "torch_fsdp":
        return TorchFSDPEngine(ctx, train_conf)
    if train_engine == "deepspeed":
        ds_config = check_deepspeed_config(load_deepspeed_config(deepspeed_config), train_conf, micro_batch_size,
                                           deepspeed_config)
        return DeepSpeedEngine(ctx, train_conf, ds_config, keep_shards)
    return TorchDDPEngine(ctx, train_conf.dtype, train_conf.grad_clip, find_unused_parameters)
