import pytest
import torch
import torch.nn.functional as F

from toolkit.models.registry import init_model
from toolkit.models.transformer.asr_model import DECODING_METHODS, ASRModel, add_sos_eos, reverse_pad_list
from toolkit.train_config import Config
from toolkit.utils.common import IGNORE_ID
from toolkit.utils.config_parsing import ConfigError

# Four different speakers and words; the shortest (0.33 s) still has 7 encoder frames for the
# 5 tokens of THREE.
KEYS = ["george-0-01", "jackson-1-00", "lucas-2-01", "nicolas-3-00"]


def _model(vocab_size: int, ctc_weight: float, encoder: str = "conformer", ctc_upsample: int = 1,
           num_blocks: int = 2, r_num_blocks: int = 0, **interctc) -> ASRModel:
    """A small model; ``r_num_blocks`` > 0: U2++'s bidirectional decoder with that many right-to-left layers;
    ``interctc``: ``interctc_layer_idx`` (to encoder_conf), ``interctc_weight``, ``interctc_use_conditioning`` and
    ``reverse_weight`` (to model_conf)."""
    encoder_conf = dict(output_size=64, attention_heads=2, linear_units=128, num_blocks=num_blocks,
                        dropout_rate=0.0, positional_dropout_rate=0.0)
    model_conf = dict(ctc_weight=ctc_weight, lsm_weight=0.1)
    if "interctc_layer_idx" in interctc:
        encoder_conf["interctc_layer_idx"] = interctc["interctc_layer_idx"]
    for key in ("interctc_weight", "interctc_use_conditioning", "reverse_weight"):
        if key in interctc:
            model_conf[key] = interctc[key]
    if encoder == "conformer":
        encoder_conf["cnn_module_kernel"] = 7
    decoder_conf = dict(attention_heads=2, linear_units=128, num_blocks=1, dropout_rate=0.0,
                        positional_dropout_rate=0.0)
    if r_num_blocks:
        decoder_conf["r_num_blocks"] = r_num_blocks
    config = Config(cmvn=None, encoder=encoder, encoder_conf=encoder_conf,
                    decoder="bitransformer" if r_num_blocks else "transformer", decoder_conf=decoder_conf,
                    ctc_conf=dict(upsample=ctc_upsample), model_conf=model_conf)
    return init_model(config, 80, vocab_size)


def _batch(tiny_fsdd):
    """Normalised fbank, character targets and the vocabulary for KEYS."""
    texts = [tiny_fsdd.text[key] for key in KEYS]
    vocab = ["<blank>", "<unk>"] + sorted(set("".join(texts))) + ["<sos/eos>"]
    feats, lengths = tiny_fsdd.batch(KEYS)
    # Stand-in for global CMVN; padding stays zero-padded in spirit (it is never read).
    feats = (feats - feats.mean(dim=(0, 1))) / feats.std(dim=(0, 1))
    targets = [torch.tensor([vocab.index(c) for c in text]) for text in texts]
    target_lengths = torch.tensor([len(t) for t in targets])
    target = torch.nn.utils.rnn.pad_sequence(targets, batch_first=True, padding_value=IGNORE_ID)
    return feats, lengths, target, target_lengths, vocab, texts


def test_add_sos_eos():
    ys = torch.tensor([[3, 4, 5], [6, IGNORE_ID, IGNORE_ID]])
    ys_in, ys_out = add_sos_eos(ys, torch.tensor([3, 1]), sos=9, eos=9)
    assert ys_in.tolist() == [[9, 3, 4, 5], [9, 6, 9, 9]]
    assert ys_out.tolist() == [[3, 4, 5, 9], [6, 9, IGNORE_ID, IGNORE_ID]]


