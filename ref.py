"""The frozen reference π_ref: a copy of the pretrained actor that nothing ever updates.

It answers one question during RLHF: how likely was each response token (or each vocabulary entry) before any
RL? kl.py turns the answer into the per-token penalty. It has no optimizer, no gradients and no dropout, and it
uses the same temperature as sampling, so that at the first step KL(actor ‖ reference) is exactly 0.
It is not needed after training: `python train.py --stage=sample` samples from the trained actor alone.
A moving anchor (ppo.py, --ref_update=sync or reset) is a second Reference, a copy, that `mix` moves towards the
actor; this one, the frozen π_ref, stays bit for bit the pretrained model.
Left out: cheaper references (half precision, int8, a LoRA actor sharing the base weights).
"""
import copy
import torch

from model import response_logits, token_logprobs


class Reference:
    def __init__(self, actor):
        self.model = copy.deepcopy(actor).eval().requires_grad_(False)   # frozen: never seen by an optimizer

    @torch.no_grad()
    def logits(self, query, query_mask, response, temperature):
        """(B, R, V) temperature-scaled logits at the response positions."""
        return response_logits(self.model, query, query_mask, response, temperature)

    @torch.no_grad()
    def logprobs(self, query, query_mask, response, temperature):
        """(B, R) log π_ref of the sampled response tokens."""
        return token_logprobs(self.logits(query, query_mask, response, temperature), response)

    @torch.no_grad()
    def mix(self, actor, alpha):
        """π_ref <- α·π_θ + (1-α)·π_ref, tensor by tensor (TR-DPO's soft update); α = 1 copies the actor exactly."""
        new = dict(actor.named_parameters())
        for k, v in self.model.named_parameters():     # each tensor once: tied embeddings must not be mixed twice
            v.copy_(new[k]) if alpha == 1 else v.lerp_(new[k].to(v.dtype), alpha)
