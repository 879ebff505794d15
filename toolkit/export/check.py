"""The export proves itself: every file passes ``onnx.checker``, and onnxruntime's outputs equal torch's on real
audio within ``rtol``/``atol`` (numpy's ``assert_allclose`` rule, ``|onnx - torch| <= atol + rtol * |torch|``):
the CTC model on a padded batch of whole utterances, the decoder on each utterance's n-best, and the chunk model
chunk by chunk with its caches, fed as sherpa-onnx feeds it (a fixed-size attention cache, masked until filled),
against the encoder's :meth:`~toolkit.models.transformer.encoder.BaseEncoder.forward_chunk_by_chunk`. The int8
copies are approximations: they are checked to load and to give finite outputs of the right shapes only (their
accuracy is a WER, ``benchmarks/bench_runtime.py``).
"""
from __future__ import annotations

import dataclasses

import numpy as np
import torch

from toolkit.dataset import processor
from toolkit.dataset.conf import PadConf
from toolkit.dataset.pipeline import decoding_features
from toolkit.export.graphs import CtcGraph, DecoderGraph
from toolkit.export.onnx import chunk_inputs, decoder_inputs
from toolkit.models.transformer.search import ctc_greedy_search

RTOL, ATOL = 1e-3, 1e-4


class ExportCheckError(Exception):
    """A check of the exported files failed; the message names the check, the file and the worst difference."""


def audio_features(wav: str, dataset_conf) -> torch.Tensor:
    """float32 (T, num_mel_bins) fbank of the audio file ``wav`` as the decoding pipeline computes it
    (:func:`toolkit.dataset.pipeline.decoding_features`: resampled, dither 0), without its padding of short clips.

    Raises:
        ValueError: the file is missing, unreadable or empty (the pipeline's reason and the path).
    """
    try:
        sample = processor.read_audio({"key": wav, "wav": wav})
        unpadded = dataclasses.replace(dataset_conf, pad_conf=PadConf(min_length=0.0))
        return decoding_features(sample, unpadded)["feat"]
    except processor.SkipSample as e:
        raise ValueError(f"check audio {wav}: {e}") from e


def _compare(name: str, onnx_value: np.ndarray, torch_value: torch.Tensor, rtol: float, atol: float) -> float:
    """The largest ``|onnx - torch|``; ExportCheckError naming ``name`` when a value is outside the tolerance."""
    expected = torch_value.detach().numpy()
    if onnx_value.shape != expected.shape:
        raise ExportCheckError(f"{name}: onnxruntime gave shape {onnx_value.shape}, torch {expected.shape}")
    diff = np.abs(onnx_value.astype(np.float64) - expected)
    bad = diff > atol + rtol * np.abs(expected)
    if bad.any():
        where = np.unravel_index(int(np.argmax(np.where(bad, diff, -1.0))), diff.shape)
        raise ExportCheckError(f"{name}: {int(bad.sum())} of {bad.size} values differ beyond rtol {rtol} / atol "
                               f"{atol}; worst at {tuple(int(i) for i in where)}: onnxruntime {onnx_value[where]} "
                               f"vs torch {expected[where]}")
    return float(diff.max()) if diff.size else 0.0


def _session(path: str):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    return ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])


def check_ctc(model, path: str, feats: list[torch.Tensor], rtol: float = RTOL, atol: float = ATOL) -> str:
    """``model.onnx`` against :class:`CtcGraph` on the padded batch of ``feats`` (each float32 (T, D)); one line
    with the largest difference."""
    lengths = torch.tensor([f.size(0) for f in feats])
    x = torch.nn.utils.rnn.pad_sequence(feats, batch_first=True)
    with torch.no_grad():
        log_probs, lens, encoder_out = CtcGraph(model)(x, lengths)
    got = _session(path).run(None, {"x": x.numpy(), "x_lens": lengths.numpy()})
    if not np.array_equal(got[1], lens.numpy()):
        raise ExportCheckError(f"{path}: log_probs_lens {got[1].tolist()} != torch's {lens.tolist()}")
    worst = 0.0
    for i, n in enumerate(lens.tolist()):
        worst = max(worst, _compare(f"{path} log_probs (utterance {i})", got[0][i, :n], log_probs[i, :n], rtol, atol))
        frames = model.encoder.output_lengths(lengths[i:i + 1]).item()
        worst = max(worst, _compare(f"{path} encoder_out (utterance {i})", got[2][i, :frames],
                                    encoder_out[i, :frames], rtol, atol))
    return f"{path}: {len(feats)} utterances as one batch, max |onnx - torch| {worst:.2e}"


