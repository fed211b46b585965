"""The reference π_ref, full or cheap, and the KL rollback that guards the distance to it.

It answers one question during RLHF: how likely was each response token (or each vocabulary entry) before any
RL? kl.py turns the answer into the per-token penalty. It has no optimizer, no gradients and no dropout, and it
uses the same temperature as sampling. `--ref=` chooses how it is held (`make_reference`):
    full      a frozen deep copy in fp32 (the default)
    bf16/fp16 the copy's weights, and its arithmetic, in half precision; logits cast to fp32 before any softmax
    int8/nf4  the copy's block Linear weights quantized blockwise (absmax per `quant_block` weights), dequantized on
              the fly in the forward; embeddings (tied with the output layer), LayerNorms and biases stay fp32
    lora      the actor is the frozen pretrained model plus LoRA adapters on every block Linear (attention and MLP);
              the reference is the same module with the adapters switched off: no second copy of the weights
    shared_n  actor and reference share the embeddings and the bottom n blocks (frozen, stored once, TRL's
              num_shared_layers); the top blocks and the final LayerNorm are trained and kept twice
full, lora and shared_n start at exactly KL 0; half and quantized references do not (evaluate.step0_kl
measures it). Under --dtype=bf16 a reference scores through `bf16_model`: its matmul weights cast to bf16 once, not
at every forward (bit for bit what autocast computes; lora's frozen bases are still cast at every forward).
A moving anchor (ppo.py, --ref_update=sync or reset) is a second, full Reference that `mix` moves towards the actor;
the frozen π_ref stays bit for bit the pretrained model. `memory_bytes` says what each choice holds. `Rollback`
(--kl_max): restore the last state under the limit (the moving anchor with it), with β raised (again at each
restore); a run whose first rollout is above, or that restores one state rollback_max_in_row times in a row, stops.
    python bench.py --refs --out_dir=out   # bytes and step-0 KL to the full ref of every option (main run's models)
Left out: quantized activations, double quantization of the scales, merging adapters during training.
"""
import contextlib, copy, math, re
from dataclasses import asdict, dataclass
import torch
import torch.nn as nn
from torch.nn import functional as F

from config import arg, RunError
from model import GPT, GPTConfig, bf16_autocast, response_logits, token_logprobs

KINDS = ["full", "bf16", "fp16", "int8", "nf4", "lora", "shared_<n>"]


@dataclass
class RefConfig:
    ref: str = arg("full", help="how the reference is held: full, bf16, fp16, int8, nf4, lora, shared_<n> "
                   "(n bottom blocks shared with the actor)")
    quant_block: int = arg(64, ">0", "int8/nf4: weights per absmax scale")
    lora_rank: int = arg(8, ">0", "lora: rank of each adapter")
    lora_alpha: float = arg(16.0, ">0", "lora: adapters scaled by lora_alpha / lora_rank")
    kl_max: float = arg(0.0, ">=0", "rollback when a rollout's exact KL to the reference exceeds this "
                        "(nats/sequence; 0 = off; a first rollout above it stops the run, exit 2)")
    rollback_beta_factor: float = arg(2.0, ">0", "β is multiplied by this at each rollback")
    rollback_max_in_row: int = arg(5, ">0", "stop the run after this many rollbacks in a row to one state (more β "
                                   "cannot hold an update whose own step leaves kl_max)")


def check(cfg):
    """Why cfg.ref's values cannot work, in one line; None when they can (train.parse calls it)."""
    r, n_layer = cfg.ref, cfg.gpt.n_layer
    m = re.fullmatch(r"shared_(\d+)", r.ref)
    if r.ref not in KINDS and not m:
        return f"bad value for --ref: {r.ref!r} (choose {', '.join(KINDS)})"
    if m and int(m.group(1)) >= n_layer:
        return f"--ref={r.ref} shares {m.group(1)} blocks but the model has --n_layer={n_layer}: share fewer"
    if r.ref != "full" and cfg.kl.ref_update != "frozen":
        return f"--ref_update={cfg.kl.ref_update} moves a full copy of the actor: it needs --ref=full, not --ref={r.ref}"
    if r.rollback_beta_factor < 1:
        return f"bad value for --rollback_beta_factor: {r.rollback_beta_factor} (must be >= 1: β never falls)"
    return None


