"""A small GPT in plain PyTorch: pre-LN blocks, causal attention, GELU MLP, tied embeddings, KV-cache sampling.

The same class serves as actor, frozen reference, and (through `hidden`) as the trunk of the reward model and
the critic. Left-padded batches are supported: `mask` (B, T) marks real tokens; positions count real tokens only,
so a prompt scores the same alone or padded inside a batch.
Shapes: B batch, T tokens, C channels, V vocabulary, H heads.
Also here: the sequence conventions every stage shares (`encode_prompts`, `response_mask`, `masked_mean`,
`join_tokens`), checkpoints (written atomically, loaded with weights_only=True onto the chosen device), and the
optimizers: fused AdamW, and what pretraining's --optimizer=muon adds (`hidden_matrices`, Muon's share;
`Optimizers`, two as one).
Mixed precision (--dtype=bf16) is torch.autocast around each stage (`autocast`) with its weight cache off, and
`cast_once` windows, inside which each trainable weight is cast to bf16 once: one `generate`, one PPO minibatch's
forwards. Weights, gradients and AdamW's states stay fp32; log-probs, KL and losses are taken in fp32.
Left out: custom kernels, weight decay groups per parameter type, fp16 with loss scaling.
"""
from dataclasses import dataclass, asdict
import contextlib, math
import torch
import torch.nn as nn
from torch.nn import functional as F

from config import arg
from errors import RunError
import dist, store


@dataclass
class GPTConfig:
    block_size: int = arg(128, ">0", "longest prompt + response, in tokens")
    vocab_size: int = 1024    # set from the tokenizer
    n_layer: int = arg(4, ">0")
    n_head: int = arg(4, ">0")
    n_embd: int = arg(128, ">0")
    dropout: float = arg(0.0, "[0,1)", "pretraining and reward-model training; RL runs with dropout off")
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
        if past == 0 and (mask is None or bool(mask.all())):                           # no padding:
            allowed, pos = None, torch.arange(T, device=idx.device).expand(B, T)       # plain causal, fast kernel
        else:
            if mask is None:
                mask = torch.ones(B, past + T, dtype=torch.bool, device=idx.device)
            pos = (mask.long().cumsum(1) - 1).clamp(min=0)[:, past:]                   # (B, T) real-token count
            qi = torch.arange(past, past + T, device=idx.device)[:, None]              # query positions
            kj = torch.arange(past + T, device=idx.device)[None, :]                    # key positions
            allowed = (kj <= qi) & mask[:, None, :]                                    # (B, T, T_past + T)
            allowed = (allowed | (kj == qi))[:, None]           # a pad still sees itself: no empty softmax rows
        assert past + T <= self.config.block_size, f"{past + T} tokens exceed block_size {self.config.block_size}"
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
        (B, R) of the sampled tokens under the distribution they were drawn from (temperature, then top-k).
        Rows that have ended leave the batch (and the cache), so a long straggler does not cost the whole batch."""
        with cast_once(self):                      # bf16: the weights cast once, not once per token
            B, Tp = idx.shape
            mask = torch.ones(B, Tp, dtype=torch.bool, device=idx.device) if mask is None else mask
            cache = [None] * self.config.n_layer
            logits = self.lm_head(self.hidden(idx, mask, cache)[:, -1])     # (B, V) prefill the prompt
            toks = torch.full((B, max_new_tokens), 0 if eos is None else eos, dtype=torch.long, device=idx.device)
            logps = torch.zeros(B, max_new_tokens, device=idx.device)
            rows = torch.arange(B, device=idx.device)                       # (b,) where each live row belongs
            for t in range(max_new_tokens):
                if not torch.isfinite(logits).all():              # sampling from NaN would fail obscurely
                    raise RunError("the model's logits are not finite while sampling: training diverged", 1)
                logits = logits.float() / temperature
                if top_k is not None and top_k < logits.size(-1):
                    kth = torch.topk(logits, top_k).values[:, -1:]
                    logits = logits.masked_fill(logits < kth, float("-inf"))
                logp = F.log_softmax(logits, dim=-1)                # (b, V)
                tok = torch.multinomial(logp.exp(), 1)              # (b, 1)
                toks[rows, t], logps[rows, t] = tok[:, 0], logp.gather(1, tok)[:, 0]
                if t + 1 == max_new_tokens:
                    break
                if eos is not None:
                    live = tok[:, 0] != eos                          # (b,)
                    if not live.all():
                        if not live.any():
                            break
                        rows, tok, mask = rows[live], tok[live], mask[live]
                        cache[:] = [(k[live], v[live]) for k, v in cache]
                mask = torch.cat([mask, torch.ones_like(tok, dtype=torch.bool)], 1)
                logits = self.lm_head(self.hidden(tok, mask, cache)[:, -1])   # (b, V)
            return toks[:, :t + 1], logps[:, :t + 1]                 # (B, R), (B, R)

    def num_params(self):
        return sum(p.numel() for p in self.parameters())


def adamw(params, lr, **kw):
    """AdamW with the fused kernel (one op per step for all parameters, on CPU and CUDA alike)."""
    return torch.optim.AdamW(params, lr=lr, fused=True, **kw)


def hidden_matrices(model):
    """The parameters Muon trains: the blocks' 2-D weight matrices (attention qkv and projection, the MLP's two).
    Muon's authors (Keller Jordan's write-up and repository) prescribe it for hidden layers' matrices only: the
    token and position embeddings, the output layer (tied to the token embedding here: one matrix) and every vector
    (LayerNorm gains, biases) go to AdamW, which they found works better for the input and output layers."""
    return [p for block in model.blocks for p in block.parameters() if p.ndim == 2]


class Optimizers:
    """Several optimizers used as one (StepGuard takes one): zero_grad, step, param_groups, state_dict (a list,
    one per optimizer) and load_state_dict, over each in turn. Pretraining's --optimizer=muon: (Muon, AdamW)."""

    def __init__(self, *opts):
        self.opts = opts

    @property
    def param_groups(self):
        return [g for o in self.opts for g in o.param_groups]

    def zero_grad(self, set_to_none=True):
        for o in self.opts:
            o.zero_grad(set_to_none=set_to_none)

    def step(self):
        for o in self.opts:
            o.step()

    def state_dict(self):
        return [o.state_dict() for o in self.opts]

    def load_state_dict(self, states):
        for o, s in zip(self.opts, states, strict=True):
            o.load_state_dict(s)


