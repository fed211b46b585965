"""A small GPT in plain PyTorch: pre-LN blocks, causal attention, GELU MLP, tied embeddings,
KV-cache sampling, and the forwards that score a response.

    python -m pytest -q tests/test_model.py   # padding, KV cache, sampling against slow loops

The same class serves as actor, frozen reference, and (through `hidden`) as the trunk of the reward
model and the critic. Left-padded batches are supported: `mask` (B, T) marks real tokens; positions
count real tokens only, so a prompt scores the same alone or padded inside a batch.
The response forwards (`response_hidden`, `response_logits`, `token_logprobs`,
`entropy_from_logits`) are what PPO, the reference and the reward model call on (prompt, response).
Shapes: B batch, T tokens, C channels, V vocabulary, H heads, R response tokens.
This file imports only torch. Elsewhere: optimizers (machinery/optim.py), bf16
(machinery/precision.py), padding and masks (sequences.py), checkpoints (machinery/state.py).
Left out: custom kernels, flash-attention flags, weight decay groups per parameter type.
"""
from dataclasses import dataclass, field
import math
import torch
import torch.nn as nn
from torch.nn import functional as F


def arg(default, rule=None, help=""):
    """A config field with its rule (a key of config.RULES) and one line of help, as config.arg
    makes them: this file imports only torch, so it writes the metadata itself."""
    return field(default=default, metadata=dict(rule=rule, help=help, choices=None))


@dataclass
class GPTConfig:
    block_size: int = arg(128, ">0", "longest prompt + response, in tokens")
    # Set from the tokenizer, not a flag.
    vocab_size: int = 1024
    n_layer: int = arg(4, ">0")
    n_head: int = arg(4, ">0")
    n_embd: int = arg(128, ">0")
    dropout: float = arg(0.0, "[0,1)", "pretraining and reward-model training; RL runs without")
    bias: bool = arg(True, help="biases in Linear and LayerNorm")


class SelfAttention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.n_head = cfg.n_head
        self.c_attn = nn.Linear(cfg.n_embd, 3 * cfg.n_embd, bias=cfg.bias)
        self.c_proj = nn.Linear(cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.dropout = cfg.dropout
        self.resid_drop = nn.Dropout(cfg.dropout)

    def forward(self, x, allowed, cache, layer):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        # Sampling: this step's keys and values join the cache, and attention sees them all.
        if cache is not None:
            if cache[layer] is not None:
                k = torch.cat([cache[layer][0], k], 2)
                v = torch.cat([cache[layer][1], v], 2)
            cache[layer] = (k, v)
        dropout = self.dropout if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, is_causal=allowed is None,
                                           dropout_p=dropout)  # (B, H, T, C/H)
        return self.resid_drop(self.c_proj(y.transpose(1, 2).reshape(B, T, C)))


