"""The ablation's statistics, tables and plots: what ablate.py writes once its runs are done.

    python -m lab.ablate --suite=core        # runs the conditions (ablate.py), then writes these
                                         # into out/ablate/
`bootstrap_ci` is the percentile bootstrap interval of a mean over seeds; `paired_ci` the interval
of a condition minus the baseline condition, paired by seed; `verdict` says "not separated" where
that interval holds 0.
`summarise` (results.md), `ref_table` (the cheap-reference table), `beta_table` (β over the run)
and `plot` (scores.png, frontier.png, beta.png) read ablate.py's rows (one per condition and seed,
results.jsonl) and, for the curves, each run's metrics.jsonl in the folder `run_dir(condition,
seed)` ablate.py names.
Left out: corrections for many comparisons, intervals for the curves.
"""
import functools, json, math, os
import numpy as np

from machinery import store
from lab import overopt

# The paired comparisons are against this row (the main run's settings).
DEFAULT_CONDITION = "adaptive"
COLUMNS = ["proxy_mean", "gold_mean", "kl", "ref_ppl", "distinct_1", "distinct_2",
           "repetition_rate", "wellformed_rate", "eos_rate", "seconds"]


def verifiable_columns(k):
    """The verifiable suite's columns: variety and best-of-k (k the largest evaluated) next to gold,
    and what the critic costs (s_per_iter, critic_mb); and the columns its paired differences
    show."""
    return (["gold_mean", "proxy_mean", "kl", "wellformed_rate", "distinct_2", "entropy",
             f"best_{k}", "pass_1", f"pass_{k}", "hard_1", f"hard_{k}", "s_per_iter", "critic_mb"],
            ("gold_mean", "kl", "wellformed_rate", "distinct_2", "entropy", f"best_{k}", "pass_1",
             f"pass_{k}", "hard_1", f"hard_{k}", "s_per_iter"))


def bootstrap_ci(x, level=0.95, n_boot=10000, seed=0):
    """(mean, low, high): the percentile bootstrap interval of the mean of x, resampled with
    replacement with a fixed RNG seed, so a table is reproducible. With 3 seeds it is coarse (10
    distinct resampled means): honest."""
    x = np.asarray(x, dtype=float)
    n = len(x)
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, n, (n_boot, n))  # (n_boot, n)
    means = x[picks].mean(1)  # (n_boot,)
    lo, hi = np.quantile(means, [(1 - level) / 2, (1 + level) / 2])
    return float(x.mean()), float(lo), float(hi)


@functools.lru_cache(maxsize=None)
def t_quantile(p, df):
    """The p-quantile (p > 0.5) of Student's t with df degrees of freedom: the density integrated
    from 0 by Simpson's rule on a fine grid, the upper limit found by bisection (no scipy)."""
    def density(x):
        c = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)
        return np.exp(c - (df + 1) / 2 * np.log1p(x ** 2 / df))

    def cdf(x):
        grid = np.linspace(0.0, x, 4001)
        w = np.ones(4001)
        w[1:-1:2], w[2:-1:2] = 4.0, 2.0
        return 0.5 + float(w @ density(grid)) * (x / 4000) / 3
    lo, hi = 0.0, 1.0
    while cdf(hi) < p:
        hi *= 2
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if cdf(mid) < p else (lo, mid)
    return (lo + hi) / 2


def t_ci(x, level=0.95):
    """(mean, low, high): the Student-t interval of the mean of x, mean ± t·s/√n with n - 1
    degrees of freedom. Its coverage at small n is checked by simulation
    (tests/test_tables.py); the percentile bootstrap's is not what it says at 3 seeds."""
    x = np.asarray(x, dtype=float)
    n = len(x)
    half = t_quantile((1 + level) / 2, n - 1) * x.std(ddof=1) / math.sqrt(n)
    return float(x.mean()), float(x.mean() - half), float(x.mean() + half)


def paired_ci(rows, cond, base, col):
    """The bootstrap interval of cond - base in column col over the seeds both have (paired: same
    seed, same prompts, same first rollout). None below 2 shared seeds."""
    a, b = ({r["seed"]: r[col] for r in rows if r["condition"] == c} for c in (cond, base))
    seeds = sorted(set(a) & set(b))
    return bootstrap_ci([a[s] - b[s] for s in seeds]) + (len(seeds),) if len(seeds) >= 2 else None


def verdict(ci):
    mean, lo, hi, n = ci
    return f"{mean:+.3f} [{lo:+.3f}, {hi:+.3f}]" + (" not separated" if lo <= 0 <= hi else "")


