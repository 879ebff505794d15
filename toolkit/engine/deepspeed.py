"""``train_engine: deepspeed``: DeepSpeed ZeRO stages 0-3 behind the :class:`~toolkit.engine.base.Engine` verbs.

ZeRO ("ZeRO: Memory Optimizations Toward Training Trillion Parameter Models", arXiv:1910.02054) partitions the
optimizer state (stage 1), the gradients (stage 2) and the parameters (stage 3) across the data-parallel ranks.
The YAML's optimizer (a plain ``torch.optim.Adam``/``AdamW``: DeepSpeed's own optimizers compile C++ ops) and its
``WarmupLR`` are passed in; the JSON given by ``--deepspeed_config`` only says how to shard and in which precision.

Values that exist on both sides are checked once, in :func:`check_deepspeed_config`; a key the JSON leaves out is
filled from the YAML, so the YAML can stay the only source.

On CPU the engine sets ``DS_ACCELERATOR=cpu`` (collectives on the torch gloo group), on GPU DeepSpeed picks CUDA
and nccl. NOTE: at start DeepSpeed's torch backend compiles a shared-memory collective op
(``deepspeed_shm_comm``): it needs a C++ compiler, costs ~1 minute the first time, and serves inference only
(machine-facts.md). :func:`disable_shm_op_build` replaces the module attribute ``build_shm_op`` of
``deepspeed.comm.torch`` with a function returning ``None`` (DeepSpeed's own "op not available" value), so training
starts without a compiler and without that minute; it logs that it did.

Checkpoints: :meth:`DeepSpeedEngine.save` calls ``save_checkpoint`` on every rank (it is collective: a rank-0-only
call hangs), then global rank 0 writes a consolidated fp32 ``{tag}.pt`` + ``{tag}.yaml`` in the format of
:mod:`toolkit.utils.checkpoint`, read by ``average_model.py``, ``recognize.py`` and a torch_ddp resume like any
other checkpoint. The shard directory ``{model_dir}/{tag}/`` holds the optimizer state; :meth:`DeepSpeedEngine.load`
needs it (it refuses to resume with fresh optimizer state).

ZeRO-3 and cross-validation: under ZeRO-3 each rank holds a slice of the parameters and every forward gathers
them (a collective), so ranks with unequal numbers of CV batches (or none) would mismatch collectives and hang.
:meth:`DeepSpeedEngine.evaluation` gathers the whole model once on every rank for the evaluation pass (DeepSpeed's
``zero.GatheredParameters``), after which forwards are local; the model must fit on one device for evaluation,
as it must for decoding.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import json
import logging
import math
import os
import shutil
import zipfile
from typing import Any, ContextManager

import torch

from toolkit.distributed.collectives import all_gather_objects
from toolkit.distributed.context import DistContext
from toolkit.distributed.main_only import barrier, check_collective, run_on_main
from toolkit.engine.base import PRECISIONS, Engine
from toolkit.engine.train_conf import TrainConf
from toolkit.utils.checkpoint import (EXTRA_KEY, MODEL_KEY, OPTIMIZER_KEY, SCHEDULER_KEY, check_model_state,
                                      load_checkpoint, read_torch_file, save_checkpoint)
from toolkit.utils.config_parsing import ConfigError


def load_deepspeed_config(path: str) -> dict:
    """Read the DeepSpeed JSON.

    Raises:
        ConfigError: the file is missing or not a JSON object.
    """
    try:
        with open(path, encoding="utf-8") as f:
            config = json.load(f)
    except FileNotFoundError as e:
        raise ConfigError(f"--deepspeed_config {path}: file not found") from e
    except json.JSONDecodeError as e:
        raise ConfigError(f"--deepspeed_config {path}: not valid JSON: {e}") from e
    if not isinstance(config, dict):
        raise ConfigError(f"--deepspeed_config {path}: top level must be an object")
    return config


def check_deepspeed_config(ds_config: dict, train_conf: TrainConf, micro_batch_size: int | None,
                           path: str = "ds_config") -> dict:
    """The one place where the DeepSpeed JSON meets the YAML: compare the values both have, fill the rest.

    Pairs: ``train_micro_batch_size_per_gpu`` <-> ``micro_batch_size``, the YAML's
    ``dataset_conf.batch_conf.batch_size`` with static batches (None otherwise: with dynamic or bucket batches
    DeepSpeed uses it only for its throughput log and it defaults to 1),
    ``gradient_accumulation_steps`` <-> ``train_conf.accum_grad``, ``gradient_clipping`` <-> ``train_conf.grad_clip``
    and ``bf16.enabled``/``fp16.enabled`` <-> ``train_conf.dtype``.

    Returns:
        a copy of ``ds_config`` with the absent paired keys filled from the YAML.

    Raises:
        ConfigError: a value differs (the message names both values), the JSON has ``optimizer``/``scheduler``
            sections (the YAML's are used), ``train_batch_size`` is set (it is derived), ZeRO >= 1 with
            ``accum_grad`` > 1 meets ``join_mode: monitored_barrier``, or ZeRO-3 meets ``train_conf.compile``.
    """
    conf = json.loads(json.dumps(ds_config))
    problems = [f"{path}: '{key}' is not allowed: the YAML's optim/scheduler are passed to DeepSpeed"
                for key in ("optimizer", "scheduler") if key in conf]
    if train_conf.join_mode == "monitored_barrier" and train_conf.accum_grad > 1 and zero_stage(conf) > 0:
        # NOTE: that join cannot tell ranks which step is the epoch's last, so a cut-short accumulation would stay
        # in ZeRO's gradient partitions (which zero_grad does not clear) and leak into the next epoch's first step.
        problems.append(f"{path}: ZeRO stage {zero_stage(conf)} with train_conf.accum_grad "
                        f"{train_conf.accum_grad} needs train_conf.join_mode flag (monitored_barrier cannot end "
                        "an epoch on an accumulation boundary)")
    if train_conf.compile and zero_stage(conf) == 3:
        # NOTE: ZeRO-3 gathers each module's parameters in its forward hooks, which a compiled block would trace.
        problems.append(f"{path}: ZeRO stage 3 with train_conf.compile true is not supported (stages 0-2 are)")
    if "train_batch_size" in conf:
        problems.append(f"{path}: remove 'train_batch_size'; it is micro batch x accum_grad x world size")
    pairs = [("gradient_accumulation_steps", train_conf.accum_grad, "train_conf.accum_grad"),
             ("gradient_clipping", train_conf.grad_clip, "train_conf.grad_clip")]
    if micro_batch_size is not None:
        pairs.append(("train_micro_batch_size_per_gpu", micro_batch_size, "dataset_conf.batch_conf.batch_size"))
    else:
        conf.setdefault("train_micro_batch_size_per_gpu", 1)
    for key, yaml_value, yaml_name in pairs:
        if key not in conf:
            conf[key] = yaml_value
        elif float(conf[key]) != float(yaml_value):
            problems.append(f"{path}: {key} = {conf[key]} but {yaml_name} = {yaml_value}")
    for dtype in ("bf16", "fp16"):
        section = conf.setdefault(dtype, {})
        wanted = train_conf.dtype == dtype
        if "enabled" not in section:
            section["enabled"] = wanted
        elif bool(section["enabled"]) != wanted:
            problems.append(f"{path}: {dtype}.enabled = {section['enabled']} but train_conf.dtype = "
                            f"{train_conf.dtype}")
    if problems:
        raise ConfigError("DeepSpeed config disagrees with the training YAML:\n  " + "\n  ".join(problems))
    return conf


def zero_stage(ds_config: dict) -> int:
    """``zero_optimization.stage`` (0 when absent)."""
    return int(ds_config.get("zero_optimization", {}).get("stage", 0))


def expected_shard_files(model_dir: str, tag: str, world_size: int, stage: int, bf16: bool) -> list[str]:
    """Files a DeepSpeed ``save_checkpoint(model_dir, tag)`` of ``world_size`` ranks leaves (DeepSpeed's naming:
    model states of model-parallel rank 00; stage 3 writes them per rank; ZeRO and bf16 write one optimizer-state
    file per data-parallel rank)."""
    shard_dir = os.path.join(model_dir, tag)
    if stage == 3:
        files = [os.path.join(shard_dir, f"zero_pp_rank_{r}_mp_rank_00_model_states.pt") for r in range(world_size)]
    else:
        files = [os.path.join(shard_dir, "mp_rank_00_model_states.pt")]
    if stage > 0 or bf16:
        prefix = "bf16_" if bf16 else ""
        files += [os.path.join(shard_dir, f"{prefix}zero_pp_rank_{r}_mp_rank_00_optim_states.pt")
                  for r in range(world_size)]
    return files


def disable_shm_op_build() -> None:
    """Stop DeepSpeed from compiling its CPU shared-memory collective op (inference only; see module docstring)."""
    comm_torch = importlib.import_module("deepspeed.comm.torch")
    comm_torch.build_shm_op = lambda: None
    logging.info("deepspeed: skipped building the CPU shared-memory op (inference-only); collectives use gloo")


@contextlib.contextmanager
def _step_skipped(optimizer: torch.optim.Optimizer):
    """Make ``optimizer.step()`` a no-op inside (an instance attribute shadows the class's method)."""
    optimizer.step = lambda *args, **kwargs: None
    try:
        yield
    finally:
        del optimizer.step


def _cast_floats(dtype: torch.dtype):
    def hook(module, args):
        return tuple(a.to(dtype) if torch.is_tensor(a) and a.is_floating_point() else a for a in args)
    return hook


def _autocast_forward(forward, device_type: str, dtype: torch.dtype):
    """``forward`` run under ``torch.autocast(device_type, dtype)``, whatever the caller entered."""
    @functools.wraps(forward)
    def autocast_forward(*args, **kwargs):
        with torch.autocast(device_type, dtype=dtype):
            return forward(*args, **kwargs)
    return autocast_forward


class DeepSpeedEngine(Engine):
    """DeepSpeed engine.

    Args:
        ctx: the rank context.
        train_conf: resolved ``train_conf`` (``dtype``, ``grad_clip``, ``accum_grad``).
        ds_config: the JSON as checked by :func:`check_deepspeed_config`.
        keep_shards: keep ``{model_dir}/{tag}/`` after the consolidated ``.pt`` is written (needed to resume with
            optimizer state); ``False`` deletes it (the ``.pt`` still decodes, averages and seeds a torch_ddp run).
    """

    def __init__(self, ctx: DistContext, train_conf: TrainConf, ds_config: dict, keep_shards: bool = True):
        super().__init__(ctx, train_conf.dtype, train_conf.grad_clip)
        self.ds_config = ds_config
        self.stage = zero_stage(ds_config)
        self.keep_shards = keep_shards
        self._sync = True
        if ctx.device.type == "cpu":
            # NOTE: read by deepspeed.accelerator at import; without it DeepSpeed looks for CUDA.
            os.environ.setdefault("DS_ACCELERATOR", "cpu")

    def prepare(self, model, optimizer, scheduler):
        import deepspeed  # NOTE: imported here: 2-3 s that torch_ddp runs should not pay.

        if self.ctx.device.type == "cpu":
            disable_shm_op_build()
        self.model, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, lr_scheduler=scheduler,
                                                   config=self.ds_config, dist_init_required=False)
        if self.dtype == "bf16":
            # NOTE: DeepSpeed keeps bf16 weights; fp32 features would meet them in ops autocast leaves alone.
            self.model.module.register_forward_pre_hook(_cast_floats(torch.bfloat16))
        if self.dtype != "fp32":
            # NOTE: the model's own forward enters autocast: DeepSpeed's forward turns off one entered outside it
            # on a GPU (deepspeed/runtime/torch_autocast.py, autocast_if_enabled), and its fp32 buffers (CMVN)
            # would then meet the bf16 weights ("mat1 and mat2 must have the same dtype", H200, 2026-12-04).
            module = self.model.module
            module.forward = _autocast_forward(module.forward, self.ctx.device.type, PRECISIONS[self.dtype])
        self.optimizer = optimizer
        self.scheduler = scheduler
        return self.model

    def autocast(self) -> ContextManager:
        """Nothing: the model's forward enters autocast itself (see :meth:`prepare`)."""
        return contextlib.nullcontext()

    def evaluation(self) -> ContextManager:
        """ZeRO-3: gather every parameter on every rank for the pass (collective; see the module docstring)."""
        if self.stage < 3:
            return contextlib.nullcontext()
        import deepspeed

        check_collective("evaluation")
        return deepspeed.zero.GatheredParameters(list(self.module.parameters()), modifier_rank=None)

    def accumulate(self, sync: bool) -> ContextManager:
        # NOTE: the executor owns the accumulation boundary (it restarts its count each epoch), so DeepSpeed's own
        # micro-step counter is overridden rather than trusted.
        self._sync = sync
        self.model.set_gradient_accumulation_boundary(sync)
        return contextlib.nullcontext()

    def backward(self, loss: torch.Tensor) -> None:
        # The executor has already divided by accum_grad; DeepSpeed would divide again.
        self.model.backward(loss, scale_wrt_gas=False)
        if not self._sync:
            self.model.step()  # DeepSpeed wants step() after every micro-batch; off the boundary it only counts.

    def step(self) -> float:
        """Boundary step: DeepSpeed clips, steps the optimizer and the LR scheduler. Returns the pre-clip global
        gradient norm.

        A non-finite norm skips the update and the LR step (:meth:`Engine.step`'s rule): DeepSpeed's ZeRO and
        bf16/fp16 optimizers do it themselves (they flag it as an ``overflow``). NOTE: at stage 0 in fp32 DeepSpeed
        calls the plain torch optimizer whatever the gradients hold, so here that call is made a no-op for the step
        and the optimizer is flagged with the same ``overflow`` attribute, which DeepSpeed reads to skip the LR step
        and count ``skipped_steps``; it then zeroes the gradients as after any step."""
        if not (self.stage == 0 and self.dtype == "fp32"):
            self.model.step()
            return float(self.model.get_global_grad_norm())
        norm = self._grad_norm()
        optimizer = self.model.optimizer
        optimizer.overflow = not math.isfinite(norm)
        with _step_skipped(optimizer) if optimizer.overflow else contextlib.nullcontext():
            self.model.step()
        return norm

    def _grad_norm(self) -> float:
        # Stage 0 fp32: after the boundary backward every rank holds the whole averaged gradient in .grad.
        grads = [p.grad for p in self.module.parameters() if p.grad is not None]
        if not grads:
            return 0.0
        return float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads])))

    def zero_grad(self) -> None:
        self.model.zero_grad()
        self.model.optimizer.zero_grad()

    def state_dict(self) -> dict[str, Any]:
        """In-memory fp32 model and scheduler state (stages 0-2: every rank holds whole parameters). Checkpoints on
        disk go through :meth:`save`, which consolidates the ZeRO shards with DeepSpeed's own API."""
        return {MODEL_KEY: {k: v.float() if v.is_floating_point() else v
                            for k, v in self.module.state_dict().items()},
                SCHEDULER_KEY: self.scheduler.state_dict()}

    def model_shapes(self) -> dict[str, tuple[int, ...]]:
        """Whole shapes also under ZeRO-3, whose parameters hold a rank's slice (their ``ds_shape`` the whole)."""
        return {key: tuple(getattr(value, "ds_shape", value.shape))
                for key, value in self.module.state_dict(keep_vars=True).items()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Load model weights (and scheduler) from a toolkit checkpoint, e.g. to initialise from a torch_ddp model.

        Raises:
            ValueError: ``state`` carries a torch optimizer state, which ZeRO cannot take over; resume a DeepSpeed
                run through :meth:`load` instead.
        """
        if OPTIMIZER_KEY in state:
            raise ValueError("a torch optimizer state cannot be loaded into DeepSpeed; resume from a checkpoint "
                             "this engine saved (its shard directory holds the optimizer state)")
        self.module.load_state_dict(state[MODEL_KEY])
        if SCHEDULER_KEY in state:
            self.scheduler.load_state_dict(state[SCHEDULER_KEY])

    def save(self, path: str, info: dict[str, Any], extra: dict[str, Any] | None = None) -> None:
        """Collective: every rank writes its shards, then rank 0 writes the consolidated fp32 ``path`` (with
        ``extra`` under ``EXTRA_KEY`` when given)."""
        check_collective("save_model")
        model_dir, tag = _split(path)
        self.model.save_checkpoint(model_dir, tag=tag, save_latest=self.keep_shards)
        barrier("save_model shards")  # every rank's shard is on disk before rank 0 reads them all

        def consolidate() -> None:
            from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

            model_state = get_fp32_state_dict_from_zero_checkpoint(model_dir, tag)
            state = {MODEL_KEY: model_state, SCHEDULER_KEY: self.scheduler.state_dict()}
            if extra is not None:
                state[EXTRA_KEY] = extra
            save_checkpoint(path, state, info)
            if not self.keep_shards:
                shutil.rmtree(os.path.join(model_dir, tag))

        run_on_main(consolidate)

    def load(self, path: str) -> dict[str, Any]:
        """Resume model, optimizer and scheduler from the shards beside ``path`` (``{model_dir}/{tag}/``). Returns
        the ``extra`` entry of ``path`` (``{}`` when absent) for the caller's saver hooks.

        Raises:
            ConfigError: on EVERY rank (decided on what all of them see, so that none waits in a later collective),
                in one line naming the checkpoint: its shards were saved with another ZeRO stage or precision, or
                by another number of ranks (ZeRO's optimizer state is partitioned by rank, so it resumes on the same
                world size only); a rank cannot see one of the shard files (node-local disks, shards dropped) or
                one is cut short or not a torch save (each rank's files named); or ``path`` is not a readable
                checkpoint or holds a model of another shape (:func:`~toolkit.utils.checkpoint.load_checkpoint`,
                :func:`~toolkit.utils.checkpoint.check_model_state`).
        """
        check_collective("load_model")
        model_dir, tag = _split(path)
        bf16 = self.dtype == "bf16"
        expected = expected_shard_files(model_dir, tag, self.ctx.world_size, self.stage, bf16)
        missing = [f for f in expected if not os.path.exists(f)]
        damaged = [f for f in expected if f not in missing and not zipfile.is_zipfile(f)]
        try:
            saved = _saved_setup(model_dir, tag)
        except ConfigError as e:
            saved = str(e)
        gathered = all_gather_objects((missing, damaged, saved), "load_model")
        for _, _, seen in gathered:
            if isinstance(seen, str):  # a rank's model-states file is unreadable
                raise ConfigError(seen)
        setup = next((seen for _, _, seen in gathered if seen is not None), None)
        if setup is not None:
            stage, dtype, world_size = setup
            if (stage, dtype) != (self.stage, self.dtype):
                raise ConfigError(
                    f"cannot resume {path} with ZeRO stage {self.stage} in {self.dtype}: its shards were saved with "
                    f"stage {stage} in {dtype} and resume with that setup only; set it "
                    "in --deepspeed_config and train_conf.dtype, or start from its weights with --train_engine "
                    "torch_ddp")
            if (self.stage > 0 or bf16) and world_size not in (0, self.ctx.world_size):
                raise ConfigError(
                    f"cannot resume {path} with {self.ctx.world_size} ranks: its ZeRO optimizer state was written "
                    f"by {world_size} ranks and resumes on that many only; resume with {world_size} ranks, or start "
                    "the new world size from its weights with --train_engine torch_ddp")
        report = [f"rank {rank} {what}: {', '.join(files)}" for rank, (missing, damaged, _) in enumerate(gathered)
                  for what, files in (("cannot see", missing), ("reads a cut or non-torch file", damaged)) if files]
        if report:
            raise ConfigError(f"cannot resume {path} with its optimizer state: " + "; ".join(report))
        consolidated = load_checkpoint(path, mmap=True)  # memory-mapped: its shapes are read, not its weights
        check_model_state(self.model_shapes(), consolidated[MODEL_KEY], path)
        load_path, _ = self.model.load_checkpoint(model_dir, tag=tag, load_optimizer_states=True,
                                                  load_lr_scheduler_states=True)
        if load_path is None:
            raise ConfigError(f"cannot resume {path}: DeepSpeed found no checkpoint {tag} in {model_dir}")
        return consolidated.get(EXTRA_KEY, {})


def _saved_setup(model_dir: str, tag: str) -> tuple[int, str, int] | None:
    """``(ZeRO stage, dtype: "fp32", "bf16" or "fp16", data-parallel world size)`` that DeepSpeed's model-states
    file in ``{model_dir}/{tag}/`` records (its ``ds_config`` and ``dp_world_size``), or None where this rank sees
    none; memory-mapped, so the weights are not read.

    Raises:
        ConfigError: the file is cut short or not a torch save.
    """
    for name in ("mp_rank_00_model_states.pt", "zero_pp_rank_0_mp_rank_00_model_states.pt"):  # stages 0-2, 3
        model_states = os.path.join(model_dir, tag, name)
        if os.path.exists(model_states):
            state = read_torch_file(model_states, mmap=True)
            ds_config = state.get("ds_config") or {}
            dtype = next((half for half in ("bf16", "fp16") if ds_config.get(half, {}).get("enabled")), "fp32")
            return zero_stage(ds_config), dtype, int(state.get("dp_world_size", 0))
    return None


def _split(path: str) -> tuple[str, str]:
    """``exp/x/epoch_3.pt`` -> (``exp/x``, ``epoch_3``)."""
    return os.path.dirname(os.path.abspath(path)), os.path.basename(path)[: -len(".pt")]