class Reference:
    """Scores responses without gradients: a frozen deep copy of `actor`. copy=False: `actor` is used as it is
    (already the reference's own, or, with share=True for lora, the actor module itself, scored with its adapters
    switched off). exact: it starts at KL 0 from the pretrained model (so PPO checks its first rollout)."""

    def __init__(self, actor, share=False, exact=True, copy=True):
        self.model = _frozen_copy(actor) if copy else actor
        self.share, self.exact = share, exact
        self.cast = None                        # --dtype=bf16: (what it was cast from, the bf16 copy): `bf16_model`

    @torch.no_grad()
    def logits(self, query, query_mask, response, temperature):
        """(B, R, V) temperature-scaled fp32 logits at the response positions. A half-precision copy (bf16, fp16)
        computes in its own precision also under --dtype=bf16: autocast would feed fp16 LayerNorms bf16 inputs."""
        half = self.model.lm_head.weight.dtype != torch.float32
        model = self.bf16_model() if not half and not self.share and bf16_autocast(query.device.type) else self.model
        with torch.autocast(query.device.type, enabled=False) if half else contextlib.nullcontext(), \
                adapters_off(self.model) if self.share else contextlib.nullcontext():
            return response_logits(model, query, query_mask, response, temperature)

    def bf16_model(self):
        """The model with every nn.Linear's weight and bias cast to bf16 once (a copy; remade when one of them has
        changed since: mix, load_state_dict), the rest shared. autocast casts a frozen weight again at every forward
        (its cache holds only weights that require grad), the same fp32 values to the same bf16 ones, so under bf16
        autocast this copy gives autocast's own numbers bit for bit; embeddings and LayerNorms, which autocast leaves
        in fp32, are the same tensors (the output layer is untied from the embedding in the copy alone)."""
        lins = [m for m in self.model.modules() if isinstance(m, nn.Linear)]
        key = [(t.data_ptr(), t._version) for m in lins for t in (m.weight, m.bias) if t is not None]
        if self.cast is None or self.cast[0] != key:
            shared = [*self.model.parameters(), *self.model.buffers()]
            model = copy.deepcopy(self.model, {id(t): t for t in shared})       # new modules, the same tensors
            for m in model.modules():
                if isinstance(m, nn.Linear):
                    for name in ("weight", "bias"):
                        if getattr(m, name) is not None:
                            setattr(m, name, nn.Parameter(getattr(m, name).to(torch.bfloat16), requires_grad=False))
            self.cast = (key, model)
        return self.cast[1]

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

def _frozen_copy(model, memo=None):
    return copy.deepcopy(model, memo).eval().requires_grad_(False)     # never seen by an optimizer


# ---- int8 and nf4: blockwise absmax, weight-only ----
def nf4_levels():
    """NF4's 16 levels (Dettmers et al. 2023, QLoRA): quantiles of N(0, 1), scaled to [-1, 1], with an exact 0.
    8 positive levels at probabilities linspace(p, ½, 9)[:-1] and 7 negative at linspace(p, ½, 8)[:-1] (mirrored),
    plus 0; p = 1 - ½(1/30 + 1/32) keeps the outermost quantile finite (p = 0.96770833, bitsandbytes' offset).
    Each level then holds about as many weights of a normal block as any other."""
    p = 1 - 0.5 * (1 / 30 + 1 / 32)
    pos = torch.special.ndtri(torch.linspace(p, 0.5, 9, dtype=torch.float64)[:-1])          # (8,)
    neg = -torch.special.ndtri(torch.linspace(p, 0.5, 8, dtype=torch.float64)[:-1])         # (7,)
    v = torch.cat([pos, torch.zeros(1, dtype=torch.float64), neg]).sort().values            # (16,)
    return (v / v.abs().max()).float()


