"""PPO for RLHF: the experience of one rollout, the clipped update, and the loop that runs them.

    python train.py --stage=ppo      # runs `train_ppo` on the pretrained actor, the frozen reference, the reward model

One iteration (find `# ---- ppo loop ----`), as in lm-human-preferences and TRL:
    rollout     the actor samples a response to each prompt (KV cache, temperature T); grpo, rloo: G per prompt
    experience  old log-probs from the actor (the rollout policy, never the reference), reference log-probs, critic
                values, the score (reward model or gold) minus missing_eos_penalty without end-of-text, rewards
                r_t = -β·kl_t with the score at the last real token, GAE advantages (whitened; grpo.py's), returns
    update      ppo_epochs passes over minibatches (`minibatches`: shuffled, or by length), each cut to its longest:
                ratio = π_θ/π_θ_old;  pg_losses = max(-A·ratio, -A·clip(ratio, 1-ε, 1+ε))
                vf_losses = ½ max((V - G)², (vpredclipped - G)²),  vpredclipped = V_old + clip(V - V_old, ±ε_v)
                actor and critic have separate optimizers and gradient clips: the value loss cannot slow the actor
    β           the controller is fed this rollout's exact KL to the penalty's reference
    anchor      --ref_update: frozen (π_ref), rolling (the last policy), sync (π_ref <- α·π_θ + (1-α)·π_ref every
                N iterations, on a copy) or reset (the copy <- π_θ every N iterations); saved in ppo_state.pt
    ptx         --ptx_coef > 0 adds ptx_coef x the language-model loss on pretraining windows (train.bin) to the
                actor's loss, as InstructGPT's PPO-ptx does: a second anchor, to the data
    rollback    --kl_max (ref.py): a first rollout above it brings back the last state under it, β raised, and is
                redone; its KL is logged as policy/kl_before_rollback
    log, save   one metrics dict and log line per iteration; a resumable state every save_interval iterations
Shapes: B batch, Tp prompt tokens (left-padded), R response tokens, V vocabulary; mask (B, R) is true up to and
including end-of-text. Names follow lm-human-preferences and TRL: lastgaelam, vpredclipped, pg_losses, whiten.
Under torchrun (dist.py) each rank samples its share of rollout_batch, trains on minibatches of its share of
minibatch_size (ptx: own windows); gradients averaged, advantages whitened, β fed over all ranks, metrics reduced.
Left out: a value head sharing the actor's trunk, reward whitening, early stopping on approx-KL.
"""
from collections import defaultdict
from dataclasses import asdict, dataclass, replace
import os, time
import torch

import data, dist, grpo, store
from config import arg
from errors import RunError
from kl import FULL, kl_full, make_kl_controller, per_token_kl, shaped_rewards
from model import (StepGuard, adamw, cast_once, encode_prompts, entropy_from_logits, join_tokens, masked_mean,
                   response_logits, response_mask, rng_states, set_rng_states, token_logprobs)
from ref import Reference, Rollback, load_trainable
from reward import gold_scores, response_values, score as reward_score


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
    missing_eos_penalty: float = arg(1.0, ">=0", "subtracted from the score of a response without end-of-text")
    save_interval: int = arg(10, ">0", "iterations between resumable checkpoints")
    n_eval: int = arg(200, "[1,100000]", "held-out samples in the final evaluation")
    bestofk_n: int = arg(16, "[1,100000]", "best-of-k, pass@k: samples per held-out prompt (n_eval in all, at "
                         "least one prompt's)")
    pass_gold: float = arg(1.25, help="pass@k: a pass is a well-formed response with gold above this")
    ptx_coef: float = arg(0.0, ">=0", "γ: weight of the pretraining LM loss (train.bin windows) in the actor's loss")
    reward: str = arg("model", help="model (the reward model) or gold (the simulated human)", choices=["model", "gold"])
    advantage: str = arg("gae", help="gae (a critic) or, with no critic, grpo or rloo", choices=["gae", "grpo", "rloo"])
    group_size: int = arg(8, ">0", "grpo, rloo: samples per prompt (rollout_batch must be divisible by it)")
    grpo_scale: str = arg("std", help="grpo: divide by the group's std, or none (Dr. GRPO)", choices=["std", "none"])
    minibatch_order: str = arg("shuffle", help="length: minibatches of similar lengths, in random order (less "
                               "padding; each response, not token, weighs alike)", choices=["shuffle", "length"])


