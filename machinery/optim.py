"""Optimizers: fused AdamW, Muon (written here) and pretraining's Muon split, the learning-rate
schedule, and the guarded step that takes the gradient, clips it and moves the weights.

    python -m pytest -q tests/test_muon.py tests/test_ppo.py   # the split, the schedule, the guard

Every training loop (pretraining, the reward model, PPO's actor and critic) steps through
`StepGuard.backward_and_step`: zero the gradients, backward, average them over torchrun ranks,
clip, step, and skip (counted) a step whose loss or gradient is not finite, so no NaN reaches the
weights. PPO's actor and critic each get their own AdamW (`make_optimizers`): the value loss never
reaches the actor's step or its clip. --optimizer=muon trains the blocks' 2-D matrices with Muon
(`Muon`: momentum, `newton_schulz` in the run's dtype) and the rest with AdamW
(`pretrain_optimizer`, `Optimizers`).
Left out: weight decay groups per parameter type, gradient accumulation, loss scaling (fp16).
"""
import math
import torch

from machinery import dist
from machinery.errors import RunError

# Non-finite steps in a row that stop a run.
MAX_BAD_STEPS = 5


def adamw(params, lr, **kw):
    """AdamW with the fused kernel (one op per step for all parameters, on CPU and CUDA alike)."""
    return torch.optim.AdamW(params, lr=lr, fused=True, **kw)


def hidden_matrices(model):
    """The parameters Muon trains: the blocks' 2-D weight matrices (attention qkv and projection,
    the MLP's two). Muon's authors (Keller Jordan's write-up and repository) prescribe it for
    hidden layers' matrices only: the token and position embeddings, the output layer (tied to the
    token embedding here: one matrix) and every vector (LayerNorm gains, biases) go to AdamW,
    which they found works better for the input and output layers."""
    return [p for block in model.blocks for p in block.parameters() if p.ndim == 2]


class Optimizers:
    """Several optimizers used as one (StepGuard takes one): zero_grad, step, param_groups,
    state_dict (a list, one per optimizer) and load_state_dict, over each in turn. Pretraining's
    --optimizer=muon: (Muon, AdamW)."""

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


class StepGuard:
    """One optimizer step per call, skipped (and counted) when the loss or the gradient is not
    finite; MAX_BAD_STEPS skips in a row stop the run with a one-line error. `opt` is one optimizer
    or an Optimizers. Under torchrun every gradient is averaged over ranks before the step, so each
    rank's step (Muon's orthogonalisation included) starts from the same gradient and state, and
    gives the same weights."""

    def __init__(self, what, advice="lower the learning rate"):
        self.what = what
        self.advice = advice
        self.skipped = 0
        self.in_a_row = 0

    def backward_and_step(self, loss, opt, params, max_norm):
        """loss.backward(), the gradients averaged over ranks and clipped to max_norm, opt.step().
        Returns True when the step was made."""
        opt.zero_grad(set_to_none=True)
        # torchrun: all ranks step or skip together, else the all-reduce below would wait forever.
        ok = dist.all_ranks(bool(torch.isfinite(loss)))
        if ok:
            loss.backward()
            # torchrun: the mean over ranks (a no-op in one process).
            dist.average_gradients(params)
            norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
            ok = bool(torch.isfinite(norm))
        if ok:
            opt.step()
            self.in_a_row = 0
            return True
        opt.zero_grad(set_to_none=True)
        self.skipped += 1
        self.in_a_row += 1
        if self.in_a_row >= MAX_BAD_STEPS:
            raise RunError(f"{self.what} diverged: {self.in_a_row} steps in a row with a "
                           f"non-finite loss or gradient ({self.advice})", 1)
        return False


# The quintic Newton-Schulz coefficients (Keller Jordan's Muon), chosen for the steepest slope at
# zero: 5 steps take every singular value of a normalised matrix into about [0.7, 1.2], not to 1.
NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)


def newton_schulz(g, steps=5, dtype=torch.float32):
    """The orthogonalised g: about U·Vᵀ of g = U·S·Vᵀ, by `steps` quintic iterations X ← aX +
    (bA + cA²)X with A = X·Xᵀ, run in `dtype` (fp32 where bf16 is emulated). g: (rows, cols), or
    a stack (n, rows, cols) of one shape, each matrix orthogonalised on its own (one batched
    multiply for all). Returns g's shape and dtype."""
    a, b, c = NS_COEFFICIENTS
    x = g.to(dtype).reshape(-1, g.size(-2), g.size(-1))  # (n, rows, cols)
    # The Gram matrix X·Xᵀ is the smaller one when the wide side is the columns.
    tall = g.size(-2) > g.size(-1)
    if tall:
        x = x.mT
    # Every singular value at most 1: divide each matrix by its Frobenius norm.
    x = x / x.norm(dim=(1, 2), keepdim=True).clamp(min=1e-7)
    for _ in range(steps):
        gram = x @ x.mT  # (n, small, small)
        # bA + cA², then aX + (bA + cA²)X: each one fused multiply-add.
        poly = torch.baddbmm(gram, gram, gram, beta=b, alpha=c)
        x = torch.baddbmm(x, poly, x, beta=a)
    if tall:
        x = x.mT
    return x.reshape(g.shape).to(g.dtype)


