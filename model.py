"""A small GPT in plain PyTorch: pre-LN blocks, causal attention, GELU MLP, tied embeddings, KV-cache sampling.

The same class serves as actor, frozen reference, and (through `hidden`) as the trunk of the reward model and
the critic. Left-padded batches are supported: `mask` (B, T) marks real tokens; positions count real tokens only,
so a prompt scores the same alone or padded inside a batch.
Shapes: B batch, T tokens, C channels, V vocabulary, H heads.
Left out: flash/fused kernels, weight decay groups per parameter type, mixed precision.
"""
from dataclasses import dataclass, asdict
import math
import torch
import torch.nn as nn
from torch.nn import functional as F


@dataclass
class GPTConfig:
    block_size: int = 128     # longest prompt + response, in tokens
    vocab_size: int = 1024
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128
    dropout: float = 0.0
    bias: bool = True


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
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))  # (B, H, T, C/H)
        if cache is not None:                                   # append this step's keys/values to the cache
            if cache[layer] is not None:
                k, v = torch.cat([cache[layer][0], k], 2), torch.cat([cache[layer][1], v], 2)
            cache[layer] = (k, v)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, is_causal=allowed is None,
                                           dropout_p=self.dropout if self.training else 0.0)  # (B, H, T, C/H)
        return self.resid_drop(self.c_proj(y.transpose(1, 2).reshape(B, T, C)))


class Block(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(cfg.n_embd, bias=cfg.bias), nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.attn = SelfAttention(cfg)
        self.mlp = nn.Sequential(nn.Linear(cfg.n_embd, 4 * cfg.n_embd, bias=cfg.bias), nn.GELU(),
                                 nn.Linear(4 * cfg.n_embd, cfg.n_embd, bias=cfg.bias), nn.Dropout(cfg.dropout))

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
        self.lm_head.weight = self.wte.weight                  # tied embeddings
        self.apply(self._init)
        for n, p in self.named_parameters():                   # GPT-2: scale residual projections by depth
            if n.endswith("c_proj.weight") or n.endswith("mlp.2.weight"):
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * cfg.n_layer))

    @staticmethod
    def _init(m):
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, 0.0, 0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)

    def hidden(self, idx, mask=None, cache=None):
        """Final-layer features (B, T, C). mask (B, T_past + T) bool marks real tokens (None: all real);
        cache: a list with one slot per layer, filled and extended in place (None: no cache)."""
        B, T = idx.shape
        past = 0 if cache is None or cache[0] is None else cache[0][0].size(2)
        if mask is None and past == 0:
            allowed, pos = None, torch.arange(T, device=idx.device).expand(B, T)       # plain causal
        else:
            if mask is None:
                mask = torch.ones(B, past + T, dtype=torch.bool, device=idx.device)
            pos = (mask.long().cumsum(1) - 1).clamp(min=0)[:, past:]                   # (B, T) real-token count
            qi = torch.arange(past, past + T, device=idx.device)[:, None]              # query positions
            kj = torch.arange(past + T, device=idx.device)[None, :]                    # key positions
            allowed = (kj <= qi) & mask[:, None, :]                                    # (B, T, T_past + T)
            allowed = (allowed | (kj == qi))[:, None]           # a pad still sees itself: no empty softmax rows
        assert past + T <= self.config.block_size, f"sequence of {past + T} tokens exceeds block_size"
        x = self.drop(self.wte(idx) + self.wpe(pos))            # (B, T, C)
        for i, block in enumerate(self.blocks):
            x = block(x, allowed, cache, i)
        return self.ln_f(x)                                     # (B, T, C)

    def forward(self, idx, targets=None, mask=None, cache=None):
        logits = self.lm_head(self.hidden(idx, mask, cache))    # (B, T, V)
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1), ignore_index=-1)
        return logits, loss

    @torch.no_grad()
    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None, eos=None, mask=None):
        """Sample a batch with a KV cache. idx (B, Tp), left-padded with mask (B, Tp) where prompts differ in length.
        Each row stops at `eos`; later positions hold `eos` with log-prob 0. Returns tokens (B, R) and the log-probs
        (B, R) of the sampled tokens under the distribution they were drawn from (temperature, then top-k)."""
        B, Tp = idx.shape
        mask = torch.ones(B, Tp, dtype=torch.bool, device=idx.device) if mask is None else mask
        cache = [None] * self.config.n_layer
        logits = self(idx, mask=mask, cache=cache)[0][:, -1]   # (B, V) prefill the prompt
        done = torch.zeros(B, dtype=torch.bool, device=idx.device)
        toks, logps = [], []
        for _ in range(max_new_tokens):
            logits = logits.float() / temperature
            if top_k is not None and top_k < logits.size(-1):
                kth = torch.topk(logits, top_k).values[:, -1:]
                logits = logits.masked_fill(logits < kth, float("-inf"))
            logp = F.log_softmax(logits, dim=-1)                # (B, V)
            tok = torch.multinomial(logp.exp(), 1)              # (B, 1)
            lp = logp.gather(1, tok)
            if eos is not None:
                tok, lp = tok.masked_fill(done[:, None], eos), lp.masked_fill(done[:, None], 0.0)
                done = done | (tok[:, 0] == eos)
            toks.append(tok); logps.append(lp)
            if done.all() or len(toks) == max_new_tokens:
                break
            mask = torch.cat([mask, torch.ones(B, 1, dtype=torch.bool, device=idx.device)], 1)
            logits = self(tok, mask=mask, cache=cache)[0][:, -1]
        return torch.cat(toks, 1), torch.cat(logps, 1)          # (B, R), (B, R)

    def num_params(self):
        return sum(p.numel() for p in self.parameters())


def save_checkpoint(model, path, **extra):
    torch.save({"config": asdict(model.config), "model": model.state_dict(), **extra}, path)


def load_checkpoint(path, device="cpu"):
    """Returns (GPT, checkpoint dict). Plain tensors and dicts only: safe with weights_only=True."""
    ckpt = torch.load(path, map_location=device, weights_only=True)
    model = GPT(GPTConfig(**ckpt["config"]))
    model.load_state_dict(ckpt["model"])
    return model, ckpt


def pad_left(seqs, pad_id):
    """List of token-id lists -> idx (B, T) left-padded with pad_id, mask (B, T) True at real tokens."""
    T = max(len(s) for s in seqs)
    idx = torch.tensor([[pad_id] * (T - len(s)) + list(s) for s in seqs], dtype=torch.long)
    mask = torch.tensor([[False] * (T - len(s)) + [True] * len(s) for s in seqs])
    return idx, mask


def response_logits(model, query, query_mask, response, temperature):
    """Temperature-scaled logits (B, R, V) that predict each response token, from one forward over
    query (B, Tp, left-padded, query_mask) + response (B, R). Tokens after end-of-text are attended by nothing
    earlier, so they never change these logits."""
    seq = torch.cat([query, response], 1)                                             # (B, Tp + R)
    mask = torch.cat([query_mask, torch.ones_like(response, dtype=torch.bool)], 1)
    logits, _ = model(seq, mask=mask)
    return logits[:, query.size(1) - 1:-1].float() / temperature                     # (B, R, V)


def token_logprobs(logits, tokens):
    """log softmax(logits) at the given tokens: logits (B, R, V), tokens (B, R) -> (B, R)."""
    return F.log_softmax(logits, -1).gather(2, tokens[..., None]).squeeze(-1)
