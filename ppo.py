"""PPO for RLHF: the experience of one rollout, the clipped update, and the loop that runs them.

    python train.py --stage=ppo    # PPO on the pretrained actor, the reference, the reward model

One iteration of `train_ppo`, as in lm-human-preferences and TRL:
    1. rollout     the actor samples a response to each prompt (KV cache, temperature T);
                   grpo, rloo: G responses per prompt
    2. experience  old log-probs from the actor (the rollout policy, never the reference),
                   reference log-probs, critic values, the score (reward model or gold) minus
                   missing_eos_penalty without end-of-text (and length_penalty per token),
                   rewards r_t = -β·kl_t with the score at the last real token, GAE
                   advantages (whitened; options/grpo.py's), returns
    3. update      ppo_epochs passes over minibatches, each cut to its longest response:
                   ratio = π_θ/π_θ_old
                   pg_losses = max(-A·ratio, -A·clip(ratio, 1-ε, 1+ε))
                   vf_losses = ½ max((V - G)², (vpredclipped - G)²)
                   vpredclipped = V_old + clip(V - V_old, ±ε_v)
                   actor and critic have separate optimizers and gradient clips
    4. β           the controller is fed this rollout's exact KL to the penalty's reference
    5. log, save   one metrics row and log line per iteration; a resumable state every
                   save_interval iterations (machinery/state.py)
Each option enters through one call to the file that owns it: the KL rollback and early stop
(--kl_max, --stop_kl: `rollback.guard`), the moving anchors (--ref_update: `anchor.moving` around
the update), the held-out evaluation (--eval_every: `evaluate.during_ppo`), group baselines
(--advantage: `grpo.advantages` in make_experience), the pretraining mix (--ptx_coef,
InstructGPT's PPO-ptx: the LM loss on train.bin windows in ppo_update, a second anchor, to the
data) and torchrun (machinery/dist.py: no-ops in one process; each rank samples and trains on its
share, gradients averaged, advantages whitened, β fed and metrics reduced over all ranks).
Shapes: B batch, Tp prompt tokens (left-padded), R response tokens, V vocabulary; mask (B, R) is
true up to and including end-of-text.
Left out: a value head sharing the actor's trunk, reward whitening, early stopping on approx-KL.
"""
from collections import defaultdict
from dataclasses import dataclass, replace
import functools, os, time
import torch

import data
from kl import FULL, kl_full, make_kl_controller, per_token_kl, shaped_rewards
from model import entropy_from_logits, response_logits, token_logprobs
from ref import check_starts_at
from reward import gold_scores, response_values, score as reward_score
from sequences import encode_prompts, join_tokens, masked_mean, response_mask
from machinery import dist, optim, state, store, tblog
from options import evaluate
from machinery.config import arg
from machinery.precision import cast_once
from options import anchors, grpo, rollback


@dataclass
class PPOConfig:
    ppo_iters: int = arg(60, ">0", "rollout + update iterations")
    rollout_batch: int = arg(64, ">0", "responses per rollout")
    minibatch_size: int = arg(16, ">0")
    ppo_epochs: int = arg(4, ">0", "passes over each rollout")
    ppo_lr: float = arg(5e-5, ">0", "actor learning rate")
    vf_lr: float = arg(1e-4, ">0", "critic learning rate (its own optimizer: there is no vf_coef)")
    gamma: float = arg(1.0, "[0,1]")
    lam: float = arg(0.95, "[0,1]")
    cliprange: float = arg(0.2, ">0")
    cliprange_value: float = arg(0.2, ">0")
    ent_coef: float = arg(0.0, ">=0", "entropy bonus in the actor's loss")
    max_grad_norm: float = arg(1.0, ">0", "gradient clip, for the actor and the critic separately")
    missing_eos_penalty: float = arg(1.0, ">=0", "subtracted from the score of a response without "
                                     "end-of-text")
    length_penalty: float = arg(0.0, ">=0", "subtracted from the score per response token "
                                "(end-of-text included): a price on length")
    save_interval: int = arg(10, ">0", "iterations between resumable checkpoints")
    ptx_coef: float = arg(0.0, ">=0", "γ: weight of the pretraining LM loss (train.bin windows) in "
                          "the actor's loss")
    reward: str = arg("model", help="model (the reward model) or gold (the simulated human)",
                      choices=["model", "gold"])
    advantage: str = arg("gae", help="gae (a critic) or, with no critic, grpo or rloo",
                         choices=["gae", "grpo", "rloo"])
    group_size: int = arg(8, ">0", "grpo, rloo: samples per prompt (rollout_batch must be "
                          "divisible by it)")
    grpo_scale: str = arg("std", help="grpo: divide by the group's std, or none (Dr. GRPO)",
                          choices=["std", "none"])
    minibatch_order: str = arg("shuffle", help="length: minibatches of similar lengths, in random "
                               "order (less padding; each response, not token, weighs alike)",
                               choices=["shuffle", "length"])


