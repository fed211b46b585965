"""Cheaper references: how π_ref is held (`--ref=`), what each way costs in memory, and the check
that the reference stayed frozen.

    python train.py --ref=lora                # PPO with a LoRA actor scored against its base
    python -m lab.bench --refs --out_dir=out  # bytes and step-0 KL of every kind, side by side

`make_reference` builds (actor, reference) for each kind:
    full      a frozen deep copy in fp32 (the default)
    bf16/fp16 the copy's weights, and its arithmetic, in half precision; logits cast to fp32
              before any softmax
    int8/nf4  the copy's block Linear weights quantized blockwise (absmax per `quant_block`
              weights), dequantized on the fly in the forward; embeddings (tied with the output
              layer), LayerNorms and biases stay fp32
    lora      the actor is the frozen pretrained model plus LoRA adapters on every block Linear
              (attention and MLP); the reference is the same module with the adapters switched
              off: no second copy of the weights
    shared_n  actor and reference share the embeddings and the bottom n blocks (frozen, stored
              once, TRL's num_shared_layers); the top blocks and the final LayerNorm are trained
              and kept twice
full, lora and shared_n start at exactly KL 0; half and quantized references do not
(evaluate.step0_kl measures it). `memory_bytes` says what each holds; `as_built` is what ref.pt
gives through the same build, which ref.check_unchanged holds the reference to after PPO.
Left out: quantized activations, double quantization of the scales, merging adapters during
training.
"""
import contextlib, copy, math, re
from dataclasses import dataclass
import torch
import torch.nn as nn
from torch.nn import functional as F

from model import response_logits
from ref import Reference, frozen_copy
from machinery.config import arg

KINDS = ["full", "bf16", "fp16", "int8", "nf4", "lora", "shared_<n>"]


@dataclass
class RefConfig:
    ref: str = arg("full", help="how the reference is held: full, bf16, fp16, int8, nf4, lora, "
                   "shared_<n> (n bottom blocks shared with the actor)")
    quant_block: int = arg(64, ">0", "int8/nf4: weights per absmax scale")
    lora_rank: int = arg(8, ">0", "lora: rank of each adapter")
    lora_alpha: float = arg(16.0, ">0", "lora: adapters scaled by lora_alpha / lora_rank")


def check(cfg):
    """Why cfg.ref's values cannot work, in one line; None when they can (train.parse calls it)."""
    kind = cfg.ref.ref
    n_layer = cfg.gpt.n_layer
    m = re.fullmatch(r"shared_(\d+)", kind)
    if kind not in KINDS and not m:
        return f"bad value for --ref: {kind!r} (choose {', '.join(KINDS)})"
    if m and int(m.group(1)) >= n_layer:
        return (f"--ref={kind} shares {m.group(1)} blocks but the model has --n_layer={n_layer}: "
                "share fewer")
    return None


# ---- int8 and nf4: blockwise absmax, weight-only ----
def nf4_levels():
    """NF4's 16 levels (Dettmers et al. 2023, QLoRA): quantiles of N(0, 1), scaled to [-1, 1],
    with an exact 0. 8 positive levels at probabilities linspace(p, ½, 9)[:-1] and 7 negative at
    linspace(p, ½, 8)[:-1] (mirrored), plus 0; p = 1 - ½(1/30 + 1/32) keeps the outermost
    quantile finite (p = 0.96770833, bitsandbytes' offset). Each level then holds about as many
    weights of a normal block as any other."""
    p = 1 - 0.5 * (1 / 30 + 1 / 32)
    pos = torch.special.ndtri(torch.linspace(p, 0.5, 9, dtype=torch.float64)[:-1])  # (8,)
    neg = -torch.special.ndtri(torch.linspace(p, 0.5, 8, dtype=torch.float64)[:-1])  # (7,)
    zero = torch.zeros(1, dtype=torch.float64)
    v = torch.cat([pos, zero, neg]).sort().values  # (16,)
    return (v / v.abs().max()).float()