def whiten(x, mask):
    """Normalise x to zero mean, unit variance over the real tokens; 0 outside the mask. Under torchrun the mean
    and variance are over every rank's tokens (sums and counts all-reduced), as if one process held the batch."""
    n = dist.all_reduce(mask.sum().float()).clamp(min=1)
    mean = dist.all_reduce(torch.where(mask, x, 0.0).sum()) / n
    var = dist.all_reduce(torch.where(mask, (x - mean) ** 2, 0.0).sum()) / n
    return torch.where(mask, (x - mean) * torch.rsqrt(var + 1e-8), 0.0)


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


@torch.no_grad()
def make_experience(actor, critic, ref, pen_ref, rm, query, query_mask, response, eos, beta, kl_cfg, cfg,
                    temperature, gold=None, gold_norm=(0.0, 1.0)):
    """Everything the update needs from one rollout (query (B, Tp) left-padded, response (B, R) as sampled).
    ref is the frozen reference; pen_ref the one the penalty uses (ref, or the previous policy when rolling); critic
    None: grpo, rloo; gold (B,): the simulated human's scores (--reward=gold: the score). Returns (batch, info)."""
    mask = response_mask(response, eos)                                                        # (B, R)
    truncated = ~(response == eos).any(1)                                                      # (B,) no end-of-text
    penalty = cfg.missing_eos_penalty * truncated                          # the reward model never saw such text
    scores = reward_score(rm, join_tokens(query, query_mask, response, mask), eos) - penalty    # (B,)
    reward = scores if cfg.reward == "model" else (gold.to(scores) - gold_norm[0]) / gold_norm[1] - penalty  # (B,)
    logits = response_logits(actor, query, query_mask, response, temperature)                  # (B, R, V)
    old_logprobs = token_logprobs(logits, response)                                            # (B, R) rollout policy
    ref_logits = ref.logits(query, query_mask, response, temperature)                          # (B, R, V)
    pen_logits = ref_logits if pen_ref is ref else pen_ref.logits(query, query_mask, response, temperature)
    pen_logprobs = token_logprobs(pen_logits, response)                                        # (B, R)
    values = 0 * old_logprobs if critic is None else response_values(critic, query, query_mask, response)  # (B, R)
    kl = per_token_kl(kl_cfg.kl_estimator, old_logprobs, pen_logprobs, logits, pen_logits, mask)  # (B, R)
    in_reward = kl if kl_cfg.kl_in == "reward" else torch.zeros_like(kl)       # loss form: the update pays it
    rewards = shaped_rewards(reward, in_reward, mask, beta)                                    # (B, R)
    if cfg.advantage == "gae":
        advantages, returns = compute_gae(rewards, values, mask, cfg.gamma, cfg.lam)           # (B, R) each
    else:                       # grpo, rloo: the sequence reward against its group's, on every token; not whitened
        advantages = returns = grpo.advantages(rewards, mask, cfg)                             # (B, R)
    batch = dict(query=query, query_mask=query_mask, response=response, mask=mask, old_logprobs=old_logprobs,
                 values=values, advantages=whiten(advantages, mask) if cfg.advantage == "gae" else advantages,
                 returns=returns)
    if kl_cfg.kl_in == "loss":
        batch["ref_logprobs"] = pen_logprobs
        if kl_cfg.kl_estimator in FULL:
            batch["ref_logits"] = pen_logits
    info = dict(scores=scores, reward=reward, gold=gold, truncated=truncated, rewards=rewards, mask=mask,
                advantages=torch.where(mask, advantages, 0.0),            # (B, R) before whitening: inspect page
                kl=torch.where(mask, kl, 0.0),                            # (B, R) the estimator, as penalised
                non_score=torch.where(mask, -beta * in_reward, 0.0).sum(1),  # (B,) the penalty the rewards hold
                kl_exact=(kl_full(logits, ref_logits) * mask).sum(1),     # (B,) exact, to the frozen reference
                kl_pen=(kl_full(logits, pen_logits) * mask).sum(1))       # (B,) exact, what β controls
    return batch, info


