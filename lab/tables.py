"""The ablation's statistics, tables and plots: what ablate.py writes once its runs are done.

    python -m lab.ablate --suite=core        # runs the conditions (ablate.py), then writes these
                                         # into out/ablate/
`t_ci` is the Student-t interval of a mean over seeds (its coverage at 3-10 seeds simulated in
tests/test_intervals.py); `paired_diffs` a condition minus the baseline condition, paired by
seed; `three_verdicts` reads each comparison of a family (a table's comparisons with its
baseline) as different, equivalent (inside ± its margin, MARGINS) or undecided, Holm's adjustment
holding the family's error (both simulated in tests/test_intervals.py); `t_prediction` the
interval a new seed's number falls in (lab/seeds.py); `welch_ci` the unpaired difference of two
conditions run on different reward models (their seeds are not paired). `bootstrap_ci`, the
percentile bootstrap the tables used before, is kept to measure its coverage (about 76 % at 3
seeds for a nominal 95 %).
`summarise` (results.md), `models_table` (the same conditions on several pretrained models, the
model as the unit), `ref_table` (the cheap-reference table), `beta_table` (β over the run) and
`plot` (scores.png, frontier.png, beta.png) read ablate.py's rows (one per condition and seed,
results.jsonl) and, for the curves, each run's metrics.jsonl in the folder `run_dir(condition,
seed)` ablate.py names.
Left out: intervals for the curves.
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
    replacement with a fixed RNG seed. No table uses it: at 3 seeds it is about [min, max] and
    covers about 76 % for a nominal 95 % (tests/test_intervals.py measures it)."""
    x = np.asarray(x, dtype=float)
    n = len(x)
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, n, (n_boot, n))  # (n_boot, n)
    means = x[picks].mean(1)  # (n_boot,)
    lo, hi = np.quantile(means, [(1 - level) / 2, (1 + level) / 2])
    return float(x.mean()), float(lo), float(hi)


def t_cdf(x, df):
    """P(T <= x) for Student's t with df degrees of freedom, x >= 0: the density integrated from 0
    by Simpson's rule on a fine grid (no scipy)."""
    c = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)
    grid = np.linspace(0.0, x, 4001)
    density = np.exp(c - (df + 1) / 2 * np.log1p(grid ** 2 / df))
    w = np.ones(4001)
    w[1:-1:2], w[2:-1:2] = 4.0, 2.0
    return 0.5 + float(w @ density) * (x / 4000) / 3


@functools.lru_cache(maxsize=None)
def t_quantile(p, df):
    """The p-quantile (p > 0.5) of Student's t with df degrees of freedom: t_cdf's upper limit
    found by bisection."""
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < p:
        hi *= 2
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if t_cdf(mid, df) < p else (lo, mid)
    return (lo + hi) / 2


def t_upper(t, df):
    """P(T > t) for Student's t (any t): a one-sided p-value."""
    tail = max(0.0, 1.0 - t_cdf(abs(t), df))
    return tail if t >= 0 else 1.0 - tail


def paired_stats(diffs):
    """(mean, standard error, degrees of freedom) of paired differences: Student's t."""
    d = np.asarray(diffs, dtype=float)
    return float(d.mean()), float(d.std(ddof=1) / math.sqrt(len(d))), len(d) - 1


def welch_stats(a, b):
    """(mean(a) - mean(b), standard error, Welch-Satterthwaite degrees of freedom rounded down to
    0.01), as welch_ci takes them."""
    a, b = (np.asarray(x, dtype=float) for x in (a, b))
    va, vb = a.var(ddof=1) / len(a), b.var(ddof=1) / len(b)
    df = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1)) if va + vb else 1.0
    return float(a.mean() - b.mean()), math.sqrt(va + vb), math.floor(df * 100) / 100


def holm(pvalues):
    """Holm's step-down adjusted p-values, in the order given: the i-th smallest times (m - i + 1),
    never below the one before it, at most 1. Rejecting where the adjusted p is below α holds
    the chance of any false rejection in the family at α (simulated in tests/test_intervals.py)."""
    m = len(pvalues)
    order = sorted(range(m), key=lambda i: pvalues[i])
    out = [0.0] * m
    top = 0.0
    for rank, i in enumerate(order):
        top = max(top, min(1.0, (m - rank) * pvalues[i]))
        out[i] = top
    return out


# The smallest difference that matters, per metric compared, fixed before the runs whose tables
# use it (ANSWER.md, "Margins"). Gold: a fifth of the pretrained model's samples' gold standard
# deviation (1.17 on prefs.jsonl's 24,000 samples; Cohen's "small" d = 0.2 gives 0.23), rounded
# to 0.25, some twice the standard error of the difference of two 200-sample evaluations (0.12).
# A rate (well-formed, end-of-text, pass@k): 0.05, one response in twenty. The KL moves with the
# condition's scale, so its margin is relative: a fifth of the baseline's own mean KL
# (RELATIVE_MARGINS). A column without a margin is read by the test of a difference alone: it reads
# "different" or "undecided", never "equivalent".
MARGINS = {"gold_mean": 0.25, "wellformed_rate": 0.05, "eos_rate": 0.05}
RELATIVE_MARGINS = {"kl": 0.2}


def margin_of(col, base_values):
    """A column's margin: MARGINS' own, 0.05 for pass@k and hard@k (rates), or RELATIVE_MARGINS'
    fraction of the baseline's mean (base_values); None when it has none."""
    if col in MARGINS:
        return MARGINS[col]
    if col.startswith(("pass_", "hard_")):
        return 0.05
    if col in RELATIVE_MARGINS:
        return RELATIVE_MARGINS[col] * abs(float(np.mean(base_values)))
    return None