MAX_BAD_STEPS = 5      # non-finite steps in a row that stop a run


class StepGuard:
    """One optimizer step per call, skipped (and counted) when the loss or the gradient is not finite, so no NaN
    reaches the weights; MAX_BAD_STEPS skips in a row stop the run with a one-line error. `opt` is one optimizer or
    an Optimizers; under torchrun every gradient is averaged over ranks before it, so each rank's step (Muon's
    orthogonalisation included) starts from the same gradient and the same state, and gives the same weights."""

    def __init__(self, what):
        self.what, self.skipped, self.in_a_row = what, 0, 0

    def step(self, loss, opt, params, max_norm):
        opt.zero_grad(set_to_none=True)
        ok = dist.all_ranks(bool(torch.isfinite(loss)))     # torchrun: all ranks step or skip together, else the
        if ok:                                              # gradient all-reduce below would wait forever
            loss.backward()
            dist.average_gradients(params)                  # torchrun: the mean over ranks (no-op in 1 process)
            ok = bool(torch.isfinite(torch.nn.utils.clip_grad_norm_(params, max_norm)))   # same on every rank
        if ok:
            opt.step()
            self.in_a_row = 0
            return True
        opt.zero_grad(set_to_none=True)
        self.skipped, self.in_a_row = self.skipped + 1, self.in_a_row + 1
        if self.in_a_row >= MAX_BAD_STEPS:
            raise RunError(f"{self.what} diverged: {self.in_a_row} steps in a row with a non-finite loss or "
                           "gradient (lower the learning rate)", 1)
        return False


def autocast(device, dtype):
    """The precision of every forward in a stage: bf16 autocast, or fp32 (a no-op). One setting for the rollout, the
    old log-probs, the reference and the update, so the first ratio is 1 and the first KL 0. Weights, gradients and
    optimizer states stay fp32, and log-probs are taken in fp32 (response_logits), so no loss scaling is needed."""
    # cache_enabled=False: autocast caches the bf16 copy of each weight until the context exits; a context held
    # around a whole stage would then train fp32 weights while every forward kept reading their first bf16 copy.
    # `cast_once` turns the cache on where no weight can change.
    assert dtype in ("fp32", "bf16"), f"dtype {dtype!r}: --dtype=auto is resolved by config.check"
    return torch.autocast(device.split(":")[0], torch.bfloat16, enabled=dtype == "bf16", cache_enabled=False)


def bf16_autocast(device_type):
    """True inside bf16 autocast on this kind of device (--dtype=bf16's `autocast`)."""
    return torch.is_autocast_enabled(device_type) and torch.get_autocast_dtype(device_type) == torch.bfloat16