class Block(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.ln_2 = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.attn = SelfAttention(cfg)
        self.mlp = nn.Sequential(nn.Linear(cfg.n_embd, 4 * cfg.n_embd, bias=cfg.bias), nn.GELU(),
                                 nn.Linear(4 * cfg.n_embd, cfg.n_embd, bias=cfg.bias),
                                 nn.Dropout(cfg.dropout))

    def forward(self, x, allowed, cache, layer):
        x = x + self.attn(self.ln_1(x), allowed, cache, layer)
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.config = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.wpe = nn.Embedding(cfg.block_size, cfg.n_embd)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        # Tied embeddings: the output layer is the token embedding.
        self.lm_head.weight = self.wte.weight
        self.apply(self._init)
        # GPT-2's init: the residual projections scaled down by depth.
        for n, p in self.named_parameters():
            if n.endswith("c_proj.weight") or n.endswith("mlp.2.weight"):
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * cfg.n_layer))

    @staticmethod
    def _init(m):
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, 0.0, 0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)

    def hidden(self, idx, mask=None, cache=None):
        """Final-layer features (B, T, C). mask (B, T_past + T) bool marks real tokens (None: all
        real); cache: a list with one slot per layer, filled and extended in place (None: none)."""
        B, T = idx.shape
        past = 0 if cache is None or cache[0] is None else cache[0][0].size(2)
        if past == 0 and (mask is None or bool(mask.all())):
            # No padding: plain causal attention, the fast kernel.
            allowed = None
            pos = torch.arange(T, device=idx.device).expand(B, T)
        else:
            if mask is None:
                mask = torch.ones(B, past + T, dtype=torch.bool, device=idx.device)
            # A position counts the real tokens before it.
            pos = (mask.long().cumsum(1) - 1).clamp(min=0)[:, past:]  # (B, T)
            qi = torch.arange(past, past + T, device=idx.device)[:, None]
            kj = torch.arange(past + T, device=idx.device)[None, :]
            allowed = (kj <= qi) & mask[:, None, :]  # (B, T, T_past + T)
            # A pad still sees itself, so no softmax row is empty.
            allowed = (allowed | (kj == qi))[:, None]
        limit = self.config.block_size
        assert past + T <= limit, f"{past + T} tokens exceed block_size {limit}"
        x = self.drop(self.wte(idx) + self.wpe(pos))  # (B, T, C)
        for i, block in enumerate(self.blocks):
            x = block(x, allowed, cache, i)
        return self.ln_f(x)  # (B, T, C)

    def forward(self, idx, targets=None, mask=None, cache=None):
        logits = self.lm_head(self.hidden(idx, mask, cache))  # (B, T, V)
        loss = None
        if targets is not None:
            flat = logits.view(-1, logits.size(-1))
            loss = F.cross_entropy(flat, targets.reshape(-1), ignore_index=-1)
        return logits, loss

    @torch.no_grad()
    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None, eos=None, mask=None):
        """Sample a batch with a KV cache. idx (B, Tp), left-padded with mask (B, Tp) where prompts
        differ in length. Each row stops at `eos`; later positions hold `eos` with log-prob 0.
        Returns tokens (B, R) and the log-probs (B, R) of the sampled tokens under the distribution
        they were drawn from (temperature, then top-k). Rows that have ended leave the batch (and
        the cache), so a long straggler does not cost the whole batch. Under bf16, callers wrap it
        in precision.cast_once, so each weight is cast once, not once per token. Logits that are
        not finite raise FloatingPointError: sampling from NaN would fail obscurely."""
        B, Tp = idx.shape
        if mask is None:
            mask = torch.ones(B, Tp, dtype=torch.bool, device=idx.device)
        cache = [None] * self.config.n_layer
        # The prompt fills the cache in one forward.
        logits = self.lm_head(self.hidden(idx, mask, cache)[:, -1])  # (B, V)
        fill = 0 if eos is None else eos
        toks = torch.full((B, max_new_tokens), fill, dtype=torch.long, device=idx.device)
        logps = torch.zeros(B, max_new_tokens, device=idx.device)
        # Where each live row belongs in the batch.
        rows = torch.arange(B, device=idx.device)  # (b,)
        for t in range(max_new_tokens):
            if not torch.isfinite(logits).all():
                raise FloatingPointError("the model's logits are not finite while sampling: "
                                         "training diverged")
            logits = logits.float() / temperature
            if top_k is not None and top_k < logits.size(-1):
                kth = torch.topk(logits, top_k).values[:, -1:]
                logits = logits.masked_fill(logits < kth, float("-inf"))
            logp = F.log_softmax(logits, dim=-1)  # (b, V)
            tok = torch.multinomial(logp.exp(), 1)  # (b, 1)
            toks[rows, t] = tok[:, 0]
            logps[rows, t] = logp.gather(1, tok)[:, 0]
            if t + 1 == max_new_tokens:
                break
            if eos is not None:
                live = tok[:, 0] != eos  # (b,)
                if not live.all():
                    if not live.any():
                        break
                    rows, tok, mask = rows[live], tok[live], mask[live]
                    cache[:] = [(k[live], v[live]) for k, v in cache]
            mask = torch.cat([mask, torch.ones_like(tok, dtype=torch.bool)], 1)
            logits = self.lm_head(self.hidden(tok, mask, cache)[:, -1])  # (b, V)
        return toks[:, :t + 1], logps[:, :t + 1]  # (B, R), (B, R)

    def num_params(self):
        return sum(p.numel() for p in self.parameters())


# ---- the response forwards: (prompt, response) -> what each response token's position says ----
def response_hidden(trunk, query, query_mask, response):
    """Final-layer features (B, R, C) at the positions that predict each response token: one
    forward over query (B, Tp, left-padded) + response (B, R) without its last token, which
    predicts nothing here. Tokens after end-of-text are attended by nothing earlier, so they never
    change these features."""
    seq = torch.cat([query, response[:, :-1]], 1)  # (B, Tp + R - 1)
    real = torch.ones_like(response[:, :-1], dtype=torch.bool)
    mask = torch.cat([query_mask, real], 1)
    return trunk.hidden(seq, mask)[:, query.size(1) - 1:]  # (B, R, C)


def response_logits(model, query, query_mask, response, temperature):
    """Temperature-scaled fp32 logits (B, R, V) that predict each response token."""
    hidden = response_hidden(model, query, query_mask, response)  # (B, R, C)
    return model.lm_head(hidden).float() / temperature  # (B, R, V)


def token_logprobs(logits, tokens):
    """log softmax(logits) at the given tokens: logits (B, R, V), tokens (B, R) -> (B, R)."""
    return F.log_softmax(logits, -1).gather(2, tokens[..., None]).squeeze(-1)


def entropy_from_logits(logits):
    """Entropy of softmax(logits) at each position: logits (B, R, V) -> (B, R), in fp32."""
    logp = F.log_softmax(logits.float(), -1)  # (B, R, V)
    return -(logp.exp() * logp).sum(-1)  # (B, R)
