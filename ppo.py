"""The PPO update: GAE, whitening, the clipped surrogate and the clipped value loss.

Given a rollout batch (made in train.py's ppo loop), with R response tokens per row and mask (B, R) true up to and
including end-of-text:
    advantages  GAE(γ, λ) by a reverse scan over response tokens; returns = advantages + values
    ratio       π_θ(y_t|s_t) / π_θ_old(y_t|s_t)      (never π_ref: the reference only enters the reward)
    pg_losses   max(-A·ratio, -A·clip(ratio, 1-ε, 1+ε))
    vf_losses   ½ max((V - G)², (clip(V, V_old ± ε_v) - G)²)
The actor and the critic (a separate trunk + head, initialised from the reward model) step on one loss.
Names follow lm-human-preferences and TRL: lastgaelam, vpredclipped, pg_losses, whiten.
Left out: value-head sharing with the actor, reward whitening, early stopping on approx-KL.
"""
from dataclasses import dataclass
import torch
from torch.nn import functional as F

from kl import kl_full, per_token_kl, shaped_rewards
from model import response_logits, token_logprobs


@dataclass
class PPOConfig:
    ppo_iters: int = 60         # rollout + update iterations
    rollout_batch: int = 64     # responses per rollout
    minibatch_size: int = 16
    ppo_epochs: int = 4         # passes over each rollout
    ppo_lr: float = 5e-5        # actor learning rate
    vf_lr: float = 1e-4         # critic learning rate
    gamma: float = 1.0
    lam: float = 0.95
    cliprange: float = 0.2
    cliprange_value: float = 0.2
    vf_coef: float = 0.1
    ent_coef: float = 0.0
    max_grad_norm: float = 1.0
    n_eval: int = 200           # held-out prompts for the before/after report


def masked_mean(x, mask):
    """Mean over real tokens; positions outside the mask contribute nothing, even NaN or inf."""
    return torch.where(mask, x, 0.0).sum() / mask.sum().clamp(min=1)


def whiten(x, mask, shift_mean=True):
    """Normalise x to zero mean, unit variance over the real tokens; 0 outside the mask."""
    mean = masked_mean(x, mask)
    var = masked_mean((x - mean) ** 2, mask)
    out = (x - mean) * torch.rsqrt(var + 1e-8)
    if not shift_mean:
        out = out + mean
    return torch.where(mask, out, 0.0)


def compute_gae(rewards, values, mask, gamma, lam):
    """Generalised advantage estimation over response tokens. rewards, values, mask (B, R) -> advantages, returns.
    Values and rewards after end-of-text are zeroed, so the last real token bootstraps from 0 (episode end)."""
    rewards, values = torch.where(mask, rewards, 0.0), torch.where(mask, values, 0.0)
    R = rewards.size(1)
    lastgaelam = torch.zeros_like(rewards[:, 0])
    advantages_reversed = []
    for t in reversed(range(R)):
        nextvalues = values[:, t + 1] if t + 1 < R else torch.zeros_like(values[:, 0])
        delta = rewards[:, t] + gamma * nextvalues - values[:, t]            # (B,)
        lastgaelam = delta + gamma * lam * lastgaelam
        advantages_reversed.append(lastgaelam)
    advantages = torch.stack(advantages_reversed[::-1], 1)                    # (B, R)
    return advantages, advantages + values


def policy_loss(logprobs, old_logprobs, advantages, mask, cliprange):
    """Clipped surrogate. All (B, R). Returns the loss and (clipfrac, approxkl, ratio mean) for logging."""
    logratio = torch.where(mask, logprobs - old_logprobs, 0.0)                 # padding can't leak inf into grads
    advantages = torch.where(mask, advantages, 0.0)
    ratio = torch.exp(logratio)
    pg_losses = -advantages * ratio
    pg_losses2 = -advantages * torch.clamp(ratio, 1.0 - cliprange, 1.0 + cliprange)
    loss = masked_mean(torch.max(pg_losses, pg_losses2), mask)
    with torch.no_grad():
        clipfrac = masked_mean((pg_losses2 > pg_losses).float(), mask)
        approxkl = 0.5 * masked_mean(logratio ** 2, mask)
        ratio_mean = masked_mean(ratio, mask)
    return loss, clipfrac, approxkl, ratio_mean


def value_loss(vpred, values, returns, mask, cliprange_value):
    """Clipped value loss: the new prediction may not move further than cliprange_value from the rollout's."""
    vpred, values, returns = (torch.where(mask, x, 0.0) for x in (vpred, values, returns))
    vpredclipped = values + torch.clamp(vpred - values, -cliprange_value, cliprange_value)
    vf_losses1 = (vpred - returns) ** 2
    vf_losses2 = (vpredclipped - returns) ** 2
    loss = 0.5 * masked_mean(torch.max(vf_losses1, vf_losses2), mask)
    return loss, masked_mean((vf_losses2 > vf_losses1).float(), mask).detach()