def whiten(x, mask):
    """Normalise x to zero mean, unit variance over the real tokens; 0 outside the mask. Under
    torchrun the mean and variance are over every rank's tokens (sums and counts all-reduced), as
    if one process held the batch."""
    n = dist.all_reduce(mask.sum().float()).clamp(min=1)
    mean = dist.all_reduce(torch.where(mask, x, 0.0).sum()) / n
    var = dist.all_reduce(torch.where(mask, (x - mean) ** 2, 0.0).sum()) / n
    return torch.where(mask, (x - mean) * torch.rsqrt(var + 1e-8), 0.0)


def compute_gae(rewards, values, mask, gamma, lam):
    """Generalised advantage estimation over response tokens. rewards, values, mask (B, R) ->
    advantages, returns. Values and rewards after end-of-text are zeroed, so the last real token
    bootstraps from 0 (the episode's end)."""
    rewards = torch.where(mask, rewards, 0.0)
    values = torch.where(mask, values, 0.0)
    R = rewards.size(1)
    lastgaelam = torch.zeros_like(rewards[:, 0])
    advantages_reversed = []
    for t in reversed(range(R)):
        nextvalues = values[:, t + 1] if t + 1 < R else torch.zeros_like(values[:, 0])
        delta = rewards[:, t] + gamma * nextvalues - values[:, t]  # (B,)
        lastgaelam = delta + gamma * lam * lastgaelam
        advantages_reversed.append(lastgaelam)
    advantages = torch.stack(advantages_reversed[::-1], 1)  # (B, R)
    return advantages, advantages + values


def explained_variance(values, returns, mask):
    """CleanRL's explained variance of the critic: 1 - Var(returns - values) / Var(returns) over
    the real tokens (population variances; NaN when the returns do not vary)."""
    var_returns = masked_mean((returns - masked_mean(returns, mask)) ** 2, mask)
    residual = returns - values
    var_residual = masked_mean((residual - masked_mean(residual, mask)) ** 2, mask)
    if var_returns == 0:
        return float("nan")
    return (1 - var_residual / var_returns).item()


def policy_loss(logprobs, old_logprobs, advantages, mask, cliprange):
    """Clipped surrogate. All (B, R). Returns the loss and (clipfrac, approxkl, ratio mean) for
    logging."""
    # Padding's log-ratio is zeroed, so it cannot leak inf into the gradients.
    logratio = torch.where(mask, logprobs - old_logprobs, 0.0)
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
    """Clipped value loss: the new prediction may not move further than cliprange_value from the
    rollout's. Returns the loss and the fraction clipped."""
    vpred = torch.where(mask, vpred, 0.0)
    values = torch.where(mask, values, 0.0)
    returns = torch.where(mask, returns, 0.0)
    vpredclipped = values + torch.clamp(vpred - values, -cliprange_value, cliprange_value)
    vf_losses1 = (vpred - returns) ** 2
    vf_losses2 = (vpredclipped - returns) ** 2
    loss = 0.5 * masked_mean(torch.max(vf_losses1, vf_losses2), mask)
    return loss, masked_mean((vf_losses2 > vf_losses1).float(), mask).detach()