def three_verdicts(stats, margin, alpha=0.05):
    """Each comparison (mean, se, df) of one family read as "different" (Holm-adjusted two-sided
    t-test below α: the adjusted 95 % interval excludes 0), "equivalent" (Holm-adjusted two
    one-sided tests below α against ±margin: at one comparison, its 90 % interval inside
    ±margin) or "undecided". margin: the smallest difference that matters, stated before the
    runs; one for all, or a list with one per comparison (None: no equivalence test for it, and
    no place in the equivalence family). A difference both tests find (real, and smaller than the
    margin) reads "different": the cell's mean says how small. Returns [(verdict, p_different,
    p_equivalent)] (adjusted; p_equivalent 1 where there is no margin)."""
    margins = margin if isinstance(margin, (list, tuple)) else [margin] * len(stats)
    diff, equiv = [], []
    for (mean, se, df), margin in zip(stats, margins):
        if margin is None:
            diff.append(min(1.0, 2 * t_upper(abs(mean) / se, df)) if se else float(mean == 0))
            equiv.append(None)
            continue
        if se == 0:
            diff.append(0.0 if mean != 0 else 1.0)
            equiv.append(0.0 if abs(mean) < margin else 1.0)
            continue
        diff.append(min(1.0, 2 * t_upper(abs(mean) / se, df)))
        # The larger of the two one-sided tests: above -margin, and below +margin.
        equiv.append(max(t_upper((mean + margin) / se, df), t_upper((margin - mean) / se, df)))
    diff = holm(diff)
    tested = [i for i, e in enumerate(equiv) if e is not None]
    adjusted = dict(zip(tested, holm([equiv[i] for i in tested])))
    equiv = [adjusted.get(i, 1.0) for i in range(len(equiv))]
    out = []
    for d, e in zip(diff, equiv):
        word = "different" if d < alpha else "equivalent" if e < alpha else "undecided"
        out.append((word, d, e))
    return out


def family_cells(stats, margins, fmt="{:+.3f}"):
    """Each comparison (mean, se, df) of one family as a table cell: the mean, its Student-t 95 %
    interval (unadjusted) and its verdict (three_verdicts: Holm over the family)."""
    cells = []
    for (mean, se, df), (word, _, _) in zip(stats, three_verdicts(stats, list(margins))):
        half = t_quantile(0.975, df) * se if se else 0.0
        cells.append(f"{fmt.format(mean)} [{fmt.format(mean - half)}, {fmt.format(mean + half)}] "
                     f"{word}")
    return cells


def margins_line(cols, margins, size):
    """The sentence under a table of comparisons: its families' sizes (size: one family's, or a
    list, one per column: each column's comparisons with the baseline are one family) and each
    column's margin."""
    sizes = size if isinstance(size, list) else [size]
    if len(sizes) == 1:
        families = f"one family of {sizes[0]} comparisons (Holm)"
    elif len(set(sizes)) == 1:
        families = f"each column's {sizes[0]} comparisons one family (Holm)"
    else:
        families = f"each column's comparisons one family (Holm; {', '.join(map(str, sizes))})"
    said = [f"{c} ±{m:.3g}" for c, m in zip(cols, margins) if m is not None]
    bare = [c for c, m in zip(cols, margins) if m is None]
    line = (f"Verdicts: {families}: different (the adjusted test rejects 0), equivalent (the "
            "adjusted two one-sided tests put it inside ± the margin) or undecided; margins "
            + (", ".join(said) or "none"))
    if bare:
        line += f"; no margin for {', '.join(bare)} (read different or undecided only)"
    return line + "."


def seeds_for(sd, half, most=1000):
    """The rule for a table's n, from spread alone: the fewest seeds n (>= 2) whose Student-t 95 %
    half-width t·sd/√n is at most `half` (half the margin) for a pilot's standard deviation sd;
    None past `most`."""
    # t exceeds the normal's 1.96, so no n below the normal's answer can do: start there.
    start = max(2, math.ceil((1.959964 * sd / half) ** 2))
    for n in range(start, most + 1):
        if t_quantile(0.975, n - 1) * sd / math.sqrt(n) <= half:
            return n
    return None


def spread_line(sds, margin, n):
    """The sentence under a table that says how many seeds its spread asks for (seeds_for at half
    the gold margin, from the median of its comparisons' standard deviations) beside its own n."""
    sd = float(np.median(sds))
    want = seeds_for(sd, margin / 2)
    need = f"n = {want}" if want else "more than 1,000 seeds"
    return (f"Seeds by spread: the paired Δ gold's standard deviation, median over the {len(sds)} "
            f"comparisons, is {sd:.3f}; a Student-t 95 % half-width of at most half the gold "
            f"margin ({margin / 2:.3g}) takes {need} (this table: n = {n}).")


def t_ci(x, level=0.95):
    """(mean, low, high): the Student-t interval of the mean of x, mean ± t·s/√n with n - 1
    degrees of freedom. Its coverage at small n is checked by simulation
    (tests/test_intervals.py); the percentile bootstrap's is not what it says at 3 seeds."""
    x = np.asarray(x, dtype=float)
    n = len(x)
    half = t_quantile((1 + level) / 2, n - 1) * x.std(ddof=1) / math.sqrt(n)
    return float(x.mean()), float(x.mean() - half), float(x.mean() + half)


def t_prediction(x, level=0.95):
    """(mean, low, high): the Student-t prediction interval for one new draw from what gave x
    (a new seed's number): mean ± t·s·√(1 + 1/n), n - 1 degrees of freedom. Its coverage is
    simulated in tests/test_intervals.py."""
    x = np.asarray(x, dtype=float)
    n = len(x)
    half = t_quantile((1 + level) / 2, n - 1) * x.std(ddof=1) * math.sqrt(1 + 1 / n)
    return float(x.mean()), float(x.mean() - half), float(x.mean() + half)


def welch_ci(a, b, level=0.95):
    """(mean, low, high): Welch's interval of mean(a) − mean(b) for two independent samples
    (unpaired, variances not assumed equal): the difference ± t·√(s_a²/n_a + s_b²/n_b), the
    degrees of freedom Welch–Satterthwaite's, rounded down to 0.01 (a little wider, never
    narrower). Its coverage is simulated in tests/test_intervals.py."""
    a, b = (np.asarray(x, dtype=float) for x in (a, b))
    va, vb = a.var(ddof=1) / len(a), b.var(ddof=1) / len(b)
    d = float(a.mean() - b.mean())
    # No spread in either sample: no interval around the difference, as t_ci gives.
    if va + vb == 0:
        return d, d, d
    df = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))
    half = t_quantile((1 + level) / 2, math.floor(df * 100) / 100) * math.sqrt(va + vb)
    return d, d - half, d + half


