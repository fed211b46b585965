"""Critic-free advantages from a group of samples per prompt: GRPO, Dr. GRPO, RLOO.

    python train.py --advantage=grpo --kl_in=loss --kl_estimator=k3  # GRPO (Shao et al. 2024)
    python train.py --advantage=grpo --grpo_scale=none  # Dr. GRPO: no division by the std
    python train.py --advantage=rloo                    # RLOO (Ahmadian et al. 2024)

Each prompt is sampled G = --group_size times per rollout; the G responses to one prompt sit in
consecutive rows, so rows (B,) reshape to groups (B/G, G). A response's sequence reward r is its
score (minus the missing-EOS penalty), and with --kl_in=reward minus β·Σ_t kl_t as well. The
baseline is the other samples of the same prompt, not a critic, so ppo.py builds, trains and saves
no critic in these modes:
    grpo      A = (r - mean of the group) / (std of the group + ε)
              std over the G samples with n - 1 (as TRL's GRPOTrainer), ε = 1e-4;
              --grpo_scale=none drops the division (Dr. GRPO, Liu et al. 2025)
    rloo      A = r - mean of the other G - 1 samples of its group
A group whose rewards are all equal gets advantage 0: it teaches nothing. The sequence advantage is
every response token's advantage up to and including end-of-text (`token_advantages`; `advantages`
does both from make_experience's rewards); it is not whitened again across the batch (GRPO does
not: the group already sets the scale). The loss is ppo.py's clipped surrogate, a mean over the
minibatch's tokens (DAPO's token-level mean: neither GRPO's per-response 1/|o| nor Dr. GRPO's
constant; with --minibatch_order=length, whose minibatches hold similar lengths, close to GRPO's
1/|o|). `check`: G >= 2, and each process's share of rollout_batch holds whole groups.
Left out: DAPO's dynamic sampling (dropping groups with equal rewards) and asymmetric clipping.
"""
import torch

from machinery import dist

EPS = 1e-4


def check(cfg):
    """Why the group settings cannot work, in one line; None when they can (train.parse calls
    it)."""
    # Under torchrun, each process's share holds whole groups.
    p, n = cfg.ppo, dist.world()
    if p.advantage != "gae" and (p.group_size < 2 or p.rollout_batch % (n * p.group_size)):
        return (f"--advantage={p.advantage} needs --group_size >= 2 dividing --rollout_batch"
                + (f" / {n} processes" if n > 1 else "")
                + f": {p.group_size} and {p.rollout_batch}")
    return None


def group_advantages(rewards, group_size, kind, scale="std"):
    """Sequence advantages (B,) from sequence rewards (B,) in groups of group_size consecutive
    rows."""
    r = rewards.view(-1, group_size)  # (B/G, G)
    if kind == "rloo":
        # The others' mean.
        baseline = (r.sum(1, keepdim=True) - r) / (group_size - 1)  # (B/G, G)
        return (r - baseline).reshape(-1)  # (B,)
    adv = r - r.mean(1, keepdim=True)  # (B/G, G)
    if scale == "std":
        adv = adv / (r.std(1, keepdim=True) + EPS)  # (B/G, G)
    return adv.reshape(-1)  # (B,)


def token_advantages(seq_advantages, mask):
    """The sequence advantage (B,) on every response token (B, R) up to and including end-of-text;
    0 after."""
    return torch.where(mask, seq_advantages[:, None], 0.0)  # (B, R)


def advantages(rewards, mask, cfg):
    """Token advantages (B, R) from the shaped rewards (B, R) of a rollout in groups (cfg:
    PPOConfig): their sum per response is its sequence reward (the score, and -β·Σ_t kl_t with
    --kl_in=reward)."""
    seq = group_advantages(rewards.sum(1), cfg.group_size, cfg.advantage, cfg.grpo_scale)  # (B,)
    return token_advantages(seq, mask)  # (B, R)
