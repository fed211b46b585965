"""The spread a new user should expect: the main pipeline under several seeds (world, pretraining,
reward model and PPO all reseeded), and each of README's first-table numbers with its mean and
min-max over them.

    python -m lab.seeds                        # seeds 1337, 1338, 1339 -> out/seeds/seeds.md
    python -m lab.seeds --seeds=1337,1338 --preset=smoke --out_dir=/tmp/s
    python -m lab.seeds --help                 # this text; train.py --help lists the other flags

Every flag but --seeds goes to train.py unchanged. The seed that --seed names (default 1337) is
the main run in --out_dir itself; each other seed runs in --out_dir/seeds/seedN. Each is
train.py's pipeline, cached as train.py caches it: a finished seed is kept, a killed one goes on
from where it stopped. The table goes to seeds/seeds.md with the line that says what made it
(provenance.py), the numbers to seeds/seeds.json.
Left out: intervals (three seeds give a range, not a distribution); another CPU (run this there).
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
from lab.claims import POLICIES, ROWS


def parse(argv):
    """(seeds, train.py's flags). Bad input: one line, exit 2."""
    # --help (or -h) prints this file's docstring, not train.py's, and exits 0.
    if "--help" in argv or "-h" in argv:
        print(__doc__.strip())
        sys.exit(0)
    check_once(argv)
    seeds, rest = "1337,1338,1339", []
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
    """Markdown: one row per number, one column per seed, then the mean and the min-max."""
    seeds = list(per_seed)
    lines = ["| number | " + " | ".join(f"seed {s}" for s in seeds) + " | mean | min–max |",
             "|---" * (len(seeds) + 3) + "|"]
    for name in per_seed[seeds[0]]:
        vals = [per_seed[s][name] for s in seeds]
        digits = 0 if name.startswith("seconds") else 3
        cells = [f"{v:.{digits}f}" for v in vals]
        spread = f"{min(vals):.{digits}f}–{max(vals):.{digits}f}"
        lines.append(f"| {name} | " + " | ".join(cells)
                     + f" | {sum(vals) / len(vals):.{digits}f} | {spread} |")
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
    text = (f"# The main pipeline under {len(seeds)} seeds\n\n{table(per_seed)}\n"
            + provenance.line(made, "the seeds' stages summed") + "\n")
    sdir = os.path.join(cfg.run.out_dir, "seeds")
    os.makedirs(sdir, exist_ok=True)
    store.write_text(os.path.join(sdir, "seeds.md"), text)
    store.save_json(os.path.join(sdir, "seeds.json"), dict(seeds=per_seed, made_by=made))
    print(text)


if __name__ == "__main__":
    run_main(main, sys.argv[1:])