def paired_diffs(rows, cond, base, col):
    """cond minus base in column col, seed by seed, over the seeds both have."""
    a, b = ({r["seed"]: r[col] for r in rows if r["condition"] == c} for c in (cond, base))
    return [a[s] - b[s] for s in sorted(set(a) & set(b))]


def over_models(per_model):
    """(mean, low, high, n): the pretrained model as the unit. Each model's mean over its seeds,
    then the Student-t 95 % interval of those means (n the models), so the variance between models
    is in it; its coverage for seeds nested in models is simulated in tests/test_intervals.py."""
    means = [float(np.mean(d)) for d in per_model]
    return t_ci(means) + (len(means),)


def endpoint_frontier(points, targets):
    """One seed's frontier of endpoints: its runs' final (KL, gold), one run per setting of a
    method (β, epochs), sorted by KL and linear between neighbours, read at each KL in targets;
    None outside the KLs its runs reached. (A penalised run's trajectory is not a frontier: each
    point here is a run's end.)"""
    pts = sorted(points)
    out = []
    for t in targets:
        hit = None
        for (k0, g0), (k1, g1) in zip(pts, pts[1:]):
            if k0 <= t <= k1 and k1 > k0:
                hit = g0 + (g1 - g0) * (t - k0) / (k1 - k0)
                break
        out.append(hit)
    return out


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
              columns=COLUMNS, same=()):
    """Markdown: mean [Student-t 95 % interval over seeds] per condition; then each condition minus
    `base` (or the suite's first condition), paired over seeds, each column's comparisons one
    family read by three verdicts (family_cells; each column's margin margin_of's). A condition in
    `same` is the baseline under another name (the same runs): its row says so, and it is no
    comparison, so neither in the families nor in the spread line."""
    # A suite without `base` is compared against its first condition (perhaps one of its twins).
    base = base if base in order else next((c for c in order if c != "pretrained"), None)
    same = [c for c in same if c != base]
    header = "| condition | seeds | " + " | ".join(columns) + " |"
    lines = [header, "|---" * (len(columns) + 2) + "|"]
    for cond in order:
        rs = [r for r in rows if r["condition"] == cond]
        if rs:
            if len(rs) > 1:
                cis = [t_ci([r[c] for r in rs]) for c in columns]
                cells = ["{:.3f} [{:.3f}, {:.3f}]".format(*ci) for ci in cis]
            else:
                # One seed: no interval.
                cells = [f"{rs[0][c]:.3f}" for c in columns]
            seeds = ",".join(str(r["seed"]) for r in rs)
            lines.append(f"| {cond} | {seeds} | " + " | ".join(cells) + " |")
    if base and len({r["seed"] for r in rows if r["condition"] == base}) < 2:
        lines += ["", "One seed: no intervals, no paired differences (run --seeds=3 or more)."]
        return "\n".join(lines) + "\n"
    if not base:
        return "\n".join(lines) + "\n"
    margins = [margin_of(c, [r[c] for r in rows if r["condition"] == base]) for c in paired]
    compared, stats, ns = [], [], {}
    for cond in order:
        if cond in (base, "pretrained") or cond in same:
            continue
        diffs = [paired_diffs(rows, cond, base, c) for c in paired]
        if len(diffs[0]) >= 2:
            compared.append(cond)
            ns[cond] = len(diffs[0])
            stats += [paired_stats(d) for d in diffs]
    # Each column's comparisons with the baseline are one family (one question each).
    width = len(paired)
    per_column = [family_cells(stats[j::width], [margins[j]] * len(compared))
                  for j in range(width)]
    cells = [per_column[j][k] for k in range(len(compared)) for j in range(width)]
    lines += ["", f"Paired differences against {base} (same seeds): mean [Student-t 95 % "
              "interval], n the seeds, and the verdict.", "",
              "| condition | seeds | " + " | ".join(f"Δ {c}" for c in paired) + " |",
              "|---" * (len(paired) + 2) + "|"]
    for k, cond in enumerate(compared):
        row = cells[k * len(paired):(k + 1) * len(paired)]
        lines.append(f"| {cond} | {ns[cond]} | " + " | ".join(row) + " |")
    # The baseline's twins, where the suite lists them: the same runs, so no comparison.
    for cond in (c for c in order if c in same):
        n = len({r["seed"] for r in rows if r["condition"] == cond})
        same_runs = [f"the same runs as {base}"] + ["—"] * (width - 1)
        lines.append(f"| {cond} | {n} | " + " | ".join(same_runs) + " |")
    lines += ["", margins_line(paired, margins, [len(compared)] * width)]
    if "gold_mean" in paired and len(compared) and margins[paired.index("gold_mean")]:
        sds = [float(np.std(paired_diffs(rows, c, base, "gold_mean"), ddof=1)) for c in compared]
        low, high = min(ns.values()), max(ns.values())
        n = f"{low}" if low == high else f"{low}–{high}"
        lines += ["", spread_line(sds, margins[paired.index("gold_mean")], n)]
    return "\n".join(lines) + "\n"


