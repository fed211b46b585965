"""The tiny learned reward model: a pretrained GPT trunk plus a scalar head, fit to noisy human
preferences.

Preference data (`make_preferences`, train.py's `preferences` stage): for random training prompts,
two responses sampled from the pretrained model, labelled by the world's noisy annotator
(data.label_pair). The model is trained with the Bradley-Terry loss  -log σ(r_chosen - r_rejected)
on the score read at the last real token, in batches of pairs of about the same length, then
normalised (gain, bias) so that responses of the pretrained policy score mean 0, std 1. The critic
(ppo.py) is a copy of this model. Run via `python train.py --stage=reward`. Under torchrun each rank
trains on its share of every batch of pairs (machinery/dist.py); the scalar is computed in fp32 even
under bf16.
--reward=gold puts the simulated human in its place (`gold_scores`), in the same units:
`gold_normaliser` is the mean and std of the gold scores of the same pretrained samples
(prefs.jsonl).
Left out: ensembles, margin losses, reward-model uncertainty.
"""
import copy, random, time
from dataclasses import dataclass, asdict
import numpy as np
import torch
import torch.nn as nn
from torch.nn import functional as F

import data
from model import GPT, GPTConfig, response_hidden
from sequences import encode_prompts, join_tokens, pad_left, response_mask
from machinery import dist, progress, store, tblog
from machinery.config import arg
from machinery.optim import StepGuard, adamw
from machinery.precision import cast_once


@dataclass
class RewardConfig:
    n_pairs: int = arg(12000, ">0", "preference pairs (prompt, two pretrained samples, one noisy "
                       "label)")
    rm_layers: int = arg(2, ">=0", "the first blocks of the pretrained trunk that the reward "
                         "model, and so the critic, keeps (0, or more than --n_layer: all)")
    rm_epochs: int = arg(2, ">0")
    rm_lr: float = arg(1e-3, ">0")
    rm_batch_size: int = arg(32, ">0")
    rm_val_frac: float = arg(0.1, "(0,1)", "held-out pairs for the accuracies")
    # The reward stage takes 59 s for its 676 steps at the default on 2 cores (docs/speed.md): a
    # line every 4 s or so.
    rm_log_every: int = arg(50, ">0", "steps between log lines (loss, accuracy, eta; each epoch "
                            "prints its held-out line too); display only, the model is the same")


@torch.no_grad()
def make_preferences(model, enc, prompts, n_pairs, run, batch=500, log=print):
    """n_pairs rows: a random prompt, two responses of the model (text and prompt + response token
    ids), the annotator's noisy label (0: a preferred) and both gold scores. Randomness: run.seed
    and torch's generator. After each batch a line to `log`: pairs so far, pairs per second, the
    time left."""
    model.eval()
    rng = random.Random(run.seed)
    chosen = [rng.choice(prompts) for _ in range(n_pairs)]
    rows = []
    t0 = time.time()
    for i in range(0, n_pairs, batch):
        # Each prompt twice in a row: two samples per prompt.
        twice = [p for p in chosen[i:i + batch] for _ in range(2)]
        q, qm = encode_prompts(enc, twice)
        # bf16: each weight cast once for the whole sampling, not once per token.
        with cast_once(model):
            resp, _ = model.generate(q.to(run.device), run.response_length, run.temperature,
                                     eos=enc.eot_token, mask=qm.to(run.device))
        resp = resp.cpu()
        m = response_mask(resp, enc.eot_token)
        toks = join_tokens(q, qm, resp, m)
        texts = [enc.decode(r[k].tolist()) for r, k in zip(resp, m)]
        for j in range(0, len(twice), 2):
            p, a, b = twice[j], texts[j], texts[j + 1]
            rows.append(dict(prompt=p, a=a, b=b, label=data.label_pair(p, a, b, rng),
                             gold_a=data.gold_score(p, a), gold_b=data.gold_score(p, b),
                             tokens_a=toks[j], tokens_b=toks[j + 1]))
        rate = len(rows) / max(time.time() - t0, 1e-9)
        eta = (n_pairs - len(rows)) / rate
        log(f"preferences: {len(rows)}/{n_pairs} pairs | {rate:.0f} pairs/s | "
            f"eta {int(eta // 60)}m{int(eta % 60):02d}s")
    return rows


class ScalarModel(nn.Module):
    """A scalar per position (B, T): the reward model reads the last one, the critic one per
    response token. gain and bias are buffers (not trained) so that the normalised score is what
    every user reads."""

    def __init__(self, trunk):
        super().__init__()
        self.trunk = trunk
        self.head = nn.Linear(trunk.config.n_embd, 1)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)
        self.register_buffer("gain", torch.tensor(1.0))
        self.register_buffer("bias", torch.tensor(0.0))

    def forward(self, idx, mask=None):
        return self.from_hidden(self.trunk.hidden(idx, mask))                     # (B, T)

    def from_hidden(self, h):
        # In fp32 even under --dtype=bf16: a bf16 score keeps 3 digits and ties pairs.
        with torch.autocast(h.device.type, enabled=False):
            return self.head(h.float()).squeeze(-1) * self.gain + self.bias  # (B, T)


