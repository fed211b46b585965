"""Evaluation: what a policy writes for held-out prompts, what it earns, what it costs; the report
and the plot.

    python train.py --stage=report      # pretrained model vs RLHF actor, side by side
                                        # -> out/report.md, report.json
The ppo and report stages and lab/ablate.py all score through `evaluate_policy`, so every row of
every table is measured the same way: same prompts, same sampling seed, same metrics; the pretrain
stage and lab/ablate.py's examples use `sample_texts` and `judge_texts`.
Best-of-k, the pass@k of this world (`best_of_k`): n = --bestofk_n samples for each of n_eval / n
held-out prompts (spread over the subjects; the same sample budget as the evaluation), and for
k = 1, 2, 4, 8, 16 the expected best gold score among k of them and pass@k, a pass being a
well-formed response with gold above --pass_gold (default 1.25: the pretrained model passes
about 26 % of the time and its pass@16 is 1.0), and again, from the same samples, above
--pass_gold_hard (default 2.0: the pretrained model's pass@16 is 0.67, so a policy that narrows
can show it). Both are the unbiased estimators over the n samples (Chen et al. 2021): every
k-subset of the n counted.
--eval_every=N evaluates the actor during PPO (`during_ppo`), every N iterations, on --eval_n
held-out samples: the trajectory of gold, proxy and KL that lab/ablate.py --suite=overopt fits.
Left out: confidence intervals, per-token views.
"""
from dataclasses import dataclass
import math, os, time
import numpy as np
import torch

import data
from kl import kl_full
from model import response_logits, token_logprobs
from reward import score as reward_score
from sequences import encode_prompts, join_tokens, response_mask
from machinery import progress, state, store
from machinery.config import arg
from machinery.precision import cast_once


@dataclass
class EvalConfig:
    n_eval: int = arg(200, "[1,100000]", "held-out samples in the final evaluation")
    bestofk_n: int = arg(16, "[1,100000]", "best-of-k, pass@k: samples per held-out prompt "
                         "(n_eval in all, at least one prompt's)")
    pass_gold: float = arg(1.25, help="pass@k: a pass is a well-formed response with gold above "
                           "this")
    pass_gold_hard: float = arg(2.0, help="pass@k again, from the same samples, at this harder "
                                "threshold (the default model's pass@16: 0.67)")
    eval_every: int = arg(0, ">=0", "PPO: evaluate the actor on held-out prompts every this many "
                          "iterations (eval/ columns of metrics.jsonl; 0 = off)")
    eval_n: int = arg(96, "[1,100000]", "--eval_every: samples per evaluation (held-out prompts "
                      "cycled, the same sampling noise each time)")


REPORT_COLUMNS = ["gold_mean", "gold_std", "proxy_mean", "kl", "wellformed_rate", "distinct_2",
                  "repetition_rate", "ref_ppl", "eos_rate", "response_length"]


def decode_responses(enc, response):
    """Texts of the responses (B, R) up to and including end-of-text (which decodes as data.EOT)."""
    m = response_mask(response, enc.eot_token)
    return [enc.decode(r[mk].tolist()) for r, mk in zip(response.cpu(), m.cpu())]


@torch.no_grad()
def sample_texts(model, enc, prompts, run, batch=100, label=""):
    """Responses (text) to a list of prompts; the randomness is torch's global generator. With a
    label, a terminal shows `label: done/total samples` while it samples (progress.counter)."""
    model.eval()
    out = []
    t0 = time.time()
    for i in range(0, len(prompts), batch):
        if label:
            progress.counter(label, i, len(prompts), "samples", t0)
        q, qm = (x.to(run.device) for x in encode_prompts(enc, prompts[i:i + batch]))
        # bf16: each weight cast once for the whole sampling, not once per token.
        with cast_once(model):
            resp, _ = model.generate(q, run.response_length, run.temperature, eos=enc.eot_token,
                                     mask=qm)
        out += decode_responses(enc, resp)
    if label:
        progress.counter(label, len(prompts), len(prompts), "samples", t0)
    return out


