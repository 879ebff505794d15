import torch

from ..conftest import assert_equal_up_to_rounding

from toolkit.models.transformer.decoder import BiTransformerDecoder, TransformerDecoder

VOCAB = 12


def _inputs():
    torch.manual_seed(0)
    memory = torch.randn(2, 9, 32, dtype=torch.float64)
    memory_mask = torch.tensor([[True] * 9, [True] * 6 + [False] * 3]).unsqueeze(1)
    ys_in = torch.randint(0, VOCAB, (2, 5))
    return memory, memory_mask, ys_in, torch.tensor([5, 3])


def _decoder():
    torch.manual_seed(0)
    return TransformerDecoder(VOCAB, 32, attention_heads=4, linear_units=64, num_blocks=2).double().eval()


def test_logits_shape_and_causality():
    decoder = _decoder()
    memory, memory_mask, ys_in, ys_lens = _inputs()
    logits = decoder(memory, memory_mask, ys_in, ys_lens)
    assert logits.shape == (2, 5, VOCAB)
    # Changing a later token must not change earlier steps.
    changed = ys_in.clone()
    changed[:, 3] = (changed[:, 3] + 1) % VOCAB
    logits_changed = decoder(memory, memory_mask, changed, ys_lens)
    assert torch.equal(logits[:, :3], logits_changed[:, :3])  # the same arithmetic, row by row: bit for bit
    assert not torch.allclose(logits[0, 3:], logits_changed[0, 3:])


def test_cached_steps_equal_teacher_forced_pass():
    decoder = _decoder()
    memory, memory_mask, ys_in, _ = _inputs()
    full = decoder(memory, memory_mask, ys_in, torch.tensor([5, 5])).log_softmax(dim=-1)
    cache = None
    for step in range(1, 6):
        log_probs, cache = decoder.forward_one_step(memory, memory_mask, ys_in[:, :step], cache)
        assert len(cache) == 2 and cache[0].shape == (2, step, 32)
        assert_equal_up_to_rounding(log_probs, full[:, step - 1])


def test_torchscript_decoder_matches_eager():
    decoder = _decoder()
    scripted = torch.jit.script(decoder)
    memory, memory_mask, ys_in, ys_lens = _inputs()
    with torch.no_grad():
        assert_equal_up_to_rounding(scripted(memory, memory_mask, ys_in, ys_lens),
                                    decoder(memory, memory_mask, ys_in, ys_lens))
        step_script, _ = scripted.forward_one_step(memory, memory_mask, ys_in[:, :2], None)
        step_eager, _ = decoder.forward_one_step(memory, memory_mask, ys_in[:, :2])
    assert_equal_up_to_rounding(step_script, step_eager)


def test_bidirectional_decoder_scripts_and_each_direction_is_its_own_stack():
    torch.manual_seed(0)
    decoder = BiTransformerDecoder(VOCAB, 32, attention_heads=4, linear_units=64, num_blocks=2,
                                   r_num_blocks=1).double().eval()
    assert len(decoder.left_decoder.decoders) == 2 and len(decoder.right_decoder.decoders) == 1
    scripted = torch.jit.script(decoder)
    memory, memory_mask, ys_in, ys_lens = _inputs()
    with torch.no_grad():
        left = decoder(memory, memory_mask, ys_in, ys_lens)
        right = decoder.forward_reverse(memory, memory_mask, ys_in, ys_lens)
        assert torch.equal(left, decoder.left_decoder(memory, memory_mask, ys_in, ys_lens))
        assert torch.equal(right, decoder.right_decoder(memory, memory_mask, ys_in, ys_lens))
        assert not torch.allclose(left, right)  # two stacks, two sets of weights
        assert_equal_up_to_rounding(scripted(memory, memory_mask, ys_in, ys_lens), left)
        assert_equal_up_to_rounding(scripted.forward_reverse(memory, memory_mask, ys_in, ys_lens), right)
        step_script, _ = scripted.forward_one_step(memory, memory_mask, ys_in[:, :2], None)
        step_left, _ = decoder.left_decoder.forward_one_step(memory, memory_mask, ys_in[:, :2])
    assert_equal_up_to_rounding(step_script, step_left)