@pytest.mark.parametrize("encoder", ["conformer", "transformer"])
def test_hybrid_loss_is_the_weighted_sum_of_its_terms_computed_here(tiny_fsdd, encoder):
    feats, lengths, target, target_lengths, vocab, _ = _batch(tiny_fsdd)
    torch.manual_seed(0)
    model = _model(len(vocab), 0.3, encoder).eval()  # no dropout: the passes below see the same network
    out = model(feats, lengths, target, target_lengths)
    assert out["loss"].dim() == 0 and out["loss"].requires_grad
    out["loss"].backward()
    assert all(p.grad is not None for p in model.parameters())
    batch, vocab_size, eos = len(KEYS), len(vocab), len(vocab) - 1
    with torch.no_grad():
        encoder_out, mask = model.encoder(feats, lengths)
        encoder_lens = mask.squeeze(1).sum(dim=1)
        # CTC: -log P(y | x) of each utterance (torch's CTC recursion), averaged over the utterances.
        log_probs = model.ctc.log_softmax(encoder_out).transpose(0, 1)
        ctc = F.ctc_loss(log_probs, target.clamp(min=0), encoder_lens, target_lengths, reduction="none").double()
        # Attention: teacher forcing on <sos> + y against y + <eos>, written out here; label smoothing 0.1 spread
        # over the V - 1 other tokens; per-utterance sums averaged over the utterances.
        ys_in = torch.full((batch, int(target_lengths.max()) + 1), eos)
        terms = []
        for i, length in enumerate(target_lengths.tolist()):
            ys_in[i, 1:length + 1] = target[i, :length]
        logits = model.decoder(encoder_out, mask, ys_in, target_lengths + 1).log_softmax(dim=2).double()
        for i, length in enumerate(target_lengths.tolist()):
            for t, token in enumerate(target[i, :length].tolist() + [eos]):
                q = torch.full((vocab_size,), 0.1 / (vocab_size - 1), dtype=torch.float64)
                q[token] = 0.9
                terms.append(q * (q.log() - logits[i, t]))
    terms = torch.stack(terms)
    expected = 0.3 * float(ctc.mean()) + 0.7 * float(terms.sum()) / batch
    # NOTE: the model sums the same float32 terms in another order (and in float32): Higham's bound for a sum of n
    # terms, gamma(n) * sum|terms| (Accuracy and Stability of Numerical Algorithms, eq. 4.4), plus one rounding
    # of each term and of each of the few scalings.
    n, u = terms.numel() + batch, 2.0 ** -24
    bound = (n + 8) * u * (0.7 * float(terms.abs().sum()) / batch + 0.3 * float(ctc.abs().mean()))
    assert abs(float(out["loss"].detach()) - expected) <= bound
    assert 0.0 <= out["th_accuracy"].item() <= 1.0


def test_reverse_pad_list():
    ys = torch.tensor([[7, 8, 9], [4, 5, IGNORE_ID], [6, IGNORE_ID, IGNORE_ID]])
    assert reverse_pad_list(ys, torch.tensor([3, 2, 0])).tolist() == [[9, 8, 7], [5, 4, IGNORE_ID],
                                                                      [IGNORE_ID] * 3]


def test_bidirectional_decoder_loss_mixes_both_directions_computed_here(tiny_fsdd):
    feats, lengths, target, target_lengths, vocab, _ = _batch(tiny_fsdd)
    torch.manual_seed(0)
    model = _model(len(vocab), 0.3, r_num_blocks=2, reverse_weight=0.4).eval()
    out = model(feats, lengths, target, target_lengths)
    out["loss"].backward()
    assert all(p.grad is not None for p in model.parameters())  # the right-to-left decoder's included
    assert len(model.decoder.right_decoder.decoders) == 2 and len(model.decoder.left_decoder.decoders) == 1
    model.set_activation_checkpointing(True)
    assert model.decoder.left_decoder.activation_checkpointing and model.decoder.right_decoder.activation_checkpointing
    model.set_activation_checkpointing(False)
    batch, vocab_size, eos = len(KEYS), len(vocab), len(vocab) - 1
    with torch.no_grad():
        encoder_out, mask = model.encoder(feats, lengths)

        def attention_loss(sequences: list[list[int]], forward) -> float:
            """Label-smoothed (0.1) teacher-forced loss of <sos> + tokens against tokens + <eos>, written out."""
            ys_in = torch.full((batch, int(target_lengths.max()) + 1), eos)
            for i, tokens in enumerate(sequences):
                ys_in[i, 1:len(tokens) + 1] = torch.tensor(tokens)
            log_probs = forward(encoder_out, mask, ys_in, target_lengths + 1).log_softmax(dim=2).double()
            total = 0.0
            for i, tokens in enumerate(sequences):
                for t, token in enumerate(tokens + [eos]):
                    q = torch.full((vocab_size,), 0.1 / (vocab_size - 1), dtype=torch.float64)
                    q[token] = 0.9
                    total += float((q * (q.log() - log_probs[i, t])).sum())
            return total / batch

        tokens = [target[i, :n].tolist() for i, n in enumerate(target_lengths.tolist())]
        left = attention_loss(tokens, model.decoder)
        right = attention_loss([t[::-1] for t in tokens], model.decoder.forward_reverse)
    assert abs(left - right) > 0.01 * left  # the two directions differ: the test can tell them apart
    assert out["loss_att"].item() == pytest.approx(0.6 * left + 0.4 * right, rel=1e-5)
    assert out["loss"].item() == pytest.approx(0.3 * out["loss_ctc"].item() + 0.7 * out["loss_att"].item(),
                                               rel=1e-6)


