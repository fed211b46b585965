"""Overoptimization, as Gao, Schulman & Hilton 2022 measure it: gold against d = sqrt(KL) for
best-of-n by the proxy and for PPO, and the two functional forms fitted to each.

    python -m lab.ablate --suite=overopt          # the runs, then overopt.json and overopt.png
    python -m pytest -q tests/test_overopt.py

Best-of-n (`best_of_n`): from a pool of N samples of the pretrained model for one prompt, sorted
by proxy, the i-th smallest is the proxy-best of an n-subset in C(i-1, n-1) of the C(N, n)
subsets, so the expected gold (and proxy) of the proxy-best of n is a weighted sum over the pool:
unbiased, every subset counted (Nakano et al. 2021). Samples with equal proxy share their mean
gold (a tie is broken at random). Its KL to the pretrained model is usually quoted as
log n - (n - 1)/n (`kl_bon_formula`), an upper bound that is exact only for a continuous
distribution without ties (Beirami et al. 2024); `kl_bon_pool` computes the exact KL of best-of-n
drawn from the pool's own empirical distribution, where identical responses are one outcome and
samples with equal proxy one rank, so the gap to the formula is measured, not assumed.
The fits (`fit`): least squares, through the origin, of the gold gain over the pretrained model
against d: best-of-n R(d) = d(α - β d), PPO R(d) = d(α - β log d); α, β, R², and the peak d* and
the gain there. A PPO trajectory is read at equal KL two ways: at its first pass through the KL
(`at_kl`), and as a frontier, the best evaluation at or under it (`best_under`).
Left out: Gao et al.'s fits across proxy sizes (here the suite reports α, β per proxy, not a law
over sizes), confidence bands on the fitted curves.
"""
import math
import numpy as np

from machinery import store


def best_of_n(proxy, gold, ns):
    """Expected (gold, proxy) of the proxy-best of n samples drawn without replacement from the
    pool, for each n in ns (n <= N). Returns two lists, one value per n."""
    order = np.argsort(np.asarray(proxy, dtype=float), kind="stable")
    p = np.asarray(proxy, dtype=float)[order]
    g = np.asarray(gold, dtype=float)[order]
    # Equal proxies: each of them is the one picked equally often, so they share their mean gold.
    for v in np.unique(p):
        tied = p == v
        g[tied] = g[tied].mean()
    big_n = len(p)
    golds, proxies = [], []
    for n in ns:
        # The i-th smallest (1-based) is the best of C(i - 1, n - 1) of the C(N, n) subsets.
        w = np.array([math.comb(i - 1, n - 1) for i in range(1, big_n + 1)], dtype=float)
        w = w / math.comb(big_n, n)
        golds.append(float(w @ g))
        proxies.append(float(w @ p))
    return golds, proxies


def kl_bon_formula(n):
    """KL(best-of-n ‖ π) for a continuous reward without ties: log n - (n - 1)/n nats."""
    return math.log(n) - (n - 1) / n


def kl_bon_pool(proxy, n, ties=True):
    """The exact KL (nats) from best-of-n to π when π is the pool's empirical distribution, each
    sample 1/N. Outcomes are ranked by proxy; with ties=True samples of equal proxy (identical
    responses among them) are one rank, whose share a random tie-break splits as π does, so they
    share one log-ratio; ties=False ranks every sample on its own (the pool as if it had none).
    With F the distribution function over ranks, best-of-n puts F_r^n - F_(r-1)^n on rank r."""
    p = np.sort(np.asarray(proxy, dtype=float))
    big_n = len(p)
    if ties:
        _, counts = np.unique(p, return_counts=True)
    else:
        counts = np.ones(big_n)
    kl, below = 0.0, 0.0
    for c in counts:
        q = c / big_n
        bon = (below + q) ** n - below ** n
        if bon > 0:
            kl += bon * math.log(bon / q)
        below += q
    return kl


def distinct_ties(texts):
    """How many of the pool's samples repeat an earlier one (identical text)."""
    return len(texts) - len(set(texts))