def models_table(rows, conds, models, base=DEFAULT_CONDITION, extra=()):
    """Markdown: each condition in conds on every pretrained model in models ("main" the main
    run's; another model m's rows are named COND_m, its pretrained row pretrained_m): gold, KL,
    well-formed rate and the `extra` (column, format, heading) as each model's mean over its seeds
    ('-' where a condition's rows lack the column), and the gold paired against `base` on the same
    model. Then the claim with the model as the unit: the models' mean differences, their Student-t
    95 % interval (n the models), and the standard deviation between the models' means beside what
    seeds alone would give it (the standard error of a model's mean: the within-model standard
    deviation over √n, averaged over the models). Empty below 2 models."""
    def name(c, m):
        return c if m == "main" else f"{c}_{m}"

    def values(c, m, col):
        return [r[col] for r in rows if r["condition"] == name(c, m) and r.get(col) is not None]
    models = [m for m in models if values(base, m, "gold_mean")]
    if len(models) < 2:
        return ""
    columns = (("gold_mean", "+.2f", "gold"), ("kl", ".1f", "KL"),
               ("wellformed_rate", ".2f", "well-formed"), *extra)
    lines = [f"\nThe same conditions on {len(models)} pretrained models ({', '.join(models)}; "
             "world, pretraining, preferences and reward model reseeded). Per model the mean over "
             "its seeds, shown as " + " / ".join(models) + f"; Δ gold against {base} paired by "
             "seed on each model, then over the models with each model's mean difference as the "
             f"unit (Student-t 95 %, n {len(models)} models); spread: the standard deviation "
             "between the models' mean differences / the standard error seeds alone give a "
             "model's mean (within-model SD / √n):\n",
             "| condition | seeds | " + " | ".join(h for _, _, h in columns)
             + " | Δ gold per model | Δ gold over models | spread: models / seeds |",
             "|---" * (len(columns) + 5) + "|"]
    shown = [c for c in ["pretrained"] + [c for c in conds if c != "pretrained"]
             if all(values(c, m, "gold_mean") for m in models)]
    diffs = {c: {m: paired_diffs(rows, name(c, m), name(base, m), "gold_mean") for m in models}
             for c in shown}
    # The claim over models, each condition against base: one family.
    compared = [c for c in shown if c not in ("pretrained", base)
                and all(len(d) >= 2 for d in diffs[c].values())]
    stats = [paired_stats([np.mean(d) for d in diffs[c].values()]) for c in compared]
    over = dict(zip(compared, family_cells(stats, [MARGINS["gold_mean"]] * len(stats))))
    for c in shown:
        cells = [" / ".join(f"{np.mean(values(c, m, col)):{fmt}}" if values(c, m, col) else "-"
                            for m in models) for col, fmt, _ in columns]
        seeds = " / ".join(str(len(values(c, m, "gold_mean"))) for m in models)
        between = "-"
        if c in over:
            means = [float(np.mean(d)) for d in diffs[c].values()]
            se = np.mean([np.std(d, ddof=1) / math.sqrt(len(d)) for d in diffs[c].values()])
            between = f"{np.std(means, ddof=1):.2f} / {se:.2f}"
        per = " / ".join(f"{np.mean(d):+.2f}" if d and c != base else "-"
                         for d in diffs[c].values())
        lines.append(f"| {c} | {seeds} | {' | '.join(cells)} | "
                     f"{per if c != 'pretrained' else '-'} | {over.get(c, '-')} | {between} |")
    if stats:
        lines += ["", margins_line(["gold_mean"], [MARGINS["gold_mean"]], len(stats))]
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
                # The Student-t 95 % interval over seeds, shown where the seeds differ at all.
                m, lo, hi = t_ci(v) if len(v) > 1 else (v[0], v[0], v[0])
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


def t_cell(values, fmt="{:+.2f}", mark=""):
    """mean [Student-t 95 % interval] of the values that are not None, with how many when some
    are; '-' when none. `mark` follows the cell (a frontier cell not read where the run was)."""
    v = [x for x in values if x is not None]
    if not v:
        return "-"
    if len(v) == 1:
        return fmt.format(v[0]) + (" (1 seed)" if len(values) > 1 else "") + mark
    mean, lo, hi = t_ci(v)
    text = f"{fmt.format(mean)} [{fmt.format(lo)}, {fmt.format(hi)}]"
    return text + (f" ({len(v)} of {len(values)})" if len(v) < len(values) else "") + mark


# The overopt suite's KL budgets (nats) and the iterations its equal-steps table reads.
FRONTIER_KLS = (1, 2, 3, 4, 6, 8, 10)
STEPS = (4, 8, 16, 40, 80, 160, 240)


def free_section(trajs, frees, res):
    """The β = 0 runs' frontier: each seed's best evaluation at or under each budget, marked † where
    some seed has no evaluation within a nat under the budget or never passed it."""
    lines = ["## The unpenalised frontier, measured\n",
             "β = 0, evaluated on 200 held-out samples after every iteration; each cell the best "
             "gold gain among a run's evaluations at or under the KL (what stopping at the best "
             "evaluation within the budget keeps; every cell is one evaluation, none "
             "interpolated), mean [Student-t 95 % interval] over seeds (n the seeds). † marks a "
             "cell where some seed has no evaluation within 1 nat under the budget, or never "
             "passed it: there the cell is a bound, not the frontier. `passes 10` gives the "
             "iterations to the first evaluation above 10 nats.\n",
             "| run | seeds | passes 10 (iterations) | " + " | ".join(
                 f"KL ≤ {k}" for k in FRONTIER_KLS) + " |",
             "|---|---|---|" + "---|" * len(FRONTIER_KLS)]
    for cond in frees:
        ts = trajs[cond]
        best = {s: overopt.best_under(t["kl"], t["gold"], FRONTIER_KLS) for s, t in ts.items()}
        ok = [all(overopt.resolved(t["kl"], k) for t in ts.values()) for k in FRONTIER_KLS]
        passes = [next((i for i, k in zip(t["iters"], t["kl"]) if k > 10), None)
                  for t in ts.values()]
        res["free"][cond] = dict(best_under=best, resolved=ok, passes_10=passes)
        reached = [p for p in passes if p is not None]
        when = (f"{min(reached)}–{max(reached)}" if reached else "never")
        when += "" if len(reached) == len(passes) else f" ({len(reached)} of {len(passes)})"
        cells = [t_cell([best[s][i] for s in best], mark="" if ok[i] else " †")
                 for i in range(len(FRONTIER_KLS))]
        lines.append(f"| {cond} | {len(ts)} | {when} | " + " | ".join(cells) + " |")
    lines += ["\nThe same runs read at their first pass through each KL (linear between the two "
              "consecutive iterations' evaluations around it: no maximum over many noisy "
              "evaluations, so it does not read high as the best does):\n",
              "| run | seeds | " + " | ".join(f"KL {k}" for k in FRONTIER_KLS) + " |",
              "|---|---|" + "---|" * len(FRONTIER_KLS)]
    for cond in frees:
        ts = trajs[cond]
        first = {s: overopt.at_kl(t["kl"], t["gold"], FRONTIER_KLS) for s, t in ts.items()}
        res["free"][cond]["first_pass"] = first
        lines.append(f"| {cond} | {len(ts)} | " + " | ".join(
            t_cell([first[s][i] for s in first]) for i in range(len(FRONTIER_KLS))) + " |")
    return lines