def test_bidirectional_decoder_settings_are_checked_naming_the_section(tiny_fsdd):
    with pytest.raises(ConfigError, match="model_conf: reverse_weight > 0 and the bidirectional decoder"):
        _model(10, 0.3, reverse_weight=0.3)  # nothing to weigh
    with pytest.raises(ConfigError, match="model_conf: reverse_weight > 0 and the bidirectional decoder"):
        _model(10, 0.3, r_num_blocks=1)  # a right-to-left decoder without a gradient
    with pytest.raises(ConfigError, match=r"model_conf: reverse_weight must be in \[0, 1\)"):
        _model(10, 0.3, r_num_blocks=1, reverse_weight=1.0)
    with pytest.raises(ConfigError, match="decoder_conf: r_num_blocks must be >= 1"):
        _model(10, 0.3, r_num_blocks=-1, reverse_weight=0.3)
    feats, lengths, _, _, vocab, _ = _batch(tiny_fsdd)
    with pytest.raises(ValueError, match="needs the bidirectional decoder"):
        _model(len(vocab), 0.3).eval().decode(["attention_rescoring"], feats, lengths, reverse_weight=0.5)
    with pytest.raises(ValueError, match=r"must be in \[0, 1\]"):
        _model(len(vocab), 0.3, r_num_blocks=1, reverse_weight=0.3).eval().decode(
            ["attention_rescoring"], feats, lengths, reverse_weight=1.5)


def test_extreme_ctc_weights_drop_one_branch(tiny_fsdd):
    feats, lengths, target, target_lengths, vocab, _ = _batch(tiny_fsdd)
    ctc_only = _model(len(vocab), 1.0)(feats, lengths, target, target_lengths)
    assert ctc_only["loss_att"] is None and ctc_only["th_accuracy"] is None
    assert torch.equal(ctc_only["loss"], ctc_only["loss_ctc"])
    att_only = _model(len(vocab), 0.0)(feats, lengths, target, target_lengths)
    assert att_only["loss_ctc"] is None
    assert torch.equal(att_only["loss"], att_only["loss_att"])


@pytest.mark.parametrize("encoder", ["conformer", "transformer"])
def test_intermediate_ctc_is_the_ctc_head_on_the_named_layers_outputs(tiny_fsdd, encoder):
    feats, lengths, target, target_lengths, vocab, _ = _batch(tiny_fsdd)
    torch.manual_seed(0)
    model = _model(len(vocab), 0.3, encoder, num_blocks=3, interctc_layer_idx=[2, 1], interctc_weight=0.4).eval()
    out = model(feats, lengths, target, target_lengths)
    out["loss"].backward()
    assert all(p.grad is not None for p in model.parameters())
    with torch.no_grad():
        # The layers' outputs recomputed here, layer by layer, each through the final LayerNorm.
        encoder = model.encoder
        masks = torch.arange(feats.size(1)).unsqueeze(0) < lengths.unsqueeze(1)
        xs, pos_emb, masks = encoder.embed(feats, masks.unsqueeze(1))
        outputs = []
        for layer in encoder.encoders:
            xs = layer(xs, masks, pos_emb, masks)[0]
            outputs.append(encoder.after_norm(xs))
        encoder_lens = masks.squeeze(1).sum(dim=1)

        def ctc(x: torch.Tensor) -> float:
            log_probs = model.ctc.log_softmax(x).transpose(0, 1)
            return float(F.ctc_loss(log_probs, target.clamp(min=0), encoder_lens, target_lengths,
                                    reduction="none").double().mean())

        last, inter = ctc(outputs[2]), (ctc(outputs[0]) + ctc(outputs[1])) / 2
        # The eager forward without intermediate layers is the encoder's own: decoding is unchanged.
        assert torch.equal(encoder(feats, lengths)[0], encoder.forward_layers(feats, lengths, [1, 2])[0])
        assert torch.allclose(encoder(feats, lengths)[0], outputs[2], atol=1e-5)
    assert abs(inter - last) > 0.01 * last  # the two kinds of term differ: the test can tell them apart
    assert out["loss_interctc"].item() == pytest.approx(inter, rel=1e-5)
    assert out["loss_ctc"].item() == pytest.approx(0.6 * last + 0.4 * inter, rel=1e-5)
    assert out["loss"].item() == pytest.approx(0.3 * out["loss_ctc"].item() + 0.7 * out["loss_att"].item(),
                                               rel=1e-6)
    assert _model(len(vocab), 0.3)(feats, lengths, target, target_lengths)["loss_interctc"] is None