def quantize(w, kind, block):
    """w (any shape) -> (codes, absmax (n_blocks,)) over blocks of `block` consecutive weights
    (row-major, the last block zero-padded). int8: round(127·w/absmax) in int8; nf4: the nearest
    level's index, two per uint8."""
    flat = w.detach().float().reshape(-1)
    flat = F.pad(flat, (0, -len(flat) % block)).view(-1, block)  # (n_blocks, block)
    absmax = flat.abs().amax(1)  # (n_blocks,)
    # Each block scaled into [-1, 1].
    x = flat / absmax.clamp(min=1e-12)[:, None]
    if kind == "int8":
        return torch.round(x * 127).to(torch.int8), absmax
    distance = (x[..., None] - nf4_levels().to(x.device)).abs()  # (n_blocks, block, 16)
    idx = distance.argmin(-1).to(torch.uint8)  # (n_blocks, block)
    idx = F.pad(idx.view(-1), (0, idx.numel() % 2)).view(-1, 2)
    # Two codes per byte.
    return idx[:, 0] | (idx[:, 1] << 4), absmax


def dequantize(codes, absmax, kind, block, shape, levels=None):
    """The inverse of `quantize`: fp32 weights of `shape`."""
    if kind == "int8":
        x = codes.float() / 127  # (n_blocks, block)
    else:
        # Unpacked: the low four bits, then the high four.
        idx = torch.stack([codes & 15, codes >> 4], 1).view(-1)[:absmax.numel() * block].long()
        if levels is None:
            levels = nf4_levels()
        x = levels[idx].view(-1, block)  # (n_blocks, block)
    return (x * absmax[:, None]).view(-1)[:math.prod(shape)].view(shape)


class QuantLinear(nn.Module):
    """A frozen nn.Linear whose weight is held as int8 or nf4 codes plus one fp32 absmax per
    block."""

    def __init__(self, lin, kind, block):
        super().__init__()
        self.kind = kind
        self.block = block
        self.shape = tuple(lin.weight.shape)
        codes, absmax = quantize(lin.weight, kind, block)
        self.register_buffer("codes", codes)
        self.register_buffer("absmax", absmax)
        self.register_buffer("levels", nf4_levels() if kind == "nf4" else None)
        bias = None if lin.bias is None else lin.bias.detach().clone()
        self.register_buffer("bias", bias)

    def forward(self, x):
        w = dequantize(self.codes, self.absmax, self.kind, self.block, self.shape, self.levels)
        return F.linear(x, w.to(x.dtype), self.bias)


def replace_linears(model, make, kind=nn.Linear):
    """Every `kind` (nn.Linear) inside the blocks (attention and MLP) -> make(it); the output
    layer is left alone."""
    for block in model.blocks:
        for parent in [block.attn, block.mlp]:
            for name, child in parent.named_children():
                if isinstance(child, kind):
                    setattr(parent, name, make(child))
    return model


# ---- lora ----
class LoRALinear(nn.Module):
    """base(x) + (α/r)·x Aᵀ Bᵀ. The base is frozen; B starts at 0, so the actor starts as the
    base exactly."""

    def __init__(self, base, rank, alpha):
        super().__init__()
        self.base = base.requires_grad_(False)
        self.scale = alpha / rank
        self.enabled = True
        a = torch.randn(rank, base.in_features) / math.sqrt(base.in_features)
        self.lora_A = nn.Parameter(a)  # (r, in)
        self.lora_B = nn.Parameter(torch.zeros(base.out_features, rank))  # (out, r)

    def forward(self, x):
        y = self.base(x)
        if not self.enabled:
            return y
        return y + self.scale * F.linear(F.linear(x, self.lora_A), self.lora_B)

    def merged(self):
        """A plain nn.Linear with W + (α/r)·B A: what actor.pt holds."""
        lin = copy.deepcopy(self.base)
        with torch.no_grad():
            lin.weight += self.scale * self.lora_B @ self.lora_A
        return lin.requires_grad_(True)


@contextlib.contextmanager
def adapters_off(model):
    """Within: every LoRALinear computes its base alone (the reference). Restored on exit, even
    on error."""
    mods = [m for m in model.modules() if isinstance(m, LoRALinear)]
    for m in mods:
        m.enabled = False
    try:
        yield
    finally:
        for m in mods:
            m.enabled = True