def stop_section(trajs, rows, stops, free, res):
    """--stop_kl's runs: the final evaluation (its own stream, as every final row) of the actor
    kept, and whether its evaluations are the β = 0 run's first ones (same seed: they should be)."""
    # The pretrained model's final evaluation on each seed's own stream.
    start = {r["seed"]: r["gold_mean"] for r in rows if r["condition"] == "pretrained"}
    if not any(r["condition"] in stops and r["seed"] in start for r in rows):
        return []
    # The pretrained model's gold on the two streams of a seed: the final evaluation's and the
    # one the during-PPO evaluations use (overopt.trajectory's start_gold).
    streams = {s: (start[s], t["start_gold"]) for s, t in trajs.get(free, {}).items()
               if s in start and "start_gold" in t}
    gap = ""
    if streams:
        far = max(streams, key=lambda s: abs(streams[s][0] - streams[s][1]))
        gap = (f": the pretrained model's two 200-sample streams differ by up to "
               f"{abs(streams[far][0] - streams[far][1]):.2f} gold, {streams[far][0]:.2f} on the "
               f"final evaluation's and {streams[far][1]:.2f} on the evaluations' for seed {far}")
    lines = ["\n## Stopping at a KL budget (--stop_kl, β = 0), final evaluation\n",
             "The actor kept (the last whose rollout was under the budget) on the final "
             "evaluation's samples; gold gain over the pretrained model's final evaluation on the "
             f"same stream (paired by seed{gap}); "
             f"mean [Student-t 95 % interval] over seeds. `same as {free}` "
             f"counts the seeds whose during-PPO evaluations equal the β = 0 run's first ones "
             "(the same training up to the stop).\n",
             f"| budget | seeds | iterations run | KL | gold gain | same as {free} |",
             "|---|---|---|---|---|---|"]
    for cond, k in stops.items():
        rs = [r for r in rows if r["condition"] == cond and r["seed"] in start]
        if not rs:
            continue
        ts = trajs.get(cond, {})
        iters = [t["iters"][-1] for t in ts.values()]
        same = sum(1 for s, t in ts.items() if s in trajs.get(free, {})
                   and trajs[free][s]["gold"][:len(t["gold"])] == t["gold"])
        gains = [r["gold_mean"] - start[r["seed"]] for r in rs]
        res["stops"][cond] = dict(kl=[r["kl"] for r in rs], gain=gains, iters=iters, same=same)
        span = f"{min(iters)}–{max(iters)}" if iters else "-"
        lines.append(f"| {k:g} nats | {len(rs)} | {span} | "
                     f"{t_cell([r['kl'] for r in rs], '{:.2f}')} | {t_cell(gains)} | "
                     f"{same} of {len(ts)} |")
    return lines


def compared(diffs, margin):
    """A cell comparing paired differences with 0 (None left out): a comparison for family_rows
    when two or more are there, else '-'."""
    v = [x for x in diffs if x is not None]
    if len(v) < 2:
        return "-"
    return dict(stats=paired_stats(v), margin=margin, note=f" (n {len(v)})")


def family_rows(rows, fmt="{:+.3f}"):
    """Markdown rows from lists of cells, each a string or a comparison (`compared`'s, or a
    dict(stats, margin, note) for Welch's); each column's comparisons are one family
    (family_cells). Returns (the lines, the families' sizes, one per column that has any)."""
    width = max((len(r) for r in rows), default=0)
    read, sizes = {}, []
    for j in range(width):
        comps = [(i, r[j]) for i, r in enumerate(rows) if j < len(r) and isinstance(r[j], dict)]
        if not comps:
            continue
        sizes.append(len(comps))
        cells = family_cells([c["stats"] for _, c in comps], [c["margin"] for _, c in comps], fmt)
        for (i, c), cell in zip(comps, cells):
            read[(i, j)] = cell + c["note"]
    lines = ["| " + " | ".join(read.get((i, j), c) for j, c in enumerate(r)) + " |"
             for i, r in enumerate(rows)]
    return lines, sizes