@pytest.mark.parametrize("interctc, message", [
    (dict(interctc_weight=0.3), "together"),  # a weight without layers
    (dict(interctc_layer_idx=[1]), "together"),  # layers without a weight: they would be ignored
    (dict(interctc_layer_idx=[2], interctc_weight=0.3), r"interctc_layer_idx \[2\] outside 1 .. num_blocks - 1"),
    (dict(interctc_layer_idx=[0], interctc_weight=0.3), r"interctc_layer_idx \[0\] outside"),
    (dict(interctc_layer_idx=[1], interctc_weight=1.0), r"interctc_weight must be in \[0, 1\)"),
])
def test_intermediate_ctc_settings_are_checked_naming_the_section(interctc, message):
    with pytest.raises(ConfigError, match=message):
        _model(10, 0.3, **interctc)
    with pytest.raises(ConfigError, match="together"):  # no CTC branch to regularise
        _model(10, 0.0, interctc_layer_idx=[1], interctc_weight=0.3)


@pytest.mark.parametrize("kind", ["conformer", "transformer"])
def test_self_conditioned_ctc_feeds_the_intermediate_posteriors_back(tiny_fsdd, kind):
    feats, lengths, target, target_lengths, vocab, _ = _batch(tiny_fsdd)
    torch.manual_seed(0)
    model = _model(len(vocab), 0.3, kind, num_blocks=3, interctc_layer_idx=[1], interctc_weight=0.4,
                   interctc_use_conditioning=True).eval()
    out = model(feats, lengths, target, target_lengths)
    out["loss"].backward()
    encoder = model.encoder
    assert encoder.conditioning_layer.weight.grad.abs().sum() > 0
    assert encoder.conditioning_ctc is model.ctc  # the one CTC head, not a copy
    with torch.no_grad():
        # Layer by layer: after layer 1, its output's CTC posteriors, projected, are added to it.
        masks = (torch.arange(feats.size(1)).unsqueeze(0) < lengths.unsqueeze(1)).unsqueeze(1)
        xs, pos_emb, masks = encoder.embed(feats, masks)
        xs = encoder.encoders[0](xs, masks, pos_emb, masks)[0]
        first = encoder.after_norm(xs)
        posteriors = model.ctc.ctc_lo(first).softmax(dim=-1)
        xs = xs + encoder.conditioning_layer(posteriors)
        for layer in encoder.encoders[1:]:
            xs = layer(xs, masks, pos_emb, masks)[0]
        expected = encoder.after_norm(xs)
        encoder_lens = masks.squeeze(1).sum(dim=1)

        def ctc(x: torch.Tensor) -> float:
            log_probs = model.ctc.log_softmax(x).transpose(0, 1)
            return float(F.ctc_loss(log_probs, target.clamp(min=0), encoder_lens, target_lengths,
                                    reduction="none").double().mean())

        # Decoding runs the same conditioned encoder.
        assert torch.allclose(encoder(feats, lengths)[0], expected, atol=1e-5)
        unconditioned = _model(len(vocab), 0.3, kind,
                               num_blocks=3, interctc_layer_idx=[1], interctc_weight=0.4).eval()
        unconditioned.load_state_dict(model.state_dict(), strict=False)
        assert not torch.allclose(unconditioned.encoder(feats, lengths)[0], expected, atol=1e-3)
        # The shared head is saved under both names and loads back into a fresh model.
        copy = _model(len(vocab), 0.3, kind,
                      num_blocks=3, interctc_layer_idx=[1], interctc_weight=0.4, interctc_use_conditioning=True)
        copy.load_state_dict(model.state_dict())
        assert torch.equal(copy.eval().encoder(feats, lengths)[0], encoder(feats, lengths)[0])
    assert out["loss_interctc"].item() == pytest.approx(ctc(first), rel=1e-5)
    assert out["loss_ctc"].item() == pytest.approx(0.6 * ctc(expected) + 0.4 * ctc(first), rel=1e-5)