def fit(d, gain, form):
    """Least squares of gain = d(α - β·f(d)) through the origin, f(d) = d for form "bon" and
    log d for form "rl", α and β bounded to what they mean (α >= 0: the gain's first slope, β >=
    0: how fast it bends down; the best fit with one of them at 0 where the free fit breaks a
    bound). Returns dict(alpha, beta, r2, d_peak, gain_peak, d_max); the peak is None unless the
    fitted curve turns (β > 0) within the data (d_peak <= d_max, the largest d fitted): a peak past
    the data is the fit's extrapolation, not a measurement."""
    d = np.asarray(d, dtype=float)
    y = np.asarray(gain, dtype=float)
    second = d * d if form == "bon" else d * np.log(np.maximum(d, 1e-12))
    # gain = α·d - β·second: two columns, no intercept.
    cols = np.stack([d, -second], axis=1)
    best = None
    # The free fit, then each bound held at 0 (two parameters: the feasible fit of least error
    # is one of these).
    for keep in ((0, 1), (0,), (1,)):
        coef = np.zeros(2)
        coef[list(keep)] = np.linalg.lstsq(cols[:, keep], y, rcond=None)[0]
        if (coef >= 0).all():
            err = float(((y - cols @ coef) ** 2).sum())
            if best is None or err < best[0] - 1e-15:
                best = (err, coef)
    if best is None:
        best = (float((y ** 2).sum()), np.zeros(2))
    err, (alpha, beta) = best
    total = ((y - y.mean()) ** 2).sum()
    r2 = 1.0 - err / total if total > 0 else 1.0
    d_max = float(d.max()) if d.size else 0.0
    d_peak, gain_peak = None, None
    if beta > 0 and form == "bon":
        d_peak = alpha / (2 * beta)
    # dR/dd = α - β log d - β = 0 (log d* below 50: no overflow on the way to the check below).
    if beta > 0 and form == "rl" and alpha / beta - 1 < 50:
        d_peak = math.exp(alpha / beta - 1)
    if d_peak is not None and d_peak <= d_max:
        gain_peak = float(curve(dict(alpha=alpha, beta=beta), d_peak, form))
    else:
        d_peak = None
    return dict(alpha=float(alpha), beta=float(beta), r2=float(r2), d_peak=d_peak,
                gain_peak=gain_peak, d_max=d_max)


def curve(f, d, form):
    """The fitted gain at each d."""
    d = np.asarray(d, dtype=float)
    second = d * d if form == "bon" else d * np.log(np.maximum(d, 1e-12))
    return f["alpha"] * d - f["beta"] * second


def at_kl(kl, values, targets):
    """values interpolated at each KL in targets along a trajectory (in iteration order): at the
    first pass through the target, linear between the two evaluations around it; None where the
    trajectory never reaches it."""
    out = []
    for t in targets:
        hit = None
        for i in range(1, len(kl)):
            lo, hi = kl[i - 1], kl[i]
            if lo <= t <= hi and hi > lo:
                hit = values[i - 1] + (values[i] - values[i - 1]) * (t - lo) / (hi - lo)
                break
        out.append(hit)
    return out


def best_under(kl, values, targets):
    """The frontier reading of a trajectory: for each KL budget in targets, the largest value among
    the evaluations at or under it (the start, at KL 0, always is): what an oracle that stops at
    the best evaluation within the budget keeps. The max of noisy evaluations reads high, for
    every run alike."""
    return [max(v for k, v in zip(kl, values) if k <= t) for t in targets]


