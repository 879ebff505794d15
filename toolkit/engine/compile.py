"""``train_conf.compile``: ``torch.compile`` on the module that trains, in place, before the engine wraps it.

What is compiled: every module held in an ``nn.ModuleList`` (the model's repeated blocks: the encoder layers and
the decoder layers), each with ``nn.Module.compile(dynamic=True)``. Why these, and how:

* One graph per stack, not per layer: the layers of a stack run the same code, and dynamo treats their parameters
  as graph inputs (``inline_inbuilt_nn_modules``), so the first layer's graph serves all of them (6 conformer
  layers: one compilation, not six). The front end, CTC and the losses stay eager: CTC's output shape depends on
  the target lengths (a graph break in a whole-model compile), and the front end is a hand-written autograd
  function already.
* ``dynamic=True``: every batch has another T (and the last one another B), so the first graph is traced with
  symbolic sizes; torch's default would compile a static graph first and a dynamic one at the second shape.
* In place (``nn.Module.compile``, not the ``torch.compile(module)`` wrapper): the module keeps its class and its
  ``state_dict`` keys (no ``_orig_mod.`` prefix), so checkpoints load into an eager model and
  ``toolkit.models.checks`` scripts the same modules for export.
* DDP: compiled blocks *inside* DDP. Each block's backward is one autograd node, so the gradients of a block
  arrive together when its backward ends and DDP's buckets still all-reduce while earlier blocks run backward
  (compiling the whole model inside DDP would release every gradient at the end of one fused backward; PyTorch's
  answer for that case is ``torch.compile(DDP(model))`` with its DDPOptimizer, which splits the graph at bucket
  boundaries: https://pytorch.org/docs/stable/torch.compiler_ddp.html). DeepSpeed ZeRO-0/1/2 hooks the
  parameters' gradients the same way; ZeRO-3 gathers parameters in module hooks that dynamo would have to trace,
  and is refused (:func:`toolkit.engine.deepspeed.check_deepspeed_config`).

Dropout and RNG: the model's CPU dropout draws its mask with the functional ``aten.random``, which inductor runs
as torch's own kernel, so compiled and eager training draw the same masks from the same generator and exact resume
restores it (:class:`toolkit.utils.rng.RngState`). ``torch._inductor.config.fallback_random`` is left at its default:
it only concerns ops inductor generates in its own kernels (``nn.functional.dropout``, the GPU path), whose seeds
are drawn from torch's generator too.
"""

from __future__ import annotations

import torch
from torch import nn


def compile_blocks(model: nn.Module) -> list[str]:
    """Compile, in place, every block of every ``nn.ModuleList`` of ``model`` (see the module docstring).

    Returns:
        the qualified names of the compiled blocks (e.g. ``encoder.encoders.0``), for the log.

    Raises:
        ValueError: ``model`` holds no ``nn.ModuleList``, so nothing would be compiled.
    """
    # NOTE: imported here, not at the top: importing inductor imports dynamo, 2-4 s of CPU in every process that
    # imports the trainer (each rank and its loader workers' server), and only a compiled run needs them.
    import torch._inductor.config
    import torch.fx.experimental._config

    # NOTE: no "duck sizing": dynamo otherwise assumes two sizes that are equal in the first batch stay equal (a
    # decoder's L and the encoder's T', a batch's B and its T') and compiles again when they differ.
    torch.fx.experimental._config.use_duck_shape = False
    # NOTE: inductor compiles in this process, not in its pool of compile workers, as PyTorch's own distributed
    # inductor tests do (pytorch/pytorch#125235); on 2 cores the pool compiled no faster (test_compile and the
    # compiled resume test: 62 s with it, 59 s without). A loader hang once blamed on the pool was the fork bug
    # that toolkit.dataset.loader.loader_context avoids.
    torch._inductor.config.compile_threads = 1
    blocks = repeated_blocks(model)
    if not blocks:
        raise ValueError(f"train_conf.compile: {type(model).__name__} has no nn.ModuleList of blocks to compile")
    for block in blocks.values():
        _convolutions_eager(block)
        block.compile(dynamic=True)
    return list(blocks)


def repeated_blocks(model: nn.Module) -> dict[str, nn.Module]:
    """``{qualified name: block}`` of every module held in an ``nn.ModuleList`` of ``model`` (the encoder and decoder
    layers), outermost lists only (a list inside a block stays part of that block), in ``named_modules`` order: what
    :func:`compile_blocks` compiles and what ``torch_fsdp`` shards as one unit each."""
    blocks: dict[str, nn.Module] = {}
    for list_name, modules in model.named_modules():
        inside_block = any(list_name.startswith(f"{name}.") for name in blocks)
        if isinstance(modules, nn.ModuleList) and not inside_block:
            blocks.update((f"{list_name}.{index}", block) for index, block in enumerate(modules))
    return blocks


def _convolutions_eager(block: nn.Module) -> None:
    """Run the convolutions inside ``block`` eagerly (a graph break around each).

    NOTE: inductor (torch 2.13, CPU) specializes the time dimension of a convolution's input in its backward
    graph (conv1d, or conv2d on a channels-last view, alike), so a compiled conformer layer would compile again for
    every new T and stop compiling after ``torch._dynamo.config.recompile_limit`` of them. Eager, the depthwise
    convolution keeps oneDNN's kernel and the rest of the layer stays one dynamic graph on each side of it.
    """
    for module in block.modules():
        if isinstance(module, nn.modules.conv._ConvNd):
            module.forward = torch.compiler.disable(module.forward)
