"""``train_engine: torch_fsdp``: PyTorch fully sharded data parallelism, FSDP2 (``torch.distributed.fsdp``).

Each rank holds a 1/world-size slice (dim 0) of every parameter, of its gradient and of the optimizer state, as
ZeRO does ("ZeRO: Memory Optimizations Toward Training Trillion Parameter Models", arXiv:1910.02054; the FSDP paper,
arXiv:2304.11277). Every encoder and decoder block (:func:`toolkit.engine.compile.repeated_blocks`) is one
``fully_shard`` unit, then the root holds the rest (front end, CTC, embeddings): a unit's parameters are all-gathered
just before its forward and its gradients reduce-scattered after its backward.

Configured by ``train_conf`` (:class:`~toolkit.engine.train_conf.TrainConf`, WeNet's names):
``fsdp_sharding_strategy`` ``zero2`` (default; gathered parameters kept from forward to backward) or ``zero3``
(resharded after the forward), ``fsdp_cpu_offload`` (``CPUOffloadPolicy``), and ``dtype``: ``bf16`` gathers the
parameters in bf16 for the forward and backward and reduces the gradients in fp32 (``MixedPrecisionPolicy``), under
autocast as the other engines; the sharded parameters and the optimizer stay fp32. ``fp16`` is refused (it would
need a gradient scaler that agrees across shards).

As the other engines: ``accum_grad`` without gradient communication between micro-batches
(``set_requires_gradient_sync(False)``), ``grad_clip`` on the global L2 norm of the sharded gradients (each rank
holds a slice: the norm is reduced over the ranks), the non-finite skip of :meth:`Engine.step`, uneven data through
the executor's join (every rank runs the same forwards, so the all-gathers match), CV on every rank
(:meth:`TorchFSDPEngine.evaluation` gathers the whole model once, after which forwards issue no collective).

Checkpoints: the same consolidated files as torch_ddp (:mod:`toolkit.utils.checkpoint`). Saving is a collective:
every rank takes part in gathering the full model and optimizer state
(``torch.distributed.checkpoint.state_dict``, full state dict offloaded to the CPU of global rank 0), which alone
writes ``{tag}.pt`` and its ``.yaml`` commit marker. The optimizer state is stored in torch's own layout (parameters
numbered in the optimizer's order), so a checkpoint of either engine resumes in the other, optimizer included.
With ``fsdp_state_dict_type: sharded`` the optimizer state is not gathered: every rank writes its slices of the model
and the optimizer state into ``{tag}/`` (DCP, ``torch.distributed.checkpoint.save``), then rank 0 writes the ``.pt``
(model and scheduler) and last the ``.yaml``, which commits both. A resume reads ``{tag}/`` when it is there (each
rank the slices it needs, whatever the world size that wrote them), after every rank has checked that it sees every
file the DCP metadata lists.
"""

from __future__ import annotations

import contextlib
import math
import os
from typing import Any, ContextManager, Iterator

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                     get_optimizer_state_dict, set_model_state_dict,
                                                     set_optimizer_state_dict)
from torch.distributed.fsdp import (CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, OffloadPolicy,
                                    fully_shard)
from torch.distributed.tensor import DTensor

from toolkit.distributed.collectives import all_gather_objects
from toolkit.distributed.context import DistContext
from toolkit.distributed.main_only import check_collective, run_on_main
from toolkit.engine.base import PRECISIONS, Engine
from toolkit.engine.compile import repeated_blocks
from toolkit.engine.train_conf import TrainConf
from toolkit.utils.checkpoint import (EXTRA_KEY, MODEL_KEY, OPTIMIZER_KEY, OPTIMIZER_SHARDS_KEY, SCHEDULER_KEY,
                                      check_model_state, load_checkpoint, save_checkpoint)
from toolkit.utils.config_parsing import ConfigError

FSDP_KEYS = ("fsdp_sharding_strategy", "fsdp_cpu_offload", "fsdp_state_dict_type")
FULL_STATE = StateDictOptions(full_state_dict=True, cpu_offload=True)


def check_fsdp_conf(train_engine: str, train_conf: TrainConf) -> None:
    """Raises ConfigError, naming the key: a ``train_conf.fsdp_*`` key with another engine than ``torch_fsdp``, or,
    with ``torch_fsdp``, ``dtype: fp16``, ``compile: true``, or ``accum_grad`` > 1 with ``join_mode:
    monitored_barrier`` (that join cannot end an epoch on an accumulation boundary, and FSDP keeps an unfinished
    accumulation in its gathered gradients, which ``zero_grad`` does not clear)."""
    if train_engine != "torch_fsdp":
        given = [key for key in FSDP_KEYS if getattr(train_conf, key) is not None]
        if given:
            raise ConfigError(f"train_conf.{given[0]} is a --train_engine torch_fsdp option (got --train_engine "
                              f"{train_engine}); remove it")
        return
    if train_conf.dtype == "fp16":
        raise ConfigError("train_conf.dtype fp16 is not supported with --train_engine torch_fsdp; use bf16")
    if train_conf.compile:
        raise ConfigError("train_conf.compile true is not supported with --train_engine torch_fsdp (FSDP's hooks "
                          "would be traced); set it false")
    if train_conf.join_mode == "monitored_barrier" and train_conf.accum_grad > 1:
        raise ConfigError(f"train_conf.accum_grad {train_conf.accum_grad} with --train_engine torch_fsdp needs "
                          "train_conf.join_mode flag (monitored_barrier cannot end an epoch on an accumulation "
                          "boundary)")