def bestofk_cells(b):
    """best_k, pass_k and hard_k (pass@k at the harder threshold) columns (k = 1, 2, 4, 8, 16)
    from evaluate.best_of_k's dict."""
    return {**{f"best_{k}": v for k, v in zip(b["k"], b["best"])},
            **{f"pass_{k}": v for k, v in zip(b["k"], b["pass_at"])},
            **{f"hard_{k}": v for k, v in zip(b["k"], b["pass_at_hard"])}}


def bestofk_curves(rows, order, pass_gold, pass_gold_hard, ks=(1, 2, 4, 8, 16)):
    """{condition: the mean over seeds of its best-of-k curve and its pass@k curves at both
    thresholds}, as evaluate.plot_bestofk takes them."""
    def mean(c, col):
        return float(np.mean([r[col] for r in rows if r["condition"] == c]))
    return {c: dict(k=list(ks), pass_gold=pass_gold, pass_gold_hard=pass_gold_hard,
                    best=[mean(c, f"best_{k}") for k in ks],
                    pass_at=[mean(c, f"pass_{k}") for k in ks],
                    pass_at_hard=[mean(c, f"hard_{k}") for k in ks])
            for c in order if any(r["condition"] == c for r in rows)}


def bestofk_table(rows, order):
    """Markdown: expected best gold of k, pass@k and pass@k at the harder threshold (hard@k) for
    every k, mean over seeds, per condition."""
    ks = sorted(int(c[5:]) for c in rows[0] if c.startswith("best_"))
    kinds = ("best", "pass", "hard")
    heads = {"best": "best of {}", "pass": "pass@{}", "hard": "hard@{}"}
    header = "| condition | " + " | ".join(heads[c].format(k) for c in kinds for k in ks) + " |"
    lines = [header, "|---" * (len(kinds) * len(ks) + 1) + "|"]
    for cond in order:
        rs = [r for r in rows if r["condition"] == cond]
        if rs:
            means = [np.mean([r[f"{c}_{k}"] for r in rs]) for c in kinds for k in ks]
            cells = [f"{m:.3f}" for m in means]
            lines.append(f"| {cond} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def summarise(rows, order, base=DEFAULT_CONDITION, paired=("gold_mean", "kl", "proxy_mean"),
              columns=COLUMNS):
    """Markdown: mean [95 % bootstrap interval over seeds] per condition; then each condition minus
    `base` (or the suite's first condition), paired over seeds, where an interval that holds 0 reads
    "not separated"."""
    # A suite without `base` is compared against its first condition.
    base = base if base in order else next((c for c in order if c != "pretrained"), None)
    header = "| condition | seeds | " + " | ".join(columns) + " |"
    lines = [header, "|---" * (len(columns) + 2) + "|"]
    for cond in order:
        rs = [r for r in rows if r["condition"] == cond]
        if rs:
            if len(rs) > 1:
                cis = [bootstrap_ci([r[c] for r in rs]) for c in columns]
                cells = ["{:.3f} [{:.3f}, {:.3f}]".format(*ci) for ci in cis]
            else:
                # One seed: no interval.
                cells = [f"{rs[0][c]:.3f}" for c in columns]
            seeds = ",".join(str(r["seed"]) for r in rs)
            lines.append(f"| {cond} | {seeds} | " + " | ".join(cells) + " |")
    if base and len({r["seed"] for r in rows if r["condition"] == base}) < 2:
        lines += ["", "One seed: no intervals, no paired differences (run --seeds=3 or more)."]
    elif base:
        title = f"Paired differences against {base} (same seeds), 95 % bootstrap interval:"
        paired_header = "| condition | seeds | " + " | ".join(f"Δ {c}" for c in paired) + " |"
        lines += ["", title, "", paired_header, "|---" * (len(paired) + 2) + "|"]
        for cond in order:
            cis = [paired_ci(rows, cond, base, c) for c in paired]
            if cond not in (base, "pretrained") and cis[0]:
                diffs = " | ".join(verdict(ci) for ci in cis)
                lines.append(f"| {cond} | {cis[0][3]} | " + diffs + " |")
    return "\n".join(lines) + "\n"