def check_decoder(model, path: str, feats: list[torch.Tensor], rtol: float = RTOL, atol: float = ATOL) -> str:
    """``decoder.onnx`` against :class:`DecoderGraph` on each utterance's n-best: its greedy CTC hypothesis, that
    without its last token, and its first three tokens (at least one token each); one line."""
    session, graph, worst = _session(path), DecoderGraph(model), 0.0
    for i, feat in enumerate(feats):
        with torch.no_grad():
            log_probs, lens, encoder_out = CtcGraph(model)(feat.unsqueeze(0), torch.tensor([feat.size(0)]))
            best = ctc_greedy_search(log_probs, lens)[0] or [1]
            frames = model.encoder.output_lengths(torch.tensor([feat.size(0)]))
            inputs = decoder_inputs(model, encoder_out, frames, [best, best[:-1] or best, best[:3]])
            expected = graph(*inputs.values())
        expected = expected if isinstance(expected, tuple) else (expected,)
        got = session.run(None, {k: v.numpy() for k, v in inputs.items()})
        for name, onnx_value, torch_value in zip(("log_probs", "r_log_probs"), got, expected):
            worst = max(worst, _compare(f"{path} {name} (utterance {i})", onnx_value, torch_value, rtol, atol))
    return f"{path}: n-best of 3 for {len(feats)} utterances, max |onnx - torch| {worst:.2e}"


def run_chunks(session, feat: np.ndarray, inputs: dict[str, np.ndarray], stride: int, window: int,
               receptive_field: int, subsample) -> np.ndarray:
    """One utterance's fbank ``feat`` (T, D) through the chunk model ``session`` as sherpa-onnx runs it: windows of
    ``window`` frames every ``stride`` (the last one shorter), ``offset`` from S on, the attention cache of S frames
    masked where the stream has not filled it; ``inputs`` are the first chunk's (:func:`~toolkit.export.onnx.
    chunk_inputs`), ``subsample`` maps a window's frames to its encoder frames. Returns float32 (T', V)."""
    cache_size = inputs["attn_cache"].shape[2]
    state = dict(inputs)
    outputs, seen = [], 0
    for start in range(0, feat.shape[0] - receptive_field + 1, stride):
        x = feat[None, start:start + window]
        chunk = subsample(x.shape[1])
        mask = np.zeros((1, 1, cache_size + chunk), dtype=bool)
        mask[:, :, cache_size - min(seen, cache_size):] = True
        log_probs, state["attn_cache"], state["conv_cache"] = session.run(None, dict(state, x=x, attn_mask=mask))
        state["offset"] = state["offset"] + log_probs.shape[1]
        outputs.append(log_probs[0])
        seen += chunk
    return np.concatenate(outputs) if outputs else np.zeros((0, 0), dtype=np.float32)


