"""The reference inside the loss: DPO (Rafailov et al. 2023) and IPO (Azar et al. 2023), from the
pretrained model on prefs.jsonl's labelled pairs, with no reward model and no sampling.

    python train.py --stage=dpo                           # after the reward stage -> dpo.json
    python train.py --stage=dpo --dpo_loss=ipo --ipo_tau=0.1
    python train.py --stage=dpo --dpo_reference=none      # the log-likelihood difference alone
    python train.py --stage=dpo --dpo_epochs=4 --dpo_eval_every=28   # 4 passes, evaluated
    python train.py --stage=dpo --dpo_pairs=online        # the policy's own pairs, judged by the RM
    python -m pytest -q tests/test_dpo.py

For a pair (x, y_w chosen, y_l rejected) the policy's and the reference's log-probs of each
response, summed over its tokens up to and including end-of-text (`sequence_logprobs`, through
model.response_logits as PPO scores), give the margin
    h = (log π_θ(y_w|x) - log π_ref(y_w|x)) - (log π_θ(y_l|x) - log π_ref(y_l|x))
    DPO  loss = -log σ(β·h)          IPO  loss = (h - 1/(2τ))²
The reference is the frozen π_ref of ref.pt; its log-probs are computed once, before training
(`reference_logprobs`), by the same function as the policy's. --dpo_reference=none puts zeros in
their place: h is then the policy's log-likelihood difference alone (Liu, Liu & Cohan 2024). The
pairs are the reward model's training split of prefs.jsonl (reward.split_pairs, its seed);
its held-out split gives the implicit reward's accuracy against the noisy labels and the gold
order. The actor runs without dropout, as in PPO. Logged with TRL's DPOTrainer names:
rewards/chosen = c·(log π_θ(y_w) - log π_ref(y_w)) (c: β, or τ for IPO), rewards/rejected likewise,
rewards/margins their difference, rewards/accuracies the fraction with chosen above rejected,
logps/chosen and logps/rejected the policy's summed log-probs; each a mean over the batch.
--dpo_logps=mean averages each response's log-probs over its tokens (TRL's IPO convention) where
the paper sums them. --dpo_pairs=online (options/online.py) replaces the labelled pairs by the
policy's own: each round two answers to each drawn prompt, the judge's (the reward model's, or
the simulated human's) preferred one chosen, and one step on them.
Left out: label smoothing (cDPO), length normalisation (SimPO), more than one process (torchrun
is refused).
"""
from dataclasses import dataclass
import math, os, time
import numpy as np
import torch
from torch.nn import functional as F

from model import response_logits, token_logprobs
from reward import split_pairs
from sequences import encode_prompts
from machinery import optim, progress, state, store, tblog
from options import evaluate, online
from machinery.config import arg


@dataclass
class DPOConfig:
    dpo_loss: str = arg("dpo", help="dpo (-log σ(β·h)) or ipo ((h - 1/(2τ))²)",
                        choices=["dpo", "ipo"])
    dpo_beta: float = arg(0.1, ">0", "DPO's β: the weight of the log-ratio margin")
    ipo_tau: float = arg(0.1, ">0", "IPO's τ: the margin's target is 1/(2τ)")
    dpo_reference: str = arg("frozen", help="frozen (π_ref's log-probs in the margin) or none "
                             "(zeros: the log-likelihood difference alone)",
                             choices=["frozen", "none"])
    dpo_logps: str = arg("sum", help="each response's log-probs summed over its tokens (DPO's, "
                         "the paper's IPO) or averaged over them (TRL's IPO convention), in "
                         "policy and reference alike", choices=["sum", "mean"])
    dpo_pairs: str = arg("offline", help="offline (prefs.jsonl's labelled pairs) or online (each "
                         "round the policy's own two answers to a prompt, judged: "
                         "options/online.py)", choices=["offline", "online"])
    dpo_judge: str = arg("reward", help="online: who picks the chosen answer, the reward model "
                         "(PPO's proxy) or gold (the simulated human)", choices=["reward", "gold"])
    online_rounds: int = arg(60, "[1,100000]", "online: rounds, one DPO step each (PPO's "
                             "ppo_iters)")
    online_prompts: int = arg(32, "[1,100000]", "online: prompts a round, each answered twice "
                              "(64 answers: PPO's rollout_batch)")
    dpo_epochs: float = arg(1.0, ">0", "offline: passes over the training pairs (a fraction "
                            "allowed)")
    dpo_lr: float = arg(1e-4, ">0", "the policy's AdamW learning rate")
    dpo_batch_size: int = arg(32, ">0", "offline: pairs per step")
    dpo_eval_every: int = arg(0, ">=0", "steps between held-out evaluations of --eval_n samples "
                              "and the implicit reward's accuracy on --eval_n held-out pairs "
                              "(eval/ columns of dpo_metrics.jsonl; 0 = off)")
    dpo_save_every: int = arg(50, ">0", "steps between resumable states (dpo_state.pt)")
    # A step is 64 sequences forward and backward, some 0.5 s at the default on 2 cores (estimated
    # from pretraining's 0.3 s an iteration of 32 x 128 tokens): a line every 5 s or so.
    dpo_log_every: int = arg(10, ">0", "steps between log lines (loss, margins, accuracy, eta; "
                             "the last step prints one too); display only, the run is the same")