def response_values(critic, query, query_mask, response):
    """The critic's value (B, R) of the state before each response token (the prefix that
    predicts it)."""
    return critic.from_hidden(response_hidden(critic.trunk, query, query_mask, response))


def from_pretrained(lm, n_layers=0):
    """A ScalarModel whose trunk is a copy of the language model's first n_layers blocks
    (0 = all)."""
    trunk = copy.deepcopy(lm)
    if 0 < n_layers < len(trunk.blocks):
        trunk.blocks = trunk.blocks[:n_layers]
        trunk.config = GPTConfig(**{**asdict(trunk.config), "n_layer": n_layers})
    return ScalarModel(trunk)


def score(model, seqs, pad_id, batch=256):
    """Scores (N,) of token sequences (prompt + response, lists of ids): the value at the last
    token."""
    out = []
    for i in range(0, len(seqs), batch):
        # Left padding: the last position is real.
        idx, mask = pad_left(seqs[i:i + batch], pad_id)
        dev = next(model.parameters()).device
        out.append(model(idx.to(dev), mask.to(dev))[:, -1])
    return torch.cat(out)


def gold_scores(enc, prompts, response):
    """The simulated human's scores (B,) of responses (B, R) (up to end-of-text) to their prompts
    (text)."""
    mask = response_mask(response, enc.eot_token).cpu()  # (B, R)
    scores = [data.gold_score(p, enc.decode(r[m].tolist()))
              for p, r, m in zip(prompts, response.cpu(), mask)]
    return torch.tensor(scores, dtype=torch.float64)  # (B,)


def gold_normaliser(rows):
    """(mean, std) of the gold scores of prefs.jsonl's rows, both samples of each: the pretrained
    policy's, the samples the reward model is normalised on, so a normalised gold score is in the
    reward model's units."""
    scores = [g for row in rows for g in (row["gold_a"], row["gold_b"])]
    gold = torch.tensor(scores, dtype=torch.float64)
    # The std with n - 1, as the reward model's.
    return gold.mean().item(), gold.std().clamp(min=1e-6).item()


def labelled_pairs(rows):
    """prefs.jsonl's rows as pairs, each with the response the annotator chose first: token lists
    `chosen`, `rejected` (prompt + response ids), their gold scores, and the prompt."""
    pairs = []
    for r in rows:
        first, second = ("a", "b") if r["label"] == 0 else ("b", "a")
        pairs.append(dict(chosen=r[f"tokens_{first}"], rejected=r[f"tokens_{second}"],
                          gold_chosen=r[f"gold_{first}"], gold_rejected=r[f"gold_{second}"],
                          prompt=r["prompt"]))
    return pairs


def split_pairs(pairs, val_frac, rng):
    """(held-out, training) pairs: a permutation drawn from rng (numpy's), its first
    max(1, val_frac of them) held out. The reward model and DPO split prefs.jsonl the same way."""
    order = rng.permutation(len(pairs))
    n_val = max(1, int(len(pairs) * val_frac))
    return [pairs[i] for i in order[:n_val]], [pairs[i] for i in order[n_val:]]


def bt_loss(r_chosen, r_rejected):
    """Bradley-Terry negative log-likelihood of the labels: -log σ(r_chosen - r_rejected), batch
    mean."""
    return -F.logsigmoid(r_chosen - r_rejected).mean()


@torch.no_grad()
def held_out(rm, val, pad_id):
    """The Bradley-Terry loss and accuracies of rm on the held-out pairs `val` (against the noisy
    labels and, where the gold scores differ, the gold order), in eval mode; rm's mode is put back
    after."""
    was_training = rm.training
    rm.eval()
    rc = score(rm, [p["chosen"] for p in val], pad_id)
    rr = score(rm, [p["rejected"] for p in val], pad_id)
    rm.train(was_training)
    diffs = [p["gold_chosen"] - p["gold_rejected"] for p in val]
    gold_diff = torch.tensor(diffs, device=rc.device)
    decided = gold_diff != 0
    return dict(val_loss=bt_loss(rc, rr).item(), acc_noisy=(rc > rr).float().mean().item(),
                acc_gold=((rc - rr)[decided] * gold_diff[decided] > 0).float().mean().item())


def log_line(recent, steps, t0):
    """The line every rm_log_every steps: the last step of `steps`, the mean loss and accuracy of
    the `recent` rows, the milliseconds per step since t0 and the time left."""
    done = recent[-1]["step"]
    loss = np.mean([r["loss"] for r in recent])
    accuracy = np.mean([r["accuracy"] for r in recent])
    ms = (time.time() - t0) / done * 1e3
    return (f"reward model step {done}/{steps} | bt loss {loss:.3f} | acc {accuracy:.2f} | "
            f"{ms:.0f} ms/step | eta {progress.fmt_time(progress.eta(t0, done, steps))}")


