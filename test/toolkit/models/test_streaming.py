"""Streaming encoders (issue 46; U2/U2++, WeNet's ``encoder_conf`` keys): chunk-wise attention masks in training and
decoding, and chunk-by-chunk encoding through ``forward_chunk`` with its caches, on real speech (tiny_lj fbank)."""
import argparse
import random

import pytest
import torch

from toolkit.bin.recognize import get_args
from toolkit.models.checks import check_model
from toolkit.models.registry import init_model
from toolkit.models.transformer.convolution import ConvolutionModule
from toolkit.models.transformer.ctc import CTC
from toolkit.models.transformer.encoder import ConformerEncoder, TransformerEncoder
from toolkit.models.transformer.search import ctc_greedy_search
from toolkit.models.transformer.streaming import StreamingDecoder
from toolkit.utils.config_parsing import ConfigError
from toolkit.utils.mask import draw_dynamic_chunk, subsequent_chunk_mask

KEYS = ["LJ001-0005", "LJ001-0002"]  # 8.1 s and 1.9 s of read English: 201 and 46 encoder frames
SMALL = dict(output_size=32, attention_heads=4, linear_units=64, num_blocks=3, dropout_rate=0.0,
             positional_dropout_rate=0.0)
CHUNK_BY_CHUNK_TOLERANCE = 1e-4  # float32, max abs (issue 46); measured: under 2e-6


def _conformer(**conf) -> ConformerEncoder:
    return ConformerEncoder(80, **{"cnn_module_kernel": 7, **conf}, causal=True, use_dynamic_chunk=True, **SMALL)


def _encoder(kind: str):
    """A seeded random streaming encoder in eval mode: a conformer (rel_pos, macaron, causal convolution with
    BatchNorm given running statistics by a training-mode pass on other speech), the same with LayerNorm and
    intermediate CTC with self-conditioning and an even kernel (WeNet's U2++ recipes' 8), or a Transformer
    (abs_pos)."""
    torch.manual_seed(0)
    if kind == "conformer":
        encoder = _conformer()
    elif kind == "self_conditioned":
        encoder = _conformer(cnn_module_norm="layer_norm", interctc_layer_idx=[1, 2], cnn_module_kernel=8)
        encoder.set_self_conditioning(CTC(30, 32))
    else:
        encoder = TransformerEncoder(80, use_dynamic_chunk=True, **SMALL)
    return encoder


def _with_running_statistics(encoder, corpus):
    with torch.no_grad():
        encoder.train()(*corpus.batch(["LJ001-0006", "LJ001-0008"]))
    return encoder.eval()


@pytest.mark.parametrize("kind", ["conformer", "self_conditioned", "transformer"])
def test_chunk_by_chunk_equals_the_masked_whole_utterance(tiny_lj, kind):
    encoder = _with_running_statistics(_encoder(kind), tiny_lj)
    feats, lengths = tiny_lj.batch(KEYS)
    measured = {}
    with torch.no_grad():
        full, _ = encoder(feats, lengths, -1)
        for chunk in (1, 4, 8, 16):
            for left in (-1, 2):
                masked, mask = encoder(feats, lengths, chunk, left)  # the padded batch, masked
                for b, length in enumerate(lengths.tolist()):
                    streamed, streamed_mask = encoder.forward_chunk_by_chunk(feats[b:b + 1, :length], chunk, left)
                    valid = int(mask[b].sum())
                    assert streamed.shape == (1, valid, 32) and bool(streamed_mask.all())
                    difference = float((streamed[0] - masked[b, :valid]).abs().max())
                    measured[chunk, left, b] = difference
                    assert difference <= CHUNK_BY_CHUNK_TOLERANCE, (chunk, left, b, difference)
                    # the mask matters: the first chunk of the stream cannot see what full context sees
                    assert float((masked[b, :valid] - full[b, :valid]).abs().max()) > 1e-3, (chunk, left, b)
    print(kind, {key: f"{value:.2g}" for key, value in measured.items()})


def test_left_chunks_bound_what_a_chunk_sees(tiny_lj):
    encoder = _with_running_statistics(_encoder("conformer"), tiny_lj)
    feats, lengths = tiny_lj.batch(KEYS[:1])
    with torch.no_grad():
        all_left, _ = encoder.forward_chunk_by_chunk(feats, 4, -1)
        two_left, _ = encoder.forward_chunk_by_chunk(feats, 4, 2)
    # chunks 0-2 see the same frames either way; from chunk 3 on, two left chunks see less
    assert torch.equal(all_left[:, :12], two_left[:, :12])
    assert float((all_left[:, 12:] - two_left[:, 12:]).abs().max()) > 1e-3


