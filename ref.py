"""The reference π_ref: how it is made, frozen, scored, and shown to have stayed frozen.

    python train.py --stage=reference     # saves ref.pt: the pretrained model's weights
    python -m pytest -q tests/test_ref.py

Its life, in the order a run meets it:
    made      `save_reference`: the reference stage writes the pretrained model's weights to
              ref.pt, once
    frozen    `load_reference`: every PPO run loads ref.pt into one model, in eval mode (no
              dropout) and without gradients; no optimizer ever sees it. That model is the
              reference
    scored    `Reference.logits`, `Reference.logprobs`: at the sampling temperature, what it says
              of each response token; kl.py turns that into the per-token penalty
    checked   `check_starts_at`: the first rollout is at exactly KL 0 from it (the actor starts as
              the model it was copied from); `check_unchanged`: after PPO every tensor it scored
              with is bit for bit what ref.pt gives, or the run stops (exit 1) naming the tensor
Under --dtype=bf16 it scores through a copy whose matmul weights are cast to bf16 once
(precision.linears_in_bf16), remade when its weights change. Cheaper ways to hold it (bf16, int8,
nf4, LoRA, shared blocks) are in options/cheap_ref.py; references that move (rolling, sync, reset)
in options/anchors.py; the KL limit that guards the distance to it in options/rollback.py.
Left out: a reference on another device than the actor, reference logits cached across epochs.
"""
import copy
from dataclasses import asdict
import torch
import torch.nn as nn

from model import GPT, GPTConfig, response_logits, token_logprobs
from machinery import dist, store
from machinery.errors import RunError
from machinery.precision import bf16_autocast, linears_in_bf16


def save_checkpoint(model, path, **extra):
    store.save_torch({"config": asdict(model.config), "model": model.state_dict(), **extra}, path)


def load_checkpoint(path, device="cpu"):
    """Returns (GPT on device, checkpoint dict). Plain tensors and dicts only: safe with
    weights_only=True. Read on the CPU, then moved once."""
    ckpt = store.load_torch(path)
    model = GPT(GPTConfig(**ckpt["config"]))
    model.load_state_dict(ckpt["model"])
    return model.to(device), ckpt


def freeze(model):
    """The model itself, in eval mode (no dropout) and with no gradients."""
    return model.eval().requires_grad_(False)


def frozen_copy(model, memo=None):
    """A frozen deep copy: never seen by an optimizer. memo: tensors the copy shares instead
    (copy.deepcopy's memo)."""
    return freeze(copy.deepcopy(model, memo))


def save_reference(pretrain_path, ref_path):
    """The reference stage: ref.pt holds the pretrained model's weights. Returns the model."""
    model, _ = load_checkpoint(pretrain_path)
    save_checkpoint(model, ref_path)
    return model


def check_copy(pretrain_path, ref_path):
    """Before a stage that reads ref.pt removes anything: ref.pt holds the weights of pretrain.pt,
    bit for bit, as the reference stage wrote them. RunError (exit 2) naming the first tensor that
    differs: a stale or edited ref.pt (whatever stages.json says of it)."""
    change = first_change(load_checkpoint(ref_path)[0].state_dict(),
                          load_checkpoint(pretrain_path)[0].state_dict())
    if change:
        raise RunError(f"{ref_path} is not the frozen copy of {pretrain_path}: {change}; redo it "
                       "with --stage=reference (and what follows), or --fresh")


def load_reference(ref_path, device):
    """A run's reference: ref.pt's model, frozen where it was loaded (the one copy there is)."""
    model, _ = load_checkpoint(ref_path, device)
    return Reference(freeze(model), copy=False)


class Reference:
    """Scores responses without gradients. model: frozen, as a copy of it (copy=True) or as it is
    (copy=False: already frozen, or --ref=lora's actor with its adapters off). exact: it starts
    at KL 0 from the pretrained model."""

    def __init__(self, model, exact=True, copy=True):
        self.model = frozen_copy(model) if copy else model
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

    def state(self):
        """Every tensor the reference scores with, by name (weights and buffers)."""
        return self.model.state_dict()


def check_starts_at(ref, kl_exact):
    """The first rollout of an exact reference (full, lora, shared_n) is at KL 0 from it: else the
    actor is not the model the reference was copied from. kl_exact (B,): each response's exact KL
    to the reference. RunError otherwise."""
    if not ref.exact:
        return
    if dist.all_reduce(kl_exact.abs().max(), "max") > 1e-6:
        kl = kl_exact.max().item()
        raise RunError(f"the first rollout is {kl:.3g} nats from the reference, not 0: the actor "
                       "does not start as the reference (a stale ref.pt?); redo with --fresh")


def first_change(now, expected):
    """Why two {name: tensor} states differ, naming the first tensor that does (its value, dtype
    or shape), or a name only one holds; None when every tensor is bit for bit the same."""
    if now.keys() != expected.keys():
        extra = sorted(now.keys() ^ expected.keys())[0]
        return f"{extra} is in only one of them"
    for name, t in now.items():
        e = expected[name]
        if t.dtype != e.dtype or t.shape != e.shape:
            return f"{name} is {t.dtype} {tuple(t.shape)}, not {e.dtype} {tuple(e.shape)}"
        if not torch.equal(t.cpu(), e.cpu()):
            return f"{name} holds other values"
    return None


def check_unchanged(ref, expected, during="PPO"):
    """After PPO (or DPO: `during`): the tensors the reference scored with are bit for bit
    `expected`, what ref.pt gives through the same build (options/cheap_ref.as_built). RunError
    (exit 1) naming the first that is not: the run's KL was paid to another model than π_ref."""
    change = first_change(ref.state(), expected)
    if change:
        raise RunError(f"the reference changed during {during}: {change} than ref.pt gives (a "
                       "frozen model was written to); nothing of this run is kept", 1)