# The loss is fp32: β·h and IPO's (h - 1/(2τ))² must stay finite and meaningful for any margin a
# response of --response_length tokens can have (|h| is at most some 10^4 nats), so β is at most
# 10^6 and τ at least 10^-6 (a target of 5·10^5 nats, beyond any margin already).
MAX_BETA = 1e6
MIN_TAU = 1e-6


# The flags that mean something for one source of pairs only: set away from their defaults for
# the other, they would be ignored without a word, so they are refused.
OFFLINE_ONLY = ("dpo_epochs", "dpo_batch_size")
ONLINE_ONLY = ("dpo_judge", "online_rounds", "online_prompts")


def check(cfg):
    """Why the DPO settings cannot work, in one line; None when they can (train.parse)."""
    if cfg.run.stage == "dpo" and int(os.environ.get("WORLD_SIZE", 1)) > 1:
        return "--stage=dpo runs on one process: run it with python, not torchrun"
    defaults = DPOConfig()
    other = ONLINE_ONLY if cfg.dpo.dpo_pairs == "offline" else OFFLINE_ONLY
    for name in other:
        if getattr(cfg.dpo, name) != getattr(defaults, name):
            return (f"--{name}={getattr(cfg.dpo, name)} has no effect with "
                    f"--dpo_pairs={cfg.dpo.dpo_pairs}: drop it, or change --dpo_pairs")
    if cfg.dpo.dpo_beta > MAX_BETA:
        return (f"--dpo_beta={cfg.dpo.dpo_beta} is above {MAX_BETA:g}: β·h would leave fp32's "
                "range (the loss is then a step at h = 0, or infinite)")
    if cfg.dpo.ipo_tau < MIN_TAU:
        return (f"--ipo_tau={cfg.dpo.ipo_tau} is below {MIN_TAU:g}: the margin's target 1/(2τ) "
                "would leave fp32's range, far past any margin a response can have")
    n_train = cfg.reward.n_pairs - max(1, int(cfg.reward.n_pairs * cfg.reward.rm_val_frac))
    if cfg.dpo.dpo_pairs == "offline" and cfg.dpo.dpo_batch_size > n_train:
        return (f"--dpo_batch_size={cfg.dpo.dpo_batch_size} is more than the {n_train} training "
                f"pairs (--n_pairs={cfg.reward.n_pairs}, --rm_val_frac={cfg.reward.rm_val_frac})")
    return None