class TorchFSDPEngine(Engine):
    """FSDP2 engine (see the module docstring).

    Args:
        ctx: the rank context.
        train_conf: resolved ``train_conf`` (``dtype``, ``grad_clip``, ``fsdp_sharding_strategy``,
            ``fsdp_cpu_offload``), checked by :func:`check_fsdp_conf`.
    """

    def __init__(self, ctx: DistContext, train_conf: TrainConf):
        super().__init__(ctx, train_conf.dtype, train_conf.grad_clip)
        self.reshard_after_forward = train_conf.fsdp_sharding_strategy == "zero3"
        self.cpu_offload = bool(train_conf.fsdp_cpu_offload)
        self.sharded_checkpoints = train_conf.fsdp_state_dict_type == "sharded"

    def prepare(self, model, optimizer, scheduler):
        """Shard ``model`` in place (each block, then the root) and point ``optimizer``'s parameter groups at the
        sharded parameters that replace the originals (matched by name; the optimizer must hold no state yet)."""
        model.to(self.ctx.device)
        name_of = {id(param): name for name, param in model.named_parameters()}
        policy = {"reshard_after_forward": self.reshard_after_forward,
                  "mp_policy": MixedPrecisionPolicy(param_dtype=PRECISIONS[self.dtype], reduce_dtype=torch.float32),
                  "offload_policy": (CPUOffloadPolicy(pin_memory=self.ctx.device.type == "cuda") if self.cpu_offload
                                     else OffloadPolicy())}
        for block in repeated_blocks(model).values():
            fully_shard(block, **policy)
        fully_shard(model, **policy)
        sharded = dict(model.named_parameters())
        for group in optimizer.param_groups:
            group["params"] = [sharded[name_of[id(param)]] for param in group["params"]]
        self.model = model
        self.optimizer = optimizer
        self.scheduler = scheduler
        return model

    @property
    def module(self) -> torch.nn.Module:
        """The model itself: ``fully_shard`` shards it in place (its class gains ``FSDPModule``, its keys stay)."""
        return self.model

    def _fsdp_modules(self) -> list[FSDPModule]:
        return [module for module in self.model.modules() if isinstance(module, FSDPModule)]

    @contextlib.contextmanager
    def evaluation(self) -> Iterator[None]:
        """Collective: gather every unit's parameters on every rank for the pass and keep them gathered after each
        forward, so ranks may run different numbers of batches (or none); resharded at the end."""
        check_collective("evaluation")
        self.model.set_reshard_after_forward(False)
        for module in self._fsdp_modules():
            module.unshard()
        try:
            yield
        finally:
            for module in self._fsdp_modules():
                module.reshard()
            self.model.set_reshard_after_forward(self.reshard_after_forward)

    def accumulate(self, sync: bool) -> ContextManager:
        self.model.set_requires_gradient_sync(sync)
        return contextlib.nullcontext()

    def grad_leaves(self) -> list[torch.Tensor]:
        """The gathered (unsharded) parameters the forward ran on: the backward accumulates into them before FSDP
        reduce-scatters into the sharded ones. NOTE: FSDP2 keeps them per parameter as ``unsharded_param`` in its
        module state, which has no public accessor in torch 2.13."""
        return [fsdp_param.unsharded_param for module in self._fsdp_modules()
                for group in module._get_fsdp_state()._fsdp_param_groups for fsdp_param in group.fsdp_params
                if fsdp_param.sharded_param.requires_grad]

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def step(self) -> float:
        grads = [param.grad for param in self.model.parameters() if param.grad is not None]
        norm = torch.nn.utils.get_total_norm(grads) if grads else torch.zeros(())
        if isinstance(norm, DTensor):  # each rank's norm of its slices: reduced to the global norm
            norm = norm.full_tensor()
        grad_norm = float(norm)
        applied = math.isfinite(grad_norm)
        if applied:
            if self.grad_clip > 0:
                # torch.nn.utils.clip_grad_norm_'s coefficient, applied to each rank's slices
                coef = torch.clamp(self.grad_clip / (norm + 1e-6), max=1.0)
                for grad in grads:
                    (grad.to_local() if isinstance(grad, DTensor) else grad).mul_(coef.to(grad.device))
            self.optimizer.step()
            self.scheduler.step()  # NOTE: a skipped update leaves the LR schedule where it is (Engine.step's rule)
        self.optimizer.zero_grad(set_to_none=True)
        return grad_norm

    def zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    def _param_names(self) -> list[str]:
        """The model's parameter names in the optimizer's order (the numbering of torch's optimizer state)."""
        name_of = {id(param): name for name, param in self.model.named_parameters()}
        return [name_of[id(param)] for group in self.optimizer.param_groups for param in group["params"]]

    def state_dict(self) -> dict[str, Any]:
        """Collective (every rank calls it): the full model and optimizer state on global rank 0 (CPU tensors; an
        empty model and optimizer state elsewhere), the optimizer's in torch's numbered layout."""
        check_collective("state_dict")
        model_state = get_model_state_dict(self.model, options=FULL_STATE)
        optim_state = get_optimizer_state_dict(self.model, self.optimizer, options=FULL_STATE)
        if self.ctx.is_main:
            number = {name: index for index, name in enumerate(self._param_names())}
            optim_state = {"state": {number[name]: value for name, value in optim_state["state"].items()},
                           "param_groups": [{**group, "params": [number[name] for name in group["params"]]}
                                            for group in optim_state["param_groups"]]}
        return {MODEL_KEY: model_state, OPTIMIZER_KEY: optim_state, SCHEDULER_KEY: self.scheduler.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Collective: every rank takes its slices of the full state (each rank holds all of ``state``)."""
        check_collective("load_state_dict")
        options = StateDictOptions(full_state_dict=True)
        set_model_state_dict(self.model, state[MODEL_KEY], options=options)
        if OPTIMIZER_KEY in state:
            names = self._param_names()
            saved = state[OPTIMIZER_KEY]
            named = {"state": {names[index]: value for index, value in saved["state"].items()},
                     "param_groups": [{**group, "params": [names[index] for index in group["params"]]}
                                      for group in saved["param_groups"]]}
            set_optimizer_state_dict(self.model, self.optimizer, named, options=options)
        if SCHEDULER_KEY in state:
            self.scheduler.load_state_dict(state[SCHEDULER_KEY])

    def _sharded_state(self) -> dict[str, Any]:
        """This rank's slices of the model and optimizer state (DTensors), keyed by parameter name."""
        return {"model": get_model_state_dict(self.model),
                "optimizer": get_optimizer_state_dict(self.model, self.optimizer)}

    def save(self, path: str, info: dict[str, Any], extra: dict[str, Any] | None = None) -> None:
        """Collective: every rank takes part in the gather (:meth:`state_dict`; with sharded checkpoints every rank
        first writes its slices into ``{tag}/`` and only the model is gathered), global rank 0 writes ``path`` and
        its ``.yaml`` as :meth:`Engine.save` does."""
        check_collective("save_model")
        if self.sharded_checkpoints:
            dcp.save(self._sharded_state(), checkpoint_id=_shard_dir(path))
            state = {MODEL_KEY: get_model_state_dict(self.model, options=FULL_STATE),
                     SCHEDULER_KEY: self.scheduler.state_dict(),
                     OPTIMIZER_SHARDS_KEY: os.path.basename(_shard_dir(path))}
        else:
            state = self.state_dict()

        def write() -> None:
            if extra is not None:
                state[EXTRA_KEY] = extra
            save_checkpoint(path, state, info)

        run_on_main(write)

    def load(self, path: str) -> dict[str, Any]:
        """Resume from ``path``: from its DCP directory ``{tag}/`` when there is one (model and optimizer slices;
        the scheduler and ``extra`` from the ``.pt``), else from the ``.pt`` alone (:meth:`Engine.load`). Collective.

        Raises:
            ConfigError: on every rank, naming the files: a rank cannot see a file the directory's ``.metadata``
                lists (or the metadata itself); or what :meth:`Engine.load` raises.
        """
        check_collective("load_model")
        shard_dir = _shard_dir(path)
        if not os.path.isdir(shard_dir):
            return super().load(path)
        try:
            metadata = dcp.FileSystemReader(shard_dir).read_metadata()
            names = {item.relative_path for item in metadata.storage_data.values()}
            missing = sorted(name for name in names if not os.path.exists(os.path.join(shard_dir, name)))
        except (OSError, ValueError, EOFError) as e:  # no .metadata, or a cut one
            missing = [f".metadata ({type(e).__name__})"]
        report = [f"rank {rank} cannot see {', '.join(files)}"
                  for rank, files in enumerate(all_gather_objects(missing, "load_model shards")) if files]
        if report:
            raise ConfigError(f"cannot resume {path} from its shard directory {shard_dir}: " + "; ".join(report))
        consolidated = load_checkpoint(path, mmap=True)
        check_model_state(self.model_shapes(), consolidated[MODEL_KEY], path)
        state = self._sharded_state()
        dcp.load(state, checkpoint_id=shard_dir)
        set_model_state_dict(self.model, state["model"])
        set_optimizer_state_dict(self.model, self.optimizer, state["optimizer"])
        self.scheduler.load_state_dict(consolidated[SCHEDULER_KEY])
        return consolidated.get(EXTRA_KEY, {})


def _shard_dir(path: str) -> str:
    """``exp/x/epoch_3.pt`` -> ``exp/x/epoch_3`` (what :func:`~toolkit.utils.checkpoint.delete_checkpoint` removes
    with the checkpoint)."""
    return path[: -len(".pt")]