def penalised_section(trajs, pens, frees, res):
    """The penalised runs beside the β = 0 ones: the final evaluation, how much gold moved over
    the last 20 iterations (against 0: one family, flat where equivalent), and gold at equal
    steps."""
    lines = ["\n## The runs at equal optimisation steps\n",
             "Gold gain after each number of iterations (the β = 0 runs stop when they pass 12 "
             "nats: '-' after that), mean [Student-t 95 % interval] over seeds; for the penalised "
             "runs the final KL and gold and the change of gold over their last 20 iterations (a "
             "least-squares slope over the evaluations in them, against 0: flat where it is "
             "equivalent to 0).\n",
             "| run | seeds | final KL | final gold | Δ gold, last 20 it. | " + " | ".join(
                 f"it. {i}" for i in STEPS) + " |", "|---|---|---|---|---|" + "---|" * len(STEPS)]
    for cond in list(frees) + list(pens):
        ts = trajs[cond]
        at = {s: overopt.at_iters(t["iters"], t["gold"], STEPS) for s, t in ts.items()}
        res["steps"][cond] = dict(at=at, final_kl=[t["kl"][-1] for t in ts.values()],
                                  final_gold=[t["gold"][-1] for t in ts.values()],
                                  last_20=[overopt.change_over_last(t["iters"], t["gold"])
                                           for t in ts.values()])
    # Each penalised run's change over its last 20 iterations against 0: one family.
    moved = {c: [x for x in res["steps"][c]["last_20"] if x is not None] for c in pens}
    moved = {c: v for c, v in moved.items() if len(v) >= 2}
    stats = [paired_stats(v) for v in moved.values()]
    last = dict(zip(moved, family_cells(stats, [MARGINS["gold_mean"]] * len(stats), "{:+.2f}")))
    for cond in list(frees) + list(pens):
        st = res["steps"][cond]
        cells = ["", "", ""]
        if cond in pens:
            cells = [t_cell(st["final_kl"], "{:.2f}"), t_cell(st["final_gold"]),
                     last.get(cond, t_cell(st["last_20"]))]
        lines.append(f"| {cond} | {len(trajs[cond])} | " + " | ".join(cells) + " | "
                     + " | ".join(t_cell([st["at"][s][i] for s in st["at"]])
                                  for i in range(len(STEPS))) + " |")
    if stats:
        lines.append("\n" + margins_line(["Δ gold, last 20 it."], [MARGINS["gold_mean"]],
                                         len(stats)) + " Equivalent reads flat.\n")
    return lines


def pair_section(trajs, pairs, res):
    """Each penalised run against its own β = 0 run at the penalised run's final KL, paired by
    seed: its final gold minus the β = 0 frontier there (the best evaluation at or under that KL),
    and minus the β = 0 run's first pass through it (linear between two consecutive
    iterations); each column's differences one family."""
    lines = ["\n## Each penalty against its own unpenalised run, at the penalty's KL\n",
             "Paired by seed: the penalised run's final gold gain minus (a) the β = 0 run's "
             "frontier at the penalised run's final KL (its best evaluation at or under it: the "
             "stop an oracle would choose) and (b) the β = 0 run's first pass through that KL "
             "(linear between two consecutive iterations' evaluations); mean [Student-t 95 % "
             "interval], n pairs, and the verdict. † where some seed's β = 0 run has no "
             "evaluation within 1 nat under the KL: its frontier there is a bound, not a "
             "measurement (the stop side is not measured).\n",
             "| penalty | its β = 0 run | KL | penalty's gold | β = 0 frontier there | "
             "penalty − frontier | penalty − first pass |", "|---|---|---|---|---|---|---|"]
    rows = []
    for pen, free in pairs:
        if pen not in trajs or free not in trajs:
            continue
        seeds = [s for s in trajs[pen] if s in trajs[free]]
        kl = {s: trajs[pen][s]["kl"][-1] for s in seeds}
        gain = {s: trajs[pen][s]["gold"][-1] for s in seeds}
        front = {s: overopt.best_under(trajs[free][s]["kl"], trajs[free][s]["gold"], [kl[s]])[0]
                 for s in seeds}
        first = {s: overopt.at_kl(trajs[free][s]["kl"], trajs[free][s]["gold"], [kl[s]])[0]
                 for s in seeds}
        ok = all(overopt.resolved(trajs[free][s]["kl"], kl[s]) for s in seeds)
        d_front = [gain[s] - front[s] for s in seeds]
        d_first = [gain[s] - first[s] for s in seeds if first[s] is not None]
        res["pairs"][f"{pen} - {free}"] = dict(kl=kl, gain=gain, frontier=front, first=first,
                                                 resolved=ok, d_frontier=d_front,
                                                 d_first=d_first)
        rows.append([pen, free, t_cell(list(kl.values()), "{:.2f}"),
                     t_cell(list(gain.values())),
                     t_cell(list(front.values()), mark="" if ok else " †"),
                     compared(d_front, MARGINS["gold_mean"]),
                     compared(d_first, MARGINS["gold_mean"])])
    body, size = family_rows(rows)
    lines += body
    if size:
        lines.append("\n" + margins_line(["gold"], [MARGINS["gold_mean"]], size) + "\n")
    return lines


# The KLs at which "what a nat buys" reads both runs of a pair.
SAME_KL = (2.0, 4.0)


def bought_section(trajs, pairs, res):
    """What the same KL buys with and without the penalty: each penalised run and its own β = 0
    run read at their first pass through each KL in SAME_KL (overopt.at_kl), and at the penalised
    run's final KL (its final evaluation beside the β = 0 run's first pass there), paired by seed:
    gold and the gains penalty − β = 0 in gold and proxy, and beside them the response length and
    the well-formed rate of each. A seed whose run never reaches the KL is left out (n says how
    many)."""
    lines = ["\n## What the same KL buys, with and without the penalty\n",
             "Each run at its first pass through the KL (linear between two consecutive "
             "evaluations); 'final': the penalised run's final evaluation and the β = 0 run's "
             "first pass through that KL. Gold gains, mean [Student-t 95 % interval] over seeds; "
             "differences penalty − β = 0 paired by seed, n pairs (seeds whose runs both reach the "
             "KL), and the verdict; the response length (tokens) and well-formed rate as means "
             "over those seeds, penalty / β = 0.\n",
             "| penalty | its β = 0 run | KL | gold: penalty | gold: β = 0 | Δ gold | Δ proxy | "
             "length | well-formed |", "|---|---|---|---|---|---|---|---|---|"]
    res["bought"] = {}
    rows = []
    keys = ("proxy", "gold", "length", "wellformed")
    for pen, free in pairs:
        if pen not in trajs or free not in trajs:
            continue
        seeds = [s for s in trajs[pen] if s in trajs[free]]
        for target in SAME_KL + ("final",):
            read = {}
            for s in seeds:
                p, f = trajs[pen][s], trajs[free][s]
                if target == "final":
                    at = p["kl"][-1]
                    both = [{k: p[k][-1] for k in keys}]
                else:
                    at = target
                    both = [{k: overopt.at_kl(p["kl"], p[k], [at])[0] for k in keys}]
                both.append({k: overopt.at_kl(f["kl"], f[k], [at])[0] for k in keys})
                if all(v is not None for b in both for v in b.values()):
                    read[s] = both
            if len(read) < 2:
                continue
            pairs_read = list(read.values())
            d_proxy = [b[0]["proxy"] - b[1]["proxy"] for b in pairs_read]
            d_gold = [b[0]["gold"] - b[1]["gold"] for b in pairs_read]
            name = target if target == "final" else f"{target:g}"
            res["bought"][f"{pen} - {free} @ {name}"] = dict(seeds=list(read), read=pairs_read,
                                                               d_proxy=d_proxy, d_gold=d_gold)
            # Each of length and well-formed rate, as the penalised run's mean / the β = 0 run's.
            sides = {k: [float(np.mean([b[i][k] for b in pairs_read])) for i in (0, 1)]
                     for k in ("length", "wellformed")}
            rows.append([pen, free, name, t_cell([b[0]["gold"] for b in pairs_read]),
                         t_cell([b[1]["gold"] for b in pairs_read]),
                         compared(d_gold, MARGINS["gold_mean"]), compared(d_proxy, None),
                         f"{sides['length'][0]:.1f} / {sides['length'][1]:.1f}",
                         f"{sides['wellformed'][0]:.2f} / {sides['wellformed'][1]:.2f}"])
    body, size = family_rows(rows)
    lines += body
    if size:
        lines.append("\n" + margins_line(["gold", "proxy"], [MARGINS["gold_mean"], None], size)
                     + "\n")
    return lines