def pair_tensors(enc, pairs):
    """A batch of pairs as tensors: the prompts left-padded (2b, Tp), each once for its chosen and
    once for its rejected response (chosen first), the responses (2b, R) right-padded with
    end-of-text, and their masks (2b, R): True on each response's own tokens, its end-of-text
    included where it ended (a truncated response has none), never on the padding."""
    prompts = [p["prompt"] for p in pairs] * 2
    q, qm = encode_prompts(enc, prompts)  # (2b, Tp)
    prompt_lengths = qm.sum(1).tolist()
    halves = [p["chosen"] for p in pairs] + [p["rejected"] for p in pairs]
    responses = [seq[n:] for seq, n in zip(halves, prompt_lengths)]
    width = max(len(r) for r in responses)
    resp = torch.full((len(responses), width), enc.eot_token, dtype=torch.long)  # (2b, R)
    mask = torch.zeros(len(responses), width, dtype=torch.bool)  # (2b, R)
    for i, r in enumerate(responses):
        resp[i, :len(r)] = torch.tensor(r)
        mask[i, :len(r)] = True
    return q, qm, resp, mask


def sequence_logprobs(model, q, qm, resp, mask, temperature, mean=False):
    """log π(response | prompt) of each row (2b,): the token log-probs summed over the mask;
    mean: averaged over it instead (--dpo_logps=mean, TRL's IPO)."""
    logits = response_logits(model, q, qm, resp, temperature)  # (2b, R, V)
    total = torch.where(mask, token_logprobs(logits, resp), 0.0).sum(1)  # (2b,)
    if mean:
        return total / mask.sum(1)
    return total


def pair_logprobs(lp):
    """Each pair's (chosen, rejected) from pair_tensors' rows (2b,), chosen first: (b, 2)."""
    b = len(lp) // 2
    return torch.stack([lp[:b], lp[b:]], 1)  # (b, 2)


@torch.no_grad()
def all_pair_logprobs(model, enc, pairs, temperature, mean=False, batch=64, label=""):
    """`model`'s sequence log-probs of every pair, (n, 2): chosen, rejected (mean: per token); in
    batches. With a label, a terminal shows `label: done/n pairs` meanwhile (progress.counter)."""
    device = next(model.parameters()).device
    out = []
    t0 = time.time()
    for i in range(0, len(pairs), batch):
        if label:
            progress.counter(label, i, len(pairs), "pairs", t0)
        q, qm, resp, mask = (x.to(device) for x in pair_tensors(enc, pairs[i:i + batch]))
        lp = sequence_logprobs(model, q, qm, resp, mask, temperature, mean)  # (2b,)
        out.append(pair_logprobs(lp))
    if label:
        progress.counter(label, len(pairs), len(pairs), "pairs", t0)
    return torch.cat(out)  # (n, 2)


def reference_logprobs(ref, enc, pairs, temperature, mean=False, label="dpo: reference log-probs"):
    """The reference's sequence log-probs of every pair, (n, 2): chosen, rejected. Computed by
    sequence_logprobs, as the policy's are: offline once, before training (10,800 training pairs
    at the default: a terminal counts them); online for each round's pairs."""
    return all_pair_logprobs(ref.model, enc, pairs, temperature, mean, label=label)


def margins(policy, reference, cfg):
    """h (b,) from the policy's and the reference's (b, 2) log-probs (chosen, rejected);
    --dpo_reference=none: the policy's alone."""
    if cfg.dpo_reference == "none":
        reference = torch.zeros_like(reference)
    ratio = policy - reference  # (b, 2)
    return ratio[:, 0] - ratio[:, 1]  # (b,)


def dpo_losses(h, cfg):
    """Each pair's loss (b,): DPO's -log σ(β·h) (logsigmoid: finite at any margin), or IPO's
    (h - 1/(2τ))²."""
    if cfg.dpo_loss == "ipo":
        return (h - 1 / (2 * cfg.ipo_tau)) ** 2
    return -F.logsigmoid(cfg.dpo_beta * h)


def coefficient(cfg):
    """The weight of the log-ratios in the implicit reward: β (DPO) or τ (IPO), as TRL logs it."""
    return cfg.ipo_tau if cfg.dpo_loss == "ipo" else cfg.dpo_beta


