"""What the reference model buys, measured: the PPO stage re-run under each condition, several seeds each.

    python ablate.py                     # every condition x 3 seeds -> out/ablate/: results, examples, plots
    python ablate.py --quick             # one seed, shorter runs: a few minutes
    python ablate.py --conditions=no_kl,adaptive --seeds=5 --ppo_iters=80    # any train.py flag passes through
    python ablate.py --subdir=ablate_b64 --rollout_batch=64   # results into out/ablate_b64/ instead
    python ablate.py --jobs=1            # runs one after another, in this process (default: 2 processes, 1 thread each)

The pretrained model, frozen reference and reward model come from the main run folder (--out_dir, built by
train.py's stages when missing), so only PPO differs between rows. Every condition gets the same iterations,
batch and learning rates; a condition changes only the KL settings named in CONDITIONS.
Left out: hyper-parameter search per condition; conditions are compared at one shared budget.
"""
import json, multiprocessing, os, sys, time
from concurrent.futures import ProcessPoolExecutor
import numpy as np
import torch

import data
import train
from model import load_checkpoint

# condition -> train.py flags. est_k1 is the default (adaptive, k1 in the reward): it reuses the adaptive runs.
CONDITIONS = {
    "no_kl": ["--kl_ctl=fixed", "--init_kl_coef=0"],
    "rolling_ref": ["--kl_ref=rolling", "--kl_ctl=fixed", "--init_kl_coef=0.05"],
    "fixed_0.005": ["--kl_ctl=fixed", "--init_kl_coef=0.005"],
    "fixed_0.05": ["--kl_ctl=fixed", "--init_kl_coef=0.05"],
    "fixed_0.5": ["--kl_ctl=fixed", "--init_kl_coef=0.5"],
    "adaptive": [],
    "band": ["--kl_ctl=band", "--init_kl_coef=0.02"],
    "linear_decay": ["--kl_ctl=linear", "--init_kl_coef=0.1", "--kl_coef_end=0.001"],
    "est_k1": [],
    "est_k3": ["--kl_estimator=k3"],
    "est_full_reward": ["--kl_estimator=full"],
    "est_full_loss": ["--kl_in=loss"],
}
SAME_AS = {"est_k1": "adaptive"}
COLUMNS = ["proxy_mean", "gold_mean", "kl_ref", "ref_ppl", "distinct_1", "distinct_2", "repetition_rate",
           "wellformed_rate", "eos_rate", "seconds"]
DEFAULTS = ["--rollout_batch=32", "--ppo_iters=40", "--n_eval=100"]   # 33 runs must fit in 30 minutes
QUICK = ["--ppo_iters=12", "--n_eval=64"]
BASE_STAGES = ["world", "pretrain", "reference", "preferences", "reward"]


def parse(argv):
    """ablate.py's own flags; everything else is a train.py flag, checked by train.parse_args."""
    if "--help" in argv or "-h" in argv:
        print(__doc__)
        sys.exit(0)
    opts = dict(quick=False, seeds=3, conditions=",".join(CONDITIONS), jobs=2, subdir="ablate")
    user = []
    for a in argv:
        name, _, value = a[2:].partition("=")
        if a.startswith("--") and name in opts:
            try:
                opts[name] = (value.lower() in ("", "1", "true")) if name == "quick" else type(opts[name])(value)
            except ValueError:
                train.die(f"bad value for --{name}: {value!r}")
        else:
            user.append(a)
    unknown = [c for c in opts["conditions"].split(",") if c not in CONDITIONS]
    if unknown:
        train.die(f"unknown condition {unknown[0]!r} (choose {', '.join(CONDITIONS)})")
    if opts["quick"]:
        opts["seeds"] = min(opts["seeds"], 1)
    rest = DEFAULTS + (QUICK if opts["quick"] else []) + user     # later flags win
    train.parse_args(rest)                                  # unknown or ill-typed flags fail here, before any work
    return opts, rest


def one_run(job):
    """A single PPO run in its own folder; returns its row for results.jsonl."""
    cond, seed, flags, base, run_dir, threads = job
    if threads:
        torch.set_num_threads(threads)
    C = train.parse_args(flags + [f"--seed={seed}", f"--out_dir={base}"])
    train.seed_everything(seed)
    t = time.time()
    s = train.run_ppo(C, base, run_dir, log=lambda line: None)
    return dict(condition=cond, seed=seed, **s["final"], kl_coef_final=s["kl_coef_final"], seconds=time.time() - t)


def baseline_row(C, base, seed):
    """The pretrained model, scored exactly as each run's final actor is (same prompts, same sampling seed): where
    every condition starts from."""
    R = C["RunConfig"]
    enc = data.load_tokenizer(base, C["WorldConfig"].tokenizer)
    actor, ref, rm = train.load_models(base, R.device)
    train.seed_everything(seed + 1)
    final, _ = train.evaluate_policy(actor, enc, data.load_prompts(base)["heldout"], R, ref, rm, C["PPOConfig"].n_eval)
    return dict(condition="pretrained", seed=seed, **final, kl_coef_final=None, seconds=0.0)