def test_self_conditioning_needs_intermediate_ctc():
    with pytest.raises(ConfigError, match="model_conf: interctc_use_conditioning needs intermediate CTC"):
        _model(10, 0.3, interctc_use_conditioning=True)


def test_unknown_decoding_method_lists_valid_ones(tiny_fsdd):
    feats, lengths, _, _, vocab, _ = _batch(tiny_fsdd)
    model = _model(len(vocab), 0.3).eval()
    with pytest.raises(ValueError, match="attention_rescoring"):
        model.decode(["beam"], feats, lengths)


@pytest.mark.parametrize("bidirectional", [False, True])
def test_overfit_four_utterances_all_decoding_methods(tiny_fsdd, bidirectional):
    feats, lengths, target, target_lengths, vocab, texts = _batch(tiny_fsdd)
    torch.manual_seed(0)
    model = _model(len(vocab), 0.3, **(dict(r_num_blocks=1, reverse_weight=0.3) if bidirectional else {}))
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    # Tensors this small gain nothing from intra-op threads, and on a loaded 2-core machine
    # OpenMP threads spinning against other processes make the loop up to 10x slower.
    def spelled(results):
        return {method: ["".join(vocab[t] for t in hyp) for hyp in hyps] for method, hyps in results.items()}

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        # 120 steps, then 40 more at a time (up to 400) until every decoding method spells the four texts: 120
        # were enough on one CPU, another's kernels round otherwise and took more
        for step in range(400):
            model.train()
            out = model(feats, lengths, target, target_lengths)
            optimizer.zero_grad()
            out["loss"].backward()
            optimizer.step()
            if step >= 119 and (step + 1) % 40 == 0:
                model.eval()
                results = model.decode(list(DECODING_METHODS), feats, lengths, beam_size=4)
                if all(hyps == texts for hyps in spelled(results).values()):
                    break
    finally:
        torch.set_num_threads(threads)
    assert set(results) == set(DECODING_METHODS)
    assert spelled(results) == {method: texts for method in DECODING_METHODS}, f"after {step + 1} steps"
    # Decoding a single utterance gives the same answer as in the batch.
    alone = model.decode(["attention", "attention_rescoring"], feats[3:, :lengths[3]],
                         lengths[3:], beam_size=4)
    assert alone == {"attention": [results["attention"][3]],
                     "attention_rescoring": [results["attention_rescoring"][3]]}


def _grads(model) -> dict[str, torch.Tensor]:
    return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


def test_an_utterance_without_ctc_alignment_is_left_out_exactly(tiny_fsdd):
    feats, lengths, target, target_lengths, vocab, _ = _batch(tiny_fsdd)
    torch.manual_seed(0)
    model = _model(len(vocab), 0.3).eval()  # eval: BatchNorm does not mix the utterances
    short = lengths.clone()
    short[1] = 12  # 12 fbank frames = 2 encoder frames for "ONE": no CTC alignment exists
    out = model(feats, short, target, target_lengths)
    assert out["excluded"].tolist() == [False, True, False, False]
    out["loss"].backward()
    with_short = _grads(model)
    model.zero_grad()
    kept = [0, 2, 3]
    alone = model(feats[kept], lengths[kept], target[kept], target_lengths[kept])
    alone["loss"].backward()
    # The same loss terms and the same gradient as if the utterance had never been in the batch.
    for key in ("loss", "loss_ctc", "loss_att", "th_accuracy"):
        assert torch.allclose(out[key], alone[key], atol=1e-5), key
    assert with_short.keys() == _grads(model).keys()
    for name, grad in _grads(model).items():
        assert torch.allclose(with_short[name], grad, atol=1e-6), name


