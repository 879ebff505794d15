"""Hybrid CTC/attention encoder-decoder ASR model (Watanabe et al., 2017, "Hybrid CTC/Attention
Architecture for End-to-End Speech Recognition", IEEE JSTSP; Kim et al., 2017,
arXiv:1609.06773)."""
from typing import Optional, Sequence

import torch
from torch import nn

from toolkit.models.transformer.ctc import CTC, min_ctc_frames
from toolkit.models.transformer.decoder import BiTransformerDecoder, TransformerDecoder
from toolkit.models.transformer.encoder import BaseEncoder
from toolkit.models.transformer.label_smoothing_loss import LabelSmoothingLoss
from toolkit.models.transformer.search import (Hypothesis, PrefixLM, attention_beam_search, attention_rescoring,
                                               ctc_greedy_search, ctc_prefix_beam_search)
from toolkit.utils.common import IGNORE_ID
from toolkit.utils.mask import make_pad_mask

DECODING_METHODS = ("ctc_greedy_search", "ctc_prefix_beam_search", "attention",
                    "attention_rescoring")
# The methods a language model passed to ASRModel.decode changes (through the CTC prefix beam search n-best).
LM_METHODS = ("ctc_prefix_beam_search", "attention_rescoring")


def decoding_modes_error(modes: Sequence[str]) -> str:
    """Why ``modes`` is not a list of decoding methods, in one line with the valid choices (no mode given, or the
    unknown ones); ``""`` when it is one."""
    unknown = [mode for mode in modes if mode not in DECODING_METHODS]
    if modes and not unknown:
        return ""
    problem = f"unknown mode(s) {unknown}" if unknown else "no mode given"
    return f"{problem}; choose one or more of {list(DECODING_METHODS)}"


def add_sos_eos(ys_pad: torch.Tensor, ys_lens: torch.Tensor, sos: int, eos: int,
                ignore_id: int = IGNORE_ID) -> tuple[torch.Tensor, torch.Tensor]:
    """Build teacher-forcing decoder input and output.

    Example: tokens [7, 8] (sos = eos = 9) -> input [9, 7, 8], output [7, 8, 9].

    Args:
        ys_pad: int64 (B, L) tokens padded with ``ignore_id``.
        ys_lens: int64 (B,) token counts.

    Returns:
        ys_in_pad: int64 (B, L+1) ``sos`` + tokens, padded with ``eos`` (a valid embedding index).
        ys_out_pad: int64 (B, L+1) tokens + ``eos``, padded with ``ignore_id``.
    """
    pad = make_pad_mask(ys_lens, ys_pad.size(1))
    column = ys_pad.new_full((ys_pad.size(0), 1), sos)
    ys_in = torch.cat([column, ys_pad.masked_fill(pad, eos)], dim=1)
    ys_out = torch.cat([ys_pad.masked_fill(pad, ignore_id), column.fill_(ignore_id)], dim=1)
    ys_out.scatter_(1, ys_lens.unsqueeze(1), eos)
    return ys_in, ys_out


def reverse_pad_list(ys_pad: torch.Tensor, ys_lens: torch.Tensor, pad_value: int = IGNORE_ID) -> torch.Tensor:
    """Each row's tokens last to first, for the right-to-left decoder.

    Example: [[7, 8, 9], [4, 5, -1]] with lengths [3, 2] -> [[9, 8, 7], [5, 4, -1]].

    Args:
        ys_pad: int64 (B, L) tokens padded with anything; ys_lens: int64 (B,) token counts.

    Returns:
        int64 (B, L): row b's first ``ys_lens[b]`` tokens reversed, then ``pad_value``.
    """
    positions = torch.arange(ys_pad.size(1), device=ys_pad.device).unsqueeze(0)
    source = (ys_lens.unsqueeze(1) - 1 - positions).clamp(min=0)
    return ys_pad.gather(1, source).masked_fill(positions >= ys_lens.unsqueeze(1), pad_value)