@contextlib.contextmanager
def cast_once(*models):
    """Within, under bf16 autocast, each trainable weight is cast to bf16 once and that copy serves every forward
    (autocast's weight cache: it holds fp32 leaves that require grad, so frozen weights are still cast per forward:
    ref.py gives the reference its own bf16 copy). The copies are dropped on exit, so the first forward after an
    optimizer step casts the new weights. No weight of `models` may change inside: checked on exit. fp32: a no-op.
    A window pays where a weight is read more than once: generate reads it once per token."""
    if not any(torch.is_autocast_enabled(d) for d in ("cpu", "cuda")):
        yield
        return
    params = [p for m in models if m is not None for p in m.parameters() if p.requires_grad]
    before = [p._version for p in params]                  # bumped by every in-place change (optimizer, copy_)
    was = torch.is_autocast_cache_enabled()
    torch.set_autocast_cache_enabled(True)
    try:
        yield
    finally:
        torch.set_autocast_cache_enabled(was)
        torch.clear_autocast_cache()                       # torch.autocast clears it only when the outermost exits
    if [p._version for p in params] != before:
        raise RuntimeError("a weight changed inside cast_once: the forwards after the change read its old bf16 copy")


def rng_states():
    """Torch's CPU and CUDA generator states, for a resumable checkpoint."""
    return dict(torch=torch.get_rng_state(), cuda=torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [])


def set_rng_states(s):
    torch.set_rng_state(s["torch"])
    if s["cuda"]:
        torch.cuda.set_rng_state_all(s["cuda"])


def save_checkpoint(model, path, **extra):
    store.save_torch({"config": asdict(model.config), "model": model.state_dict(), **extra}, path)


def load_checkpoint(path, device="cpu"):
    """Returns (GPT on device, checkpoint dict). Plain tensors and dicts only: safe with weights_only=True."""
    ckpt = store.load_torch(path)                                   # on the CPU, then moved once
    model = GPT(GPTConfig(**ckpt["config"]))
    model.load_state_dict(ckpt["model"])
    return model.to(device), ckpt


def pad_left(seqs, pad_id):
    """List of token-id lists -> idx (B, T) left-padded with pad_id, mask (B, T) True at real tokens."""
    T = max(len(s) for s in seqs)
    idx = torch.tensor([[pad_id] * (T - len(s)) + list(s) for s in seqs], dtype=torch.long)
    mask = torch.tensor([[False] * (T - len(s)) + [True] * len(s) for s in seqs])
    return idx, mask


def encode_prompts(enc, prompts):
    """Prompts -> left-padded ids (B, Tp) and mask (B, Tp). Each starts with end-of-text, as every document after
    the first does in the pretraining stream."""
    return pad_left([[enc.eot_token] + enc.encode_ordinary(p) for p in prompts], enc.eot_token)


def response_mask(response, eos):
    """(B, R) True up to and including the first end-of-text; all True for a truncated row."""
    is_eos = (response == eos).long()
    return torch.cumsum(is_eos, 1) - is_eos == 0                  # no end-of-text strictly before t


def masked_mean(x, mask):
    """Mean over real tokens; positions outside the mask contribute nothing, even NaN or inf."""
    return torch.where(mask, x, 0.0).sum() / mask.sum().clamp(min=1)


def join_tokens(query, query_mask, response, mask):
    """Per row: the prompt's real tokens followed by the response's real tokens (a list of id lists)."""
    return [q[qm].tolist() + r[m].tolist() for q, qm, r, m in zip(query, query_mask, response, mask)]


def response_hidden(trunk, query, query_mask, response):
    """Final-layer features (B, R, C) at the positions that predict each response token: one forward over
    query (B, Tp, left-padded) + response (B, R) without its last token, which predicts nothing here.
    Tokens after end-of-text are attended by nothing earlier, so they never change these features."""
    seq = torch.cat([query, response[:, :-1]], 1)                                     # (B, Tp + R - 1)
    mask = torch.cat([query_mask, torch.ones_like(response[:, :-1], dtype=torch.bool)], 1)
    return trunk.hidden(seq, mask)[:, query.size(1) - 1:]                             # (B, R, C)


def response_logits(model, query, query_mask, response, temperature):
    """Temperature-scaled logits (B, R, V) that predict each response token."""
    return model.lm_head(response_hidden(model, query, query_mask, response)).float() / temperature   # (B, R, V)


def token_logprobs(logits, tokens):
    """log softmax(logits) at the given tokens: logits (B, R, V), tokens (B, R) -> (B, R)."""
    return F.log_softmax(logits, -1).gather(2, tokens[..., None]).squeeze(-1)


def entropy_from_logits(logits):
    """Entropy of softmax(logits) at each position: logits (B, R, V) -> (B, R), in fp32."""
    logp = F.log_softmax(logits.float(), -1)                                  # (B, R, V)
    return -(logp.exp() * logp).sum(-1)                                       # (B, R)
