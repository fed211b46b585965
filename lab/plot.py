"""Runs side by side from their JSONL logs: one panel per key, one line per run, each labelled by
its folder.

    python -m lab.plot out/ablate/no_kl/seed1337 out/ablate/adaptive/seed1337 \\
        --keys=objective/gold,objective/kl_exact --out=no_kl_vs_adaptive.png
    python -m lab.plot out --file=dpo_metrics.jsonl --keys=loss,rewards/margins
    python -m lab.plot --help               # this text

RUN: a run's folder (out/, one of lab/ablate.py's runs) holding --file: metrics.jsonl (PPO's, the
default), pretrain_metrics.jsonl, reward_metrics.jsonl or dpo_metrics.jsonl. --keys: the columns
to draw, comma-separated, named as the file names them (docs/outputs.md); the x axis is the rows'
"iter" (PPO, pretraining) or "step" (reward model, DPO). A key only some rows hold (eval/ columns,
val_loss) is drawn at those rows, with markers; a run without a key has no line in its panel.
--out: the PNG (default plot.png). Bad input (no RUN, no --keys, a folder without the file, a file
that is not a JSONL log, a key no run holds: the line names the keys there are, an --out that is
not a .png, a flag given twice): one line on stderr, exit 2. Needs matplotlib.
Left out: smoothing, log scales, several files in one figure (one command per file).
"""
# Ctrl-C while the imports below load torch (seconds) is one line and exit 130.
if __name__ == "__main__":
    from machinery.errors import ctrl_c_while_starting
    ctrl_c_while_starting()
import importlib.util, json, math, os, sys

from machinery import store
from machinery.config import check_once
from machinery.errors import RunError, die, run_main

FILES = ("metrics.jsonl", "pretrain_metrics.jsonl", "reward_metrics.jsonl", "dpo_metrics.jsonl")


def parse(argv):
    """(runs, keys, file, out). Bad input: one line, exit 2."""
    if "--help" in argv or "-h" in argv:
        print(__doc__.strip())
        sys.exit(0)
    check_once(argv)
    runs, opts = [], dict(keys="", file=FILES[0], out="plot.png")
    for a in argv:
        name, eq, value = a[2:].partition("=")
        if not a.startswith("--"):
            runs.append(a)
        elif name not in opts:
            die(f"lab.plot: unknown flag {a!r} (--keys, --file, --out; --help says more)")
        elif not eq or not value:
            die(f"lab.plot: --{name} has no value: write --{name}=VALUE")
        else:
            opts[name] = value
    keys = [k for k in opts["keys"].split(",") if k]
    if not runs:
        die("lab.plot: no RUN: name one run folder or more (python -m lab.plot out --keys=...)")
    if not keys:
        die("lab.plot: no --keys: name the columns to draw (--keys=objective/gold,objective/kl)")
    if opts["file"] not in FILES:
        die(f"lab.plot: --file={opts['file']} is none of {', '.join(FILES)}")
    if not opts["out"].endswith(".png"):
        die(f"lab.plot: --out={opts['out']} is not a .png")
    return runs, keys, opts["file"], opts["out"]


def is_number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def load_rows(run, name):
    """The rows of run/name, each a dict. Bad input (no such file, not a JSONL of rows, no row):
    one line, exit 2."""
    path = os.path.join(run, name)
    if not os.path.isdir(run):
        die(f"lab.plot: {run} is not a folder (a run's folder, such as out)")
    if not os.path.isfile(path):
        die(f"lab.plot: {run} has no {name} (--file picks another: {', '.join(FILES)})")
    try:
        with open(path) as f:
            rows = [json.loads(line) for line in f if line.strip()]
    except (OSError, ValueError) as e:
        die(f"lab.plot: {path} is not a JSONL log ({type(e).__name__})")
    if not rows or not all(isinstance(r, dict) for r in rows):
        die(f"lab.plot: {path} holds no rows of a log (one JSON object a line)")
    return rows


def x_key(rows):
    """The rows' step: "iter" or "step"."""
    return "iter" if "iter" in rows[0] else "step"


def available(logs):
    """Every key with a number in some row of some run, the step's aside, sorted."""
    found = {k for rows in logs.values() for r in rows for k, v in r.items() if is_number(v)}
    return sorted(found - {"iter", "step"})


def draw(logs, keys, out):
    """One panel per key, one line per run (its folder the label, in one legend under the
    panels), into the PNG `out`."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    cols = 2 if len(keys) in (2, 4) else min(3, len(keys))
    rows_of_panels = math.ceil(len(keys) / cols)
    # The legend: a line of about a quarter inch per run, under the panels.
    legend = 0.25 * len(logs) + 0.3
    height = 3.6 * rows_of_panels + legend
    fig, axes = plt.subplots(rows_of_panels, cols, figsize=(5 * cols, height), squeeze=False)
    for ax in axes.flat[len(keys):]:
        ax.set_visible(False)
    for ax, key in zip(axes.flat, keys):
        for i, (run, rows) in enumerate(logs.items()):
            x = x_key(rows)
            have = [r for r in rows if is_number(r.get(key)) and x in r]
            # A column only some rows hold (an evaluation's) is points, joined.
            marker = "o" if len(have) < len(rows) or len(have) <= 20 else None
            ax.plot([r[x] for r in have], [r[key] for r in have], color=f"C{i}", lw=1.2,
                    marker=marker, ms=3)
        ax.set_title(key, fontsize=10)
        ax.set_xlabel(x_key(next(iter(logs.values()))))
    handles = [Line2D([], [], color=f"C{i}", lw=1.5) for i in range(len(logs))]
    fig.legend(handles, list(logs), loc="lower center", fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, legend / height, 1, 1))
    store.save_figure(fig, out)
    plt.close(fig)


def main(argv):
    runs, keys, name, out = parse(argv)
    if importlib.util.find_spec("matplotlib") is None:
        die("lab.plot needs matplotlib (pip install matplotlib)")
    logs = {os.path.normpath(run): load_rows(run, name) for run in runs}
    there = available(logs)
    unknown = [k for k in keys if k not in there]
    if unknown:
        die(f"lab.plot: no run's {name} has the key {unknown[0]!r}; its keys: {', '.join(there)}")
    try:
        draw(logs, keys, out)
    except RunError as e:
        die(f"lab.plot: {e}")
    print(f"{out}: {', '.join(keys)} of {len(logs)} run(s)")
    return 0


if __name__ == "__main__":
    run_main(main, sys.argv[1:])
