"""The frozen reference π_ref: a copy of the pretrained actor that nothing ever updates.

It answers one question during RLHF: how likely was each response token (or each vocabulary entry) before any
RL? kl.py turns the answer into the per-token penalty. It has no optimizer, no gradients and no dropout, and it
uses the same temperature as sampling, so that at the first step KL(actor ‖ reference) is exactly 0.
It is not needed after training: `python train.py --stage=sample` samples from the trained actor alone.
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