def draw_prompts(prompts, cfg, local, gen):
    """This rollout's prompts: rollout_batch / G drawn from `gen`, each repeated G times (grpo,
    rloo: G = group_size; gae: 1). torchrun: this rank's share of them (`local`'s size)."""
    G = 1 if cfg.advantage == "gae" else cfg.group_size
    drawn = torch.randint(len(prompts), (cfg.rollout_batch // G,), generator=gen)
    idx = drawn.repeat_interleave(G).tolist()
    first = dist.rank() * local.rollout_batch
    return [prompts[i] for i in idx[first:first + local.rollout_batch]]


def rollout(actor, enc, prompts, query, query_mask, run):
    """The actor as it is now (the rollout policy π_θ_old) answers each prompt: response (B, R),
    and the simulated human's gold scores (B,) of the answers."""
    # bf16: each weight cast once for the whole sampling, not once per token.
    with cast_once(actor):
        response, _ = actor.generate(query, run.response_length, run.temperature,
                                     eos=enc.eot_token, mask=query_mask)
    return response, gold_scores(enc, prompts, response)


@torch.no_grad()
def make_experience(actor, critic, ref, pen_ref, rm, query, query_mask, response, eos, beta,
                    kl_cfg, cfg, temperature, gold=None, gold_norm=(0.0, 1.0)):
    """Everything the update needs from one rollout (query (B, Tp) left-padded, response (B, R)
    as sampled). ref is the frozen reference; pen_ref the one the penalty uses (ref, or a moving
    anchor); critic None: grpo, rloo; gold (B,): the simulated human's scores (--reward=gold: the
    score). Returns (batch, info)."""
    mask = response_mask(response, eos)  # (B, R)
    # The reward model never saw text without end-of-text: such a response pays a penalty.
    truncated = ~(response == eos).any(1)  # (B,)
    penalty = cfg.missing_eos_penalty * truncated
    # --length_penalty: a price per response token, which β = 0 runs pay in place of the KL's.
    if cfg.length_penalty:
        penalty = penalty + cfg.length_penalty * mask.sum(1)
    joined = join_tokens(query, query_mask, response, mask)
    scores = reward_score(rm, joined, eos) - penalty  # (B,)
    reward = scores
    if cfg.reward == "gold":
        reward = (gold.to(scores) - gold_norm[0]) / gold_norm[1] - penalty  # (B,)
    logits = response_logits(actor, query, query_mask, response, temperature)  # (B, R, V)
    # The rollout policy's log-probs: the ratio's denominator.
    old_logprobs = token_logprobs(logits, response)  # (B, R)
    ref_logits = ref.logits(query, query_mask, response, temperature)  # (B, R, V)
    pen_logits = ref_logits
    if pen_ref is not ref:
        pen_logits = pen_ref.logits(query, query_mask, response, temperature)  # (B, R, V)
    pen_logprobs = token_logprobs(pen_logits, response)  # (B, R)
    if critic is None:
        values = 0 * old_logprobs  # (B, R)
    else:
        values = response_values(critic, query, query_mask, response)  # (B, R)
    kl = per_token_kl(kl_cfg.kl_estimator, old_logprobs, pen_logprobs, logits, pen_logits, mask)
    # The loss form: the update pays the KL, the rewards do not hold it.
    in_reward = kl if kl_cfg.kl_in == "reward" else torch.zeros_like(kl)
    rewards = shaped_rewards(reward, in_reward, mask, beta, kl_cfg.kl_placement)  # (B, R)
    if cfg.advantage == "gae":
        advantages, returns = compute_gae(rewards, values, mask, cfg.gamma, cfg.lam)
        trained = whiten(advantages, mask)
    else:
        # grpo, rloo: the sequence reward against its group's, on every token; not whitened.
        advantages = returns = trained = grpo.advantages(rewards, mask, cfg)  # (B, R)
    batch = dict(query=query, query_mask=query_mask, response=response, mask=mask,
                 old_logprobs=old_logprobs, values=values, advantages=trained, returns=returns)
    if kl_cfg.kl_in == "loss":
        batch["ref_logprobs"] = pen_logprobs
        if kl_cfg.kl_estimator in FULL:
            batch["ref_logits"] = pen_logits
    # beta: the β the rewards were shaped with; advantages: before whitening (the inspect page);
    # kl: the estimator, as penalised; non_score: the penalty the rewards hold (shaped as they
    # are, with no score); kl_exact: to the frozen reference; kl_pen: the exact KL to the
    # penalty's reference, what β controls; neg_logprob: each response's -log π_θ_old, summed.
    info = dict(beta=beta, scores=scores, reward=reward, gold=gold, truncated=truncated,
                rewards=rewards, mask=mask, advantages=torch.where(mask, advantages, 0.0),
                kl=torch.where(mask, kl, 0.0),
                neg_logprob=-torch.where(mask, old_logprobs, 0.0).sum(1),
                explained_variance=explained_variance(values, returns, mask),
                non_score=shaped_rewards(torch.zeros_like(reward), in_reward, mask, beta).sum(1),
                kl_exact=(kl_full(logits, ref_logits) * mask).sum(1),
                kl_pen=(kl_full(logits, pen_logits) * mask).sum(1))
    return batch, info


def collect_experience(actor, critic, ref, anchor, rm, enc, prompts, kl_ctl, cfg, gold_norm):
    """Steps 1 and 2 of an iteration for its prompts (text): the actor as it is now answers them
    (`rollout`), and `make_experience` scores the answers with β as kl_ctl has it now, the penalty
    paid to the anchor's current reference. Returns (batch, info)."""
    run = cfg.run
    q, qm = (x.to(run.device) for x in encode_prompts(enc, prompts))  # (B, Tp)
    # Dropout off during RL; gradients still flow.
    actor.eval()
    if critic is not None:
        critic.eval()
    resp, gold = rollout(actor, enc, prompts, q, qm, run)
    return make_experience(
        actor=actor, critic=critic, ref=ref, pen_ref=anchor.current, rm=rm, query=q,
        query_mask=qm, response=resp, eos=enc.eot_token, beta=kl_ctl.value, kl_cfg=cfg.kl,
        cfg=cfg.ppo, temperature=run.temperature, gold=gold, gold_norm=gold_norm)


def minibatches(lengths, size, order):
    """One epoch's minibatches for responses of `lengths` (B,): index tensors, each response once,
    `size` a piece (the last may be smaller), from one torch.randperm.
    shuffle: the permutation, cut.
    length: it, stably sorted by length (ties in its random order; all of it, not in chunks: the
    default has 4 minibatches), cut, each piece put where shuffle puts its minibatch of the same
    rank by mean length, then variance. Equal lengths give shuffle's minibatches; the order is
    random, independent of what the pieces hold. Unbiased only in that an epoch trains on every
    response once (a per-response loss, the KL loss, sums alike): a piece is no uniform sample,
    and token means divide by its tokens, about size x L: each response weighs about alike
    (GRPO's 1/|o|), not each token (shuffle)."""
    perm = torch.randperm(len(lengths))
    # Shuffle's minibatches.
    pieces = perm.split(size)
    if order == "shuffle":
        return pieces
    lengths_of = [lengths[p].double() for p in pieces]
    moments = [(x.mean().item(), x.var(unbiased=False).item()) for x in lengths_of]
    # By mean length, then variance; ties as drawn.
    ranked = sorted(range(len(pieces)), key=moments.__getitem__)
    sizes = [len(pieces[j]) for j in ranked]
    by_length = perm[lengths[perm].argsort(stable=True)].split(sizes)
    # The k-th shortest goes where shuffle's k-th was.
    return [by_length[ranked.index(j)] for j in range(len(pieces))]


def ppo_update(actor, critic, opts, guards, batch, cfg, temperature, beta=0.0, kl_cfg=None,
               ptx_batch=None):
    """ppo_epochs passes of `minibatches` over one rollout. opts and guards: (actor's, critic's).
    ptx_batch: with ptx_coef > 0, a function returning pretraining windows (x, y) for each
    minibatch. Returns each logged statistic's mean, and ratio_dev_first: max |ratio - 1| on the
    first minibatch, 0 when the old log-probs are the sampler's."""
    stats = defaultdict(list)
    actor_params = list(actor.parameters())
    lengths = batch["mask"].sum(1).cpu()  # (B,)
    for epoch in range(cfg.ppo_epochs):
        for idx in minibatches(lengths, cfg.minibatch_size, cfg.minibatch_order):
            mb = {k: v[idx] for k, v in batch.items()}
            # This minibatch's longest response: the rest is padding.
            n = int(mb["mask"].sum(1).max())
            mb = {k: v if k.startswith("query") else v[:, :n] for k, v in mb.items()}
            q, qm, resp, mask = mb["query"], mb["query_mask"], mb["response"], mb["mask"]
            # bf16: each weight cast once for this step's forwards (ptx: twice).
            with cast_once(actor, critic):
                logits = response_logits(actor, q, qm, resp, temperature)  # (b, R, V)
                logprobs = token_logprobs(logits, resp)  # (b, R)
                pg_loss, clipfrac, approxkl, ratio = policy_loss(
                    logprobs, mb["old_logprobs"], mb["advantages"], mask, cfg.cliprange)
                entropy_in = logits if cfg.ent_coef else logits.detach()
                entropy = masked_mean(entropy_from_logits(entropy_in), mask)
                actor_loss = pg_loss - cfg.ent_coef * entropy
                # Each term is zero unless it is on.
                kl_loss = ptx_loss = vf_loss = vf_clipfrac = torch.zeros(())
                if kl_cfg is not None and kl_cfg.kl_in == "loss":
                    # The estimator, differentiated, summed per sequence.
                    kl = per_token_kl(kl_cfg.kl_estimator, logprobs, mb["ref_logprobs"], logits,
                                      mb.get("ref_logits"), mask)
                    kl_loss = torch.where(mask, kl, 0.0).sum(1).mean()
                    actor_loss = actor_loss + beta * kl_loss
                if cfg.ptx_coef > 0:
                    # InstructGPT's pretraining mix.
                    _, ptx_loss = actor(*ptx_batch())
                    actor_loss = actor_loss + cfg.ptx_coef * ptx_loss
                if critic is not None:
                    vpred = response_values(critic, q, qm, resp)  # (b, R)
                    vf_loss, vf_clipfrac = value_loss(vpred, mb["values"], mb["returns"], mask,
                                                      cfg.cliprange_value)
            # The gradients are taken and the steps made after the window (no stale bf16 copy):
            # backward, clip, step (optim.StepGuard), the critic's first. grpo, rloo: no critic.
            if critic is not None:
                critic_params = list(critic.parameters())
                guards[1].backward_and_step(vf_loss, opts[1], critic_params, cfg.max_grad_norm)
            if not stats["ratio_dev_first"]:
                dev = (torch.exp(logprobs - mb["old_logprobs"]) - 1).abs()
                stats["ratio_dev_first"].append(torch.where(mask, dev, 0.0).max().item())
            guards[0].backward_and_step(actor_loss, opts[0], actor_params, cfg.max_grad_norm)
            logged = dict(pg_loss=pg_loss, vf_loss=vf_loss, clipfrac=clipfrac, approxkl=approxkl,
                          ratio=ratio, vf_clipfrac=vf_clipfrac, entropy=entropy, kl_loss=kl_loss,
                          ptx_loss=ptx_loss)
            for k, v in logged.items():
                stats[k].append(v.item())
    means = {k: sum(v) / len(v) for k, v in stats.items()}
    # TRL's val/ratio_var: the variance over the minibatches of each one's mean ratio.
    means["ratio_var"] = 0.0
    if len(stats["ratio"]) > 1:
        means["ratio_var"] = torch.tensor(stats["ratio"]).var().item()
    return means


def metrics_row(it, info, stats, guards, limit, lr, episode, seconds, elapsed):
    """Iteration it's metrics. A name TRL's PPOTrainer also logs measures TRL's quantity; the rest
    are tether's (docs/outputs.md has each with its formula). info["kl_before_rollback"]: the first
    rollout's KL (the one --kl_max judged, even if it was redone); episode: responses so far."""
    mask = info["mask"]
    n_tok = mask.sum().item()
    n_responses = mask.size(0)
    return {"iter": it + 1,
            "episode": episode,
            "lr": lr,
            "objective/kl": info["kl"].sum(1).mean().item(),
            "objective/kl_exact": info["kl_exact"].mean().item(),
            "objective/kl_penalized": info["kl_pen"].mean().item(),
            "objective/kl_coef": info["beta"],
            "objective/scores": info["scores"].mean().item(),
            "objective/gold": info["gold"].mean().item(),
            "objective/non_score_reward": info["non_score"].mean().item(),
            "objective/rlhf_reward": (info["reward"] + info["non_score"]).mean().item(),
            "objective/missing_eos": info["truncated"].float().mean().item(),
            "objective/entropy": info["neg_logprob"].mean().item(),
            "policy/entropy_avg": stats["entropy"],
            "policy/clipfrac_avg": stats["clipfrac"],
            "policy/approxkl_avg": stats["approxkl"],
            "policy/ratio_dev_first": stats["ratio_dev_first"],
            "policy/skipped_updates": guards[0].skipped + guards[1].skipped,
            "policy/rollbacks": 0 if limit is None else limit.count,
            "policy/kl_before_rollback": info["kl_before_rollback"],
            "loss/policy_avg": stats["pg_loss"],
            "loss/value_avg": stats["vf_loss"],
            "loss/kl_avg": stats["kl_loss"],
            "loss/ptx_avg": stats["ptx_loss"],
            "val/clipfrac_avg": stats["vf_clipfrac"],
            "val/ratio": stats["ratio"],
            "val/ratio_var": stats["ratio_var"],
            "val/explained_variance": info["explained_variance"],
            "val/num_eos_tokens": (~info["truncated"]).float().sum().item(),
            "val/response_length": n_tok / n_responses,
            "time/tokens_per_second": n_tok / seconds,
            "time/elapsed": elapsed}


# torchrun: how each metric is reduced over the ranks (the rest: the mean).
SAME = ("iter", "episode", "lr", "objective/kl_coef", "policy/skipped_updates")
SUMMED = ("val/num_eos_tokens", "time/tokens_per_second")
MAXED = ("policy/ratio_dev_first",)


def log_line(row, n_iters, eta):
    """The line printed after each iteration (README explains it)."""
    return (f"iter {row['iter']}/{n_iters} | rm {row['objective/scores']:+.2f} | "
            f"gold {row['objective/gold']:+.2f} | kl {row['objective/kl_exact']:.2f} | "
            f"β {row['objective/kl_coef']:.4f} | ent {row['policy/entropy_avg']:.2f} | "
            f"clip {row['policy/clipfrac_avg']:.3f} | "
            f"approxkl {row['policy/approxkl_avg']:.4f} | vf {row['loss/value_avg']:.3f} | "
            f"len {row['val/response_length']:.1f} | "
            f"{row['time/tokens_per_second']:.0f} tok/s | "
            f"eta {int(eta // 60)}m{int(eta % 60):02d}s")


def say(line):
    """One log line, flushed at once, so `python train.py | tee log` shows each iteration as it
    ends."""
    print(line, flush=True)


def train_ppo(actor, critic, ref, rm, enc, prompts, cfg, run_dir, stamp, log=say,
              gold_norm=(0.0, 1.0), heldout=()):
    """PPO from the given actor and critic (both trained in place; critic None: grpo, rloo)
    against the frozen reference `ref` and the reward model `rm` (gold_norm: --reward=gold's;
    heldout: --eval_every's prompts).
    Writes run_dir/metrics.jsonl every iteration and run_dir/ppo_state.pt every save_interval
    iterations; a state made under `stamp` (config, inputs, code) is resumed, so an interrupted
    run ends with the same numbers as an uninterrupted one. Returns (metrics, final β)."""
    run, kc, pc = cfg.run, cfg.kl, cfg.ppo
    # torchrun: each rank samples and trains on its share of every batch.
    n_ranks = dist.world()
    local = replace(pc, rollout_batch=pc.rollout_batch // n_ranks,
                    minibatch_size=pc.minibatch_size // n_ranks)
    opts = optim.make_optimizers(actor, critic, pc)
    guards = (optim.StepGuard("PPO (actor)"), optim.StepGuard("PPO (critic)"))
    kl_ctl = make_kl_controller(kc, pc.ppo_iters * pc.rollout_batch)
    anchor = anchors.Anchor(ref, cfg.anchor)
    limit = rollback.make_rollback(cfg.rollback, actor, critic, opts, kl_ctl, anchor)
    prompt_gen = torch.Generator().manual_seed(run.seed)
    # ptx: its windows from a stream of their own, so ptx_coef=0 changes nothing else.
    ptx_gen = torch.Generator().manual_seed(run.seed + 7 + 1000003 * dist.rank())
    ptx_batch = None
    if pc.ptx_coef > 0:
        train_bin = os.path.join(run.out_dir, "train.bin")
        ptx_batch = data.pretraining_batches(train_bin, local.minibatch_size, cfg.gpt.block_size,
                                             ptx_gen, run.device)
    # torchrun: each rank its own sampling noise.
    dist.seed_rank(run.seed)
    metrics_path = os.path.join(run_dir, "metrics.jsonl")
    # What a resumable state holds, and the file it is in (machinery/state.py).
    trained = dict(actor=actor, critic=critic, opts=opts, guards=guards, kl_ctl=kl_ctl,
                   gens=(prompt_gen, ptx_gen), anchor=anchor, rollback=limit)
    saved = os.path.join(run_dir, "ppo_state.pt"), stamp
    metrics, start = state.load_ppo_state(*saved, log, **trained)
    # The log as the state has it: a kill after the last iteration leaves none to write it.
    if metrics and dist.is_main():
        store.save_json(metrics_path, metrics, lines=True)
    t0 = time.time() - (metrics[-1]["time/elapsed"] if metrics else 0.0)
    # --log_to=tensorboard: this process's rows, as they come, in run_dir/tb/ppo/ too.
    board = tblog.open_log(run.log_to, run_dir, "ppo", start + 1)
    # ---- ppo loop ----
    for it in range(start, pc.ppo_iters):
        t_it = time.time()
        # 1. rollout and 2. experience, for this iteration's prompts
        collect = functools.partial(collect_experience, actor, critic, ref, anchor, rm, enc,
                                    draw_prompts(prompts, pc, local, prompt_gen), kl_ctl, cfg,
                                    gold_norm)
        batch, info = collect()
        if it == 0:
            check_starts_at(ref, info["kl_exact"])
        # --kl_max, --stop_kl: a rollout too far from the reference is undone (options/rollback.py).
        batch, info = rollback.guard(limit, it, batch, info, collect)
        if batch is None:
            break
        # 3. update; --ref_update: a moving anchor moves around it (options/anchors.py).
        with anchor.moving(actor, it):
            stats = ppo_update(actor, critic, opts, guards, batch, local, run.temperature,
                               info["beta"], kc, ptx_batch)
        # 4. β, fed this rollout's exact KL to the penalty's reference (the same on every rank)
        kl_ctl.update(dist.all_reduce(info["kl_pen"].mean().item(), "mean"), pc.rollout_batch)
        # 5. log
        row = metrics_row(it, info, stats, guards, limit, opts[0].param_groups[0]["lr"],
                          (it + 1) * pc.rollout_batch, time.time() - t_it, time.time() - t0)
        # --eval_every: the updated actor on held-out prompts, from a random stream of its own.
        if evaluate.due(cfg.eval, it):
            row.update(evaluate.during_ppo(actor, enc, heldout, run, ref, rm, cfg.eval))
        metrics.append(dist.reduce_row(row, same=SAME, summed=SUMMED, maxed=MAXED))
        if dist.is_main():
            store.save_json(metrics_path, metrics, lines=True)
        tblog.write(board, metrics[-1], "iter")
        eta = (time.time() - t0) / (it + 1) * (pc.ppo_iters - it - 1)
        log(log_line(row, pc.ppo_iters, eta))
        # 6. save
        if (it + 1) % pc.save_interval == 0 or it + 1 == pc.ppo_iters:
            state.save_ppo_state(*saved, it + 1, metrics, **trained)
    # --stop_kl: the last actor under the budget, saved as a finished run.
    if limit is not None and limit.stopped:
        state.save_ppo_state(*saved, pc.ppo_iters, metrics, **trained)
        log(limit.stop_line())
    tblog.close(board)
    return metrics, kl_ctl.value