def summarise(rows, order):
    """Markdown table: mean ± std over seeds for each condition."""
    lines = ["| condition | seeds | " + " | ".join(COLUMNS) + " |", "|---" * (len(COLUMNS) + 2) + "|"]
    for cond in order:
        rs = [r for r in rows if r["condition"] == cond]
        if rs:
            cells = [f"{np.mean([r[c] for r in rs]):.3f} ± {np.std([r[c] for r in rs]):.3f}" for c in COLUMNS]
            lines.append(f"| {cond} | {len(rs)} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot(rows, adir, order):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharex=True)
    for i, cond in enumerate(c for c in ["no_kl", "rolling_ref", "fixed_0.005", "fixed_0.5", "adaptive"] if c in order):
        curves = []
        for r in (r for r in rows if r["condition"] == cond):
            with open(os.path.join(adir, cond, f"seed{r['seed']}", "metrics.jsonl")) as f:
                curves.append([json.loads(line) for line in f])
        if curves:
            it = [x["iter"] for x in curves[0]]
            for ax, key in zip(axes, ["objective/gold", "objective/scores"]):
                ax.plot(it, np.mean([[x[key] for x in c] for c in curves], 0), color=f"C{i}", label=cond)
    axes[0].set_title("gold score (simulated human)"); axes[1].set_title("proxy score (reward model)")
    for ax in axes:
        ax.set_xlabel("PPO iteration")
    axes[1].legend(fontsize=8); fig.tight_layout(); fig.savefig(os.path.join(adir, "scores.png"), dpi=100)
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    for i, cond in enumerate(order):
        rs = [r for r in rows if r["condition"] == cond]
        ax.scatter([np.sqrt(max(r["kl_ref"], 0)) for r in rs], [r["gold_mean"] for r in rs], color=f"C{i % 10}",
                   marker="o" if i < 10 else "s", label=cond)
    ax.set_xlabel("sqrt(KL to reference), sqrt(nats)"); ax.set_ylabel("gold score, held-out prompts")
    ax.set_title("over-optimisation frontier (Gao et al. 2022)"); ax.legend(fontsize=7)
    fig.tight_layout(); fig.savefig(os.path.join(adir, "frontier.png"), dpi=100); plt.close(fig)


def write_examples(C, base, adir, order, seed, n=3):
    """examples.md: what the pretrained model and each condition's first-seed actor write for the same held-out
    prompts, with the same sampling noise, and the gold verdict on each."""
    R = C["RunConfig"]
    enc = data.load_tokenizer(base, C["WorldConfig"].tokenizer)
    heldout = data.load_prompts(base)["heldout"]
    prompts = heldout[::max(1, len(heldout) // n)][:n]                 # spread over the held-out subjects
    runs = [("pretrained", os.path.join(base, "pretrain.pt"))]
    runs += [(c, os.path.join(adir, c, f"seed{seed}", "actor.pt")) for c in order
             if c != "pretrained" and SAME_AS.get(c) not in order]
    lines = [f"# What each actor writes (seed {seed}, temperature {R.temperature})\n"]
    for name, path in runs:
        model, _ = load_checkpoint(path, R.device)
        train.seed_everything(seed + 2)                            # the same sampling noise for every actor
        lines.append(f"\n## {name}\n")
        for p, r in zip(prompts, train.sample_texts(model, enc, prompts, R)):
            v = data.judge(p, r)
            lines.append(f"- gold {v['score']:+.2f}{'' if v['wellformed'] else ' (not well-formed)'}: "
                         f"`{p.strip()}` | {r.replace(data.EOT, ' <eot>').strip()}")
    with open(os.path.join(adir, "examples.md"), "w") as f:
        f.write("\n".join(lines) + "\n")


def main(argv):
    opts, rest = parse(argv)
    C = train.parse_args(rest)
    base = C["RunConfig"].out_dir
    for stage in BASE_STAGES:                                # the shared pretrained model, reference, reward model
        out = dict((n, o) for n, o, _ in train.STAGES)[stage]
        if not os.path.exists(os.path.join(base, out)):
            train.main(rest + [f"--stage={stage}"])
    adir = os.path.join(base, opts["subdir"])
    os.makedirs(adir, exist_ok=True)
    order = opts["conditions"].split(",")
    seed0 = C["RunConfig"].seed
    jobs = [(c, seed0 + k, rest + CONDITIONS[c], base, os.path.join(adir, c, f"seed{seed0 + k}"),
             1 if opts["jobs"] > 1 else 0) for c in order if SAME_AS.get(c) not in order for k in range(opts["seeds"])]
    t0, rows = time.time(), [baseline_row(C, base, seed0)]
    print(f"ablate: {len(jobs)} PPO runs ({opts['jobs']} at a time) into {adir}", flush=True)
    pool = ProcessPoolExecutor(opts["jobs"], mp_context=multiprocessing.get_context("spawn")) \
        if opts["jobs"] > 1 else _Serial()
    with pool:
        for row in pool.map(one_run, jobs):
            rows.append(row)
            print(f"  {row['condition']:16s} seed {row['seed']}: gold {row['gold_mean']:+.2f} proxy "
                  f"{row['proxy_mean']:+.2f} kl {row['kl_ref']:.2f} ({row['seconds']:.0f}s, total "
                  f"{time.time() - t0:.0f}s)", flush=True)
    for cond, same in SAME_AS.items():                       # identical configuration: same runs, listed twice
        if cond in order and same in order:
            rows += [dict(r, condition=cond) for r in rows if r["condition"] == same]
    with open(os.path.join(adir, "results.jsonl"), "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    order = ["pretrained"] + order
    table = summarise(rows, order)
    with open(os.path.join(adir, "results.md"), "w") as f:
        f.write(f"# ablate.py {' '.join(argv)}\n\n{len(jobs)} PPO runs, {time.time() - t0:.0f} s in all. "
                f"Mean ± std over seeds; held-out prompts.\n\n{table}")
    plot(rows, adir, order)
    write_examples(C, base, adir, order, seed0)
    print(table)


class _Serial:
    """The executor interface, in this process (threads and seeds exactly as train.py runs them)."""
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False

    def map(self, fn, items):
        return map(fn, items)


if __name__ == "__main__":
    main(sys.argv[1:])
