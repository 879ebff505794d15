"""Write a trained model as ONNX files that sherpa-onnx and onnxruntime run, then prove them (:mod:`.check`).

Files written into the output directory (the CTC files and ``tokens.txt`` under sherpa-onnx's names for WeNet CTC
models; the interfaces are in :mod:`toolkit.export.graphs`):

- ``model.onnx``: fbank -> CTC log-posteriors over whole utterances, global CMVN inside (sherpa-onnx's
  ``OfflineRecognizer.from_wenet_ctc``).
- ``model-streaming.onnx`` (a streaming model only): one chunk with its attention and convolution caches
  (``OnlineRecognizer.from_wenet_ctc``).
- ``decoder.onnx``: the attention decoder for attention rescoring.
- ``tokens.txt``: ``symbol id`` lines, the model's symbol table (``<blank>`` is sherpa-onnx's blank; ``▁`` the word
  boundary).
- with ``int8``: ``model.int8.onnx``, ``model-streaming.int8.onnx`` and ``decoder.int8.onnx``, the MatMul weights
  quantized to int8 by onnxruntime's ``quantize_dynamic`` (as sherpa-onnx's WeNet export does).

The metadata sherpa-onnx reads rides in each CTC file (``model_type`` ``wenet_ctc``, ``vocab_size``,
``subsampling_factor``; for streaming also ``head``, ``num_blocks``, ``output_size``, ``cnn_module_kernel``,
``right_context``, and the ``chunk_size``/``left_chunks`` the file was checked with). sherpa-onnx computes the
fbank itself (kaldi-native-fbank) on 16-bit-scale samples, as the toolkit's pipeline does.
"""
from __future__ import annotations

import logging
import os
import warnings

import torch

from toolkit.export.graphs import ChunkGraph, CtcGraph, DecoderGraph, streaming_error
from toolkit.models.transformer.attention import MultiHeadedAttention

OPSET = 18
# Sample lengths of the traced inputs: a dynamic dimension must not be traced at 0 or 1 (torch.export specializes
# those), and the attention cache traced at its usual size.
_TRACE_FRAMES = 300
_TRACE_HYP_LEN = 6
# A dynamic dimension whose range torch.export infers from the code (fixed bounds fail its solver on the front end's
# floor divisions in torch 2.13). The fbank length's range ends where the positional encoding's stored table does
# (``max_len`` 5000 encoder frames: 200 s after conv2d; positions past it, computed on demand in torch, are not in
# the graph, and onnxruntime refuses a longer input with a shape error).
DYNAMIC = torch.export.Dim.DYNAMIC


def _export(graph: torch.nn.Module, args: tuple, path: str, input_names: list[str], output_names: list[str],
            dynamic_shapes: tuple) -> None:
    """``graph`` traced on ``args`` by torch.onnx's exporter (torch.export; the TorchScript exporter is deprecated
    and cannot export the front end's unfold with a dynamic length) into one file at ``path``, its attention
    modules in their ``for_export`` form meanwhile."""
    attentions = [m for m in graph.modules() if isinstance(m, MultiHeadedAttention)]
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")  # the exporter's deprecation and tracing notes, one per module
        for attention in attentions:
            attention.for_export = True
        try:
            torch.onnx.export(graph, args, path, input_names=input_names, output_names=output_names,
                              dynamic_shapes=dynamic_shapes, opset_version=OPSET, dynamo=True, external_data=False,
                              verbose=False)
        finally:
            for attention in attentions:
                attention.for_export = False


def add_metadata(path: str, metadata: dict[str, object]) -> None:
    """Replace the ONNX file's ``metadata_props`` with ``metadata`` (values as strings), in place."""
    import onnx

    model = onnx.load(path)
    del model.metadata_props[:]
    for key, value in metadata.items():
        model.metadata_props.add(key=key, value=str(value))
    onnx.save(model, path)