REF_COLUMNS = [("bytes held for the reference", lambda r: r["ref"]["bytes"] / 1e6, "{:.2f} MB"),
               ("trainable actor state", lambda r: r["ref"]["trainable_bytes"] / 1e6, "{:.2f} MB"),
               ("KL to full ref, step 0", lambda r: r["ref"]["kl_step0"], "{:.1e}"),
               ("gold", lambda r: r["gold_mean"], "{:+.2f}"),
               ("proxy", lambda r: r["proxy_mean"], "{:+.2f}"),
               ("KL to full ref", lambda r: r["kl"], "{:.2f}"),
               ("KL to own ref", lambda r: r["ref"]["kl_own_ref"], "{:.2f}"),
               ("well-formed", lambda r: r["wellformed_rate"], "{:.2f}"),
               ("s / iteration", lambda r: r["ref"]["seconds_per_iter"], "{:.2f}"),
               ("rollbacks", lambda r: r["ref"]["rollbacks"], "{:.1f}")]


def ref_table(rows, order):
    """Markdown table "Making the reference cheap": bytes, step-0 KL, and the PPO run's results,
    mean [95 %]."""
    header = "| condition | " + " | ".join(c for c, _, _ in REF_COLUMNS) + " |"
    lines = [header, "|---" * (len(REF_COLUMNS) + 1) + "|"]
    for cond in order:
        rs = [r for r in rows if r["condition"] == cond and r.get("ref")]
        if rs:
            cells = []
            for _, get, fmt in REF_COLUMNS:
                v = [get(r) for r in rs]
                # The 95 % interval over seeds, shown where the seeds differ at all.
                m, lo, hi = bootstrap_ci(v)
                interval = f" [{fmt.format(lo)}, {fmt.format(hi)}]" if hi > lo else ""
                cells.append(fmt.format(m) + interval)
            lines.append(f"| `{cond}` | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def beta_table(run_dir, rows, order, at=(1, 0.25, 0.5, 0.75, 1.0)):
    """Markdown: β at the first iteration and at fractions of the run, mean over seeds, for the
    conditions whose β moves (read from each run's metrics.jsonl, in the folder run_dir(condition,
    seed)); empty when none does."""
    lines = []
    for cond in (c for c in order if c != "pretrained"):
        curves = []
        for r in (r for r in rows if r["condition"] == cond):
            with open(os.path.join(run_dir(cond, r["seed"]), "metrics.jsonl")) as f:
                curves.append([json.loads(line)["objective/kl_coef"] for line in f])
        if curves and len({round(b, 12) for c in curves for b in c}) > 1:
            n = len(curves[0])
            its = [1] + [max(1, round(f * n)) for f in at[1:]]
            means = [np.mean([c[i - 1] for c in curves]) for i in its]
            lines.append(f"| {cond} | " + " | ".join(f"{m:.4f}" for m in means) + " |")
            head = "| condition | " + " | ".join(f"β at iter {i}" for i in its) + " |"
    if not lines:
        return ""
    title = "\nβ over the run (mean over seeds; the β each iteration's rewards used):\n\n"
    rule = "|---" * (len(at) + 1) + "|\n"
    return title + head + "\n" + rule + "\n".join(lines) + "\n"


def plot(rows, adir, order, run_dir):
    """scores.png, frontier.png and beta.png into adir, from the rows and each run's metrics.jsonl
    (in the folder run_dir(condition, seed)); skipped without matplotlib."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharex=True)
    shown = ["no_kl", "rolling_ref", "fixed_0.005", "fixed_0.5", "adaptive"]
    for i, cond in enumerate(c for c in shown if c in order):
        curves = []
        for r in (r for r in rows if r["condition"] == cond):
            with open(os.path.join(run_dir(cond, r["seed"]), "metrics.jsonl")) as f:
                curves.append([json.loads(line) for line in f])
        if curves:
            it = [x["iter"] for x in curves[0]]
            for ax, key in zip(axes, ["objective/gold", "objective/scores"]):
                mean = np.mean([[x[key] for x in c] for c in curves], 0)
                ax.plot(it, mean, color=f"C{i}", label=cond)
    axes[0].set_title("gold score (simulated human)")
    axes[1].set_title("proxy score (reward model)")
    for ax in axes:
        ax.set_xlabel("PPO iteration")
    # A suite may plot none of these.
    if axes[1].get_legend_handles_labels()[0]:
        axes[1].legend(fontsize=8)
    fig.tight_layout()
    store.save_figure(fig, os.path.join(adir, "scores.png"))
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    for i, cond in enumerate(order):
        rs = [r for r in rows if r["condition"] == cond]
        root_kl = [np.sqrt(max(r["kl"], 0)) for r in rs]
        gold = [r["gold_mean"] for r in rs]
        ax.scatter(root_kl, gold, color=f"C{i % 10}", marker="o" if i < 10 else "s", label=cond)
    ax.set_xlabel("sqrt(KL to reference), sqrt(nats)")
    ax.set_ylabel("gold score, held-out prompts")
    ax.set_title("over-optimisation frontier (Gao et al. 2022)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    store.save_figure(fig, os.path.join(adir, "frontier.png"))
    plt.close(fig)
    moving = [c for c in ("adaptive", "adaptive_fast", "band", "linear_decay") if c in order]
    # β over iterations, the first seed of each condition.
    if moving:
        fig, ax = plt.subplots(figsize=(6.5, 4))
        for i, cond in enumerate(moving):
            r = next(r for r in rows if r["condition"] == cond)
            with open(os.path.join(run_dir(cond, r["seed"]), "metrics.jsonl")) as f:
                m = [json.loads(line) for line in f]
            its = [x["iter"] for x in m]
            betas = [x["objective/kl_coef"] for x in m]
            ax.plot(its, betas, color=f"C{i}", label=cond)
        ax.set_xlabel("PPO iteration")
        ax.set_ylabel("β")
        ax.set_yscale("log")
        ax.legend(fontsize=8)
        fig.tight_layout()
        store.save_figure(fig, os.path.join(adir, "beta.png"))
        plt.close(fig)


def cell(ci):
    """mean [low, high] of a bootstrap_ci, or the mean alone for one value, or "-" for none."""
    if ci is None:
        return "-"
    mean, lo, hi = ci[:3]
    return f"{mean:+.2f}" if lo == hi else f"{mean:+.2f} [{lo:+.2f}, {hi:+.2f}]"


def ci_or_none(values):
    values = [v for v in values if v is not None]
    return bootstrap_ci(values) if values else None


def overopt_tables(bon, trajs, rows, order, other_base=(), kls=(2, 4, 6, 8), against="no_kl"):
    """The overopt suite's tables (markdown) and numbers (a dict): bon {base: overopt.bon_curve},
    trajs {condition: {seed: overopt.trajectory}}, rows ablate.py's final rows. Gold and proxy gain
    at equal KL (each seed's trajectory interpolated, mean over seeds and the paired difference
    from `against`, for the conditions not in other_base: those on another reward or pretrained
    model), the fitted forms, and the key pairs' final evaluations."""
    res = dict(bon={}, fits={}, at_kl={}, pairs={})
    lines = ["## Best-of-n by the proxy (the pretrained model's pool)\n"]
    for name, b in bon.items():
        f = overopt.fit(b["d"], b["gold"], "bon")
        res["bon"][name] = dict(curve=b, fit=f)
        lines += [f"\n{name}: {b['samples']} samples, {b['repeats']} of them repeat an earlier "
                  f"one for their prompt. Fit d(α - βd): α {f['alpha']:.3f}, β {f['beta']:.3f}, "
                  f"R² {f['r2']:.3f}, peak {peak(f)}.\n",
                  "| n | KL formula | KL pool, ties | KL pool, no ties | d | gold gain | "
                  "proxy gain |", "|---|---|---|---|---|---|---|"]
        for i, n in enumerate(b["n"]):
            lines.append(f"| {n} | {b['kl_formula'][i]:.3f} | {b['kl_pool'][i]:.3f} | "
                         f"{b['kl_no_ties'][i]:.3f} | {b['d'][i]:.3f} | {b['gold'][i]:+.3f} | "
                         f"{b['proxy'][i]:+.3f} |")
    lines += ["\n## PPO: gold and proxy gain at equal KL (nats), mean [95 % interval] over seeds\n",
              "| condition | seeds | " + " | ".join(f"gold at {k}" for k in kls) + " | "
              + " | ".join(f"proxy at {k}" for k in kls) + " | fit d(α - β log d): α, β, R² "
              "| peak d*, gain |", "|---|---|" + "---|" * (2 * len(kls) + 2)]
    for cond in (c for c in order if c in trajs):
        per_seed = trajs[cond]
        gold = {s: overopt.at_kl(t["kl"], t["gold"], kls) for s, t in per_seed.items()}
        proxy = {s: overopt.at_kl(t["kl"], t["proxy"], kls) for s, t in per_seed.items()}
        d = [math.sqrt(max(k, 0.0)) for t in per_seed.values() for k in t["kl"]]
        g = [x for t in per_seed.values() for x in t["gold"]]
        f = overopt.fit(d, g, "rl")
        res["fits"][cond] = f
        res["at_kl"][cond] = dict(gold=gold, proxy=proxy)
        gcells = [cell(ci_or_none([gold[s][i] for s in gold])) for i in range(len(kls))]
        pcells = [cell(ci_or_none([proxy[s][i] for s in proxy])) for i in range(len(kls))]
        lines.append(f"| {cond} | {len(per_seed)} | " + " | ".join(gcells + pcells)
                     + f" | {f['alpha']:.3f}, {f['beta']:.3f}, {f['r2']:.2f} | {peak(f)} |")
    if against in trajs:
        lines += [f"\nPaired by seed, condition minus {against} at equal KL (gold; an interval "
                  "holding 0 is not separated):\n",
                  "| condition | " + " | ".join(f"gold at {k}" for k in kls) + " |",
                  "|---|" + "---|" * len(kls)]
        base = res["at_kl"][against]["gold"]
        for cond in (c for c in order if c in trajs and c != against and c not in other_base):
            mine = res["at_kl"][cond]["gold"]
            cells = []
            for i in range(len(kls)):
                diffs = [mine[s][i] - base[s][i] for s in mine
                         if s in base and mine[s][i] is not None and base[s][i] is not None]
                if len(diffs) >= 2:
                    cells.append(verdict(bootstrap_ci(diffs) + (len(diffs),)))
                else:
                    cells.append(cell(ci_or_none(diffs)))
            lines.append(f"| {cond} | " + " | ".join(cells) + " |")
    # The frontier reading: the best evaluation within each KL budget, paired against `against`.
    lines += ["\nThe frontier reading: the best gold gain among each run's evaluations at or under "
              "each KL (an oracle that stops at the best evaluation within the budget), mean "
              "[95 % interval] over seeds; paired by seed against " + against + ":\n",
              "| condition | seeds | " + " | ".join(f"best at <= {k}" for k in kls) + " | "
              + " | ".join(f"Δ at <= {k}" for k in kls) + " |",
              "|---|---|" + "---|" * (2 * len(kls))]
    res["best_under"] = {}
    for cond in (c for c in order if c in trajs):
        mine = {s: overopt.best_under(t["kl"], t["gold"], kls) for s, t in trajs[cond].items()}
        res["best_under"][cond] = mine
        cells = [cell(ci_or_none([mine[s][i] for s in mine])) for i in range(len(kls))]
        base = res["best_under"].get(against)
        for i in range(len(kls)):
            diffs = [mine[s][i] - base[s][i] for s in mine if base and s in base]
            if cond == against or cond in other_base or len(diffs) < 2:
                cells.append("")
            else:
                cells.append(verdict(bootstrap_ci(diffs) + (len(diffs),)))
        lines.append(f"| {cond} | {len(mine)} | " + " | ".join(cells) + " |")
    pairs = [("adaptive", "stop_at_target"), ("adaptive_model2", "stop_model2")]
    lines += ["\n## The key pair: the penalty against stopping at its KL (final evaluations)\n",
              "| pair | seeds | gold, penalty | gold, stopped | gold difference | KL, penalty | "
              "KL, stopped |", "|---|---|---|---|---|---|---|"]
    both = []
    for a, b in pairs:
        ci = paired_ci(rows, a, b, "gold_mean")
        if ci is None:
            continue
        both += [ra["gold_mean"] - rb["gold_mean"] for ra in rows if ra["condition"] == a
                 for rb in rows if rb["condition"] == b and rb["seed"] == ra["seed"]]
        res["pairs"][f"{a} - {b}"] = ci
        cols = [ci_or_none([r[k] for r in rows if r["condition"] == c])
                for k, c in (("gold_mean", a), ("gold_mean", b))]
        kl = [np.mean([r["kl"] for r in rows if r["condition"] == c]) for c in (a, b)]
        lines.append(f"| {a} - {b} | {ci[3]} | {cell(cols[0])} | {cell(cols[1])} | "
                     f"{verdict(ci)} | {kl[0]:.2f} | {kl[1]:.2f} |")
    if len(both) >= 2:
        ci = bootstrap_ci(both) + (len(both),)
        res["pairs"]["both models"] = ci
        lines.append(f"| both pretrained models | {len(both)} | | | {verdict(ci)} | | |")
    return "\n".join(lines) + "\n", res


def peak(f):
    if f["d_peak"] is None:
        return "none in reach (β <= 0, or d* > e^50)"
    return f"d* {f['d_peak']:.2f} (KL {f['d_peak'] ** 2:.1f}), gain {f['gain_peak']:+.2f}"