def batch_metrics(policy, reference, losses, cfg):
    """TRL DPOTrainer's names for one batch (each a mean over its pairs)."""
    if cfg.dpo_reference == "none":
        reference = torch.zeros_like(reference)
    rewards = coefficient(cfg) * (policy - reference).detach()  # (b, 2)
    return {"loss": losses.mean().item(),
            "rewards/chosen": rewards[:, 0].mean().item(),
            "rewards/rejected": rewards[:, 1].mean().item(),
            "rewards/margins": (rewards[:, 0] - rewards[:, 1]).mean().item(),
            "rewards/accuracies": (rewards[:, 0] > rewards[:, 1]).float().mean().item(),
            "logps/chosen": policy[:, 0].mean().item(),
            "logps/rejected": policy[:, 1].mean().item()}


@torch.no_grad()
def implicit_accuracy(actor, ref, enc, pairs, cfg, temperature, reference=None):
    """The implicit reward's held-out accuracy: the fraction of pairs whose margin h ranks them as
    the noisy label does (acc_noisy) and, of the pairs whose gold scores differ, as the gold order
    does (acc_gold). reference: the reference's log-probs of these pairs (n, 2), when made
    already."""
    mean = cfg.dpo_logps == "mean"
    policy = all_pair_logprobs(actor, enc, pairs, temperature, mean)  # (n, 2)
    if reference is None:
        reference = reference_logprobs(ref, enc, pairs, temperature, mean, "")
    h = margins(policy, reference.to(policy), cfg).cpu()  # (n,)
    gold = torch.tensor([p["gold_chosen"] - p["gold_rejected"] for p in pairs])
    decided = gold != 0
    return dict(acc_noisy=(h > 0).float().mean().item(),
                acc_gold=((h[decided] > 0) == (gold[decided] > 0)).float().mean().item())


def evaluation_due(step, steps, dc, row):
    """True when --dpo_eval_every asks for an evaluation after `step` (0-based): every
    dpo_eval_every steps, at the last, and offline at the end of each pass over the pairs (so
    each epoch is read where it ends)."""
    at_epoch_end = "epoch" in row and float(row["epoch"]).is_integer()
    return (step + 1) % dc.dpo_eval_every == 0 or step + 1 == steps or at_epoch_end


def offline_batch(train, cached, order, step, per_epoch, dc, gen):
    """An offline step's pairs and their cached reference log-probs (b, 2): each epoch a
    permutation of the training pairs from the run's generator, cut into batches. Returns (pairs,
    reference, this epoch's permutation)."""
    if step % per_epoch == 0 or order is None:
        order = torch.randperm(len(train), generator=gen)
    k = step % per_epoch
    idx = order[k * dc.dpo_batch_size:(k + 1) * dc.dpo_batch_size]
    return [train[i] for i in idx.tolist()], cached[idx], order


