"""The KL to the reference: per-token estimators, reward shaping, and the controllers that set β.

    python train.py --kl_estimator=k3 --kl_in=loss    # choose the estimator and where it is paid
    python -m pytest -q tests/test_estimators.py       # each estimator's gradient, by enumeration

Per response token t, with logp = log π_θ(y_t|s_t) and logp_ref = log π_ref(y_t|s_t) of the
*sampled* token:
    k1 = logp - logp_ref               unbiased for KL(π_θ‖π_ref), can be negative per token
    k2 = ½ (logp - logp_ref)²          biased, never negative, low variance
    k3 = (r - 1) - log r, r = p_ref/p  unbiased, never negative (Schulman 2020)
    full = Σ_v π_θ(v|s_t) (log π_θ(v|s_t) - log π_ref(v|s_t))   exact, from both softmaxes
    full_forward = Σ_v π_ref(v|s_t) (log π_ref(v|s_t) - log π_θ(v|s_t))   the exact forward
                                       (mass-covering) KL; a loss only (`check`)
    seq_mean = k1 / L                  the common mistake: summed over the L response tokens it
                                       is the *mean* log-ratio (kept to measure it)
The actor pays -β·kl_t at every response token (`shaped_rewards`). Unbiased *values* are not
unbiased *gradients*: which placement gives the sequence KL's gradient is checked by exact
enumeration on small tabular policies in tests/test_estimators.py and summed up in
answers/kl-placement.md (of the single placements, only k1 as a detached reward does).
β comes from a controller with `value` and `update(kl, n)`, where kl is the batch mean of
per-sequence summed KL and n the number of sequences.
Left out: the sequence-level forward KL (it needs π_ref's samples), entropy bonuses (ppo.py has
ent_coef), per-token adaptive β.
"""
from dataclasses import dataclass
import torch
from torch.nn import functional as F

from machinery.config import arg


@dataclass
class KLConfig:
    kl_ctl: str = arg("adaptive", help="how β moves: fixed, adaptive (Ziegler et al. 2019), band "
                      "(x1.2 or /1.2), linear (decay)",
                      choices=["fixed", "adaptive", "band", "linear"])
    init_kl_coef: float = arg(0.05, ">=0", "β at the start (linear: the start value)")
    kl_target: float = arg(6.0, ">0", "adaptive: target KL per sequence, nats; band: the middle "
                           "of its range")
    kl_horizon: int = arg(2000, ">=0", "adaptive: sequences over which β can move by about 20 %; "
                          "0 = a tenth of the run's sequences, so that β can move about x7 over "
                          "any budget")
    band_width: float = arg(0.5, "[0,1)", "band: the range is kl_target x (1 ± band_width)")
    kl_coef_end: float = arg(0.001, ">=0", "linear: β at the end of training")
    kl_estimator: str = arg("k1", help="per-token KL: k1, k2, k3, full (exact, from both "
                            "softmaxes), full_forward (exact KL(π_ref‖π_θ); --kl_in=loss only), "
                            "or seq_mean (k1 / response length: the mean log-ratio, a common "
                            "mistake)", choices=["k1", "k2", "k3", "full", "full_forward",
                                                 "seq_mean"])
    kl_in: str = arg("reward", help="reward (-β·kl per token, detached) or loss (β·Σ_t kl, "
                     "differentiated)", choices=["reward", "loss"])
    kl_placement: str = arg("token", help="--kl_in=reward: token (-β·kl_t at every token) or "
                            "sequence (-β·Σ_t kl_t at the last token, with the score)",
                            choices=["token", "sequence"])


# ---- per-token estimators (B, R) ----
def kl_k1(logp, logp_ref):
    return logp - logp_ref


def kl_k2(logp, logp_ref):
    return 0.5 * (logp - logp_ref) ** 2


def kl_k3(logp, logp_ref):
    # log(p_ref / p); expm1 keeps (r - 1) - log r stable near r = 1.
    log_r = logp_ref - logp
    return torch.expm1(log_r) - log_r


def kl_full(logits, logits_ref):
    """Exact KL(π_θ(·|s_t) ‖ π_ref(·|s_t)) at each position: logits (B, R, V), already
    temperature-scaled."""
    logp = F.log_softmax(logits.float(), -1)  # (B, R, V)
    logq = F.log_softmax(logits_ref.float(), -1)  # (B, R, V)
    return (logp.exp() * (logp - logq)).sum(-1)  # (B, R)


def kl_full_forward(logits, logits_ref):
    """Exact forward KL(π_ref(·|s_t) ‖ π_θ(·|s_t)) at each position (B, R): mass-covering."""
    return kl_full(logits_ref, logits)  # (B, R)


ESTIMATORS = {"k1": kl_k1, "k2": kl_k2, "k3": kl_k3}
# The estimators that need both softmaxes.
FULL = {"full": kl_full, "full_forward": kl_full_forward}


