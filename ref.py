"""The reference π_ref: a frozen copy of the pretrained model that scores responses.

    python train.py --stage=reference     # saves ref.pt, the pretrained model frozen
    python -m pytest -q tests/test_ref.py

It answers one question during RLHF: how likely was each response token (or each vocabulary
entry) before any RL? kl.py turns the answer into the per-token penalty. It has no optimizer, no
gradients and no dropout, and it uses the same temperature as sampling. A full reference starts
at exactly KL 0 from the actor (`exact`: PPO checks its first rollout). Under --dtype=bf16 it
scores through a copy whose matmul weights are cast to bf16 once (precision.linears_in_bf16),
remade when its weights change. Cheaper ways to hold it (bf16, int8, nf4, LoRA, shared blocks)
are in cheap_ref.py; references that move (rolling, sync, reset) in anchors.py; the KL limit that
guards the distance to it in rollback.py.
Left out: a reference on another device than the actor, reference logits cached across epochs.
"""
import copy
import torch
import torch.nn as nn

from model import response_logits, token_logprobs
from precision import bf16_autocast, linears_in_bf16


def frozen_copy(model, memo=None):
    """A deep copy in eval mode with no gradients: never seen by an optimizer. memo: tensors the
    copy shares instead (copy.deepcopy's memo)."""
    return copy.deepcopy(model, memo).eval().requires_grad_(False)


class Reference:
    """Scores responses without gradients: a frozen deep copy of `actor`. copy=False: `actor` is
    used as it is (already the reference's own). exact: it starts at KL 0 from the pretrained
    model."""

    def __init__(self, actor, exact=True, copy=True):
        self.model = frozen_copy(actor) if copy else actor
        self.exact = exact
        # --dtype=bf16: (the weights it was cast from, the bf16 copy); see `bf16_model`.
        self.cast = None

    @torch.no_grad()
    def logits(self, query, query_mask, response, temperature):
        """(B, R, V) temperature-scaled fp32 logits at the response positions. A half-precision
        copy (bf16, fp16) computes in its own precision also under --dtype=bf16: autocast would
        feed fp16 LayerNorms bf16 inputs."""
        if self.model.lm_head.weight.dtype != torch.float32:
            with torch.autocast(query.device.type, enabled=False):
                return response_logits(self.model, query, query_mask, response, temperature)
        model = self.model
        if bf16_autocast(query.device.type):
            model = self.bf16_model()
        return response_logits(model, query, query_mask, response, temperature)

    def bf16_model(self):
        """The model with every nn.Linear's weight and bias in bf16, cast once and remade when one
        of them has changed since (a moving anchor's mix, load_state_dict)."""
        lins = [m for m in self.model.modules() if isinstance(m, nn.Linear)]
        tensors = [t for m in lins for t in (m.weight, m.bias) if t is not None]
        key = [(t.data_ptr(), t._version) for t in tensors]
        if self.cast is None or self.cast[0] != key:
            self.cast = (key, linears_in_bf16(self.model))
        return self.cast[1]

    @torch.no_grad()
    def logprobs(self, query, query_mask, response, temperature):
        """(B, R) log π_ref of the sampled response tokens."""
        logits = self.logits(query, query_mask, response, temperature)  # (B, R, V)
        return token_logprobs(logits, response)