def train_reward_model(lm, pairs, cfg, pad_id, seed=0, log=print, board=None):
    """pairs: list of dicts with token lists `chosen`, `rejected` and gold scores `gold_chosen`,
    `gold_rejected`. Returns (ScalarModel, stats with the held-out accuracy against the noisy
    labels and against the gold order, rows: one per step, each epoch's last with the held-out
    numbers). board: machinery/tblog.py's writer (--log_to), given each row as it is made."""
    rng = np.random.default_rng(seed)
    val, tr = split_pairs(pairs, cfg.rm_val_frac, rng)
    rm = from_pretrained(lm, cfg.rm_layers)
    # Under torchrun each rank draws its own dropout.
    dist.seed_rank(seed)
    rm.train()
    opt = adamw(rm.parameters(), cfg.rm_lr, weight_decay=0.0)
    steps = cfg.rm_epochs * ((len(tr) + cfg.rm_batch_size - 1) // cfg.rm_batch_size)
    # The learning rate decays linearly.
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 - s / max(1, steps))
    guard = StepGuard("reward model training")
    rows = []
    longest = np.array([max(len(p["chosen"]), len(p["rejected"])) for p in tr])
    t0 = time.time()
    for epoch in range(cfg.rm_epochs):
        # Batches of pairs of about the same length (little padding), in random order; ties are
        # broken at random.
        perm = rng.permutation(len(tr))
        perm = perm[np.argsort(longest[perm], kind="stable")]
        batches = [perm[i:i + cfg.rm_batch_size] for i in range(0, len(tr), cfg.rm_batch_size)]
        losses = []
        for b in rng.permutation(len(batches)):
            lr = sched.get_last_lr()[0]
            # Under torchrun: a share for every rank, or no step anywhere.
            if len(batches[b]) < dist.world():
                continue
            # Under torchrun: this rank's share.
            mb = [tr[j] for j in batches[b][dist.rank()::dist.world()]]
            r = score(rm, [p["chosen"] for p in mb] + [p["rejected"] for p in mb], pad_id)   # (2b,)
            loss = bt_loss(r[:len(mb)], r[len(mb):])
            guard.backward_and_step(loss, opt, list(rm.parameters()), 1.0)
            sched.step()
            losses.append(loss.item())
            accuracy = (r[:len(mb)] > r[len(mb):]).float().mean().item()
            rows.append(dict(step=len(rows) + 1, epoch=epoch + 1, loss=losses[-1],
                             accuracy=accuracy, lr=lr))
            tblog.write(board, rows[-1], "step")
            # Every rm_log_every steps, from the rows' numbers: nothing computed for it.
            if len(rows) % cfg.rm_log_every == 0:
                log(log_line(rows[-cfg.rm_log_every:], steps, t0))
        # The held-out pairs after each epoch; after the last, the numbers reward.json keeps.
        held = held_out(rm, val, pad_id)
        rows[-1].update(held)
        tblog.write(board, dict(held, step=rows[-1]["step"]), "step")
        log(f"reward model epoch {epoch + 1}/{cfg.rm_epochs}: bt loss {np.mean(losses):.3f}, "
            f"held-out {rows[-1]['val_loss']:.3f} (accuracy {rows[-1]['acc_noisy']:.1%})")
    rm.eval()
    with torch.no_grad():
        all_scores = score(rm, [s for p in pairs for s in (p["chosen"], p["rejected"])], pad_id)
    # Normalise on the pretrained policy's samples.
    rm.gain.fill_(1.0 / all_scores.std().clamp(min=1e-6).item())
    rm.bias.fill_(-all_scores.mean().item() * rm.gain.item())
    agree = [(p["gold_chosen"] > p["gold_rejected"]) for p in pairs
             if p["gold_chosen"] != p["gold_rejected"]]
    final = {k: rows[-1][k] for k in ("val_loss", "acc_noisy", "acc_gold")}
    stats = dict(n_train=len(tr), n_val=len(val), val_loss=final["val_loss"],
                 acc_noisy=final["acc_noisy"], skipped_updates=guard.skipped,
                 acc_gold=final["acc_gold"], annotator_agreement=float(np.mean(agree)))
    return rm, stats, rows


def save_scalar_model(model, path, **extra):
    ckpt = {"config": asdict(model.trunk.config), "model": model.state_dict(), **extra}
    store.save_torch(ckpt, path)


def load_scalar_model(path, device="cpu"):
    # On the CPU, then moved once.
    ckpt = store.load_torch(path)
    model = ScalarModel(GPT(GPTConfig(**ckpt["config"])))
    model.load_state_dict(ckpt["model"])
    return model.to(device).eval(), ckpt