def judge_texts(prompts, texts):
    """Gold verdicts: well-formed rate, gold mean and std."""
    verdicts = [data.judge(p, r) for p, r in zip(prompts, texts)]
    gold = np.array([v["score"] for v in verdicts])
    stats = dict(wellformed_rate=float(np.mean([v["wellformed"] for v in verdicts])),
                 gold_mean=float(gold.mean()), gold_std=float(gold.std()))
    return stats, verdicts


@torch.no_grad()
def evaluate_policy(model, enc, prompts, run, ref, rm, n, batch=100):
    """n samples on the given prompts (cycled) and what they cost and earn: gold and proxy score,
    exact KL to the reference (nats per sequence), fluency (well-formed, perplexity under the
    reference), diversity (distinct-n, repetition), end-of-text rate. Returns (metrics,
    [(prompt, text, gold, proxy)]). A terminal shows `evaluating: done/n samples` meanwhile."""
    model.eval()
    prompts = [prompts[i % len(prompts)] for i in range(n)]
    kl, nll, ntok, proxy, texts, eos = [], 0.0, 0, [], [], []
    t0 = time.time()
    for i in range(0, n, batch):
        progress.counter("evaluating", i, n, "samples", t0)
        q, qm = (x.to(run.device) for x in encode_prompts(enc, prompts[i:i + batch]))  # (b, Tp)
        with cast_once(model):
            resp, _ = model.generate(q, run.response_length, run.temperature,
                                     eos=enc.eot_token, mask=qm)  # (b, R)
        m = response_mask(resp, enc.eot_token)  # (b, R)
        logits = response_logits(model, q, qm, resp, run.temperature)  # (b, R, V)
        ref_logits = ref.logits(q, qm, resp, run.temperature)  # (b, R, V)
        # The KL of each sequence, summed over its real tokens.
        kl += (kl_full(logits, ref_logits) * m).sum(1).tolist()
        nll, ntok = nll - (token_logprobs(ref_logits, resp) * m).sum().item(), ntok + m.sum().item()
        proxy += reward_score(rm, join_tokens(q, qm, resp, m), enc.eot_token).tolist()
        texts += decode_responses(enc, resp)
        eos += (resp == enc.eot_token).any(1).tolist()
    progress.counter("evaluating", n, n, "samples", t0)
    stats, verdicts = judge_texts(prompts, texts)
    bodies = [t.split(data.EOT)[0] for t in texts]
    metrics = dict(**stats, proxy_mean=float(np.mean(proxy)), kl=float(np.mean(kl)),
                   distinct_1=data.distinct_n(bodies, 1), distinct_2=data.distinct_n(bodies, 2),
                   repetition_rate=float(np.mean([v["repetition"] for v in verdicts])),
                   ref_ppl=math.exp(nll / ntok), eos_rate=float(np.mean(eos)),
                   response_length=ntok / n)
    examples = [(p, t, v["score"], s) for p, t, v, s in zip(prompts, texts, verdicts, proxy)]
    return metrics, examples


def due(cfg, it):
    """True when --eval_every asks for an evaluation after PPO iteration `it` (0-based)."""
    return cfg.eval_every > 0 and (it + 1) % cfg.eval_every == 0


@torch.no_grad()
def during_ppo(actor, enc, prompts, run, ref, rm, cfg):
    """--eval_every: `evaluate_policy` on cfg.eval_n samples of the held-out prompts, drawn from a
    random stream of its own (seeded by --seed, the same at every evaluation, so two evaluations
    differ only by the policy) and every other stream put back as it was, so a run with evaluation
    trains exactly as one without. The KL is to `ref`, the run's frozen reference. Returns the
    eval/ columns of a metrics row."""
    saved = state.rng_states()
    torch.manual_seed(run.seed + 20221019)
    m, _ = evaluate_policy(actor, enc, prompts, run, ref, rm, cfg.eval_n)
    state.set_rng_states(saved)
    names = ("gold_mean", "proxy_mean", "kl", "wellformed_rate", "distinct_2", "response_length",
             "eos_rate")
    return {f"eval/{k}": m[k] for k in names}


