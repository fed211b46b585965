"""README's "Change it" recipes, measured: each recipe's diff applied to a copy of the code, then
PPO and the report run on a copy of the main run, side by side with the code as it is.

    python -m lab.recipes                  # every recipe -> out/recipes/recipes.md, .json
    python -m lab.recipes --help           # this text; every other flag is train.py's

A recipe is a list of README's ```diff blocks (RECIPES names them by their first line) and the
flags to run it under. Each run copies the project's .py files and the main run's world,
pretrained model, reference, reward model and records into out/recipes/NAME/, applies the blocks
(each '-' line must be where the block says, else the recipe is stale: exit 2), and runs
`python train.py` there: the edit changes the ppo stage's code, so ppo and report are redone and
nothing before them. The table gives each run's held-out gold, proxy, KL to the reference, final
β, response length, and the penalty the rewards held (objective/non_score_reward, the mean of the
last 10 iterations). A finished recipe run is kept, as train.py keeps a stage.
Left out: seeds (one run per recipe, seed --seed), recipes in docs/.
"""
# Ctrl-C while the imports below load torch (seconds) is one line and exit 130.
if __name__ == "__main__":
    from machinery.errors import ctrl_c_while_starting
    ctrl_c_while_starting()
import glob, os, re, shutil, subprocess, sys

import train
from machinery import provenance, store
from pipeline import stages
from machinery.config import check_once, override
from machinery.errors import RunError, die, run_main

# A diff block of README: its first line names the file, the line and the function.
BLOCK = re.compile(r"```diff\n(# (\S+):(\d+), in (\w+)\n.*?)```", re.S)
# name -> (the diff blocks it applies, each by (file, function) as its first line names them; the
# flags it runs under). "as_is" applies nothing.
MEAN = [("kl.py", "shaped_rewards"), ("ppo.py", "ppo_update")]
RECIPES = {
    "as_is": ([], []),
    "as_is_fixed_0.05": ([], ["--kl_ctl=fixed", "--init_kl_coef=0.05"]),
    "per_token_mean": (MEAN, []),
    "per_token_mean_fixed_0.8": (MEAN, ["--kl_ctl=fixed", "--init_kl_coef=0.8"]),
    "length_reward": ([("ppo.py", "make_experience")], []),
}
# The main run's files a recipe run starts from: every output of the stages `python train.py` runs
# before ppo (a missing one would make train.py redo its stage, pretraining included) and the
# records; the ppo and report stages are redone.
FIRST_REDONE = [st.name for st in stages.STAGES].index("ppo")
KEEP = [n for st in stages.STAGES[:FIRST_REDONE] if not st.optional for n in st.outputs]
KEEP += ["stages.json", "timings.json"]


def blocks(readme):
    """[(file, line, function, '-' lines, '+' lines)] of README's diff blocks, in order."""
    out = []
    for m in BLOCK.finditer(readme):
        lines = m.group(1).splitlines()[1:]
        minus = [x[1:] for x in lines if x.startswith("-")]
        plus = [x[1:] for x in lines if x.startswith("+")]
        out.append((m.group(2), int(m.group(3)), m.group(4), minus, plus))
    return out


def chosen(name, found):
    """The diff blocks recipe `name` applies; RunError when README has none for one of them."""
    picked = []
    for file, function in RECIPES[name][0]:
        matching = [b for b in found if b[:3:2] == (file, function)]
        if not matching:
            raise RunError(f"README has no diff block '# {file}:LINE, in {function}' for recipe "
                           f"{name}")
        picked.append(matching[0])
    return picked


def apply(code, block):
    """One diff block applied to the copy of the code in `code`; RunError when its '-' lines are
    not at its line (README is stale)."""
    name, line, _, minus, plus = block
    path = os.path.join(code, name)
    with open(path) as f:
        lines = f.read().split("\n")
    if lines[line - 1:line - 1 + len(minus)] != minus:
        raise RunError(f"README's recipe is stale: {name}:{line} is not {minus[0].strip()!r}")
    lines[line - 1:line - 1 + len(minus)] = plus
    store.write_text(path, "\n".join(lines))