def _common_metadata(model, comment: str) -> dict[str, object]:
    rate = model.encoder.embed.rate
    return {"model_type": "wenet_ctc", "version": "1", "model_author": "toolkit", "comment": comment,
            "vocab_size": model.eos + 1,
            # NOTE: sherpa-onnx turns CTC frames into times with it (CTC upsampling divides the encoder's rate)
            "subsampling_factor": rate // model.ctc.upsample}


def export_ctc(model, input_dim: int, path: str) -> None:
    """``model.onnx`` (:class:`CtcGraph`, ``input_dim`` fbank bins) at ``path``, with sherpa-onnx's offline metadata."""
    batch = frames = DYNAMIC
    x = torch.zeros(2, _TRACE_FRAMES, input_dim)
    x_lens = torch.tensor([_TRACE_FRAMES, _TRACE_FRAMES - 37])
    _export(CtcGraph(model).eval(), (x, x_lens), path, ["x", "x_lens"],
            ["log_probs", "log_probs_lens", "encoder_out"], ({0: batch, 1: frames}, {0: batch}))
    add_metadata(path, _common_metadata(model, "non-streaming: fbank -> CTC log-probs"))


def chunk_inputs(model, input_dim: int, chunk_size: int, num_left_chunks: int) -> dict[str, torch.Tensor]:
    """The first chunk's inputs of :class:`ChunkGraph` as sherpa-onnx builds them: a window of zeros, ``offset``
    and ``required_cache_size`` S = chunk_size x num_left_chunks, zero caches of S frames, all masked."""
    encoder = model.encoder
    _, window, cache = encoder.chunk_windows(chunk_size, num_left_chunks)
    layer = encoder.encoders[0]
    heads, blocks, size = layer.self_attn.h, len(encoder.encoders), encoder.output_size()
    conv = getattr(layer, "conv_module", None)
    kernel = conv.lorder + 1 if conv is not None else 1
    mask = torch.zeros(1, 1, cache + chunk_size, dtype=torch.bool)
    mask[:, :, cache:] = True
    return {"x": torch.zeros(1, window, input_dim), "offset": torch.tensor([cache]),
            "required_cache_size": torch.tensor([cache]),
            "attn_cache": torch.zeros(blocks, heads, cache, size // heads * 2),
            "conv_cache": torch.zeros(blocks, 1, size, kernel - 1), "attn_mask": mask}


def export_chunk(model, input_dim: int, path: str, chunk_size: int, num_left_chunks: int) -> None:
    """``model-streaming.onnx`` (:class:`ChunkGraph`) at ``path``, traced at ``chunk_size`` encoder frames and
    ``num_left_chunks`` chunks of cache; the window and the cache stay dynamic (any chunk size, any cache)."""
    inputs = chunk_inputs(model, input_dim, chunk_size, num_left_chunks)
    window = cache = keys = DYNAMIC
    _export(ChunkGraph(model).eval(), tuple(inputs.values()), path, list(inputs),
            ["log_probs", "next_attn_cache", "next_conv_cache"],
            ({1: window}, None, None, {2: cache}, None, {2: keys}))
    encoder = model.encoder
    metadata = _common_metadata(model, "streaming: one chunk with its caches -> CTC log-probs")
    metadata.update(chunk_size=chunk_size, left_chunks=num_left_chunks, head=inputs["attn_cache"].size(1),
                    num_blocks=len(encoder.encoders), output_size=encoder.output_size(),
                    cnn_module_kernel=inputs["conv_cache"].size(3) + 1,
                    right_context=encoder.embed.receptive_field - 1)
    add_metadata(path, metadata)


def decoder_inputs(model, encoder_out: torch.Tensor, encoder_lens: torch.Tensor, hyps: list[list[int]]
                   ) -> dict[str, torch.Tensor]:
    """:class:`DecoderGraph`'s inputs for the n-best ``hyps`` (token-id lists) of one utterance's encoder output
    (float32 (1, T', D_model), its length int64 (1,)), as :func:`~toolkit.models.transformer.search.
    attention_rescoring` builds them."""
    count, width = len(hyps), max(len(h) for h in hyps) + 1
    sos, eos = model.sos, model.eos

    def padded(sequences: list[list[int]]) -> torch.Tensor:
        ys = torch.full((count, width), eos, dtype=torch.long)
        ys[:, 0] = sos
        for i, tokens in enumerate(sequences):
            ys[i, 1:len(tokens) + 1] = torch.tensor(tokens, dtype=torch.long)
        return ys

    inputs = {"encoder_out": encoder_out.expand(count, -1, -1).contiguous(),
              "encoder_out_lens": encoder_lens.expand(count).contiguous(), "hyps_in": padded(hyps),
              "hyps_in_lens": torch.tensor([len(h) + 1 for h in hyps])}
    if DecoderGraph(model).bidirectional:
        inputs["r_hyps_in"] = padded([h[::-1] for h in hyps])
    return inputs


def export_decoder(model, path: str) -> None:
    """``decoder.onnx`` (:class:`DecoderGraph`) at ``path``."""
    size = model.encoder.output_size()
    hyps = [list(range(1, _TRACE_HYP_LEN + 1)), list(range(2, _TRACE_HYP_LEN))]
    inputs = decoder_inputs(model, torch.zeros(1, _TRACE_FRAMES // 4, size), torch.tensor([_TRACE_FRAMES // 4]),
                            hyps)
    batch, frames, length = DYNAMIC, DYNAMIC, DYNAMIC
    shapes = [{0: batch, 1: frames}, {0: batch}, {0: batch, 1: length}, {0: batch}, {0: batch, 1: length}]
    outputs = ["log_probs", "r_log_probs"] if "r_hyps_in" in inputs else ["log_probs"]
    _export(DecoderGraph(model).eval(), tuple(inputs.values()), path, list(inputs), outputs,
            tuple(shapes[:len(inputs)]))
    add_metadata(path, {"model_author": "toolkit", "comment": "attention decoder for rescoring",
                        "sos": model.sos, "eos": model.eos, "vocab_size": model.eos + 1})


def write_tokens(tokenizer, path: str) -> None:
    """``tokens.txt``: the model's symbol table as ``symbol id`` lines in id order."""
    with open(path, "w", encoding="utf-8") as f:
        for symbol_id in range(tokenizer.vocab_size()):
            f.write(f"{tokenizer.id_to_symbol[symbol_id]} {symbol_id}\n")


# every file :func:`export_model` can write; an earlier export's are removed before a new one
EXPORTED_FILES = ("tokens.txt", *(f"{name}{suffix}.onnx" for name in ("model", "model-streaming", "decoder")
                                  for suffix in ("", ".int8")))


def quantize(path: str) -> str:
    """An int8 copy of the ONNX file ``path`` (``x.onnx`` -> ``x.int8.onnx``): the MatMul weights quantized
    dynamically by onnxruntime (per tensor, signed int8); returns its path."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    out = path[:-len(".onnx")] + ".int8.onnx"
    quantize_dynamic(path, out, op_types_to_quantize=["MatMul"], weight_type=QuantType.QInt8)
    return out


def export_model(model, tokenizer, input_dim: int, out_dir: str, streaming: bool, chunk_size: int = 16,
                 num_left_chunks: int = 4, int8: bool = False) -> dict[str, str]:
    """Write every file of the module docstring for ``model`` (an ASRModel in eval mode reading ``input_dim`` fbank
    bins) into ``out_dir``, after removing any of :data:`EXPORTED_FILES` an earlier export left there;
    ``{name: path}`` (names: ``model``, ``model-streaming``, ``decoder``, ``tokens`` and the ``.int8`` copies).
    The files are not checked here (:func:`toolkit.export.check.check_export`).

    Raises:
        ValueError: ``streaming`` for a model that cannot stream (:func:`streaming_error`), or ``chunk_size`` < 1 /
            ``num_left_chunks`` < 1.
    """
    if streaming:
        error = streaming_error(model)
        if error:
            raise ValueError(error)
        if chunk_size < 1 or num_left_chunks < 1:
            raise ValueError(f"chunk_size {chunk_size} / num_left_chunks {num_left_chunks}: both >= 1 (sherpa-onnx "
                             "keeps a cache of chunk_size x num_left_chunks frames)")
    os.makedirs(out_dir, exist_ok=True)
    stale = [name for name in EXPORTED_FILES if os.path.lexists(os.path.join(out_dir, name))]
    if stale:  # an earlier export's files, perhaps of another model or with more of them (int8, streaming)
        logging.warning("%s: removing the earlier export's %s", out_dir, ", ".join(stale))
        for name in stale:
            os.unlink(os.path.join(out_dir, name))
    files = {"tokens": os.path.join(out_dir, "tokens.txt"), "model": os.path.join(out_dir, "model.onnx"),
             "decoder": os.path.join(out_dir, "decoder.onnx")}
    write_tokens(tokenizer, files["tokens"])
    logging.info("exporting %s", files["model"])
    export_ctc(model, input_dim, files["model"])
    logging.info("exporting %s", files["decoder"])
    export_decoder(model, files["decoder"])
    if streaming:
        files["model-streaming"] = os.path.join(out_dir, "model-streaming.onnx")
        logging.info("exporting %s", files["model-streaming"])
        export_chunk(model, input_dim, files["model-streaming"], chunk_size, num_left_chunks)
    if int8:
        for name in [name for name in files if name != "tokens"]:
            files[f"{name}.int8"] = quantize(files[name])
    return files