def quantize(w, kind, block):
    """w (any shape) -> (codes, absmax (n_blocks,)) over blocks of `block` consecutive weights (row-major, the last
    block zero-padded). int8: round(127·w/absmax) in int8; nf4: the nearest level's index, two per uint8."""
    flat = w.detach().float().reshape(-1)
    flat = F.pad(flat, (0, -len(flat) % block)).view(-1, block)                             # (n_blocks, block)
    absmax = flat.abs().amax(1)                                                             # (n_blocks,)
    x = flat / absmax.clamp(min=1e-12)[:, None]                                             # in [-1, 1]
    if kind == "int8":
        return torch.round(x * 127).to(torch.int8), absmax
    idx = (x[..., None] - nf4_levels().to(x.device)).abs().argmin(-1).to(torch.uint8)       # (n_blocks, block)
    idx = F.pad(idx.view(-1), (0, idx.numel() % 2)).view(-1, 2)
    return idx[:, 0] | (idx[:, 1] << 4), absmax                                             # two codes per byte


def dequantize(codes, absmax, kind, block, shape, levels=None):
    """The inverse of `quantize`: fp32 weights of `shape`."""
    if kind == "int8":
        x = codes.float() / 127                                                             # (n_blocks, block)
    else:
        idx = torch.stack([codes & 15, codes >> 4], 1).view(-1)[:absmax.numel() * block].long()   # unpacked
        x = (nf4_levels() if levels is None else levels)[idx].view(-1, block)               # (n_blocks, block)
    return (x * absmax[:, None]).view(-1)[:math.prod(shape)].view(shape)


class QuantLinear(nn.Module):
    """A frozen nn.Linear whose weight is held as int8 or nf4 codes plus one fp32 absmax per block."""

    def __init__(self, lin, kind, block):
        super().__init__()
        self.kind, self.block, self.shape = kind, block, tuple(lin.weight.shape)
        codes, absmax = quantize(lin.weight, kind, block)
        self.register_buffer("codes", codes)
        self.register_buffer("absmax", absmax)
        self.register_buffer("levels", nf4_levels() if kind == "nf4" else None)
        self.register_buffer("bias", None if lin.bias is None else lin.bias.detach().clone())

    def forward(self, x):
        w = dequantize(self.codes, self.absmax, self.kind, self.block, self.shape, self.levels).to(x.dtype)  # (out, in)
        return F.linear(x, w, self.bias)


def replace_linears(model, make, kind=nn.Linear):
    """Every `kind` (nn.Linear) inside the blocks (attention and MLP) -> make(it); the output layer is left alone."""
    for block in model.blocks:
        for parent in [block.attn, block.mlp]:
            for name, child in parent.named_children():
                if isinstance(child, kind):
                    setattr(parent, name, make(child))
    return model


# ---- lora ----
class LoRALinear(nn.Module):
    """base(x) + (α/r)·x Aᵀ Bᵀ. The base is frozen; B starts at 0, so the actor starts as the base exactly."""

    def __init__(self, base, rank, alpha):
        super().__init__()
        self.base, self.scale, self.enabled = base.requires_grad_(False), alpha / rank, True
        self.lora_A = nn.Parameter(torch.randn(rank, base.in_features) / math.sqrt(base.in_features))  # (r, in)
        self.lora_B = nn.Parameter(torch.zeros(base.out_features, rank))                               # (out, r)

    def forward(self, x):
        y = self.base(x)
        return y + self.scale * F.linear(F.linear(x, self.lora_A), self.lora_B) if self.enabled else y

    def merged(self):
        """A plain nn.Linear with W + (α/r)·B A: what actor.pt holds."""
        lin = copy.deepcopy(self.base)
        with torch.no_grad():
            lin.weight += self.scale * self.lora_B @ self.lora_A
        return lin.requires_grad_(True)


