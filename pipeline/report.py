"""The report and the plots: report.md (the pretrained model and the RLHF actor side by side) and
each stage's PNG (pretraining's loss, the reward model's, PPO's grid, DPO's, best-of-k).

    python train.py --stage=report      # -> out/report.md, report.json, bestofk.png

The numbers come from options/evaluate.py (evaluate_policy, best_of_k); this file only writes
them. Plots are skipped where matplotlib is not installed.
Left out: interactive plots (python -m lab.plot overlays runs; --log_to=tensorboard streams them).
"""
import math
import numpy as np

from machinery import store
from options.evaluate import REPORT_COLUMNS


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
    fixed_layout(fig)
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


def fixed_layout(fig, right=0.3, wspace=0.35, hspace=0.55):
    """Margins in inches, the same on every figure: a y label on the left, a twin axis's on the
    right where `right` leaves room, a title above and an x label below. (tight_layout measures
    every label first: half of a plot's time, paid in every run and every test.)"""
    w, h = fig.get_size_inches()
    fig.subplots_adjust(left=0.75 / w, right=1 - right / w, bottom=0.6 / h, top=1 - 0.4 / h,
                        wspace=wspace, hspace=hspace)


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
    fixed_layout(fig, wspace=0.2)
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
    fixed_layout(fig, right=0.75 if evals else 0.3, wspace=0.25)
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
    fixed_layout(fig, right=0.45, wspace=0.45, hspace=0.5)
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
    fixed_layout(fig, wspace=0.3)
    store.save_figure(fig, png)
    plt.close(fig)
