"""The spread a new user should expect: the main pipeline under several seeds (world, pretraining,
reward model and PPO all reseeded), each number's mean and 95 % prediction interval for a new
seed over them, and README's first table written from them.

    python -m lab.seeds                        # seeds 1337-1341 -> out/seeds/seeds.md
    python -m lab.seeds --seeds=1337,1338 --preset=smoke --out_dir=/tmp/s
    python -m lab.seeds --help                 # this text; train.py --help lists the other flags

Every flag but --seeds goes to train.py unchanged. The seed that --seed names (default 1337) is
the main run in --out_dir itself; each other seed runs in --out_dir/seeds/seedN. Each is
train.py's pipeline, cached as train.py caches it: a finished seed is kept, a killed one goes on
from where it stopped. seeds/seeds.md holds one row per number (each seed, the mean, min-max and
the Student-t prediction interval, mean ± t·s·√(1 + 1/n): tables.t_prediction, its coverage
simulated in tests/test_intervals.py), then README's first table: the main run's own numbers,
a new seed's interval, and the sampling standard error of the main run's 200-sample means where
the report holds what it takes (the gold score's std, a rate's binomial one), and the seeds' n
(lab.claims widens the intervals by it), with the line that says what made it (provenance.py);
the numbers go to seeds/seeds.json.
Left out: another CPU (run this there); the sampling error of the means the report keeps no
spread for (proxy, KL, distinct-2, perplexity).
"""
# Ctrl-C while the imports below load torch (seconds) is one line and exit 130.
if __name__ == "__main__":
    from machinery.errors import ctrl_c_while_starting
    ctrl_c_while_starting()
import os, sys

import train
from machinery import provenance, store
from machinery.config import check_once, override
from machinery.errors import RunError, die, run_main
from lab.claims import HEADER, POLICIES, ROWS
from lab.tables import t_prediction


def parse(argv):
    """(seeds, train.py's flags). Bad input: one line, exit 2."""
    # --help (or -h) prints this file's docstring, not train.py's, and exits 0.
    if "--help" in argv or "-h" in argv:
        print(__doc__.strip())
        sys.exit(0)
    check_once(argv)
    seeds, rest = "1337,1338,1339,1340,1341", []
    for a in argv:
        if a.startswith("--seeds="):
            seeds = a.partition("=")[2]
        else:
            rest.append(a)
    try:
        picked = [int(s) for s in seeds.split(",")]
    except ValueError:
        die(f"bad value for --seeds: {seeds!r} (a comma-separated list of integers)")
    if len(set(picked)) != len(picked):
        die(f"bad value for --seeds: {seeds!r} (distinct integers)")
    # An interval needs a spread: at least two seeds.
    if len(picked) < 2:
        die(f"bad value for --seeds: {seeds!r} (at least two seeds, for an interval)")
    cfg = train.parse(rest)
    # The whole pipeline, so that each seed has a report to read.
    if cfg.run.stage != "all":
        die(f"seeds.py runs every stage: leave out --stage (got --stage={cfg.run.stage})")
    # Every seed's flags and folders are checked before any run.
    for seed in picked:
        folder = folder_of(cfg, seed)
        train.parse(override(rest, [f"--seed={seed}", f"--out_dir={folder}"]))
        for d in (folder, os.path.join(cfg.run.out_dir, "seeds")):
            if store.not_a_folder(d):
                die(f"--out_dir={cfg.run.out_dir}: {d} {store.not_a_folder(d)}")
    return picked, rest


def folder_of(cfg, seed):
    """The main run's folder for its own seed; out_dir/seeds/seedN for another."""
    if seed == cfg.run.seed:
        return cfg.run.out_dir
    return os.path.join(cfg.run.out_dir, "seeds", f"seed{seed}")


def numbers(run_dir):
    """One seed's numbers: README's table (ROWS, both policies), the pretraining's validation
    loss, the reward model's accuracy against the gold order, the gold gain in the pretrained
    model's standard deviations, and the stages' seconds summed."""
    rep = store.load_json(os.path.join(run_dir, "report.json"))
    row = {}
    for name, columns in ROWS.items():
        # The mean only: the "± std" part of README's row is the spread within one run.
        label = name.replace("(mean ± std)", "(mean)")
        for policy in POLICIES:
            row[f"{label}, {policy}"] = rep[policy][columns[0]]
    pre, rlhf = rep["pretrained"], rep["rlhf"]
    row["gold gain (pretrained std)"] = (rlhf["gold_mean"] - pre["gold_mean"]) / pre["gold_std"]
    row["pretraining validation loss"] = store.load_json(
        os.path.join(run_dir, "pretrain.json"))["val_loss"]
    row["reward model accuracy (gold order)"] = store.load_json(
        os.path.join(run_dir, "reward.json"))["acc_gold"]
    row["seconds (stages summed)"] = sum(rep["seconds"].values())
    return row