@contextlib.contextmanager
def adapters_off(model):
    """Within: every LoRALinear computes its base alone (the reference). Restored on exit, even on error."""
    mods = [m for m in model.modules() if isinstance(m, LoRALinear)]
    for m in mods:
        m.enabled = False
    try:
        yield
    finally:
        for m in mods:
            m.enabled = True


def plain_actor(actor):
    """The actor as a plain GPT (adapters merged) for actor.pt; the actor itself when it has no adapters."""
    if not any(isinstance(m, LoRALinear) for m in actor.modules()):
        return actor
    return replace_linears(copy.deepcopy(actor), LoRALinear.merged, LoRALinear)


# ---- choosing the reference ----
def make_reference(actor, ref_model, cfg):
    """(actor, reference) for cfg.ref (a RefConfig). actor: the pretrained model PPO will train; ref_model: the
    frozen model from ref.pt. full, bf16, fp16, int8, nf4: the actor as given, a converted copy of ref_model.
    lora, shared_n: the actor is built on ref_model itself, so the reference's weights are held once."""
    kind = cfg.ref
    if kind == "full":
        return actor, Reference(ref_model)
    if kind in ("bf16", "fp16"):
        dtype = torch.bfloat16 if kind == "bf16" else torch.float16
        return actor, Reference(ref_model.to(dtype), exact=False)      # response_logits casts logits to fp32
    if kind in ("int8", "nf4"):
        model = replace_linears(_frozen_copy(ref_model), lambda lin: QuantLinear(lin, kind, cfg.quant_block))
        return actor, Reference(model, exact=False, copy=False)
    if kind == "lora":
        ref_model.requires_grad_(False)
        replace_linears(ref_model, lambda lin: LoRALinear(lin, cfg.lora_rank, cfg.lora_alpha))
        return ref_model, Reference(ref_model, share=True, copy=False)
    n = int(kind.split("_")[1])                                         # shared_n
    ref_model.requires_grad_(True)                                      # the actor: trained but for what is shared
    shared = [ref_model.wte, ref_model.wpe, ref_model.lm_head, *ref_model.blocks[:n]]
    memo = {id(x): x for m in shared for x in [m, *m.parameters()]}    # deepcopy leaves these as they are
    ref = Reference(_frozen_copy(ref_model, memo), copy=False)
    for m in shared:
        m.requires_grad_(False)                                         # stored once, trained by no one
    return ref_model, ref


def frozen_state(ref):
    """Every tensor the reference scores with, by name (adapters excluded: they are the actor's)."""
    return {k: v for k, v in ref.model.state_dict().items() if "lora_" not in k}


def unchanged(ref, ref_model, cfg):
    """True when the reference's tensors are bit-identical to those ref.pt's model gives through the same build."""
    with torch.random.fork_rng(devices=[]):                            # lora's A draws numbers: not from the run's
        fresh = frozen_state(make_reference(copy.deepcopy(ref_model), copy.deepcopy(ref_model), cfg)[1])
    now = frozen_state(ref)
    return now.keys() == fresh.keys() and all(torch.equal(now[k].cpu(), fresh[k].cpu()) for k in now)


def _bytes(tensors):
    seen = {}
    for t in tensors:
        if t is not None:
            seen[(t.device, t.untyped_storage().data_ptr())] = t.untyped_storage().nbytes()
    return seen


def memory_bytes(actor, ref):
    """ref: bytes the reference holds that the actor does not share; actor: bytes of the actor's weights
    (trainable or not); trainable: parameters the optimizer moves x 16 bytes (fp32 weight, gradient and AdamW's
    two moments)."""
    a = _bytes([*actor.parameters(), *actor.buffers()])
    r = _bytes([*ref.model.parameters(), *ref.model.buffers()])
    n_train = sum(p.numel() for p in actor.parameters() if p.requires_grad)
    return dict(ref=sum(v for k, v in r.items() if k not in a), actor=sum(a.values()), trainable=16 * n_train)