def check(cfg):
    """Why cfg.kl's values cannot work, in one line; None when they can (train.parse calls it).
    full_forward as a detached reward would be a REINFORCE weight for the states π_θ visits: it
    would steer which states are reached, never pull π_θ(·|s_t) towards π_ref(·|s_t) (the
    forward KL's gradient reaches π_θ only by differentiating it)."""
    if cfg.kl.kl_estimator == "full_forward" and cfg.kl.kl_in != "loss":
        return ("--kl_estimator=full_forward is a loss only: use it with --kl_in=loss (as a "
                "detached reward it weighs which states are visited and never pulls π_θ towards "
                "π_ref)")
    if cfg.kl.kl_placement == "sequence" and cfg.kl.kl_in != "reward":
        return ("--kl_placement=sequence places the reward's penalty: use it with --kl_in=reward "
                "(the loss already sums the KL per sequence)")
    return None


def kl_seq_mean(logp, logp_ref, mask):
    """k1 / L per token (B, R), L the response length: summed over the response it is the mean
    log-ratio."""
    return (logp - logp_ref) * mask / mask.sum(1, keepdim=True).clamp(min=1)


def per_token_kl(name, logp, logp_ref, logits=None, logits_ref=None, mask=None):
    """The configured estimator on response tokens (B, R); `full` and `full_forward` need the
    logits, `seq_mean` the mask (B, R). Differentiable in every input, so the same function
    serves the detached reward and the loss. With a mask, the inputs after end-of-text are zeroed
    *before* the estimator (kl 0 there): what the models say about padding can be anything, and
    k3's exp(log π_ref - log π) overflows beyond 88 nats, whose inf·0 is a NaN gradient."""
    if mask is not None:
        logp = torch.where(mask, logp, 0.0)
        logp_ref = torch.where(mask, logp_ref, 0.0)
        if name in FULL:
            logits = torch.where(mask[..., None], logits, 0.0)  # (B, R, V)
            logits_ref = torch.where(mask[..., None], logits_ref, 0.0)  # (B, R, V)
    if name in FULL:
        return FULL[name](logits, logits_ref)
    if name == "seq_mean":
        return kl_seq_mean(logp, logp_ref, mask)
    return ESTIMATORS[name](logp, logp_ref)


def shaped_rewards(scores, kl, mask, beta, placement="token"):
    """rewards (B, R): -β·kl_t on every response token up to and including end-of-text, plus the
    reward model's score (B,) on the last real token (end-of-text, or the last token of a
    truncated response). placement sequence: the same total, -β·Σ_t kl_t, paid at the last real
    token with the score, and 0 before it (no per-token credit)."""
    # Nothing after end-of-text counts.
    rewards = -beta * kl * mask
    # The index of each row's last real token.
    last = mask.long().sum(1) - 1  # (B,)
    if placement == "sequence":
        scores = scores.to(rewards.dtype) + rewards.sum(1)  # (B,)
        rewards = torch.zeros_like(rewards)
    return rewards.scatter_add(1, last[:, None], scores[:, None].to(rewards.dtype))


# ---- controllers for β ----
@dataclass
class FixedKLController:
    value: float

    def update(self, kl, n):
        pass


@dataclass
class AdaptiveKLController:
    """Proportional control (Ziegler et al. 2019; lm-human-preferences): β moves towards the KL
    target."""
    value: float
    target: float
    horizon: int

    def update(self, kl, n):
        # The proportional error, clipped.
        e = min(max(kl / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + e * n / self.horizon


@dataclass
class BandKLController:
    """β ×factor when KL is above [low, high], ÷factor below it, unchanged inside."""
    value: float
    low: float
    high: float
    factor: float = 1.2

    def update(self, kl, n):
        if kl > self.high:
            self.value *= self.factor
        elif kl < self.low:
            self.value /= self.factor


@dataclass
class LinearDecayKLController:
    """β from `start` to `end` linearly over `total` sequences, whatever the KL."""
    start: float
    end: float
    total: int
    seen: int = 0
    value: float = None

    def __post_init__(self):
        self.value = self.start

    def update(self, kl, n):
        self.seen += n
        self.value = self.start + (self.end - self.start) * min(1.0, self.seen / self.total)


def make_kl_controller(cfg, total_sequences):
    """cfg.kl_ctl's controller; total_sequences: the run's, for linear and kl_horizon=0."""
    if cfg.kl_ctl == "fixed":
        return FixedKLController(cfg.init_kl_coef)
    if cfg.kl_ctl == "adaptive":
        horizon = cfg.kl_horizon or max(1, total_sequences // 10)
        return AdaptiveKLController(cfg.init_kl_coef, cfg.kl_target, horizon)
    if cfg.kl_ctl == "band":
        return BandKLController(cfg.init_kl_coef, cfg.kl_target * (1 - cfg.band_width),
                                cfg.kl_target * (1 + cfg.band_width))
    if cfg.kl_ctl == "linear":
        return LinearDecayKLController(cfg.init_kl_coef, cfg.kl_coef_end, total_sequences)
    raise ValueError(f"unknown kl_ctl {cfg.kl_ctl!r} (choose fixed, adaptive, band, linear)")


def load_controller(ctl, state):
    """A controller's fields set from `state` (dataclasses.asdict of one: a resumed state, the
    KL rollback's)."""
    for k, v in state.items():
        setattr(ctl, k, v)
