"""Positional encodings grow with the input (issue 45: a 216 s test clip, 5400 encoder frames, stopped the decoding
of a whole test list at the fixed 5000-position table): positions past ``max_len`` are computed on demand, equal to
those of a larger table, and the first ``max_len`` are the stored table itself."""
import pytest
import torch

from toolkit.models.transformer.decoder import TransformerDecoder
from toolkit.models.transformer.embedding import PositionalEncoding, RelPositionalEncoding
from toolkit.models.transformer.encoder import ConformerEncoder, TransformerEncoder

from ..conftest import assert_equal_up_to_rounding

SMALL = dict(output_size=32, attention_heads=4, linear_units=64, num_blocks=2)


@pytest.mark.parametrize("module", [PositionalEncoding, RelPositionalEncoding])
def test_longer_input_than_the_table_gets_the_larger_tables_encoding(module):
    short, large = module(8, 0.0, max_len=16), module(8, 0.0, max_len=64)
    x = torch.randn(2, 40, 8)
    scaled, pos_emb = short(x)
    scaled_large, pos_emb_large = large(x)
    assert pos_emb.shape == pos_emb_large.shape == ((1, 40, 8) if module is PositionalEncoding else (1, 79, 8))
    assert torch.allclose(pos_emb, pos_emb_large, rtol=0.0, atol=1e-6)  # the same formula per position
    assert torch.equal(scaled, scaled_large)
    if module is PositionalEncoding:  # the first max_len positions are the stored table, bit for bit
        assert torch.equal(pos_emb[:, :16], short.pe)
        assert torch.equal(pos_emb[:, :16], large.pe[:, :16])
    else:  # the distances 15 .. -15 sit in the middle of 39 .. -39; distance 0 at the centre
        assert torch.equal(pos_emb[:, 24:55], short.pe)
        assert torch.equal(pos_emb[0, 39], torch.tensor([0.0, 1.0] * 4))
    assert short.pe.shape[1] == (16 if module is PositionalEncoding else 31)  # nothing stored by the call
    for time in (1, 15, 16):  # within the table: the stored rows as before
        assert torch.equal(short(x[:, :time])[1], large(x[:, :time])[1])


@pytest.mark.parametrize("module", [PositionalEncoding, RelPositionalEncoding])
def test_extension_keeps_the_tables_dtype_and_scripts(module):
    pos_enc = module(8, 0.0, max_len=4).double()
    x = torch.randn(1, 9, 8, dtype=torch.float64)
    eager = pos_enc(x)
    scripted = torch.jit.script(pos_enc)(x)
    assert eager[1].dtype == torch.float64 and torch.equal(eager[1], scripted[1])
    assert torch.allclose(eager[1], module(8, 0.0, max_len=9).double()(x)[1], rtol=0.0, atol=1e-6)


def _encoders():
    torch.manual_seed(0)
    return [TransformerEncoder(80, **SMALL), ConformerEncoder(80, cnn_module_kernel=7, **SMALL),
            ConformerEncoder(80, cnn_module_kernel=7, time_reduce_idx=1, time_recover_idx=2, **SMALL)]


@pytest.mark.parametrize("index", range(3))
def test_encoder_of_more_frames_than_its_table_matches_a_larger_table(index):
    # 100 fbank frames are 24 encoder frames, past a table of 10
    feats, lengths = torch.randn(2, 100, 80, dtype=torch.float64), torch.tensor([100, 61])
    encoder = _encoders()[index].double().eval()
    with torch.no_grad():
        expected, mask = encoder(feats, lengths)
        pos_enc = type(encoder.embed.pos_enc)
        encoder.embed.pos_enc = pos_enc(32, 0.0, max_len=10).double()
        out, short_mask = encoder(feats, lengths)
    assert out.size(1) == 24 and torch.equal(mask, short_mask)
    assert_equal_up_to_rounding(out, expected)


def test_decoder_of_more_tokens_than_its_table_matches_a_larger_table():
    torch.manual_seed(0)
    decoder = TransformerDecoder(12, 32, attention_heads=4, linear_units=64, num_blocks=2).double().eval()
    memory, memory_mask = torch.randn(1, 9, 32, dtype=torch.float64), torch.ones(1, 1, 9, dtype=torch.bool)
    ys_in = torch.randint(0, 12, (1, 20))
    with torch.no_grad():
        expected = decoder(memory, memory_mask, ys_in, torch.tensor([20]))
        decoder.pos_enc = PositionalEncoding(32, 0.0, max_len=8).double()
        assert_equal_up_to_rounding(decoder(memory, memory_mask, ys_in, torch.tensor([20])), expected)
        step, _ = decoder.forward_one_step(memory, memory_mask, ys_in, None)
    assert_equal_up_to_rounding(step, expected[:, -1].log_softmax(dim=-1))