def trainable_state(model):
    """Clones of the parameters an optimizer moves (all of them for a full actor; adapters or top blocks else)."""
    return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


def load_trainable(model, state):
    """Loads the trainable parameters only: frozen ones (the reference's) are never taken from a checkpoint."""
    names = {n for n, p in model.named_parameters() if p.requires_grad}
    model.load_state_dict({k: v for k, v in state.items() if k in names}, strict=False)


# ---- the KL rollback ----
class Rollback:
    """The last state whose rollout was under kl_max: actor (trainable part), critic, both optimizers, β controller,
    and a moving anchor (rolling, sync, reset: it moved with the actor, so it comes back with it). `above(kl)` judges
    each iteration's first rollout, `restore` brings the state back with β x factor, `keep` follows a rollout under.
    RunError where a restore cannot help: no state yet (the first rollout is above), or max_in_row restores in a
    row to one state (β alone cannot hold the update's own step; at π_θ = π_ref the KL's gradient is 0)."""

    def __init__(self, cfg):
        self.kl_max, self.factor, self.max_in_row = cfg.kl_max, cfg.rollback_beta_factor, cfg.rollback_max_in_row
        self.state, self.count, self.in_row = None, 0, 0

    def above(self, kl):
        if kl <= self.kl_max:
            self.in_row = 0                     # an update stayed under the limit: progress
            return False
        if self.state is None:
            raise RunError(f"the first rollout is {kl:.3g} nats from the reference, above --kl_max={self.kl_max}, "
                           "so the rollback has no state to return to: raise --kl_max, or use --ref=full")
        if self.in_row == self.max_in_row:
            raise RunError(f"the KL rollback restored one state {self.in_row} times in a row (β x"
                           f"{self.factor ** self.in_row:.3g}) and each update from it left --kl_max={self.kl_max}: "
                           "lower --ppo_lr, raise --kl_max, or allow more with --rollback_max_in_row", 1)
        return True

    def keep(self, actor, critic, opts, kl_ctl, anchor=None):        # anchor None: the frozen π_ref
        clone = lambda sd: {k: v.clone() for k, v in sd.items()}
        self.state = dict(actor=trainable_state(actor), kl_ctl=asdict(kl_ctl),       # critic None: grpo, rloo
                          critic=None if critic is None else clone(critic.state_dict()),
                          opts=[copy.deepcopy(o.state_dict()) for o in opts],
                          anchor=anchor and clone(anchor.model.state_dict()))

    def restore(self, actor, critic, opts, kl_ctl, anchor=None):
        """The kept state back into the models; returns the anchor to use (None: the frozen π_ref)."""
        s = self.state
        load_trainable(actor, s["actor"])
        if critic is not None:
            critic.load_state_dict(s["critic"])
        for o, sd in zip(opts, s["opts"]):
            o.load_state_dict(copy.deepcopy(sd))       # a copy: the optimizer would update the snapshot in place
        kl_ctl.__dict__.update({k: v * self.factor if k in ("value", "start", "end") else v     # linear: value
                                for k, v in s["kl_ctl"].items()})              # is recomputed from start and end
        s["kl_ctl"] = asdict(kl_ctl)        # the raised β is kept: a second restore to this state raises it again
        self.count, self.in_row = self.count + 1, self.in_row + 1
        if s["anchor"] is not None:
            (anchor := anchor or Reference(actor)).model.load_state_dict(s["anchor"])
        return anchor if s["anchor"] is not None else None

    def state_dict(self):
        return dict(state=self.state, count=self.count, in_row=self.in_row)

    def load_state_dict(self, d):
        self.state, self.count, self.in_row = d["state"], d["count"], d["in_row"]