@torch.no_grad()
def step0_kl(pretrained, ref, enc, prompts, run, rm, n):
    """Exact KL (nats/sequence) from the pretrained model, i.e. the full fp32 reference, to `ref`,
    on n samples of the pretrained model on `prompts`: the error a cheap reference adds before any
    training."""
    return evaluate_policy(pretrained, enc, prompts, run, ref, rm, n)[0]["kl"]


def expected_best(scores, k):
    """E[max of k scores drawn without replacement from the n given]: the i-th smallest is the
    largest of a k-subset in C(i-1, k-1) of the C(n, k) subsets, so
    Σ_i C(i-1, k-1) / C(n, k) · x_(i) over the sorted scores."""
    x, n = sorted(scores), len(scores)
    return sum(math.comb(i - 1, k - 1) * x[i - 1] for i in range(k, n + 1)) / math.comb(n, k)


def pass_at_k(n, c, k):
    """P(at least one pass among k drawn without replacement from n samples of which c pass):
    1 - C(n-c, k)/C(n, k)."""
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


@torch.no_grad()
def best_of_k(model, enc, prompts, run, n, pass_gold, budget, ks=(1, 2, 4, 8, 16),
              pass_gold_hard=None):
    """n samples for each of budget // n prompts (at least 1, at most all, spread over the list);
    for each k <= n the mean over prompts of the expected best gold score of k samples and of
    pass@k (pass: well-formed with gold > pass_gold), and, with pass_gold_hard, pass@k of the same
    samples at that threshold (pass_at_hard). Randomness: torch's global generator. A terminal
    shows `best-of-k: done/total samples` meanwhile."""
    m = min(len(prompts), max(1, budget // n))
    prompts = [prompts[i * len(prompts) // m] for i in range(m)]
    # Each prompt n times in a row.
    rows = [p for p in prompts for _ in range(n)]
    texts = sample_texts(model, enc, rows, run, batch=256, label="best-of-k")
    verdicts = [data.judge(p, t) for p, t in zip(rows, texts)]
    groups = [verdicts[i:i + n] for i in range(0, len(verdicts), n)]
    ks = [k for k in ks if k <= n]
    best = [float(np.mean([expected_best([v["score"] for v in g], k) for g in groups])) for k in ks]

    def pass_curve(threshold):
        passes = [sum(v["wellformed"] and v["score"] > threshold for v in g) for g in groups]
        return [float(np.mean([pass_at_k(n, c, k) for c in passes])) for k in ks]
    out = dict(n=n, prompts=len(prompts), pass_gold=pass_gold, k=ks, best=best,
               pass_at=pass_curve(pass_gold))
    if pass_gold_hard is not None:
        out.update(pass_gold_hard=pass_gold_hard, pass_at_hard=pass_curve(pass_gold_hard))
    return out


def write_report(path_md, res, samples, n_eval, temperature, timings, made_by=""):
    """report.md: the two policies side by side, a few examples, the seconds per stage, and
    made_by (provenance.line: machine, commit, command) last."""
    title = f"# tether report ({n_eval} samples on held-out prompts, temperature {temperature})"
    lines = [title, "", "| metric | pretrained | rlhf |", "|---|---|---|"]
    lines += [f"| {k} | {res['pretrained'][k]:.3f} | {res['rlhf'][k]:.3f} |"
              for k in REPORT_COLUMNS]
    lines += ["", "Examples (gold, proxy):", ""]
    for i in range(min(4, n_eval)):
        for name in ("pretrained", "rlhf"):
            p, t, g, s = samples[name][i]
            lines.append(f"- {name:10s} [{g:+.2f}, {s:+.2f}] {p.strip()} | "
                         f"{t.replace(chr(10), ' / ')}")
    bok = {name: r["bestofk"] for name, r in res.items() if "bestofk" in r}
    if bok:
        b = next(iter(bok.values()))
        # The harder threshold's column where it was measured.
        hard = "pass_at_hard" in b
        heading = (f"Best-of-k on {b['prompts']} held-out prompts x {b['n']} samples: expected "
                   f"best gold of k, and pass@k (well-formed, gold > {b['pass_gold']}")
        heading += f"; hard: gold > {b['pass_gold_hard']}):" if hard else "):"
        heads = [f"best {name} | pass {name}" + (f" | hard {name}" if hard else "") for name in bok]
        header = "| k | " + " | ".join(heads) + " |"
        lines += ["", heading, "", header, "|---|" + ("---|" * (3 if hard else 2)) * len(bok)]
        for i, k in enumerate(b["k"]):
            cells = []
            for r in bok.values():
                cells += [f"{r['best'][i]:.3f}", f"{r['pass_at'][i]:.3f}"]
                cells += [f"{r['pass_at_hard'][i]:.3f}"] if hard else []
            lines.append(f"| {k} | " + " | ".join(cells) + " |")
    lines += ["", "Seconds per stage: " + ", ".join(f"{k} {v}" for k, v in timings.items())]
    lines += ["", made_by] if made_by else []
    text = "\n".join(lines) + "\n"
    store.write_text(path_md, text)
    return text


def plot_curves(rows, train_key, held_out_key, title, png, x="iter"):
    """A training curve: rows[train_key] at every step and rows[held_out_key] where a row has one
    (pretraining's validation loss, the reward model's held-out loss), against rows[x] (skipped
    without matplotlib)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, ax = plt.subplots(figsize=(6, 3.5))
    train = [r[train_key] for r in rows]
    ax.plot([r[x] for r in rows], train, lw=0.8, label=f"{train_key} (train)")
    held = [r for r in rows if held_out_key in r]
    ax.plot([r[x] for r in held], [r[held_out_key] for r in held], marker="o", label=held_out_key)
    ax.set_xlabel(x)
    ax.set_title(title, fontsize=9)
    ax.legend()
    fig.tight_layout()
    store.save_figure(fig, png)
    plt.close(fig)


def pyplot():
    """matplotlib's pyplot with the file-only backend, or None where matplotlib is not installed
    (the plots are skipped: stages.files)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def running_mean(values, k):
    """The mean of each value and the k - 1 before it (fewer at the start)."""
    total = np.cumsum(np.asarray(values, dtype=float))
    out = total.copy()
    out[k:] = total[k:] - total[:-k]
    return out / np.minimum(np.arange(1, len(out) + 1), k)


def plot_steps(ax, rows, x, key, label, color, smooth=True, faded=True, ls="-"):
    """rows[key] against rows[x], over the rows that have it. smooth: a noisy per-step curve as
    its running mean over a 25th of the steps, the raw values faded beneath it unless not faded;
    else the values as they are."""
    have = [r for r in rows if key in r]
    xs = [r[x] for r in have]
    ys = [r[key] for r in have]
    k = max(1, len(ys) // 25) if smooth else 1
    if k > 1 and faded:
        ax.plot(xs, ys, lw=0.6, alpha=0.3, color=color)
    if k > 1 and label:
        label = f"{label} (mean of {k})"
    # A short run's few points are marked: one step alone is no line.
    marker = "o" if len(ys) <= 20 else None
    ax.plot(xs, running_mean(ys, k), lw=1.2, color=color, label=label, ls=ls, marker=marker, ms=3)
    # Steps and iterations are whole numbers: so are the ticks.
    ax.xaxis.get_major_locator().set_params(integer=True)


def twin_legend(ax, twin):
    """One legend for an axis and its twin (the right-hand scale)."""
    handles, labels = ax.get_legend_handles_labels()
    more, more_labels = twin.get_legend_handles_labels()
    ax.legend(handles + more, labels + more_labels, fontsize=8)


def plot_points(ax, rows, x, key, label, color, marker="o"):
    """rows[key] as points, where a row has it (held-out numbers); nothing, and no legend entry,
    where none has."""
    have = [r for r in rows if key in r]
    if have:
        ax.plot([r[x] for r in have], [r[key] for r in have], marker=marker, ms=5, ls=":",
                color=color, label=label)
        ax.xaxis.get_major_locator().set_params(integer=True)


def plot_reward(rows, png):
    """The reward model's training per step: the Bradley-Terry loss and the batch's accuracy, with
    the held-out loss and accuracies (against the noisy labels and the gold order) after each epoch
    (skipped without matplotlib)."""
    plt = pyplot()
    if plt is None:
        return
    panels = 2 if any("accuracy" in r for r in rows) else 1
    fig, axes = plt.subplots(1, panels, figsize=(5.5 * panels, 3.8), squeeze=False)
    a = axes[0, 0]
    plot_steps(a, rows, "step", "loss", "train (batch)", "C0")
    plot_points(a, rows, "step", "val_loss", "held-out", "C3")
    a.set_title("Bradley-Terry loss", fontsize=10)
    if panels == 2:
        b = axes[0, 1]
        plot_steps(b, rows, "step", "accuracy", "train (batch)", "C0")
        plot_points(b, rows, "step", "acc_noisy", "held-out, noisy labels", "C3")
        plot_points(b, rows, "step", "acc_gold", "held-out, gold order", "C2", marker="s")
        b.set_title("accuracy: chosen scored above rejected", fontsize=10)
    for ax in axes[0]:
        ax.set_xlabel("step")
        ax.legend(fontsize=8)
    fig.tight_layout()
    store.save_figure(fig, png)
    plt.close(fig)


def plot_dpo(rows, png):
    """DPO's training per step: the loss, the implicit reward's margins (chosen and rejected) and
    accuracy; with --dpo_eval_every, a panel of the held-out KL and gold score (skipped without
    matplotlib)."""
    plt = pyplot()
    if plt is None:
        return
    evals = [r for r in rows if "eval/kl" in r]
    fig, axes = plt.subplots(1, 4 if evals else 3, figsize=(17 if evals else 13, 3.8))
    plot_steps(axes[0], rows, "step", "loss", "loss", "C0")
    axes[0].set_title("loss", fontsize=10)
    plot_steps(axes[1], rows, "step", "rewards/margins", "margin", "C0")
    plot_steps(axes[1], rows, "step", "rewards/chosen", "chosen", "C2", faded=False)
    plot_steps(axes[1], rows, "step", "rewards/rejected", "rejected", "C3", faded=False)
    axes[1].axhline(0, color="grey", lw=0.5)
    axes[1].set_title("implicit reward β·log(π/π_ref)", fontsize=10)
    plot_steps(axes[2], rows, "step", "rewards/accuracies", "accuracy", "C0")
    axes[2].set_ylim(0, 1)
    axes[2].set_title("accuracy: margin > 0", fontsize=10)
    if evals:
        plot_points(axes[3], evals, "step", "eval/kl", "KL to the reference", "C3")
        gold = axes[3].twinx()
        plot_points(gold, evals, "step", "eval/gold_mean", "gold (right axis)", "C2", marker="s")
        gold.set_ylabel("gold score")
        axes[3].set_ylabel("KL, nats/sequence")
        axes[3].set_xlabel("step")
        axes[3].set_title("held-out samples", fontsize=10)
        twin_legend(axes[3], gold)
    for ax in axes[:3]:
        ax.set_xlabel("step")
        ax.legend(fontsize=8)
    fig.tight_layout()
    store.save_figure(fig, png)
    plt.close(fig)


# ppo.png's panels: (title, [(key, label)]); a panel whose first key no row holds is left out.
PPO_PANELS = [("score", [("objective/scores", "proxy (reward model)"),
                         ("objective/gold", "gold (simulated human)")]),
              ("KL to the reference (nats/seq) and β", [("objective/kl_exact", "KL")]),
              ("entropy (nats/token)", [("policy/entropy_avg", "")]),
              ("clip fraction", [("policy/clipfrac_avg", "")]),
              ("approx KL to the rollout policy", [("policy/approxkl_avg", "")]),
              ("value loss", [("loss/value_avg", "")]),
              ("explained variance", [("val/explained_variance", "")]),
              ("response length (tokens)", [("val/response_length", "")])]
# The critic's panels: left out for grpo and rloo, which log zeros there.
CRITIC = ("loss/value_avg", "val/explained_variance")


def plot_metrics(rows, png, critic=True):
    """What a PPO user reads, per iteration, one panel each: proxy and gold score (held-out ones too
    with --eval_every), the exact KL to the reference with β (and the rollouts --kl_max undid),
    entropy, clip fraction, approxkl, value loss, explained variance and response length; the
    critic's two without a critic (skipped without matplotlib)."""
    plt = pyplot()
    if plt is None:
        return
    panels = [(t, keys) for t, keys in PPO_PANELS if any(keys[0][0] in r for r in rows)
              and (critic or keys[0][0] not in CRITIC)]
    cols = math.ceil(len(panels) / 2)
    fig, axes = plt.subplots(2, cols, figsize=(3.8 * cols, 6.5), squeeze=False)
    for ax in axes.flat[len(panels):]:
        ax.set_visible(False)
    for ax, (title, keys) in zip(axes.flat, panels):
        for i, (key, label) in enumerate(keys):
            plot_steps(ax, rows, "iter", key, label or None, f"C{i}", smooth=False)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("PPO iteration")
        if title == "score":
            plot_points(ax, rows, "iter", "eval/proxy_mean", "held-out proxy", "C0")
            plot_points(ax, rows, "iter", "eval/gold_mean", "held-out gold", "C1", marker="s")
        if keys[0][0] != "objective/kl_exact":
            if ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize=8)
            continue
        # The rollouts undone by --kl_max: the iterations where the count of rollbacks went up.
        undone = [(r["iter"], r["policy/kl_before_rollback"]) for p, r in zip([{}] + rows, rows)
                  if r.get("policy/rollbacks", 0) > p.get("policy/rollbacks", 0)]
        if undone:
            ax.scatter(*zip(*undone), color="C1", marker="x", label="rollout undone (--kl_max)")
        beta = ax.twinx()
        plot_steps(beta, rows, "iter", "objective/kl_coef", "β (right axis)", "C2", smooth=False,
                   ls="--")
        beta.tick_params(axis="y", colors="C2", labelsize=8)
        # From 0, so that a fixed β is a flat line, not noise magnified (β = 0: left as it is).
        top = 1.15 * max(r["objective/kl_coef"] for r in rows)
        if top > 0:
            beta.set_ylim(0, top)
        twin_legend(ax, beta)
    fig.tight_layout()
    store.save_figure(fig, png)
    plt.close(fig)


def plot_bestofk(curves, png):
    """Expected best gold of k and pass@k against k, one line per policy (the harder threshold's
    pass@k dashed, in the same colour): curves {name: best_of_k's dict}."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.5))
    for name, c in curves.items():
        a.plot(c["k"], c["best"], marker="o", label=name)
        line, = b.plot(c["k"], c["pass_at"], marker="o", label=name)
        if "pass_at_hard" in c:
            b.plot(c["k"], c["pass_at_hard"], marker="o", linestyle="--", color=line.get_color())
    b.set_ylim(0, 1)
    title = f"solid: gold > {c['pass_gold']}"
    if "pass_at_hard" in c:
        title += f"; dashed: gold > {c['pass_gold_hard']}"
    b.set_title(title, fontsize=9)
    pass_label = "pass@k (well-formed, gold above)"
    for ax, label in ((a, "expected best gold of k"), (b, pass_label)):
        ax.set_xscale("log", base=2)
        ax.set_xticks(c["k"], [str(k) for k in c["k"]])
        ax.set_xlabel("k (samples per prompt)")
        ax.set_ylabel(label)
        ax.legend(fontsize=7)
    fig.tight_layout()
    store.save_figure(fig, png)
    plt.close(fig)