def check_chunks(model, path: str, feats: list[torch.Tensor], input_dim: int, chunk_size: int,
                 num_left_chunks: int, rtol: float = RTOL, atol: float = ATOL) -> str:
    """``model-streaming.onnx`` run chunk by chunk (:func:`run_chunks`) against the encoder's
    ``forward_chunk_by_chunk`` at ``chunk_size`` / ``num_left_chunks`` and the CTC head; one line."""
    encoder, session, worst = model.encoder, _session(path), 0.0
    stride, window, _ = encoder.chunk_windows(chunk_size, num_left_chunks)
    inputs = {k: v.numpy() for k, v in chunk_inputs(model, input_dim, chunk_size, num_left_chunks).items()}

    def subsample(frames: int) -> int:
        return int(encoder.output_lengths(torch.tensor([frames])))

    for i, feat in enumerate(feats):
        with torch.no_grad():
            expected = model.ctc.log_softmax(encoder.forward_chunk_by_chunk(feat.unsqueeze(0), chunk_size,
                                                                            num_left_chunks)[0])[0]
        got = run_chunks(session, feat.numpy(), inputs, stride, window, encoder.embed.receptive_field, subsample)
        worst = max(worst, _compare(f"{path} log_probs chunk by chunk (utterance {i}, chunk {chunk_size}, "
                                    f"{num_left_chunks} left chunks)", got, expected, rtol, atol))
    return (f"{path}: {len(feats)} utterances chunk by chunk (chunk {chunk_size}, {num_left_chunks} left chunks), "
            f"max |onnx - torch| {worst:.2e}")


def check_runs(path: str, feeds: dict[str, np.ndarray], shapes: list[tuple]) -> str:
    """An int8 copy loads and gives finite outputs of the fp32 file's ``shapes`` on ``feeds``; one line."""
    got = _session(path).run(None, feeds)
    for name, value, shape in zip(("output 0", "output 1", "output 2"), got, shapes):
        if value.shape != shape or not np.isfinite(value).all():
            raise ExportCheckError(f"{path}: {name} has shape {value.shape} (fp32: {shape}) or non-finite values")
    return f"{path}: runs, outputs finite"


def check_export(model, files: dict[str, str], feats: list[torch.Tensor], input_dim: int, chunk_size: int = 16,
                 num_left_chunks: int = 4) -> list[str]:
    """Every check of the module docstring on the files of :func:`~toolkit.export.onnx.export_model`
    (``{name: path}``) with the fbank ``feats`` of real audio; one line per check passed.

    Raises:
        ExportCheckError: the first check that fails (its file, and what differs).
    """
    import onnx

    lines = []
    for name, path in files.items():
        if path.endswith(".onnx"):
            try:
                onnx.checker.check_model(path, full_check=True)
            except onnx.checker.ValidationError as e:
                raise ExportCheckError(f"{path}: onnx.checker: {str(e).splitlines()[0]}") from e
    lines.append(f"onnx.checker: {sum(p.endswith('.onnx') for p in files.values())} files valid")
    lines.append(check_ctc(model, files["model"], feats))
    lines.append(check_decoder(model, files["decoder"], feats))
    if "model-streaming" in files:
        lines.append(check_chunks(model, files["model-streaming"], feats, input_dim, chunk_size, num_left_chunks))
    for name in [name for name in files if name.endswith(".int8")]:
        fp32 = _session(files[name[:-len(".int8")]])
        feeds = _int8_feeds(model, name, feats[0], input_dim, chunk_size, num_left_chunks)
        lines.append(check_runs(files[name], feeds, [v.shape for v in fp32.run(None, feeds)]))
    return lines


def _int8_feeds(model, name: str, feat: torch.Tensor, input_dim: int, chunk_size: int, num_left_chunks: int
                ) -> dict[str, np.ndarray]:
    """The inputs of the file ``name`` (``model``, ``decoder`` or ``model-streaming``, ``.int8``) for one
    utterance's fbank ``feat``."""
    lengths = torch.tensor([feat.size(0)])
    if name.startswith("model-streaming"):
        inputs = chunk_inputs(model, input_dim, chunk_size, num_left_chunks)
        window = min(inputs["x"].size(1), feat.size(0))
        inputs["x"][0, :window] = feat[:window]  # the first window (zeros past a short clip's end)
    elif name.startswith("model"):
        inputs = {"x": feat.unsqueeze(0), "x_lens": lengths}
    else:
        with torch.no_grad():
            _, _, encoder_out = CtcGraph(model)(feat.unsqueeze(0), lengths)
        inputs = decoder_inputs(model, encoder_out, model.encoder.output_lengths(lengths), [[1, 2, 3]])
    return {k: v.numpy() for k, v in inputs.items()}