def entropy_from_logits(logits):
    logp = F.log_softmax(logits.float(), -1)                                  # (B, R, V)
    return -(logp.exp() * logp).sum(-1)                                       # (B, R)


@torch.no_grad()
def make_experience(actor, critic, ref, pen_ref, query, query_mask, response, mask, scores, beta, kl_cfg, cfg,
                    temperature):
    """Everything the update needs from one rollout: old and reference log-probs, critic values, KL-shaped
    rewards, whitened GAE advantages and returns. scores (B,) are the reward model's; pen_ref is the reference the
    penalty uses (the frozen one, or the previous policy for --kl_ref=rolling). Returns (batch, kl info)."""
    logits = response_logits(actor, query, query_mask, response, temperature)                  # (B, R, V)
    old_logprobs = token_logprobs(logits, response)                                            # (B, R)
    ref_logits = ref.logits(query, query_mask, response, temperature)                          # (B, R, V)
    pen_logits = ref_logits if pen_ref is ref else pen_ref.logits(query, query_mask, response, temperature)
    seq = torch.cat([query, response], 1)
    values = critic(seq, torch.cat([query_mask, torch.ones_like(mask)], 1))[:, query.size(1) - 1:-1]  # (B, R)
    kl = per_token_kl(kl_cfg.kl_estimator, old_logprobs, token_logprobs(pen_logits, response), logits, pen_logits)
    rewards = shaped_rewards(scores, kl if kl_cfg.kl_in == "reward" else torch.zeros_like(kl), mask, beta)
    advantages, returns = compute_gae(rewards, values, mask, cfg.gamma, cfg.lam)
    batch = dict(query=query, query_mask=query_mask, response=response, mask=mask, old_logprobs=old_logprobs,
                 values=values, advantages=whiten(advantages, mask), returns=returns)
    if kl_cfg.kl_in == "loss":
        batch["ref_logits"] = pen_logits
    info = dict(kl=kl,                                                     # (B, R) the estimator, as penalised
                kl_ref=(kl_full(logits, ref_logits) * mask).sum(1),        # (B,) exact, to the frozen reference
                kl_pen=(kl_full(logits, pen_logits) * mask).sum(1))        # (B,) exact, what β controls
    return batch, info


def ppo_update(actor, critic, opt, batch, cfg, temperature, kl_coef=0.0, kl_in="reward"):
    """Several epochs of shuffled minibatches over one rollout. batch holds (B, ·) tensors: query, query_mask,
    response, mask, old_logprobs, values, advantages, returns (and ref_logits when kl_in == 'loss').
    Returns the mean of each logged statistic."""
    B, Tp = batch["query"].shape
    stats = {k: [] for k in ("pg_loss", "vf_loss", "clipfrac", "approxkl", "ratio", "vf_clipfrac", "entropy", "kl_loss")}
    params = [p for g in opt.param_groups for p in g["params"]]
    for _ in range(cfg.ppo_epochs):
        perm = torch.randperm(B)
        for i in range(0, B, cfg.minibatch_size):
            mb = {k: v[perm[i:i + cfg.minibatch_size]] for k, v in batch.items()}
            logits = response_logits(actor, mb["query"], mb["query_mask"], mb["response"], temperature)  # (b, R, V)
            logprobs = token_logprobs(logits, mb["response"])                                             # (b, R)
            seq = torch.cat([mb["query"], mb["response"]], 1)
            seq_mask = torch.cat([mb["query_mask"], torch.ones_like(mb["response"], dtype=torch.bool)], 1)
            vpred = critic(seq, seq_mask)[:, Tp - 1:-1]                       # (b, R) value before each token
            pg_loss, clipfrac, approxkl, ratio = policy_loss(logprobs, mb["old_logprobs"], mb["advantages"],
                                                              mb["mask"], cfg.cliprange)
            vf_loss, vf_clipfrac = value_loss(vpred, mb["values"], mb["returns"], mb["mask"], cfg.cliprange_value)
            entropy = masked_mean(entropy_from_logits(logits), mb["mask"])
            loss = pg_loss + cfg.vf_coef * vf_loss - cfg.ent_coef * entropy
            kl_loss = torch.zeros(())
            if kl_in == "loss":               # exact KL, differentiated: only the direct part of its gradient
                kl_loss = masked_mean(kl_full(logits, mb["ref_logits"]), mb["mask"])
                loss = loss + kl_coef * kl_loss
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)
            opt.step()
            for k, v in zip(stats, (pg_loss, vf_loss, clipfrac, approxkl, ratio, vf_clipfrac, entropy, kl_loss)):
                stats[k].append(v.item())
    return {k: sum(v) / len(v) for k, v in stats.items()}