def test_forward_chunk_carries_caches_of_the_documented_shapes(tiny_lj):
    encoder = _with_running_statistics(_encoder("conformer"), tiny_lj)
    feats, _ = tiny_lj.batch(KEYS[:1])
    chunk, rate, context = 4, encoder.embed.rate, encoder.embed.receptive_field
    window = (chunk - 1) * rate + context
    att_cache = cnn_cache = torch.zeros(0, 0, 0, 0)
    offset, outputs = 0, []
    with torch.no_grad():
        for i in range(5):
            out, att_cache, cnn_cache = encoder.forward_chunk(feats[:, i * chunk * rate:i * chunk * rate + window],
                                                              offset, 2 * chunk, att_cache, cnn_cache)
            offset += out.size(1)
            outputs.append(out)
            assert out.shape == (1, chunk, 32)
            assert att_cache.shape == (3, 4, min(2 * chunk, offset), 2 * 32 // 4)
            assert cnn_cache.shape == (3, 1, 32, 7 - 1)
        scripted = torch.jit.script(encoder)  # check_model's export compiles forward_chunk too
        out, _, _ = scripted.forward_chunk(feats[:, 5 * chunk * rate:5 * chunk * rate + window], offset, 2 * chunk,
                                           att_cache, cnn_cache)
        streamed, _ = encoder.forward_chunk_by_chunk(feats[:, :5 * chunk * rate + window], chunk, 2)
    assert torch.equal(torch.cat(outputs, dim=1), streamed[:, :5 * chunk])
    assert float((out - streamed[:, 5 * chunk:]).abs().max()) <= CHUNK_BY_CHUNK_TOLERANCE


@pytest.mark.parametrize("kernel", [7, 8])
def test_causal_convolution_sees_no_future_frame_and_its_cache_continues_it(tiny_lj, kernel):
    torch.manual_seed(0)
    encoder = _encoder("conformer")
    feats, _ = tiny_lj.batch(KEYS[:1])
    with torch.no_grad():
        x, _, _ = encoder.embed(feats, torch.ones(1, 1, feats.size(1), dtype=torch.bool))  # (1, 201, 32)
        conv = ConvolutionModule(32, kernel, torch.nn.SiLU(), "layer_norm", causal=True).eval()
        valid = torch.ones(1, 1, x.size(1), dtype=torch.bool)
        out = conv(x, valid)
        changed = x.clone()
        changed[:, 100:] += 1.0
        out_changed = conv(changed, valid)
        assert torch.equal(out[:, :100], out_changed[:, :100])
        assert float((out[:, 100] - out_changed[:, 100]).abs().max()) > 1e-3
        first, cache = conv.forward_chunk(x[:, :90], valid[:, :, :90], torch.zeros(0, 0, 0))
        second, _ = conv.forward_chunk(x[:, 90:], valid[:, :, 90:], cache)
        assert cache.shape == (1, 32, kernel - 1)
    assert float((torch.cat([first, second], dim=1) - out).abs().max()) <= CHUNK_BY_CHUNK_TOLERANCE


def test_subsequent_chunk_mask_is_the_chunk_rule():
    for size, chunk, left in [(10, 3, -1), (10, 3, 0), (10, 3, 1), (7, 1, 2), (5, 8, -1)]:
        expected = torch.tensor([[j // chunk <= i // chunk and (left < 0 or j // chunk >= i // chunk - left)
                                  for j in range(size)] for i in range(size)])
        assert torch.equal(subsequent_chunk_mask(size, chunk, left), expected), (size, chunk, left)


def test_dynamic_draw_is_full_context_about_half_the_time_else_a_chunk_of_1_to_25():
    torch.manual_seed(0)
    max_len, draws = 240, 4000
    chunks = [draw_dynamic_chunk(max_len, False, 25) for _ in range(draws)]
    full = [c for c in chunks if c == (max_len, -1)]
    assert abs(len(full) / draws - 119 / 239) < 0.03  # 119 of the 239 values of randint(1, 240) exceed 120
    sizes = {c for c, left in chunks if c != max_len}
    assert sizes == set(range(1, 26)) and all(left == -1 for _, left in chunks)
    with_left = [draw_dynamic_chunk(max_len, True, 25) for _ in range(draws)]
    lefts = [(c, left) for c, left in with_left if c != max_len]
    assert all(0 <= left < (max_len - 1) // c for c, left in lefts)
    assert len({left for _, left in lefts}) > 50  # spread over the possible left chunks
    assert draw_dynamic_chunk(1, True, 25) == (1, -1)


def test_training_masks_follow_the_draw_or_the_static_chunk_and_eval_is_full_context(tiny_lj):
    feats, lengths = tiny_lj.batch(KEYS)
    masks = torch.ones(2, 1, 201, dtype=torch.bool)
    masks[1, :, 46:] = False
    dynamic = _encoder("self_conditioned").train()
    torch.manual_seed(3)
    drawn = [draw_dynamic_chunk(201, False, 25) for _ in range(20)]
    torch.manual_seed(3)
    for chunk, left in drawn:
        expected = masks if chunk == 201 else masks & subsequent_chunk_mask(201, chunk, left)
        assert torch.equal(dynamic.attention_mask(masks, 0, -1), expected)
    assert torch.equal(dynamic.eval().attention_mask(masks, 0, -1), masks)
    static = TransformerEncoder(80, static_chunk_size=8, **SMALL)
    for mode in (True, False):
        assert torch.equal(static.train(mode).attention_mask(masks, 0, -1), masks & subsequent_chunk_mask(201, 8))
    # the draw reaches the layers: a training pass at 0 is the pass at the chunk drawn (no dropout here)
    torch.manual_seed(5)
    chunk, _ = draw_dynamic_chunk(201, False, 25)
    assert chunk < 201
    dynamic.train()
    torch.manual_seed(5)
    drawn_out, _, drawn_intermediate = dynamic.forward_layers(feats, lengths, [1, 2])
    given_out, _, given_intermediate = dynamic.forward_layers(feats, lengths, [1, 2], chunk, -1)
    assert torch.equal(drawn_out, given_out) and torch.equal(drawn_intermediate[1], given_intermediate[1])


def _model_config(**encoder_conf) -> dict:
    return dict(encoder="conformer", input_dim=80, output_dim=30,
                encoder_conf=dict(SMALL, cnn_module_kernel=7, interctc_layer_idx=[1], **encoder_conf),
                decoder="bitransformer", decoder_conf=dict(attention_heads=4, linear_units=64, num_blocks=1,
                                                           r_num_blocks=1),
                model_conf=dict(ctc_weight=0.3, interctc_weight=0.3, interctc_use_conditioning=True,
                                reverse_weight=0.3))


def test_a_u2pp_model_trains_scripts_and_decodes_at_a_chunk_size(tiny_lj):
    torch.manual_seed(0)
    model = init_model(_model_config(causal=True, use_dynamic_chunk=True, use_dynamic_left_chunk=True,
                                     cnn_module_norm="layer_norm"))
    feats, lengths = tiny_lj.batch(KEYS)
    target = torch.randint(1, 29, (2, 12))
    losses = model(feats, lengths, target, torch.tensor([12, 9]))
    losses["loss"].backward()
    assert torch.isfinite(losses["loss"]) and losses["loss_interctc"] is not None
    assert model.encoder.conditioning_layer.weight.grad.abs().sum() > 0
    assert check_model(model, log=lambda *args: None) > 0
    model.eval()
    hyps = model.decode(["ctc_greedy_search", "attention_rescoring"], feats, lengths, beam_size=3,
                        decoding_chunk_size=4, num_decoding_left_chunks=2)
    with torch.no_grad():
        for b, length in enumerate(lengths.tolist()):
            streamed, _ = model.encoder.forward_chunk_by_chunk(feats[b:b + 1, :length], 4, 2)
            log_probs = model.ctc.log_softmax(streamed)
            greedy = ctc_greedy_search(log_probs, model.ctc.output_lengths(torch.tensor([streamed.size(1)])))
            assert hyps["ctc_greedy_search"][b] == greedy[0]
    assert len(hyps["attention_rescoring"]) == 2


@pytest.mark.parametrize("conf, words", [
    (dict(use_dynamic_chunk="yes"), ["use_dynamic_chunk", "true or false"]),
    (dict(static_chunk_size=-4), ["static_chunk_size", ">= 0"]),
    (dict(use_dynamic_chunk=True, static_chunk_size=16), ["use_dynamic_chunk", "static_chunk_size"]),
    (dict(use_dynamic_left_chunk=True), ["use_dynamic_left_chunk", "use_dynamic_chunk"]),
    (dict(causal=1), ["causal", "true or false"]),
    (dict(time_reduce_idx=1, time_recover_idx=2, causal=True), ["time_reduce_idx", "causal"]),
    (dict(time_reduce_idx=1, time_recover_idx=2, use_dynamic_chunk=True), ["time_reduce_idx", "use_dynamic_chunk"]),
    (dict(time_reduce_idx=1, time_recover_idx=2, static_chunk_size=8), ["time_reduce_idx", "static_chunk_size"]),
])
def test_streaming_config_errors_are_one_line_naming_the_keys(conf, words):
    with pytest.raises(ConfigError) as error:
        init_model(_model_config(**conf))
    message = str(error.value)
    assert message.startswith("encoder_conf: ") and "\n" not in message
    assert all(word in message for word in words), message


def test_decoding_options_are_checked_in_one_line(tiny_lj):
    feats, lengths = tiny_lj.batch(KEYS[:1])
    full_context = ConformerEncoder(80, cnn_module_kernel=7, **SMALL).eval()
    for chunk, left in ((-2, -1), (4, -2)):
        with pytest.raises(ValueError, match=r"decoding_chunk_size .* num_decoding_left_chunks"):
            full_context(feats, lengths, chunk, left)
    squeezed = ConformerEncoder(80, cnn_module_kernel=7, time_reduce_idx=1, time_recover_idx=2, **SMALL).eval()
    with pytest.raises(ValueError, match="decoding_chunk_size 4 with time_reduce_idx 1"):
        squeezed(feats, lengths, 4)
    with pytest.raises(ValueError, match="decoding_chunk_size 4 with time_reduce_idx 1"):
        squeezed.attention_mask(torch.ones(1, 1, 1, dtype=torch.bool), 4, -1)  # recognize.py's check
    with pytest.raises(ValueError, match="time_reduce_idx 1: Squeezeformer's time reduction does not run chunk"):
        squeezed.forward_chunk_by_chunk(feats, 4)
    with pytest.raises(ValueError, match="needs encoder_conf.causal: true"):
        full_context.forward_chunk_by_chunk(feats, 4)
    with pytest.raises(ValueError, match="decoding_chunk_size 0 .* chunk > 0"):
        _encoder("conformer").forward_chunk_by_chunk(feats, 0)
    assert "trained with full context" in full_context.untrained_chunk_note(4)
    assert full_context.untrained_chunk_note(-1) == _encoder("conformer").untrained_chunk_note(4) == ""
    static = TransformerEncoder(80, static_chunk_size=8, **SMALL)
    assert static.untrained_chunk_note(8) == "" and "static_chunk_size 8: not for full context" in \
        static.untrained_chunk_note(-1)
    base = ["--config", "c", "--checkpoint", "p", "--test_data", "t", "--result_dir", "r"]
    for option, value in (("--decoding_chunk_size", "0"), ("--decoding_chunk_size", "-2"),
                          ("--num_decoding_left_chunks", "-3")):
        with pytest.raises(ConfigError, match=f"^{option} must be .*, got {value}$"):
            get_args(base + [option, value])
    assert isinstance(get_args(base + ["--decoding_chunk_size", "16"]), argparse.Namespace)


def test_a_stream_fed_in_pieces_decodes_as_the_masked_utterance_in_every_method(tiny_lj):
    # U2's two passes live (StreamingDecoder): fbank pieces of random sizes, the CTC prefix beam search's partials
    # after each, then every method over the whole encoder output, equal to ASRModel.decode's masked results
    torch.manual_seed(0)
    model = init_model(_model_config(causal=True, use_dynamic_chunk=True, cnn_module_norm="layer_norm")).eval()
    feats, lengths = tiny_lj.batch(KEYS)
    methods = ["ctc_greedy_search", "ctc_prefix_beam_search", "attention", "attention_rescoring"]
    rng = random.Random(0)
    for chunk, left in ((1, -1), (4, 2), (16, -1)):
        masked = model.decode(methods, feats, lengths, beam_size=4, decoding_chunk_size=chunk,
                              num_decoding_left_chunks=left)
        for b, length in enumerate(lengths.tolist()):
            stream = StreamingDecoder(model, chunk, left, beam_size=4)
            start = 0
            while start < length:
                piece = rng.randint(1, 60)
                partial = stream.accept(feats[b, start:min(start + piece, length)])
                start += piece
                assert bool(partial) == (min(start, length) >= stream.window)  # from the first window's end on
            result = stream.finish(methods)
            assert result == {method: masked[method][b] for method in methods}, (chunk, left, b)
            assert stream.partial[0].tokens == result["ctc_prefix_beam_search"]  # no LM: finish ranks as feed
    short = StreamingDecoder(model, 4)
    assert short.accept(feats[0, :6]) == [] and short.finish(methods) == {method: [] for method in methods}