class LoRAReference(Reference):
    """--ref=lora: the actor module itself, scored with its adapters switched off. It holds no
    weights of its own, and no bf16 copy: the frozen bases are cast at every forward."""

    @torch.no_grad()
    def logits(self, query, query_mask, response, temperature):
        with adapters_off(self.model):
            return response_logits(self.model, query, query_mask, response, temperature)

    def state(self):
        """The tensors it scores with: the frozen bases (the adapters are the actor's)."""
        return {k: v for k, v in self.model.state_dict().items() if "lora_" not in k}


def plain_actor(actor):
    """The actor as a plain GPT (adapters merged) for actor.pt; the actor itself when it has no
    adapters."""
    if not any(isinstance(m, LoRALinear) for m in actor.modules()):
        return actor
    return replace_linears(copy.deepcopy(actor), LoRALinear.merged, LoRALinear)


# ---- choosing the reference ----
def make_reference(actor, ref, cfg):
    """(actor, reference) for cfg.ref (a RefConfig). actor: the pretrained model PPO will train;
    ref: ref.py's Reference of ref.pt (ref.load_reference). full: both as given. bf16, fp16, int8,
    nf4: ref's model converted where it is. lora, shared_n: the actor is built on ref's model
    itself, so the reference's weights are held once."""
    kind, ref_model = cfg.ref, ref.model
    if kind == "full":
        return actor, ref
    if kind in ("bf16", "fp16"):
        dtype = torch.bfloat16 if kind == "bf16" else torch.float16
        # model.response_logits casts the logits to fp32.
        return actor, Reference(ref_model.to(dtype), exact=False, copy=False)
    if kind in ("int8", "nf4"):
        replace_linears(ref_model, lambda lin: QuantLinear(lin, kind, cfg.quant_block))
        return actor, Reference(ref_model, exact=False, copy=False)
    if kind == "lora":
        replace_linears(ref_model, lambda lin: LoRALinear(lin, cfg.lora_rank, cfg.lora_alpha))
        return ref_model, LoRAReference(ref_model, copy=False)
    # shared_n: the actor is trained but for what is shared.
    n = int(kind.split("_")[1])
    ref_model.requires_grad_(True)
    shared = [ref_model.wte, ref_model.wpe, ref_model.lm_head, *ref_model.blocks[:n]]
    # deepcopy leaves these as they are.
    memo = {id(x): x for m in shared for x in [m, *m.parameters()]}
    frozen = Reference(frozen_copy(ref_model, memo), copy=False)
    # Stored once, trained by no one.
    for m in shared:
        m.requires_grad_(False)
    return ref_model, frozen


def as_built(ref_pt, cfg):
    """{name: tensor} that a reference of kind cfg.ref (a RefConfig) scores with when built from
    ref.pt's Reference `ref_pt` (loaded afresh): what the run's reference must still hold after
    PPO (ref.check_unchanged)."""
    # lora's A draws random numbers: not from the run's stream.
    with torch.random.fork_rng(devices=[]):
        model = copy.deepcopy(ref_pt.model)
        return make_reference(model, Reference(model, copy=False), cfg)[1].state()


def storage_bytes(tensors):
    """{(device, storage address): bytes} of the storages behind `tensors`, each counted once."""
    seen = {}
    for t in tensors:
        if t is not None:
            seen[(t.device, t.untyped_storage().data_ptr())] = t.untyped_storage().nbytes()
    return seen


def memory_bytes(actor, ref):
    """ref: bytes the reference holds that the actor does not share; actor: bytes of the actor's
    weights (trainable or not); trainable: parameters the optimizer moves x 16 bytes (fp32
    weight, gradient and AdamW's two moments)."""
    a = storage_bytes([*actor.parameters(), *actor.buffers()])
    r = storage_bytes([*ref.model.parameters(), *ref.model.buffers()])
    n_train = sum(p.numel() for p in actor.parameters() if p.requires_grad)
    own = sum(v for k, v in r.items() if k not in a)
    return dict(ref=own, actor=sum(a.values()), trainable=16 * n_train)