def code_copy(dest):
    """The project's .py files (root and folders, not the tests) copied into dest."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for f in glob.glob(os.path.join(root, "*.py")) + glob.glob(os.path.join(root, "*", "*.py")):
        rel = os.path.relpath(f, root)
        if rel.startswith("tests"):
            continue
        os.makedirs(os.path.join(dest, os.path.dirname(rel)), exist_ok=True)
        shutil.copy(f, os.path.join(dest, rel))


def run_recipe(name, found, main, folder, flags):
    """Recipe `name` in folder/code (the edited copy) on folder/out (the main run's models); the
    numbers of its report and PPO log."""
    code, out = os.path.join(folder, "code"), os.path.join(folder, "out")
    if not os.path.exists(os.path.join(out, "report.json")):
        shutil.rmtree(code, ignore_errors=True)
        code_copy(code)
        for block in chosen(name, found):
            apply(code, block)
        os.makedirs(out, exist_ok=True)
        for n in KEEP:
            if os.path.exists(os.path.join(main, n)):
                shutil.copy(os.path.join(main, n), os.path.join(out, n))
        own = [f"--out_dir={os.path.abspath(out)}", *RECIPES[name][1]]
        argv = [sys.executable, "train.py", *override(flags, own)]
        done = subprocess.run(argv, cwd=code, capture_output=True, text=True)
        if done.returncode != 0:
            why = (done.stderr.strip().splitlines() or ["no message"])[-1]
            raise RunError(f"recipe {name}: train.py exited {done.returncode}: {why}", 1)
    rep = store.load_json(os.path.join(out, "report.json"))["rlhf"]
    ppo = store.load_json(os.path.join(out, "ppo.json"))
    rows = store.load_json(os.path.join(out, "metrics.jsonl"), lines=True)[-10:]
    non_score = sum(r["objective/non_score_reward"] for r in rows) / len(rows)
    return dict(recipe=name, gold=rep["gold_mean"], proxy=rep["proxy_mean"], kl=rep["kl"],
                beta=ppo["kl_coef_final"], length=rep["response_length"],
                wellformed=rep["wellformed_rate"], non_score=non_score,
                seconds=ppo["seconds"])


def table(rows):
    head = ("| recipe | gold | proxy | KL (nats) | final β | length | well-formed | "
            "non_score_reward |")
    lines = [head, "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['recipe']} | {r['gold']:+.2f} | {r['proxy']:+.2f} | {r['kl']:.2f} | "
                     f"{r['beta']:.4f} | {r['length']:.1f} | {r['wellformed']:.3f} | "
                     f"{r['non_score']:+.3f} |")
    return "\n".join(lines) + "\n"


def main(argv):
    if "--help" in argv or "-h" in argv:
        print(__doc__.strip())
        sys.exit(0)
    check_once(argv)
    cfg = train.parse(argv)
    main_dir = cfg.run.out_dir
    readme = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                          "README.md")
    with open(readme) as f:
        found = blocks(f.read())
    # The main run's models, made when missing.
    if not os.path.exists(os.path.join(main_dir, "reward.pt")):
        train.main(argv)
    try:
        rdir = os.path.join(main_dir, "recipes")
        rows = [run_recipe(n, found, main_dir, os.path.join(rdir, n), argv) for n in RECIPES]
    except RunError as e:
        die(str(e), e.code)
    except KeyboardInterrupt:
        die("interrupted; finished recipes are kept and the same command goes on from there", 130)
    made = provenance.stamp(sum(r["seconds"] for r in rows), device=cfg.run.device)
    text = (f"# README's recipes, measured\n\n{table(rows)}\n"
            + provenance.line(made, "the PPO stages' seconds summed") + "\n")
    store.write_text(os.path.join(rdir, "recipes.md"), text)
    store.save_json(os.path.join(rdir, "recipes.json"), dict(rows=rows, made_by=made))
    print(text)


if __name__ == "__main__":
    run_main(main, sys.argv[1:])