def models_section(res, models):
    """The key pair's difference (penalty − frontier) with the pretrained model as the unit: each
    model's mean over its seeds, then the mean over models with its t interval (n the models), and
    the standard deviation between the models' means beside the standard error seeds alone give a
    model's mean (the within-model standard deviation over √n, averaged over the models)."""
    per = {m: res["pairs"][k]["d_frontier"] for m, k in models.items() if k in res["pairs"]}
    if len(per) < 2:
        return []
    means = [float(np.mean(v)) for v in per.values()]
    within = float(np.mean([np.std(v, ddof=1) for v in per.values() if len(v) > 1]))
    se = float(np.mean([np.std(v, ddof=1) / math.sqrt(len(v)) for v in per.values()
                        if len(v) > 1]))
    mean, lo, hi, _ = over_models(per.values())
    res["models"] = dict(per_model=per, means=means, between_sd=float(np.std(means, ddof=1)),
                         within_sd=within, within_se=se, ci=(mean, lo, hi, len(means)))
    return ["\n## The key pair over pretrained models\n",
            "Penalty − the β = 0 frontier at its KL, with each pretrained model (world, "
            "pretraining and reward model reseeded) as the unit: "
            + ", ".join(f"{m} {np.mean(v):+.3f} (n {len(v)} seeds)" for m, v in per.items())
            + f"; over models {family_cells([paired_stats(means)], [MARGINS['gold_mean']])[0]} "
            f"(Student-t, n {len(means)} models, one comparison, margin ±"
            f"{MARGINS['gold_mean']:g}); standard deviation between the models' means "
            f"{np.std(means, ddof=1):.3f}, against {se:.3f}, the standard error seeds alone give "
            f"a model's mean (between seeds within a model the standard deviation is "
            f"{within:.3f}).\n"]


def proxies_section(res, proxies):
    """The key pair's difference (penalty − frontier) on reward models of other quality: for each
    proxy its held-out accuracy (against the annotator's noisy labels and the gold order), the
    difference over its seeds (Student-t) and its difference from the main proxy's (Welch:
    another reward model, so the seeds are not paired). proxies {name: dict(pair=own_free's
    'pen - free' name, acc_noisy, acc_gold, n_val, about=what differs)}, the main proxy first."""
    per = {m: p for m, p in proxies.items() if p["pair"] in res["pairs"]}
    if len(per) < 2 or "main" not in per:
        return []
    main = res["pairs"][per["main"]["pair"]]["d_frontier"]
    lines = ["\n## The key pair on proxies of other quality\n",
             "The default penalty minus the β = 0 frontier at its KL (as above), on reward models "
             "that differ from the main one in size or data; each reward model's held-out "
             "accuracy against the annotator's noisy labels and against the gold order (pairs "
             "the gold scores tell apart). Mean [Student-t 95 % interval], n seeds; minus the "
             "main proxy's: Welch's 95 % interval (another reward model, so unpaired); each with "
             "its verdict, each column one family.\n",
             "| proxy | what differs | held-out pairs | accuracy: noisy | accuracy: gold | "
             "penalty − frontier | minus the main proxy's |", "|---|---|---|---|---|---|---|"]
    res["proxies"] = {}
    rows = []
    for m, p in per.items():
        d = res["pairs"][p["pair"]]["d_frontier"]
        diff = "-"
        ci = None
        if m != "main" and len(d) >= 2 and len(main) >= 2:
            ci = welch_ci(d, main)
            diff = dict(stats=welch_stats(d, main), margin=MARGINS["gold_mean"],
                        note=f" (n {len(d)} and {len(main)})")
        res["proxies"][m] = dict(p, d_frontier=d, minus_main=ci)
        rows.append([m, p["about"], str(p["n_val"]), f"{p['acc_noisy']:.3f}",
                     f"{p['acc_gold']:.3f}", compared(d, MARGINS["gold_mean"]), diff])
    body, size = family_rows(rows)
    lines += body
    if size:
        lines.append("\n" + margins_line(["gold"], [MARGINS["gold_mean"]], size) + "\n")
    return lines


def range_cell(values, fmt):
    """mean (lowest to highest): the fits' own values, so the cell never leaves what the quantity
    allows (a t interval of R² can pass 1, one of a bounded β go below 0)."""
    return f"{fmt.format(np.mean(values))} ({fmt.format(min(values))} to {fmt.format(max(values))})"