def test_upsampled_ctc_aligns_what_the_encoder_frames_alone_cannot(tiny_fsdd):
    # 12 fbank frames = 2 encoder frames: "ONE" has no alignment with them, and one with their 4 CTC frames.
    feats, lengths, target, target_lengths, vocab, _ = _batch(tiny_fsdd)
    short = lengths.clone()
    short[1] = 12
    torch.manual_seed(0)
    model = _model(len(vocab), 0.3, ctc_upsample=2).eval()
    out = model(feats, short, target, target_lengths)
    assert not out["excluded"].any() and torch.isfinite(out["loss"])
    expected = model.ctc(*model.encoder(feats, short)[:1], model.encoder.output_lengths(short), target,
                         target_lengths).mean()
    assert torch.allclose(out["loss_ctc"], expected)
    # decoding reads 2 CTC frames per encoder frame: greedy search can spell up to 4 tokens from 2 encoder frames
    with torch.no_grad():
        model.ctc.ctc_lo.bias.copy_(torch.tensor([-50.0] * len(vocab) + [0.0] * len(vocab)))
        model.ctc.ctc_lo.bias[len(vocab) + vocab.index("O")] = 50.0  # every second CTC frame: O, the rest blank
    hyps = model.decode(["ctc_greedy_search"], feats[1:2, :12], short[1:2])["ctc_greedy_search"]
    assert hyps == [[vocab.index("O")] * 2]


def test_a_batch_of_impossible_utterances_gives_zero_loss_and_zero_gradient(tiny_fsdd):
    feats, lengths, target, target_lengths, vocab, _ = _batch(tiny_fsdd)
    model = _model(len(vocab), 0.3)
    out = model(feats[:, :5], torch.full_like(lengths, 5), target, target_lengths)  # 5 frames: no encoder frame
    assert out["excluded"].all() and out["loss"].item() == 0.0
    out["loss"].backward()  # every parameter still gets a gradient (DDP needs it), and it is exactly zero
    assert all(p.grad is not None and not p.grad.any() for p in model.parameters())


def test_attention_only_excludes_only_utterances_without_encoder_frames(tiny_fsdd):
    feats, lengths, target, target_lengths, vocab, _ = _batch(tiny_fsdd)
    model = _model(len(vocab), 0.0).eval()
    out = model(feats, torch.tensor([12, 5, int(lengths[2]), 6]), target, target_lengths)
    assert out["excluded"].tolist() == [False, True, False, True]  # 2 frames can still be attended to
    assert torch.isfinite(out["loss"])


def test_clips_under_the_receptive_field_decode_to_empty_alone_and_in_a_batch(tiny_fsdd):
    feats, lengths, _, _, vocab, _ = _batch(tiny_fsdd)
    torch.manual_seed(0)
    model = _model(len(vocab), 0.3).eval()
    methods = list(DECODING_METHODS)
    assert model.encoder.output_lengths(torch.tensor([1, 6, 7, 12])).tolist() == [0, 0, 1, 2]
    for frames in (6, 5, 1):  # under 7 fbank frames (~85 ms): no encoder frame
        alone = model.decode(methods, feats[:1, :frames], torch.tensor([frames]), beam_size=4)
        assert alone == {method: [[]] for method in methods}, frames
    padded = model.decode(methods, feats[:2], torch.tensor([int(lengths[0]), 5]), beam_size=4)
    assert {method: hyps[1] for method, hyps in padded.items()} == {method: [] for method in methods}
    first = model.decode(methods, feats[:1, :lengths[0]], lengths[:1], beam_size=4)
    assert {method: hyps[:1] for method, hyps in padded.items()} == first


@pytest.mark.parametrize("ctc_upsample", [1, 2])
def test_each_utterance_decodes_the_same_alone_and_in_a_batch(tiny_fsdd_test, ctc_upsample):
    # An untrained model that rarely says <eos> (like the start of training): every attention hypothesis runs to its
    # length limit, which must be the utterance's own encoder length, not the batch's padded one.
    feats, lengths = tiny_fsdd_test.batch(["theo-6-00", "theo-2-00"])
    feats = (feats - feats.mean(dim=(0, 1))) / feats.std(dim=(0, 1))
    torch.manual_seed(0)
    model = _model(19, 0.3, ctc_upsample=ctc_upsample).eval()
    with torch.no_grad():
        model.decoder.output_layer.bias[18] = -30.0
    methods = list(DECODING_METHODS)
    batched = model.decode(methods, feats, lengths, beam_size=4)
    for i in range(2):
        alone = model.decode(methods, feats[i:i + 1, :lengths[i]], lengths[i:i + 1], beam_size=4)
        assert alone == {method: [hyps[i]] for method, hyps in batched.items()}
    limit = model.encoder.output_lengths(lengths).tolist()
    assert [len(hyp) for hyp in batched["attention"]] == limit  # no eos: as many tokens as encoder frames