def table(per_seed):
    """Markdown: one row per number, one column per seed, then the mean, the min-max and a new
    seed's 95 % prediction interval."""
    seeds = list(per_seed)
    n = len(seeds)
    lines = ["| number | " + " | ".join(f"seed {s}" for s in seeds)
             + f" | mean | min–max | a new seed (t, n = {n}) |",
             "|---" * (n + 4) + "|"]
    for name in per_seed[seeds[0]]:
        vals = [per_seed[s][name] for s in seeds]
        digits = 0 if name.startswith("seconds") else 3
        cells = [f"{v:.{digits}f}" for v in vals]
        spread = f"{min(vals):.{digits}f}–{max(vals):.{digits}f}"
        mean, lo, hi = t_prediction(vals)
        lines.append(f"| {name} | " + " | ".join(cells)
                     + f" | {mean:.{digits}f} | {spread} | [{lo:.{digits}f}, {hi:.{digits}f}] |")
    return "\n".join(lines) + "\n"


# README's rows: the decimals each row's numbers are printed to.
DIGITS = {"gold score (mean ± std)": 2, "proxy score (reward model)": 2,
          "exact KL to reference (nats / sequence)": 2, "well-formed rate": 3, "distinct-2": 3,
          "perplexity under the reference": 2}


def sampling_se(rep, column, n):
    """The standard error of the report's n-sample mean in `column`, or None where the report
    keeps no spread for it: the gold score's std / √n, a rate's √(p(1 - p) / n)."""
    if column == "gold_mean":
        return rep["gold_std"] / n ** 0.5
    if column == "wellformed_rate":
        return (rep[column] * (1 - rep[column]) / n) ** 0.5
    return None


def readme_table(main_rep, per_seed, n_eval):
    """README's first table (lab/claims.py reads it): the main run's numbers, a new seed's
    "mean [low, high]" over per_seed, and the sampling s.e. of the main run's means."""
    lines = [HEADER, "|---" * (HEADER.count("|") - 1) + "|"]
    for name, (column, std) in ROWS.items():
        d = DIGITS[name]
        label = name.replace("(mean ± std)", "(mean)")
        own, new, ses = [], [], []
        for policy in POLICIES:
            rep = main_rep[policy]
            cell = f"{rep[column]:.{d}f}"
            if std is not None:
                cell += f" ± {rep[std]:.{d}f}"
            own.append(cell)
            mean, lo, hi = t_prediction([row[f"{label}, {policy}"] for row in per_seed.values()])
            new.append(f"{mean:.{d}f} [{lo:.{d}f}, {hi:.{d}f}]")
            se = sampling_se(rep, column, n_eval)
            ses.append("—" if se is None else f"{se:.{d}f}")
        se_cell = "—" if ses == ["—"] * len(ses) else " / ".join(ses)
        lines.append(f"| {name} | " + " | ".join(own + new) + f" | {se_cell} |")
    return "\n".join(lines) + "\n"


def main(argv):
    seeds, rest = parse(argv)
    cfg = train.parse(rest)
    per_seed = {}
    for seed in seeds:
        run_dir = folder_of(cfg, seed)
        print(f"==== seed {seed}: python train.py into {run_dir} ====", flush=True)
        train.main(override(rest, [f"--seed={seed}", f"--out_dir={run_dir}"]))
        try:
            per_seed[seed] = numbers(run_dir)
        except (RunError, KeyError, OSError) as e:
            die(f"lab.seeds: seed {seed}'s run in {run_dir} has no readable report ({e})", 1)
        except KeyboardInterrupt:
            die("interrupted; finished seeds are kept, and the same command goes on from there",
                130)
    runs = sum(row["seconds (stages summed)"] for row in per_seed.values())
    made = provenance.stamp(runs, device=cfg.run.device)
    main_dir = folder_of(cfg, cfg.run.seed)
    if cfg.run.seed in per_seed:
        main_rep = store.load_json(os.path.join(main_dir, "report.json"))
        first = ("\nREADME's first table (the run of seed "
                 f"{cfg.run.seed}, a new seed's 95 % prediction interval over these {len(seeds)}, "
                 f"and the sampling s.e. of the run's {cfg.eval.n_eval}-sample means):\n\n"
                 + readme_table(main_rep, per_seed, cfg.eval.n_eval)
                 # lab.claims reads n from the prose under the table.
                 + f"\nA new seed's intervals: Student-t, n = {len(seeds)}.\n")
    else:
        first = ""
    text = (f"# The main pipeline under {len(seeds)} seeds\n\n{table(per_seed)}{first}\n"
            + provenance.line(made, "the seeds' stages summed") + "\n")
    sdir = os.path.join(cfg.run.out_dir, "seeds")
    os.makedirs(sdir, exist_ok=True)
    store.write_text(os.path.join(sdir, "seeds.md"), text)
    store.save_json(os.path.join(sdir, "seeds.json"), dict(seeds=per_seed, made_by=made))
    print(text)


if __name__ == "__main__":
    run_main(main, sys.argv[1:])