class ASRModel(nn.Module):
    """Encoder + CTC head + attention decoder, trained with
    loss = ctc_weight * loss_ctc + (1 - ctc_weight) * loss_att, where with intermediate CTC (Lee & Watanabe,
    2021, arXiv:2102.03216) loss_ctc is (1 - interctc_weight) * the last layer's CTC loss + interctc_weight * the
    mean CTC loss of the encoder layers ``encoder.interctc_layer_idx``, all through the one CTC head; with
    self-conditioned CTC (Nozaki & Komatsu, 2021, arXiv:2104.02724) those layers' CTC posteriors are also fed back
    into the encoder (:meth:`BaseEncoder.set_self_conditioning`); with U2++'s bidirectional decoder (Wu et al.,
    2021, arXiv:2106.05642) loss_att is (1 - reverse_weight) * the left-to-right decoder's loss + reverse_weight *
    the right-to-left decoder's on the reversed tokens.

    Args:
        vocab_size: V; ``<sos/eos>`` = V - 1.
        encoder: TransformerEncoder or ConformerEncoder.
        decoder: TransformerDecoder, or BiTransformerDecoder (with ``reverse_weight`` > 0).
        ctc: CTC head.
        ctc_weight: in [0, 1]; 1.0 skips the decoder loss, 0.0 skips the CTC loss.
        lsm_weight: label smoothing of the attention loss.
        length_normalized_loss: normalise the attention loss per token instead of per utterance.
        interctc_weight: in [0, 1); > 0 needs ``ctc_weight`` > 0 and the layers in the encoder's
            ``interctc_layer_idx`` (``encoder_conf``), which 0 must go without. Training only: decoding reads the
            last layer.
        interctc_use_conditioning: self-conditioned CTC on the intermediate CTC layers (ESPnet's name); needs
            ``interctc_weight`` > 0. It changes the encoder, so decoding conditions too.
        reverse_weight: in [0, 1); > 0 needs a BiTransformerDecoder, which needs it > 0 (its right-to-left
            decoder would get no gradient). Also the default weight of the right-to-left score in attention
            rescoring.

    Raises:
        ValueError: ``ctc_weight`` outside [0, 1], ``interctc_weight`` outside [0, 1), or ``interctc_weight``
            and ``encoder.interctc_layer_idx`` not given together (or without a CTC branch), or
            ``interctc_use_conditioning`` without intermediate CTC, or ``reverse_weight`` outside [0, 1) or not
            given together with a BiTransformerDecoder.
    """

    def __init__(self, vocab_size: int, encoder: BaseEncoder, decoder: TransformerDecoder | BiTransformerDecoder,
                 ctc: CTC, ctc_weight: float = 0.5, lsm_weight: float = 0.0,
                 length_normalized_loss: bool = False, interctc_weight: float = 0.0,
                 interctc_use_conditioning: bool = False, reverse_weight: float = 0.0):
        super().__init__()
        if not 0.0 <= ctc_weight <= 1.0:
            raise ValueError(f"ctc_weight must be in [0, 1], got {ctc_weight}")
        if not 0.0 <= interctc_weight < 1.0:
            raise ValueError(f"interctc_weight must be in [0, 1), got {interctc_weight}")
        if (interctc_weight > 0.0) != bool(encoder.interctc_layer_idx) or (interctc_weight > 0.0 and ctc_weight == 0.0):
            raise ValueError(f"intermediate CTC needs interctc_weight > 0, encoder_conf.interctc_layer_idx and "
                             f"ctc_weight > 0 together; got interctc_weight {interctc_weight}, interctc_layer_idx "
                             f"{encoder.interctc_layer_idx}, ctc_weight {ctc_weight}")
        if interctc_use_conditioning:
            if interctc_weight == 0.0:
                raise ValueError("interctc_use_conditioning needs intermediate CTC (interctc_weight > 0 and "
                                 "encoder_conf.interctc_layer_idx)")
            encoder.set_self_conditioning(ctc)
        if not 0.0 <= reverse_weight < 1.0:
            raise ValueError(f"reverse_weight must be in [0, 1), got {reverse_weight}")
        if (reverse_weight > 0.0) != isinstance(decoder, BiTransformerDecoder):
            raise ValueError(f"reverse_weight > 0 and the bidirectional decoder (decoder: bitransformer) go together; "
                             f"got reverse_weight {reverse_weight} with {type(decoder).__name__}")
        self.reverse_weight = reverse_weight
        self.interctc_weight = interctc_weight
        self.vocab_size = vocab_size
        self.sos = vocab_size - 1
        self.eos = vocab_size - 1
        self.ctc_weight = ctc_weight
        self.encoder = encoder
        self.decoder = decoder
        self.ctc = ctc
        self.criterion_att = LabelSmoothingLoss(vocab_size, lsm_weight, IGNORE_ID,
                                                length_normalized_loss)

    @property
    def has_unused_parameters(self) -> bool:
        """True when a branch gets no gradient (``ctc_weight`` 0 or 1): DDP must then be told
        (``find_unused_parameters``)."""
        return not 0.0 < self.ctc_weight < 1.0

    def set_activation_checkpointing(self, enabled: bool) -> None:
        """Checkpoint each encoder and decoder layer (``train_conf.activation_checkpointing``): in training mode
        with gradients enabled a layer keeps only its inputs and recomputes its activations in the backward pass
        (see :mod:`toolkit.models.activation_checkpointing`); evaluation, decoding and TorchScript are unchanged."""
        self.encoder.activation_checkpointing = enabled
        for module in self.decoder.modules():
            if isinstance(module, TransformerDecoder):
                module.activation_checkpointing = enabled

    def forward(self, feats: torch.Tensor, feats_lengths: torch.Tensor, target: torch.Tensor,
                target_lengths: torch.Tensor) -> dict[str, Optional[torch.Tensor]]:
        """Training loss for a batch.

        An utterance whose encoder output is too short for its target is left out of every loss
        term (it weighs 0, so its gradient is exactly 0) and flagged in ``"excluded"``: with a
        CTC branch when ``T'`` < its tokens + adjacent repeats (no CTC alignment exists, the
        loss would be infinite), and always when ``T'`` = 0 (fewer than 7 fbank frames: nothing
        to attend to). The caller names and counts these (see :mod:`toolkit.engine.executor`).

        Args:
            feats: float32 (B, T, D) fbank, zero-padded, 10 ms frames.
            feats_lengths: int64 (B,).
            target: int64 (B, L) token ids padded with IGNORE_ID.
            target_lengths: int64 (B,).

        Returns:
            {"loss": scalar, mean over the utterances not excluded (0 when none is left),
            "loss_ctc": scalar or None, "loss_att": scalar or None, "loss_interctc": scalar (the mean over the
            intermediate layers) or None without intermediate CTC (same normalisation for all three; "loss_ctc"
            is the combined CTC term when there is one),
            "th_accuracy": float32 scalar (teacher-forced token accuracy, no grad) or None,
            "excluded": bool (B,), True for the utterances left out}.
        """
        encoder_out, encoder_mask, intermediate = self.encoder.forward_layers(
            feats, feats_lengths, self.encoder.interctc_layer_idx)
        encoder_lens = encoder_mask.squeeze(1).sum(dim=1)
        excluded = encoder_lens == 0
        if self.ctc_weight > 0.0:
            excluded |= self.ctc.output_lengths(encoder_lens) < min_ctc_frames(target, target_lengths)
        # NOTE: an excluded utterance keeps its row (the graph, and so the set of parameters that
        # get a gradient, stays the same, as DDP requires) but its target becomes empty.
        target = target.masked_fill(excluded.unsqueeze(1), IGNORE_ID)
        target_lengths = target_lengths.masked_fill(excluded, 0)
        loss_ctc = loss_att = th_accuracy = loss_interctc = None
        if self.ctc_weight > 0.0:
            loss_ctc = self._ctc_loss(encoder_out, encoder_lens, target, target_lengths, excluded)
            if intermediate:
                loss_interctc = torch.stack([self._ctc_loss(x, encoder_lens, target, target_lengths, excluded)
                                             for x in intermediate]).mean()
                loss_ctc = (1.0 - self.interctc_weight) * loss_ctc + self.interctc_weight * loss_interctc
        if self.ctc_weight < 1.0:
            loss_att, th_accuracy = self._attention_loss(encoder_out, encoder_mask, target,
                                                         target_lengths, excluded)
        if loss_ctc is None:
            loss = loss_att
        elif loss_att is None:
            loss = loss_ctc
        else:
            loss = self.ctc_weight * loss_ctc + (1.0 - self.ctc_weight) * loss_att
        return {"loss": loss, "loss_ctc": loss_ctc, "loss_att": loss_att, "loss_interctc": loss_interctc,
                "th_accuracy": th_accuracy, "excluded": excluded}

    def _ctc_loss(self, encoder_out: torch.Tensor, encoder_lens: torch.Tensor, target: torch.Tensor,
                  target_lengths: torch.Tensor, excluded: torch.Tensor) -> torch.Tensor:
        """Mean CTC loss of the utterances not ``excluded`` (B,) (0 when none is left)."""
        # An excluded row of 0 frames reads 1 (padding): its empty-target loss is finite, then weighted 0.
        per_utt = self.ctc(encoder_out, encoder_lens.clamp(min=1), target, target_lengths)
        kept = (~excluded).sum().clamp(min=1)
        return per_utt.masked_fill(excluded, 0.0).sum() / kept

    def _attention_loss(self, encoder_out: torch.Tensor, encoder_mask: torch.Tensor,
                        target: torch.Tensor, target_lengths: torch.Tensor, excluded: torch.Tensor
                        ) -> tuple[torch.Tensor, torch.Tensor]:
        """Label-smoothed decoder loss (with a right-to-left decoder, the ``reverse_weight`` mix of the two
        directions') and the left-to-right decoder's teacher-forced accuracy over non-ignored tokens; the rows of
        ``excluded`` (B,) utterances are all ignored (not even their ``eos`` counts)."""
        ys_in, ys_out = add_sos_eos(target, target_lengths, self.sos, self.eos)
        ys_out = ys_out.masked_fill(excluded.unsqueeze(1), IGNORE_ID)
        logits = self.decoder(encoder_out, encoder_mask, ys_in, target_lengths + 1)
        loss_att = self.criterion_att(logits, ys_out)
        if self.reverse_weight > 0.0:
            r_ys_in, r_ys_out = add_sos_eos(reverse_pad_list(target, target_lengths), target_lengths, self.sos,
                                            self.eos)
            r_ys_out = r_ys_out.masked_fill(excluded.unsqueeze(1), IGNORE_ID)
            r_logits = self.decoder.forward_reverse(encoder_out, encoder_mask, r_ys_in, target_lengths + 1)
            loss_att = ((1.0 - self.reverse_weight) * loss_att
                        + self.reverse_weight * self.criterion_att(r_logits, r_ys_out))
        with torch.no_grad():
            valid = ys_out != IGNORE_ID
            correct = ((logits.argmax(dim=2) == ys_out) & valid).sum()
            th_accuracy = correct.float() / valid.sum().clamp(min=1)
        return loss_att, th_accuracy

    def rescoring_reverse_weight(self, reverse_weight: float | None) -> float:
        """The right-to-left decoder's weight in attention rescoring: ``reverse_weight``, or the model's for None.

        Raises:
            ValueError: ``reverse_weight`` outside [0, 1], or > 0 for a model without the right-to-left decoder.
        """
        if reverse_weight is None:
            return self.reverse_weight
        if not 0.0 <= reverse_weight <= 1.0 or (reverse_weight > 0.0 and self.reverse_weight == 0.0):
            raise ValueError(f"reverse_weight must be in [0, 1] and needs the bidirectional decoder (decoder: "
                             f"bitransformer) when > 0; got {reverse_weight} with {type(self.decoder).__name__}")
        return reverse_weight

    def decode(self, methods: list[str], feats: torch.Tensor, feats_lengths: torch.Tensor,
               beam_size: int = 10, ctc_weight: float = 0.5, length_penalty: float = 0.0,
               lm: PrefixLM | None = None, reverse_weight: float | None = None, decoding_chunk_size: int = 0,
               num_decoding_left_chunks: int = -1) -> dict[str, list[list[int]]]:
        """Recognise a batch with one or more decoding methods, running the encoder once.

        Call ``model.eval()`` first: dropout and BatchNorm follow the module's mode.

        Args:
            methods: names from DECODING_METHODS.
            feats: float32 (B, T, D) fbank; feats_lengths: int64 (B,).
            beam_size: beam for prefix beam search, attention and attention rescoring.
            ctc_weight: weight of the CTC prefix score in attention rescoring.
            length_penalty: per-token bonus added to the log-prob score in attention and
                attention rescoring (0: none). ``attention`` then ranks its finished hypotheses
                by score per decoding step (see :func:`attention_beam_search`).
            lm: language model fused into CTC prefix beam search, so into its n-best for attention
                rescoring too (:func:`ctc_prefix_beam_search`); None: no LM.
            reverse_weight: weight of the right-to-left decoder's score in attention rescoring, in [0, 1] (the
                left-to-right one's is 1 - reverse_weight); None: the model's ``reverse_weight``.
            decoding_chunk_size, num_decoding_left_chunks: the encoder's self-attention mask over the whole
                utterance (:class:`BaseEncoder`): chunks of N > 0 encoder frames seeing M chunks to their left (-1:
                all), as a stream would; -1 full context; 0 the model's own (full context, or its
                ``static_chunk_size``).

        An utterance with no valid encoder frame (fewer than 7 fbank frames, see
        :meth:`BaseEncoder.output_lengths`) gets the empty hypothesis in every method, alone or in
        a padded batch; each utterance's result does not depend on the rest of its batch.

        Returns:
            {method: B token-id lists in batch order}.

        Raises:
            ValueError: an unknown method name, ``reverse_weight`` outside [0, 1] or > 0 without a
                right-to-left decoder, or a chunk option the encoder refuses (:meth:`BaseEncoder.attention_mask`).
        """
        with torch.no_grad():
            encoder_out, encoder_mask = self.encoder(feats, feats_lengths, decoding_chunk_size,
                                                     num_decoding_left_chunks)
            return self.search(methods, encoder_out, encoder_mask, beam_size, ctc_weight, length_penalty, lm,
                               reverse_weight)

    def search(self, methods: list[str], encoder_out: torch.Tensor, encoder_mask: torch.Tensor, beam_size: int = 10,
               ctc_weight: float = 0.5, length_penalty: float = 0.0, lm: PrefixLM | None = None,
               reverse_weight: float | None = None, nbests: list[list[Hypothesis]] | None = None
               ) -> dict[str, list[list[int]]]:
        """The decoding methods over an encoded batch (:meth:`decode` after its encoder; a stream's encoder output
        after its last chunk, :class:`~toolkit.models.transformer.streaming.StreamingDecoder`).

        Args:
            encoder_out: float32 (B, T', D); encoder_mask: bool (B, 1, T'), True at valid frames.
            nbests: per utterance, the CTC prefix beam search's n-best when already searched (a stream's,
                incrementally); None: searched here. The other arguments: as :meth:`decode`.

        Returns / Raises: as :meth:`decode`.
        """
        reverse_weight = self.rescoring_reverse_weight(reverse_weight)
        error = decoding_modes_error(methods)
        if error:
            raise ValueError(error)
        results: dict[str, list[list[int]]] = {}
        with torch.no_grad():
            lengths = encoder_mask.squeeze(1).sum(dim=1)
            if "attention" in methods:
                results["attention"] = attention_beam_search(
                    self.decoder, encoder_out, encoder_mask, self.sos, self.eos, beam_size,
                    length_penalty)
            need_nbest = any(method in LM_METHODS for method in methods)
            if "ctc_greedy_search" in methods or (need_nbest and nbests is None):
                ctc_log_probs = self.ctc.log_softmax(encoder_out)
                ctc_lengths = self.ctc.output_lengths(lengths)
            if "ctc_greedy_search" in methods:
                results["ctc_greedy_search"] = ctc_greedy_search(ctc_log_probs, ctc_lengths)
            if need_nbest:
                if nbests is None:
                    nbests = [ctc_prefix_beam_search(ctc_log_probs[i, :length], beam_size, lm)
                              for i, length in enumerate(ctc_lengths.tolist())]
                if "ctc_prefix_beam_search" in methods:
                    results["ctc_prefix_beam_search"] = [nbest[0].tokens for nbest in nbests]
                if "attention_rescoring" in methods:
                    results["attention_rescoring"] = [
                        attention_rescoring(self.decoder, encoder_out[i:i + 1, :length],
                                            encoder_mask[i:i + 1, :, :length], nbest, self.sos,
                                            self.eos, ctc_weight, length_penalty, reverse_weight)
                        for i, (nbest, length) in enumerate(zip(nbests, lengths.tolist()))]
        return results