def minibatches(lengths, size, order):
    """One epoch's minibatches for responses of `lengths` (B,): index tensors, each response once, `size` a piece (the
    last may be smaller), from one torch.randperm. shuffle: the permutation, cut. length: it, stably sorted by length
    (ties in its random order; all of it, not in chunks: the default has 4 minibatches), cut, each piece put where
    shuffle puts its minibatch of the same rank by mean length, then variance. Equal lengths give shuffle's minibatches;
    the order is random, independent of what the pieces hold. Unbiased only in that an epoch trains on every response
    once (a per-response loss, the KL loss, sums alike): a piece is no uniform sample, and token means divide by its
    tokens, about size x L: each response weighs about alike (GRPO's 1/|o|), not each token (shuffle)."""
    perm = torch.randperm(len(lengths))
    pieces = perm.split(size)                                                  # shuffle's minibatches
    if order == "shuffle":
        return pieces
    moments = [(x.mean().item(), x.var(unbiased=False).item()) for x in (lengths[p].double() for p in pieces)]
    ranked = sorted(range(len(pieces)), key=moments.__getitem__)     # by mean length, then variance; ties: as drawn
    by_length = perm[lengths[perm].argsort(stable=True)].split([len(pieces[j]) for j in ranked])
    return [by_length[ranked.index(j)] for j in range(len(pieces))]  # the k-th shortest where shuffle's k-th was


def ppo_update(actor, critic, opts, guards, batch, cfg, temperature, beta=0.0, kl_cfg=None, ptx_batch=None):
    """ppo_epochs passes of `minibatches` over one rollout. opts and guards: (actor's, critic's). ptx_batch: with
    ptx_coef > 0, a function returning pretraining windows (x, y) for each minibatch. Returns each logged statistic's
    mean, and ratio_dev_first: max |ratio - 1| on the first minibatch, 0 when the old log-probs are the sampler's."""
    stats, actor_params = defaultdict(list), list(actor.parameters())
    for epoch in range(cfg.ppo_epochs):
        for idx in minibatches(batch["mask"].sum(1).cpu(), cfg.minibatch_size, cfg.minibatch_order):   # (B,) lengths
            mb = {k: v[idx] for k, v in batch.items()}
            n = int(mb["mask"].sum(1).max())          # this minibatch's longest response: the rest is padding
            mb = {k: v if k.startswith("query") else v[:, :n] for k, v in mb.items()}
            q, qm, resp, mask = mb["query"], mb["query_mask"], mb["response"], mb["mask"]
            with cast_once(actor, critic):      # bf16: each weight cast once for this step's forwards (ptx: twice)
                logits = response_logits(actor, q, qm, resp, temperature)                       # (b, R, V)
                logprobs = token_logprobs(logits, resp)                                          # (b, R)
                pg_loss, clipfrac, approxkl, ratio = policy_loss(logprobs, mb["old_logprobs"], mb["advantages"],
                                                                  mask, cfg.cliprange)
                entropy = masked_mean(entropy_from_logits(logits if cfg.ent_coef else logits.detach()), mask)
                actor_loss = pg_loss - cfg.ent_coef * entropy
                kl_loss = ptx_loss = vf_loss = vf_clipfrac = torch.zeros(())      # unless their term is on
                if kl_cfg is not None and kl_cfg.kl_in == "loss":  # the estimator, differentiated, summed per sequence
                    kl = per_token_kl(kl_cfg.kl_estimator, logprobs, mb["ref_logprobs"], logits, mb.get("ref_logits"),
                                      mask)
                    kl_loss = torch.where(mask, kl, 0.0).sum(1).mean()
                    actor_loss = actor_loss + beta * kl_loss
                if cfg.ptx_coef > 0:                                 # InstructGPT's pretraining mix
                    _, ptx_loss = actor(*ptx_batch())
                    actor_loss = actor_loss + cfg.ptx_coef * ptx_loss
                if critic is not None:                        # grpo, rloo: no critic, no value loss (opts: the actor's)
                    vpred = response_values(critic, q, qm, resp)                                # (b, R)
                    vf_loss, vf_clipfrac = value_loss(vpred, mb["values"], mb["returns"], mask, cfg.cliprange_value)
            if critic is not None:                            # the steps after the window: no stale bf16 copy
                guards[1].step(vf_loss, opts[1], list(critic.parameters()), cfg.max_grad_norm)
            if not stats["ratio_dev_first"]:
                dev = (torch.exp(logprobs - mb["old_logprobs"]) - 1).abs()
                stats["ratio_dev_first"].append(torch.where(mask, dev, 0.0).max().item())
            guards[0].step(actor_loss, opts[0], actor_params, cfg.max_grad_norm)
            for k, v in dict(pg_loss=pg_loss, vf_loss=vf_loss, clipfrac=clipfrac, approxkl=approxkl, ratio=ratio,
                             vf_clipfrac=vf_clipfrac, entropy=entropy, kl_loss=kl_loss, ptx_loss=ptx_loss).items():
                stats[k].append(v.item())
    return {k: sum(v) / len(v) for k, v in stats.items()}