def train_dpo(actor, ref, rm, enc, pairs, cfg, run_dir, stamp, log, prompts, split_seed,
              gold_norm):
    """DPO (or IPO) on `pairs` (reward.labelled_pairs of prefs.jsonl), the actor trained in place.
    Offline: the reward model's training split (split_seed: the seed the reward model was trained
    under), in batches drawn from a generator of --seed. Online: each round the pairs
    options/online.py makes from the actor's own answers to the training prompts (a generator of
    --seed draws them, as PPO's; gold_norm: the gold judge's units), one step each. Writes
    run_dir/dpo_metrics.jsonl as it goes and run_dir/dpo_state.pt every dpo_save_every steps, so a
    killed run resumes to an uninterrupted run's numbers; a line to `log` every dpo_log_every
    steps. rm: the proxy of the evaluations (and the online judge); prompts: {"train", "heldout"}.
    Returns (metrics, held-out pairs)."""
    run, dc = cfg.run, cfg.dpo
    mean = dc.dpo_logps == "mean"
    val, train = split_pairs(pairs, cfg.reward.rm_val_frac, np.random.default_rng(split_seed))
    if dc.dpo_pairs == "offline":
        cached = reference_logprobs(ref, enc, train, run.temperature, mean)  # (n, 2)
        per_epoch = math.ceil(len(train) / dc.dpo_batch_size)
        steps = max(1, math.ceil(dc.dpo_epochs * per_epoch))
    else:
        steps = dc.online_rounds
    # --dpo_eval_every: the implicit reward on the first --eval_n held-out pairs, its reference's
    # log-probs made once.
    probe = val[:cfg.eval.eval_n]
    probe_ref = None
    if dc.dpo_eval_every:
        probe_ref = reference_logprobs(ref, enc, probe, run.temperature, mean, "")
    opt = optim.adamw([p for p in actor.parameters() if p.requires_grad], dc.dpo_lr,
                      weight_decay=0.0)
    guard = optim.StepGuard("DPO", "lower --dpo_lr, or --dpo_beta (raise --ipo_tau)")
    gen = torch.Generator().manual_seed(run.seed)
    state_path = os.path.join(run_dir, "dpo_state.pt")
    metrics_path = os.path.join(run_dir, "dpo_metrics.jsonl")
    metrics, start, order = state.load_dpo_state(state_path, stamp, log, actor, opt, guard, gen)
    # The log as the state has it: a kill after the last step leaves no step to write it.
    if metrics:
        store.save_json(metrics_path, metrics, lines=True)
    t0 = time.time() - (metrics[-1]["time/elapsed"] if metrics else 0.0)
    # --log_to=tensorboard: this process's rows, as they come, in run_dir/tb/dpo/ too.
    board = tblog.open_log(run.log_to, run_dir, "dpo", start + 1)
    # Dropout off, as in PPO; gradients still flow.
    actor.eval()
    for step in range(start, steps):
        row = {"step": step + 1}
        # 1. This step's pairs, and the reference's log-probs of them.
        if dc.dpo_pairs == "offline":
            chunk, reference, order = offline_batch(train, cached, order, step, per_epoch, dc, gen)
            row["epoch"] = (step + 1) / per_epoch
        else:
            chunk, info = online.round_pairs(actor, rm, enc, prompts["train"], cfg, gen,
                                             gold_norm)
            row.update(info)
            # A round whose answers all tied has no pair: no step.
            if chunk:
                reference = reference_logprobs(ref, enc, chunk, run.temperature, mean, "")
        # 2. The policy's log-probs, the loss and a step.
        if chunk:
            q, qm, resp, mask = (x.to(run.device) for x in pair_tensors(enc, chunk))
            lp = sequence_logprobs(actor, q, qm, resp, mask, run.temperature, mean)  # (2b,)
            policy = pair_logprobs(lp)  # (b, 2)
            reference = reference.to(policy)  # (b, 2)
            losses = dpo_losses(margins(policy, reference, dc), dc)
            guard.backward_and_step(losses.mean(), opt, list(actor.parameters()), 1.0)
            row.update(batch_metrics(policy.detach(), reference, losses.detach(), dc))
        row.update({"skipped_updates": guard.skipped, "time/elapsed": time.time() - t0})
        # 3. With --dpo_eval_every: the policy on held-out prompts and the implicit reward on
        # held-out pairs, every so many steps, at the end of each epoch and at the last step.
        if dc.dpo_eval_every and evaluation_due(step, steps, dc, row):
            row.update(evaluate.during_ppo(actor, enc, prompts["heldout"], run, ref, rm,
                                           cfg.eval))
            implicit = implicit_accuracy(actor, ref, enc, probe, dc, run.temperature, probe_ref)
            row.update({f"eval/implicit_{k}": v for k, v in implicit.items()})
        metrics.append(row)
        store.save_json(metrics_path, metrics, lines=True)
        tblog.write(board, row, "step")
        # Every dpo_log_every steps and at the last, from the row: nothing computed for it.
        if (step + 1) % dc.dpo_log_every == 0 or step + 1 == steps:
            left = progress.fmt_time(progress.eta(t0, step + 1, steps))
            log(f"dpo step {step + 1}/{steps} | loss {row.get('loss', math.nan):.3f} | margins "
                f"{row.get('rewards/margins', math.nan):+.3f} | acc "
                f"{row.get('rewards/accuracies', math.nan):.2f} | logp chosen "
                f"{row.get('logps/chosen', math.nan):.1f} | eta {left}")
        if (step + 1) % dc.dpo_save_every == 0 or step + 1 == steps:
            state.save_dpo_state(state_path, stamp, step + 1, metrics, actor, opt, guard, gen,
                                 order)
    tblog.close(board)
    return metrics, val