def fit_cells(fits):
    """α, β, R², the KL at the peak and the gain there of per-seed (or per-pool) fits (overopt.fit,
    α and β bounded): mean (range over the fits) each; a peak only where the fitted curve turns
    within the fit's data, else "no peak within N nats" (N: the largest KL fitted)."""
    cells = [range_cell([f[k] for f in fits], "{:.3f}") for k in ("alpha", "beta")]
    cells.append(range_cell([f["r2"] for f in fits], "{:.2f}"))
    peaks = [f["d_peak"] ** 2 for f in fits if f["d_peak"] is not None]
    gains = [f["gain_peak"] for f in fits if f["d_peak"] is not None]
    within = max(f["d_max"] ** 2 for f in fits)
    if not peaks:
        return cells + [f"no peak within {within:.1f} nats", "-"]
    some = "" if len(peaks) == len(fits) else f"{len(peaks)} of {len(fits)}: "
    return cells + [some + range_cell(peaks, "{:.1f}"), some + range_cell(gains, "{:+.2f}")]


def fits_section(trajs, frees, betas, bon, res):
    """Gao et al.'s forms fitted to frontiers: R(d) = d(α − β log d) to each β = 0 run's
    evaluations (its KL grows, so its trajectory is a frontier) and, across the fixed β, to each
    seed's final points; best-of-n's d(α − βd) to each pool of prompts."""
    lines = ["\n## Gao et al.'s forms fitted to frontiers\n",
             "Least squares through the origin, d = √KL: PPO's d(α − β log d), best-of-n's "
             "d(α − βd). One fit per seed (β = 0: its evaluations; fixed β: each β's final "
             "evaluation, one point per β) or per pool of held-out prompts (best-of-n: the prompts "
             "dealt into 4 pools), α >= 0 and β >= 0 (bounded to what they mean); each column "
             "the mean (range over the fits); the KL at the peak only where the fitted curve "
             "turns within the KL the fit saw (a peak beyond it is the fit's extrapolation, not a "
             "measurement).\n",
             "| frontier | fits | α | β | R² | KL at peak | gain at peak |",
             "|---|---|---|---|---|---|---|"]
    for cond in frees:
        fits = [overopt.fit(np.sqrt(np.maximum(t["kl"], 0)), t["gold"], "rl")
                for t in trajs[cond].values()]
        res["fits"][cond] = fits
        lines.append(f"| {cond} | {len(fits)} | " + " | ".join(fit_cells(fits)) + " |")
    seeds = sorted(set.intersection(*[set(trajs[c]) for c in betas])) if betas else []
    if seeds:
        fits = []
        for s in seeds:
            kl = [0.0] + [trajs[c][s]["kl"][-1] for c in betas]
            gold = [0.0] + [trajs[c][s]["gold"][-1] for c in betas]
            fits.append(overopt.fit(np.sqrt(np.maximum(kl, 0)), gold, "rl"))
        res["fits"]["fixed β, final points"] = fits
        lines.append(f"| fixed β {', '.join(c.split('_')[-1] for c in betas)}: final points | "
                     f"{len(fits)} | " + " | ".join(fit_cells(fits)) + " |")
    for name, b in bon.items():
        fits = [overopt.fit(p["d"], p["gold"], "bon") for p in b["pools"]]
        res["fits"][f"best-of-n ({name})"] = fits
        lines.append(f"| best-of-n ({name}) | {len(fits)} pools | " + " | ".join(fit_cells(fits))
                     + " |")
    return lines


def bon_section(bon, res):
    """Best-of-n by the proxy on each base's pretrained model, all pools together."""
    lines = ["\n## Best-of-n by the proxy (the pretrained model's pools together)\n"]
    for name, b in bon.items():
        a = b["all"]
        res["bon"][name] = a
        lines += [f"\n{name}: {a['samples']} samples over {len(b['pools'])} pools of prompts, "
                  f"{a['repeats']} of them repeat an earlier one for their prompt.\n",
                  "| n | KL formula | KL pool, ties | KL pool, no ties | d | gold gain | "
                  "proxy gain |", "|---|---|---|---|---|---|---|"]
        for i, n in enumerate(a["n"]):
            lines.append(f"| {n} | {a['kl_formula'][i]:.3f} | {a['kl_pool'][i]:.3f} | "
                         f"{a['kl_no_ties'][i]:.3f} | {a['d'][i]:.3f} | {a['gold'][i]:+.3f} | "
                         f"{a['proxy'][i]:+.3f} |")
    return lines


def overopt_tables(bon, trajs, rows, plan):
    """The overopt suite's tables (markdown) and numbers (a dict). bon {base: dict(pools=[one
    overopt.bon_curve per pool of prompts], all=the pools together)}; trajs {condition: {seed:
    overopt.trajectory}}; rows ablate.py's final rows; plan names the conditions' roles:
    dict(free=[β = 0 runs], stops={condition: budget}, stop_of=the β = 0 run the stops share,
    penalised=[runs], betas=[the fixed-β runs, in β order], own_free={penalised: its β = 0 run},
    also=[(penalised, a β = 0 run at another learning rate)],
    models={model: its key pair's name in own_free's 'pen - free' form}, proxies: as
    proxies_section's, optional)."""
    res = dict(free={}, stops={}, steps={}, pairs={}, fits={}, bon={})
    frees = [c for c in plan["free"] if c in trajs]
    pens = [c for c in plan["penalised"] if c in trajs]
    betas = [c for c in plan["betas"] if c in trajs]
    lines = free_section(trajs, frees, res)
    lines += stop_section(trajs, rows, plan["stops"], plan["stop_of"], res)
    lines += penalised_section(trajs, pens, frees, res)
    lines += pair_section(trajs, list(plan["own_free"].items()) + plan["also"], res)
    lines += bought_section(trajs, list(plan["own_free"].items()) + plan.get("controls", []), res)
    lines += models_section(res, plan["models"])
    lines += proxies_section(res, plan.get("proxies", {}))
    lines += fits_section(trajs, frees, betas, bon, res)
    lines += bon_section(bon, res)
    return "\n".join(lines) + "\n", res