def plot(curves, png):
    """overopt.png: gold (solid) and proxy (dashed) gain against d = sqrt(KL), one colour per
    curve, with the fitted form dotted. curves: {label: dict(d, gold, proxy, fit, form)}. Skipped
    without matplotlib."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, ax = plt.subplots(figsize=(8, 5))
    for i, (label, c) in enumerate(curves.items()):
        colour = f"C{i % 10}"
        ax.plot(c["d"], c["gold"], color=colour, marker=".", label=f"{label}: gold")
        ax.plot(c["d"], c["proxy"], color=colour, linestyle="--", linewidth=0.8)
        if c.get("fit"):
            grid = np.linspace(1e-3, max(c["d"]), 100)
            ax.plot(grid, curve(c["fit"], grid, c["form"]), color=colour, linestyle=":")
    ax.axhline(0, color="grey", linewidth=0.5)
    ax.set_xlabel("d = sqrt(KL to the pretrained model), sqrt(nats)")
    ax.set_ylabel("gain over the pretrained model (solid: gold; dashed: proxy; dotted: fit)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    store.save_figure(fig, png)
    plt.close(fig)


def trajectory(rows, start):
    """A run's evaluations from its metrics rows: lists kl, gold, proxy (gains over `start`, the
    pretrained model's evaluation on the same stream), length (response tokens) and wellformed
    (the rate), beginning at the pretrained model (KL 0); start_gold is that evaluation's gold."""
    evals = [start] + [r for r in rows if "eval/kl" in r]
    kl = [0.0] + [r["eval/kl"] for r in evals[1:]]
    gold = [r["eval/gold_mean"] - start["eval/gold_mean"] for r in evals]
    proxy = [r["eval/proxy_mean"] - start["eval/proxy_mean"] for r in evals]
    length = [r["eval/response_length"] for r in evals]
    wellformed = [r["eval/wellformed_rate"] for r in evals]
    return dict(kl=kl, gold=gold, proxy=proxy, length=length, wellformed=wellformed,
                iters=[0] + [r["iter"] for r in evals[1:]], start_gold=start["eval/gold_mean"])


def bon_curve(pool, ns):
    """Best-of-n over a pool {prompt: [(text, gold, proxy)]}: per n the mean over prompts of the
    expected gold and proxy gain over n = 1, the formula's KL, the pool's exact KL with and
    without ties, and d from the tie-aware KL."""
    per = {k: [] for k in ("gold", "proxy", "kl_pool", "kl_no_ties")}
    for samples in pool.values():
        gold = [s[1] for s in samples]
        # One proxy per text: the same response scored in two batches may differ in its last bits.
        first = {}
        for s in samples:
            first.setdefault(s[0], s[2])
        proxy = [first[s[0]] for s in samples]
        g, p = best_of_n(proxy, gold, ns)
        per["gold"].append([x - g[0] for x in g])
        per["proxy"].append([x - p[0] for x in p])
        per["kl_pool"].append([kl_bon_pool(proxy, n) for n in ns])
        per["kl_no_ties"].append([kl_bon_pool(proxy, n, ties=False) for n in ns])
    out = {k: [float(x) for x in np.mean(v, 0)] for k, v in per.items()}
    out["n"] = list(ns)
    out["kl_formula"] = [kl_bon_formula(n) for n in ns]
    out["d"] = [math.sqrt(max(k, 0.0)) for k in out["kl_pool"]]
    texts = [s[0] for samples in pool.values() for s in samples]
    repeats = sum(distinct_ties([s[0] for s in samples]) for samples in pool.values())
    out["repeats"] = repeats
    out["samples"] = len(texts)
    return out


def at_iters(iters, values, targets):
    """The value at the evaluation made after exactly iteration t, for each t in targets; None where
    the run was not evaluated there (it stopped earlier, or evaluates every few iterations)."""
    at = dict(zip(iters, values))
    return [at.get(t) for t in targets]


def resolved(kl, target, gap=1.0):
    """True when a frontier cell at `target` nats is read where the run was: an evaluation within
    `gap` nats under the target, and a later one past it. Otherwise the best evaluation under the
    target may sit far below it, or the run never reached it."""
    near = any(target - gap <= k <= target for k in kl)
    return near and any(k > target for k in kl)


def change_over_last(iters, values, span=20):
    """How much values moved over the run's last `span` iterations: the least-squares slope
    against the iteration over the evaluations made in them (the last included), times span.
    None with fewer than 3 evaluations there."""
    last = iters[-1]
    pts = [(i, v) for i, v in zip(iters, values) if i >= last - span]
    if len(pts) < 3:
        return None
    x = np.array([p[0] for p in pts], dtype=float)
    y = np.array([p[1] for p in pts], dtype=float)
    slope = ((x - x.mean()) * (y - y.mean())).sum() / ((x - x.mean()) ** 2).sum()
    return float(slope * span)