class Muon(torch.optim.Optimizer):
    """Muon for 2-D matrices: Nesterov momentum, its update orthogonalised by `newton_schulz`
    in `ns_dtype`, scaled per shape by sqrt(max(1, rows/cols)), and decoupled weight decay
    (θ ← θ(1 − lr·wd) − lr·scale·O). torch.optim.Muon's update, with the iteration's dtype a
    choice (torch's is always bf16) and the matrices of one shape orthogonalised as one batch.
    Its state (one momentum buffer per matrix) saves and loads with torch.optim.Optimizer's
    state_dict."""

    def __init__(self, params, lr, momentum, weight_decay, ns_dtype=torch.float32):
        super().__init__(params, dict(lr=lr, momentum=momentum, weight_decay=weight_decay))
        self.ns_dtype = ns_dtype

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            lr, mu = group["lr"], group["momentum"]
            by_shape = {}
            for p in group["params"]:
                if p.grad is not None:
                    by_shape.setdefault(p.shape, []).append(p)
            for shape, params in by_shape.items():
                ahead = []
                for p in params:
                    buf = self.state[p].setdefault("momentum_buffer", torch.zeros_like(p))
                    # buf ← μ·buf + (1 − μ)·g; Nesterov looks one step ahead: (1 − μ)·g + μ·buf.
                    buf.lerp_(p.grad, 1 - mu)
                    ahead.append(p.grad.lerp(buf, mu))
                updates = newton_schulz(torch.stack(ahead), dtype=self.ns_dtype)  # (n, rows, cols)
                scale = math.sqrt(max(1.0, shape[0] / shape[1]))
                for p, update in zip(params, updates, strict=True):
                    p.mul_(1 - lr * group["weight_decay"])
                    p.add_(update, alpha=-lr * scale)


def make_optimizers(actor, critic, cfg):
    """PPO's: one AdamW each, so the critic's loss never reaches the actor's step or its clip. The
    actor's holds only what it trains (--ref=lora: the adapters; --ref=shared_n: the top blocks).
    No critic (grpo, rloo): the actor's alone. cfg: a PPOConfig (ppo_lr, vf_lr)."""
    trained = [p for p in actor.parameters() if p.requires_grad]
    opts = (adamw(trained, cfg.ppo_lr, eps=1e-5, weight_decay=0.0),)
    if critic is None:
        return opts
    return opts + (adamw(critic.parameters(), cfg.vf_lr, eps=1e-5, weight_decay=0.0),)


def scheduled_lr(it, pt, peak, floor):
    """Iteration it's learning rate: linear warmup to `peak`, then a cosine down to `floor` at
    max_iters. pt: a PretrainConfig (warmup_iters, max_iters)."""
    if it < pt.warmup_iters:
        return peak * (it + 1) / pt.warmup_iters
    angle = math.pi * (it - pt.warmup_iters) / max(1, pt.max_iters - pt.warmup_iters)
    return floor + 0.5 * (peak - floor) * (1 + math.cos(angle))


def pretrain_optimizer(model, pt, dtype="fp32"):
    """--optimizer=adamw: AdamW on every parameter. muon: Muon on the blocks' 2-D matrices
    (`hidden_matrices`, as Muon's authors prescribe) and AdamW, as with adamw, on the rest
    (embeddings, the tied output layer, LayerNorm gains, biases). Muon has its own lr (--muon_lr,
    Keller Jordan's 0.02 with his per-shape scaling sqrt(max(1, rows/cols))), so the AdamW part
    keeps the lr tuned for it; its Newton-Schulz runs in bf16 where dtype (the run's resolved
    --dtype) is bf16, else in fp32. Each group carries its peak and floor lr (peak_lr,
    min_lr) for the schedule: Muon's floor is in the same ratio to its peak as AdamW's."""
    if pt.optimizer == "adamw":
        opt = adamw(model.parameters(), pt.lr, betas=(0.9, 0.95), weight_decay=pt.weight_decay)
        peaks = [(pt.lr, pt.min_lr)]
    else:
        hidden = hidden_matrices(model)
        mine = {id(p) for p in hidden}
        # parameters() yields the tied matrix once.
        rest = [p for p in model.parameters() if id(p) not in mine]
        # Newton-Schulz in bf16 only where the run computes in bf16 (--dtype, resolved).
        ns_dtype = torch.bfloat16 if dtype == "bf16" else torch.float32
        muon = Muon(hidden, pt.muon_lr, pt.muon_momentum, pt.muon_weight_decay, ns_dtype)
        opt = Optimizers(muon, adamw(rest, pt.lr, betas=(0.9, 0.95), weight_decay=pt.weight_decay))
        peaks = [(pt.muon_lr, pt.muon_lr * pt.min_lr / pt.lr), (pt.lr, pt.min_lr)]
    for g, (peak, floor) in zip(opt.param_groups, peaks, strict=True):
        g["peak_lr"] = peak
        g["min_lr"] = floor
    return opt