def make_optimizers(actor, critic, cfg):
    """One AdamW each: the critic's loss never reaches the actor's step or its gradient clip. The actor's holds only
    what it trains (--ref=lora: the adapters; --ref=shared_n: the top blocks). No critic: the actor's alone."""
    opts = (adamw([p for p in actor.parameters() if p.requires_grad], cfg.ppo_lr, eps=1e-5, weight_decay=0.0),)
    return opts if critic is None else opts + (adamw(critic.parameters(), cfg.vf_lr, eps=1e-5, weight_decay=0.0),)


def say(line):
    """One log line, flushed at once, so `python train.py | tee log` shows each iteration as it ends."""
    print(line, flush=True)


# What ppo_state.pt holds besides its stamp: what a resumed run needs to end as an uninterrupted one.
PPO_STATE = ["iter", "actor", "critic", "opts", "skipped", "kl_ctl", "prompt_gen", "rng", "pen_ref", "rollback",
             "metrics"]


def train_ppo(actor, critic, ref, rm, enc, prompts, cfg, run_dir, stamp, log=say, gold_norm=(0.0, 1.0)):
    """PPO from the given actor and critic (both trained in place; None: grpo, rloo) against the frozen reference
    `ref` and the reward model `rm` (gold_norm: --reward=gold's). Writes run_dir/metrics.jsonl every iteration and
    run_dir/ppo_state.pt every save_interval iterations; a state whose `stamp` (config and input hashes) matches is
    resumed, so an interrupted run ends with the same numbers as an uninterrupted one. Returns (metrics, final β)."""
    run, kc, pc = cfg.run, cfg.kl, cfg.ppo
    eos, device, G = enc.eot_token, run.device, 1 if pc.advantage == "gae" else pc.group_size   # G rows per prompt
    n_ranks, rank = dist.world(), dist.rank()                  # torchrun: each rank samples and trains on its share
    local = replace(pc, rollout_batch=pc.rollout_batch // n_ranks, minibatch_size=pc.minibatch_size // n_ranks)
    opts = make_optimizers(actor, critic, pc)
    guards = (StepGuard("PPO (actor)"), StepGuard("PPO (critic)"))
    kl_ctl = make_kl_controller(kc, pc.ppo_iters * pc.rollout_batch)
    pen_ref = ref                       # the penalty's reference: ref until rolling, sync or reset replaces it
    rollback = Rollback(cfg.ref) if cfg.ref.kl_max else None          # --kl_max: the last good state
    prompt_gen = torch.Generator().manual_seed(run.seed)
    ptx_gen = torch.Generator().manual_seed(run.seed + 7 + 1000003 * rank)   # own stream (ptx_coef=0 changes
    ptx_batch = data.pretraining_batches(os.path.join(run.out_dir, "train.bin"), local.minibatch_size,
                                         cfg.gpt.block_size, ptx_gen, device) if pc.ptx_coef > 0 else None   # nothing)
    metrics, start = [], 0
    dist.seed_rank(run.seed)                                   # torchrun: each rank its own sampling noise
    state_path, metrics_path = os.path.join(run_dir, "ppo_state.pt"), os.path.join(run_dir, "metrics.jsonl")
    # Same config, same inputs: go on where it stopped (on the CPU: RNG states must stay there).
    s, why = store.load_resumable(state_path, stamp, PPO_STATE)
    if s is not None:
        load_trainable(actor, s["actor"])                                   # frozen weights: from ref.pt
        if critic is not None:
            critic.load_state_dict(s["critic"])
        for o, sd in zip(opts, s["opts"]):
            o.load_state_dict(sd)
        for g, n in zip(guards, s["skipped"]):
            g.skipped = n
        kl_ctl.__dict__.update(s["kl_ctl"])
        if s["pen_ref"] is not None:
            pen_ref = Reference(actor)
            pen_ref.model.load_state_dict(s["pen_ref"])
        if rollback is not None:
            rollback.load_state_dict(s["rollback"])
        prompt_gen.set_state(s["prompt_gen"])
        rng = dist.mine(s["rng"], state_path)                               # this rank's
        set_rng_states(rng)
        ptx_gen.set_state(rng["ptx"])
        metrics, start = s["metrics"], s["iter"]
        # The log as the state has it: a kill after the last iteration leaves no iteration to write it.
        if dist.is_main():
            store.save_json(metrics_path, metrics, lines=True)
        log(f"ppo: resuming from {state_path} after iteration {start}")
    elif why != "missing":
        log(f"ppo: {state_path} is {why}; starting over")
    t0 = time.time() - (metrics[-1]["time/elapsed"] if metrics else 0.0)
    # ---- ppo loop ----
    for it in range(start, pc.ppo_iters):
        t_it = time.time()
        idx = torch.randint(len(prompts), (pc.rollout_batch // G,), generator=prompt_gen).repeat_interleave(G).tolist()
        idx = idx[rank * local.rollout_batch:(rank + 1) * local.rollout_batch]             # torchrun: this rank's
        batch_prompts = [prompts[i] for i in idx]
        q, qm = (x.to(device) for x in encode_prompts(enc, batch_prompts))                      # (B, Tp)
        for m in (actor, critic) if critic is not None else (actor,):
            m.eval()                                               # dropout off during RL; gradients still flow
        def rollout():
            # 1. rollout: the actor as it is now is the rollout policy π_θ_old
            resp, _ = actor.generate(q, run.response_length, run.temperature, eos=eos, mask=qm)    # (B, R)
            gold = gold_scores(enc, batch_prompts, resp)                                           # (B,)
            # 2. experience
            return resp, kl_ctl.value, *make_experience(actor, critic, ref, pen_ref, rm, q, qm, resp, eos,
                                                        kl_ctl.value, kc, pc, run.temperature, gold, gold_norm)
        resp, beta, batch, info = rollout()
        if it == 0 and ref.exact and dist.all_reduce(info["kl_exact"].abs().max(), "max") > 1e-6:
            raise RunError(f"the first rollout is {info['kl_exact'].max().item():.3g} nats from the reference, not 0: "
                           "the actor does not start as the reference (a stale ref.pt?); redo with --fresh")
        kl_first = info["kl_exact"].mean().item()                 # the rollout --kl_max judges (logged, even if redone)
        moving = lambda: None if pen_ref is ref else pen_ref      # a moving anchor is rolled back with the actor
        if rollback and rollback.above(dist.all_reduce(kl_first, "mean")):     # torchrun: one decision for all
            pen_ref = rollback.restore(actor, critic, opts, kl_ctl, moving()) or ref    # last state under, β up
            resp, beta, batch, info = rollout()                                          # and the rollout redone
        if rollback and dist.all_reduce(info["kl_exact"].mean().item(), "mean") <= cfg.ref.kl_max:
            rollback.keep(actor, critic, opts, kl_ctl, moving())         # under the limit: the state to come back to
        snapshot = Reference(actor) if kc.ref_update == "rolling" else None     # this iteration's policy, frozen
        # 3. update
        stats = ppo_update(actor, critic, opts, guards, batch, local, run.temperature, beta, kc, ptx_batch)
        # 4. β, and a moving reference moves on (sync and reset move a copy: the frozen π_ref never changes)
        kl_ctl.update(dist.all_reduce(info["kl_pen"].mean().item(), "mean"), pc.rollout_batch)   # same β everywhere
        if snapshot is not None:
            pen_ref = snapshot
        every = {"sync": kc.ref_sync_every, "reset": kc.ref_reset_every}.get(kc.ref_update)
        if every and (it + 1) % every == 0:
            pen_ref = Reference(pen_ref.model) if pen_ref is ref else pen_ref
            pen_ref.mix(actor, kc.ref_sync_alpha if kc.ref_update == "sync" else 1.0)
        # 5. log
        mask, scores = info["mask"], info["scores"]
        n_tok, dt = mask.sum().item(), time.time() - t_it
        row = {"iter": it + 1, "objective/kl": info["kl_exact"].mean().item(),
               "objective/kl_penalized": info["kl_pen"].mean().item(),
               "objective/kl_estimate": info["kl"].sum(1).mean().item(), "objective/kl_coef": beta,
               "objective/scores": scores.mean().item(), "objective/gold": info["gold"].mean().item(),
               "objective/non_score_reward": info["non_score"].mean().item(),
               "objective/rlhf_reward": (info["reward"] + info["non_score"]).mean().item(),
               "objective/missing_eos": info["truncated"].float().mean().item(), "objective/entropy": stats["entropy"],
               "policy/clipfrac_avg": stats["clipfrac"], "policy/approxkl_avg": stats["approxkl"],
               "policy/ratio_dev_first": stats["ratio_dev_first"],
               "policy/skipped_updates": guards[0].skipped + guards[1].skipped,
               "policy/rollbacks": rollback.count if rollback else 0, "policy/kl_before_rollback": kl_first,
               "loss/policy_avg": stats["pg_loss"], "loss/value_avg": stats["vf_loss"], "loss/kl_avg": stats["kl_loss"],
               "loss/ptx_avg": stats["ptx_loss"], "val/clipfrac_avg": stats["vf_clipfrac"], "val/ratio": stats["ratio"],
               "val/num_eos_tokens": (~info["truncated"]).float().sum().item(),
               "val/response_length": n_tok / len(resp),
               "time/tokens_per_second": n_tok / dt, "time/elapsed": time.time() - t0}
        metrics.append(dist.reduce_row(row, same=("iter", "objective/kl_coef", "policy/skipped_updates"),   # torchrun
                                       summed=("val/num_eos_tokens", "time/tokens_per_second"),
                                       maxed=("policy/ratio_dev_first",)))
        if dist.is_main():
            store.save_json(metrics_path, metrics, lines=True)
        eta = (time.time() - t0) / (it + 1) * (pc.ppo_iters - it - 1)
        log(f"iter {it + 1}/{pc.ppo_iters} | rm {row['objective/scores']:+.2f} | gold {row['objective/gold']:+.2f} | "
            f"kl {row['objective/kl']:.2f} | β {beta:.4f} | ent {row['objective/entropy']:.2f} | "
            f"clip {row['policy/clipfrac_avg']:.3f} | approxkl {row['policy/approxkl_avg']:.4f} | "
            f"vf {row['loss/value_avg']:.3f} | len {row['val/response_length']:.1f} | "
            f"{row['time/tokens_per_second']:.0f} tok/s | eta {int(eta // 60)}m{int(eta % 60):02d}s")
        if (it + 1) % pc.save_interval == 0 or it + 1 == pc.ppo_iters:
            rng = dist.gather_objects(dict(rng_states(), ptx=ptx_gen.get_state()))     # torchrun: every rank's
            if dist.is_main():
                store.save_torch(dict(stamp=stamp, iter=it + 1, actor=actor.state_dict(),
                                      critic=None if critic is None else critic.state_dict(),
                                      opts=[o.state_dict() for o in opts], skipped=[g.skipped for g in guards],
                                      kl_ctl=asdict(kl_ctl), prompt_gen=prompt_gen.get_state(), rng=rng,
                                      pen_ref=None if pen_ref is ref else pen_ref.model.state_dict(),
                                      rollback=rollback.state_dict() if rollback else None,
                                      metrics=metrics), state_path)
    return metrics, kl_ctl.value
