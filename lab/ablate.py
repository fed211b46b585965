"""What the reference model buys, measured: the PPO stage re-run under each condition, several
seeds each.

    python -m lab.ablate                     # the core suite x 5 seeds at the main run's budget
                                             # -> out/ablate/
    python -m lab.ablate --suite=estimators  # a suite: core, estimators, reference, beta, anchors,
                                             # models, or all (SUITES)
    python -m lab.ablate --quick             # one seed, short runs (32 x 12 sequences): about 2
                                             # minutes -> out/ablate_quick/
    python -m lab.ablate --conditions=no_kl,adaptive --seeds=5 --ppo_iters=80
                                             # any train.py flag passes through
    python -m lab.ablate --subdir=ablate_short --rollout_batch=32 --ppo_iters=40
                                             # results into out/ablate_short/
    python -m lab.ablate --jobs=1            # runs one after another, in this process
                                             # (default: 2 processes, 1 thread each)
    python -m lab.ablate --suite=cheap       # cheaper references and the KL rollback
                                             # -> also out/ablate/results_ref.md
    python -m lab.ablate --suite=overopt     # is the penalty more than early stopping? 5 seeds,
                                             # 200 held-out samples after every iteration, best-of-n
                                             # -> out/ablate_overopt/ (overopt.md, .json, .png)
    python -m lab.ablate --suite=controls    # its controls: β = 0 with a price on length or an
                                             # entropy bonus -> out/ablate_overopt/controls.md
    python -m lab.ablate --fresh             # this command's runs again from the start
                                             # (never the main run: train.py's)
    python -m lab.ablate --kept=             # no kept runs taken or kept (default: lab/runs)
    python -m lab.ablate --suite=beta --tables_only
                                             # the tables and figures from lab/runs alone, on any
                                             # CPU, without training (--base=HASH: the pretrained
                                             # model's, where the archive holds several; the
                                             # figures also into docs/figures/)
    python -m lab.ablate --suite=beta --tables_only --make_pretrained
                                             # also the pretrained model's evaluations the archive
                                             # lacks, made on a CPU that rebuilds its base
    python -m lab.ablate --suite=beta --tables_only --figures=
                                             # the figures left in out/ only (default: also into
                                             # docs/figures/)
    python -m lab.ablate --tables_only --check
                                             # every suite's tables rebuilt so, and each table the
                                             # answers quote compared with them (lab/check.py)

results.md gives each column's mean with a Student-t 95 % interval over seeds, then each condition
minus `adaptive` (or the suite's first condition) paired over seeds, each column's comparisons
one family read as different, equivalent or undecided (tables.summarise, tables.MARGINS).
Each run folder holds what train.py's PPO stage writes but its plot (a run's curves:
`python -m lab.plot RUN_DIR`), and a run.json, written last, that records the config, input and
output hashes the run was made with (as stages.json does for train.py's stages). A run whose
record matches the current config and inputs, its outputs intact, is reused, so an interrupted
ablation goes on where it stopped (a run killed half way resumes from its ppo_state.pt); a run
with a damaged output, or no record, is done again, alone. `--fresh` redoes this command's runs
from the start and never touches the main run (that is `python train.py --fresh`). Ctrl-C, or a
kill -9 of ablate.py, stops every worker before it writes another file.
Kept runs: out/ is not part of the project, so each finished run's ppo.json, metrics.jsonl and
record (with the machine, commit and date that made it) are also kept in
lab/runs/SUBDIR/COND/SEED/inputs_HASH (--kept=FOLDER; only for the main run folder, out/, unless
--kept names one; --kept= turns it off). A run missing from out/ whose kept record matches the
current config, inputs and code, its kept files intact, is restored from there instead of being
run: the tables come out the same, and say how many of their runs earlier commands made (restored
or reused) and what made them. The inputs include the pretrained model's hash, so a kept run stands
in only on a CPU whose rounding rebuilds the same base; elsewhere the runs are made again and kept
beside it (HASH is a digest of the inputs), so runs made on several CPUs accumulate, each CPU's own
set. The weights are not kept (examples.md says so for a kept run). The pretrained model's rows
(each base's, scored as the runs are) are kept too, under lab/runs/SUBDIR/pretrained/inputs_HASH,
so --tables_only rebuilds every table and figure from the archive on any CPU (lab/archive.py).

The pretrained model, frozen reference and reward model come from the main run folder (--out_dir,
built by train.py's stages when missing), so only PPO differs between rows. Every condition gets
the same iterations, batch and learning rates; a condition changes only the KL settings named in
CONDITIONS.
A condition in BASES runs on another base instead: a reward model of other size or data, or
another pretrained model (world, pretraining and reward model reseeded), made under
--out_dir/SUBDIR/bases/NAME by train.py's stages from what the main run already has.
The models suite runs the headline conditions (no reference, the fixed βs, the default penalty) on
the main model and on two more (model2, model3), and tables.models_table takes each model's mean
over seeds as the unit: the claims with the variance between pretrained models in them.
The overopt suite (SUITE_FLAGS: its own budget, so its own folder, and not part of `all`) runs
β = 0 until it passes 12 nats at three learning rates, evaluated after every iteration; β = 0
stopped at budgets of 1-6 nats; fixed β, the adaptive controller and the mechanism's arms (the
penalty per sequence, λ = 1, RLOO) for 240 iterations, evaluated every 4th; the key pair on other
proxies and two more pretrained models. It adds best-of-n by the proxy on each reward model's
pretrained model, and tables.overopt_tables reads the trajectories as frontiers, pairs each
penalty with its own β = 0 run, and fits Gao et al. 2022's forms (overopt.py). The controls
suite, read the same way, asks what the penalty's lead is made of: β = 0 runs that pay for length
(--length_penalty) or are paid for entropy (--ent_coef) beside the default penalty.
Its statistics (Student-t intervals, paired differences), tables and plots are in tables.py.
Left out: hyper-parameter search per condition; conditions are compared at one shared budget.
"""
# Ctrl-C while the imports below load torch (seconds) is one line and exit 130.
if __name__ == "__main__":
    from machinery.errors import ctrl_c_while_starting
    ctrl_c_while_starting()
import math, multiprocessing, os, shutil, signal, sys, time
import numpy as np
import torch

import data, tokenizer, train
from ppo import PPOConfig
from machinery import provenance, records, store
from pipeline import stages
from machinery.config import RunConfig, check_once, override
from machinery.errors import RunError, die, run_main
from options.evaluate import best_of_k, during_ppo, evaluate_policy, sample_texts
from pipeline.report import plot_bestofk
from machinery.precision import autocast
from ref import load_checkpoint
from lab import archive, check, overopt
from lab.tables import (DEFAULT_CONDITION, beta_table, bestofk_cells, bestofk_curves, bestofk_table,
                        models_table, overopt_tables, plot, ref_table, summarise,
                        verifiable_columns)

PPO_LR = PPOConfig().ppo_lr
# The frontier's β = 0 runs stop at the first rollout past FREE_KL nats (their last evaluation is
# of that actor), or at FREE_ITERS iterations.
FREE_KL, FREE_ITERS = 12, 480
NO_KL = ["--kl_ctl=fixed", "--init_kl_coef=0"]
FREE = [f"--stop_kl={FREE_KL}", f"--ppo_iters={FREE_ITERS}"]
# The learning rates of the β = 0 frontier: the default, ¼ and 1/16 of it.
FREE_LRS = {"": [], "_lr_x0.25": [f"--ppo_lr={PPO_LR / 4:g}"],
            "_lr_x0.0625": [f"--ppo_lr={PPO_LR / 16:g}"]}
STOP_KLS = (1, 2, 3, 4, 6)
# The penalised runs' budget: long enough for gold to flatten, evaluated every 4th iteration.
LONG_ITERS, PENALISED_EVERY = 240, 4
LONG = [f"--ppo_iters={LONG_ITERS}", f"--eval_every={PENALISED_EVERY}"]
LONG_BETAS = ("0.01", "0.03", "0.1", "0.3", "1")
# The early-stopping controls' coefficients (fixed before their runs).
CONTROL_LENGTH, CONTROL_ENTROPY = ("0.01", "0.05"), ("0.01", "0.1")
# condition -> train.py flags. A condition in SAME_AS has the same flags as another and reuses its
# runs.
CONDITIONS = {
    "no_kl": ["--kl_ctl=fixed", "--init_kl_coef=0"],
    "rolling_ref": ["--ref_update=rolling", "--kl_ctl=fixed", "--init_kl_coef=0.05"],
    "fixed_0.005": ["--kl_ctl=fixed", "--init_kl_coef=0.005"],
    "fixed_0.05": ["--kl_ctl=fixed", "--init_kl_coef=0.05"],
    "fixed_0.5": ["--kl_ctl=fixed", "--init_kl_coef=0.5"],
    "adaptive": [],
    "band": ["--kl_ctl=band", "--init_kl_coef=0.02"],
    "linear_decay": ["--kl_ctl=linear", "--init_kl_coef=0.1", "--kl_coef_end=0.001"],
    "est_k1": [],
    "est_k3": ["--kl_estimator=k3"],
    "est_full_reward": ["--kl_estimator=full"],
    "est_full_loss": ["--kl_in=loss", "--kl_estimator=full"],
    # every estimator in every place (adaptive β, as the default), and the mean-over-the-response
    # mistake
    **{f"est_{k}_{place}": [f"--kl_estimator={k}", f"--kl_in={place}"]
       for k in ("k1", "k2", "k3", "full") for place in ("reward", "loss")},
    "est_seq_mean": ["--kl_estimator=seq_mean"],
    # between frozen and rolling, at rolling_ref's fixed β (fixed_0.05 is the frozen row)
    "ref_sync": ["--ref_update=sync", "--ref_sync_alpha=0.6", "--ref_sync_every=10",
                 "--kl_ctl=fixed", "--init_kl_coef=0.05"],
    "ref_reset": ["--ref_update=reset", "--ref_reset_every=20", "--kl_ctl=fixed",
                  "--init_kl_coef=0.05"],
    # a second anchor, to the pretraining data (InstructGPT's PPO-ptx)
    "ptx": ["--ptx_coef=1.0"],
    "ptx_no_kl": ["--ptx_coef=1.0", "--kl_ctl=fixed", "--init_kl_coef=0"],
    # fixed β from almost nothing to a lot; and a controller whose horizon (a tenth of the run) lets
    # β move
    **{f"beta_{b}": ["--kl_ctl=fixed", f"--init_kl_coef={b}"]
       for b in ("0.001", "0.01", "0.03", "0.1", "0.3", "1")},
    "adaptive_fast": ["--kl_horizon=0"],
    # how the reference is held (ref.py); ref_full is the default, as adaptive
    "ref_full": [],
    "ref_bf16": ["--ref=bf16"],
    "ref_fp16": ["--ref=fp16"],
    "ref_int8": ["--ref=int8"],
    "ref_nf4": ["--ref=nf4"],
    "ref_lora": ["--ref=lora"],
    # Adapters usually want a larger learning rate.
    "ref_lora_lr10": ["--ref=lora", "--ppo_lr=5e-4"],
    # The default model has 4 blocks: the top 2 train.
    "ref_shared_2": ["--ref=shared_2"],
    # a run that drifts (weak fixed β, as fixed_0.005), and the same run with the KL rollback
    "drift": ["--kl_ctl=fixed", "--init_kl_coef=0.005"],
    "rollback": ["--kl_ctl=fixed", "--init_kl_coef=0.005", "--kl_max=10"],
    # a verifiable reward (the simulated human itself) and critic-free group baselines (G = 8
    # samples per prompt). GRPO's β = 0.04 weighs a per-token mean of k3; tether's loss sums k3
    # over the ~40 tokens of a response, so the same weight is β = 0.04 / 40 = 0.001
    "gold_adaptive": ["--reward=gold"],
    "gold_no_kl": ["--reward=gold", "--kl_ctl=fixed", "--init_kl_coef=0"],
    "gold_grpo_k3loss": ["--reward=gold", "--advantage=grpo", "--kl_in=loss", "--kl_estimator=k3",
                         "--kl_ctl=fixed", "--init_kl_coef=0.001"],
    # No KL term at all: TRL's default.
    "gold_grpo_no_kl": ["--reward=gold", "--advantage=grpo", "--kl_ctl=fixed", "--init_kl_coef=0"],
    # The KL term is k1 in the reward, with adaptive β.
    "gold_rloo": ["--reward=gold", "--advantage=rloo"],
    # A mass-covering anchor.
    "gold_forward_kl": ["--reward=gold", "--kl_in=loss", "--kl_estimator=full_forward"],
    "grpo_k3loss": ["--advantage=grpo", "--kl_in=loss", "--kl_estimator=k3", "--kl_ctl=fixed",
                    "--init_kl_coef=0.001"],
    "grpo_no_kl": ["--advantage=grpo", "--kl_ctl=fixed", "--init_kl_coef=0"],
    # The early-stopping frontier (the overopt suite, evaluated every iteration): β = 0 run until
    # its rollout passes FREE_KL nats (then it stops, its last evaluation past it), at three
    # learning rates; β = 0 stopped at a budget; fixed β and the adaptive controller on a long
    # budget, evaluated every PENALISED_EVERY iterations.
    **{f"free{lr}": NO_KL + lr_flag for lr, lr_flag in FREE_LRS.items()},
    **{f"stop_{k:g}": NO_KL + [f"--stop_kl={k:g}"] for k in STOP_KLS},
    **{f"long_{b}": ["--kl_ctl=fixed", f"--init_kl_coef={b}"] for b in LONG_BETAS},
    "long_adaptive": [],
    # The mechanism: the same β = 0.1 paid once per sequence (at GAE's λ = 0.95 and 1), the
    # per-token penalty at λ = 1, and RLOO (no critic; its KL in the reward is per sequence by
    # construction), each beside its own β = 0 run.
    "long_seq_0.1": ["--kl_ctl=fixed", "--init_kl_coef=0.1", "--kl_placement=sequence"],
    "long_seq_0.1_lam1": ["--kl_ctl=fixed", "--init_kl_coef=0.1", "--kl_placement=sequence",
                          "--lam=1"],
    "long_0.1_lam1": ["--kl_ctl=fixed", "--init_kl_coef=0.1", "--lam=1"],
    "free_lam1": NO_KL + ["--lam=1"],
    "long_rloo_0.1": ["--advantage=rloo", "--kl_ctl=fixed", "--init_kl_coef=0.1"],
    "free_rloo": NO_KL + ["--advantage=rloo"],
    # The controls of what the KL is spent on: β = 0 with a price on length (per token: 20
    # tokens, the unpenalised actor's excess length, cost 0.2 and 1.0, either side of the ~0.4
    # the default penalty pays per response at its final KL) and with an entropy bonus (a
    # per-token KL at β holds -β·H: the penalised arms' βs 0.01 and 0.1).
    **{f"free_len_{c}": NO_KL + [f"--length_penalty={c}"] for c in CONTROL_LENGTH},
    **{f"free_ent_{c}": NO_KL + [f"--ent_coef={c}"] for c in CONTROL_ENTROPY},
    # The key pair (the adaptive controller and its β = 0 run) on other proxies and two more
    # pretrained models (BASES says which).
    **{f"{arm}_{b}": flags for arm, flags in (("long_adaptive", []), ("free", NO_KL))
       for b in ("rm1", "rm4", "pairs1500", "pairs3000", "model2", "model3")},
}
# The overopt conditions' own budgets: β = 0 until it passes FREE_KL nats, the penalised runs for
# LONG_ITERS iterations (the suite's, SUITE_FLAGS, for the rest).
BUDGETS = {c: FREE if c.startswith("free") else LONG for c in CONDITIONS
           if c.startswith(("free", "long_"))}
# condition -> (its base's folder name, the flags of the stages before PPO): a condition whose
# reward model or pretrained model is not the main run's. Its base, out/ablate/bases/NAME, is made
# by train.py's stages from a copy of the main run's world and pretrained model (what the flags
# leave alone is reused); model2 and model3 reseed everything, the world included.
BASE_OF = {"rm1": ("rm_layers1", ["--rm_layers=1"]), "rm4": ("rm_layers4", ["--rm_layers=4"]),
           "pairs1500": ("pairs1500", ["--n_pairs=1500"]),
           "pairs3000": ("pairs3000", ["--n_pairs=3000"]), "model2": ("model2", ["--seed=4242"]),
           "model3": ("model3", ["--seed=5151"])}
BASES = {f"{arm}_{b}": BASE_OF[b] for arm in ("long_adaptive", "free") for b in BASE_OF}
# The headline claims on the two other pretrained models, at the main run's budget: no reference
# (hacking) and the β hill, each beside the default penalty on the same model (the models suite).
MODELS = ("model2", "model3")
MODEL_CONDITIONS = ("no_kl", "beta_0.001", "fixed_0.005", "beta_0.01", "beta_0.03", "fixed_0.05",
                    "beta_0.1", "beta_0.3", "beta_1", "adaptive")
CONDITIONS.update({f"{c}_{m}": CONDITIONS[c] for m in MODELS for c in MODEL_CONDITIONS})
BASES.update({f"{c}_{m}": BASE_OF[m] for m in MODELS for c in MODEL_CONDITIONS})
SAME_AS = {"est_k1": "adaptive", "est_k1_reward": "adaptive", "est_k3_reward": "est_k3",
           "ref_full": "adaptive", "drift": "fixed_0.005"}
CORE = ["no_kl", "rolling_ref", "fixed_0.005", "fixed_0.05", "fixed_0.5", "adaptive", "band",
        "linear_decay", "est_k1", "est_k3", "est_full_reward", "est_full_loss"]
# A plain dict: add a suite by adding a line; `all` is the union, in this order.
SUITES = {
    "core": CORE,
    "estimators": [f"est_{k}_{p}" for p in ("reward", "loss") for k in ("k1", "k2", "k3", "full")]
                  + ["est_seq_mean"],
    "reference": ["fixed_0.05", "rolling_ref", "ref_sync", "ref_reset"],
    "anchors": ["no_kl", "adaptive", "ptx", "ptx_no_kl"],
    "cheap": ["ref_full", "ref_bf16", "ref_fp16", "ref_int8", "ref_nf4", "ref_lora",
              "ref_lora_lr10", "ref_shared_2", "drift", "rollback"],
    "beta": ["no_kl", "beta_0.001", "beta_0.01", "beta_0.03", "fixed_0.05", "beta_0.1", "beta_0.3",
             "beta_1", "adaptive", "adaptive_fast"],
    "verifiable": ["gold_adaptive", "gold_no_kl", "gold_grpo_k3loss", "gold_grpo_no_kl",
                   "gold_rloo", "gold_forward_kl", "adaptive", "no_kl", "grpo_k3loss",
                   "grpo_no_kl"],
    # In the order they run: the longest first.
    "overopt": ["free_lr_x0.0625", "free_lr_x0.25", "free", *(f"stop_{k:g}" for k in STOP_KLS),
                "long_adaptive", *(f"long_{b}" for b in LONG_BETAS), "long_seq_0.1",
                "long_seq_0.1_lam1", "long_0.1_lam1", "free_lam1", "long_rloo_0.1", "free_rloo",
                *(f"{arm}_{b}" for b in BASE_OF for arm in ("long_adaptive", "free"))],
    # β = 0 with the controls beside the default penalty and its β = 0 run, at the overopt
    # budget, kept with the overopt suite's runs.
    "controls": ["long_adaptive", "free", *(f"free_len_{c}" for c in CONTROL_LENGTH),
                 *(f"free_ent_{c}" for c in CONTROL_ENTROPY)],
    # The main model's conditions first, then each other model's.
    "models": [*MODEL_CONDITIONS, *(f"{c}_{m}" for m in MODELS for c in MODEL_CONDITIONS)],
}
# A suite's own budget, before the user's flags: overopt evaluates on 200 held-out samples after
# every iteration (its penalised runs every PENALISED_EVERY).
SUITE_FLAGS = {"overopt": [f"--ppo_iters={LONG_ITERS}", "--eval_every=1", "--eval_n=200"]}
# The suites read as the overopt suite is (its budget, folder and tables).
OVEROPT = ("overopt", "controls")
SUITE_FLAGS["controls"] = SUITE_FLAGS["overopt"]
# A suite with its own budget (SUITE_FLAGS) is not part of `all`.
SUITES["all"] = list(dict.fromkeys(c for name, suite in SUITES.items() for c in suite
                                   if name not in SUITE_FLAGS))
# The main run's budget: train.py's rollout_batch, ppo_iters and n_eval.
DEFAULTS = []
QUICK = ["--rollout_batch=32", "--ppo_iters=12", "--n_eval=64"]
BOOLS = {"": True, "1": True, "true": True, "0": False, "false": False}


def parse(argv):
    """ablate.py's own flags; everything else is a train.py flag, checked by train.parse."""
    if "--help" in argv or "-h" in argv:
        print(__doc__)
        sys.exit(0)
    opts = dict(quick=False, seeds=5, conditions="", suite="core", jobs=2, subdir="ablate",
                kept=KEPT_DIR, tables_only=False, base="", check=False, make_pretrained=False,
                figures=FIGURES)
    check_once(argv)
    user = []
    for a in argv:
        name, _, value = a[2:].partition("=")
        if a.startswith("--") and name in opts:
            try:
                yes_no = name in ("quick", "tables_only", "check", "make_pretrained")
                opts[name] = BOOLS[value.lower()] if yes_no else type(opts[name])(value)
            except (KeyError, ValueError):
                die(f"bad value for --{name}: {value!r}")
        else:
            user.append(a)
    if opts["suite"] not in SUITES:
        die(f"bad value for --suite: {opts['suite']!r} (choose {', '.join(SUITES)})")
    opts["user_conditions"] = bool(opts["conditions"])
    opts["conditions"] = opts["conditions"] or ",".join(SUITES[opts["suite"]])
    conds = opts["conditions"].split(",")
    unknown = [c for c in conds if c not in CONDITIONS]
    if unknown:
        die(f"unknown condition {unknown[0]!r} (choose {', '.join(CONDITIONS)})")
    if len(set(conds)) < len(conds):
        die(f"--conditions names {max(conds, key=conds.count)!r} twice")
    if opts["seeds"] < 1 or opts["jobs"] < 1:
        die(f"--seeds and --jobs must be >= 1 (got {opts['seeds']} and {opts['jobs']})")
    # --quick runs have other budgets: their own folder, so they never replace the main-budget runs
    # of out/ablate
    # A suite with its own budget (SUITE_FLAGS) likewise runs in out/ablate_SUITE.
    own = f"ablate_{opts['suite']}" if opts["suite"] in SUITE_FLAGS else "ablate"
    if opts["suite"] in OVEROPT:
        own = "ablate_overopt"
    if not any(a.startswith("--subdir=") for a in argv):
        opts["subdir"] = own + "_quick" if opts["quick"] else own
    if not opts["subdir"] or os.sep in opts["subdir"] or opts["subdir"].startswith("."):
        die(f"bad value for --subdir: {opts['subdir']!r} (a plain folder name)")
    if opts["quick"]:
        opts["seeds"] = min(opts["seeds"], 1)
    # Each run's flags and seed (--seed + k for run k < --seeds) fail here, before any work.
    suite_flags = SUITE_FLAGS.get(opts["suite"], [])
    budget = override(DEFAULTS + suite_flags, QUICK if opts["quick"] else [])
    rest = override(budget, user)
    opts["user"] = user
    for c in conds:
        train.parse(override(flags_before(c, opts), CONDITIONS[c]))
    # The runs' seeds come from --seed (a base's own seed is not a run's).
    cfg = train.parse(rest)
    if cfg.run.seed + opts["seeds"] > 2 ** 31:
        die(f"--seed={cfg.run.seed} with --seeds={opts['seeds']}: a run's seed would be >= 2^31")
    # The overopt tables fit each run's evaluations: a suite without any would fit nothing.
    if opts["suite"] in OVEROPT and not cfg.eval.eval_every:
        die(f"--suite={opts['suite']} fits each run's held-out evaluations: --eval_every=0 gives "
            "it none (leave it out: the suite evaluates after every iteration)")
    for d in (cfg.run.out_dir, os.path.join(cfg.run.out_dir, opts["subdir"])):
        if store.not_a_folder(d):
            die(f"--out_dir={cfg.run.out_dir}: {d} {store.not_a_folder(d)}")
    # Runs are kept for the main run folder only, unless --kept names a folder.
    named = any(a.startswith("--kept=") for a in argv)
    if not named and os.path.abspath(cfg.run.out_dir) != os.path.abspath(OUT_DEFAULT):
        opts["kept"] = ""
    if opts["kept"]:
        for d in (opts["kept"], os.path.join(opts["kept"], opts["subdir"])):
            if store.not_a_folder(d):
                die(f"--kept={opts['kept']}: {d} {store.not_a_folder(d)}")
    if opts["tables_only"] and not opts["kept"]:
        die("--tables_only reads the kept runs: name their folder with --kept=FOLDER")
    if opts["make_pretrained"] and not opts["tables_only"]:
        die("--make_pretrained makes what --tables_only reads of the pretrained model: it goes "
            "with --tables_only")
    if opts["check"] and not opts["tables_only"]:
        die("--check compares the tables rebuilt from the kept runs: it goes with --tables_only")
    if opts["base"] and not opts["tables_only"]:
        die("--base chooses among the kept runs' pretrained models: it goes with --tables_only")
    return opts, rest


# In each run folder, written last: config, input and output hashes, as in stages.json.
RECORD = archive.RECORD
# Where finished runs are kept (the project's folder, not out/), and which of a run's files: the
# outputs the tables read, then the record. The weights (MBs each) are left out.
KEPT_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "runs")
# Where --tables_only puts its figures: tracked files the documents show.
FIGURES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs",
                       "figures")
KEPT = ("ppo.json", "metrics.jsonl")
OUT_DEFAULT = RunConfig().out_dir


def unplotted(names):
    """A stage's outputs less its plots: a suite's runs draw none (stages.run_ppo's plot=False)."""
    return [n for n in names if not n.endswith(".png")]


def run_record(run_dir, stamp, outputs):
    """A run folder's record: as stages.json's, with the inputs in base's folder (the stamp's
    hashes)."""
    rec = records.make_record(run_dir, stamp["config"], [], outputs, stamp["defaults"],
                              stamp["code"])
    rec["inputs"] = stamp["inputs"]
    return rec


def finished(run_dir, stamp):
    """True when run_dir holds a finished run made under `stamp` whose outputs are as the run wrote
    them (their hashes in run_dir/run.json). A run from before run.json existed is taken once it is
    whole: ppo.json under this stamp, no ppo_state.pt left (run_ppo's last act removes it), every
    output loadable; then its record is written."""
    st = stages.BY_NAME["ppo"]

    def path(n):
        return os.path.join(run_dir, n)
    # Optional outputs are left out: matplotlib's plot, and the critic (gae only).
    needed = [n for n in st.outputs if not n.endswith(".png") and n != "critic.pt"]
    try:
        rec = store.load_json(path(RECORD)) if os.path.exists(path(RECORD)) else None
        # A run from before run.json existed: ppo.json written and no ppo_state.pt left.
        unrecorded = rec is None and os.path.exists(path("ppo.json"))
        if unrecorded and not os.path.exists(path(st.partial)):
            made = store.load_json(path("ppo.json"))
            if not isinstance(made, dict) or made.get("stamp") != stamp:
                return False
            store.load_json(path("metrics.jsonl"), lines=True)
            for n in ("actor.pt", "critic.pt"):
                if n == "actor.pt" or os.path.exists(path(n)):
                    store.load_torch(path(n))
            rec = run_record(run_dir, stamp, [n for n in st.outputs if os.path.exists(path(n))])
            store.save_json(path(RECORD), rec)
    except RunError:
        # A damaged record or output: the run is done again.
        return False
    if rec is None or records.damaged_record(rec):
        return False
    if records.code_difference(rec, stamp):
        return False
    if records.first_difference(rec, stamp) is not None:
        return False
    return records.outputs_intact(run_dir, rec, needed)


def keep(run_dir, kept_dir, rec, threads, device, names=KEPT):
    """A finished run's kept files (`names`, the first its result json) copied into kept_dir, then
    its record (written last, with the outputs it keeps and made_on: the machine, commit and date,
    and the run's own seconds)."""
    os.makedirs(kept_dir, exist_ok=True)
    store.remove(os.path.join(kept_dir, RECORD))
    for n in names:
        with open(os.path.join(run_dir, n), "rb") as f:
            store.write_bytes(os.path.join(kept_dir, n), f.read())
    seconds = store.load_json(os.path.join(run_dir, names[0]))["seconds"]
    kept = dict(rec, outputs={n: rec["outputs"][n] for n in names},
                made_on=provenance.stamp(seconds, threads, device))
    store.save_json(os.path.join(kept_dir, RECORD), kept)


def kept_run(kept_dir, stamp, names=KEPT):
    """What made the run kept in kept_dir ("CPU (...), commit, date"), when its record matches
    `stamp` (config, inputs and code) and its kept files (`names`) are as the run wrote them;
    else None."""
    path = os.path.join(kept_dir, RECORD)
    if not os.path.exists(path):
        return None
    try:
        rec = store.load_json(path)
    except RunError:
        return None
    if records.damaged_record(rec) or not isinstance(rec.get("made_on"), dict):
        return None
    if records.code_difference(rec, stamp) or records.first_difference(rec, stamp) is not None:
        return None
    if not records.outputs_intact(kept_dir, rec, names):
        return None
    try:
        return archive.made_on(rec)
    except (KeyError, TypeError):
        return None


def kept_folder(seed_dir, stamp):
    """Where a run is kept: archive.inputs_folder of its inputs, so each CPU's runs are kept beside
    another's and each stands in on the CPUs that rebuild its inputs."""
    return archive.inputs_folder(seed_dir, stamp["inputs"])


def restore(kept_dir, run_dir, names=KEPT):
    """A kept run's files copied into run_dir, without a record: a restored run is taken from
    kept_dir again by the next command (its weights are not there to make it a finished run)."""
    os.makedirs(run_dir, exist_ok=True)
    for n in names:
        with open(os.path.join(kept_dir, n), "rb") as f:
            store.write_bytes(os.path.join(run_dir, n), f.read())


def one_run(job):
    """A single PPO run in its own folder; returns its row for results.jsonl. A finished run made
    under the same config and inputs, its outputs intact, is reused; else a kept one (kept_dir)
    that matches is restored; any other is done again (resuming from its ppo_state.pt when that
    was made under the same config and inputs; --fresh: from the start) and kept."""
    cond, seed, rest, base, run_dir, threads, kept_dir = job
    if threads:
        torch.set_num_threads(threads)
    cfg = train.parse(override(rest, CONDITIONS[cond] + [f"--seed={seed}", f"--out_dir={base}"]))
    st = stages.BY_NAME["ppo"]
    stamp = stages.stamp(cfg, st)
    if kept_dir:
        kept_dir = kept_folder(kept_dir, stamp)
    made_on = None
    made_now = False
    if cfg.run.fresh or not finished(run_dir, stamp):
        if kept_dir and not cfg.run.fresh:
            made_on = kept_run(kept_dir, stamp)
        # The temporary files a kill mid-write leaves.
        stray = [n for n in os.listdir(run_dir) if ".tmp" in n] if os.path.isdir(run_dir) else []
        partial = [st.partial] if cfg.run.fresh or made_on else []
        # The record goes first.
        for n in [RECORD] + st.outputs + stray + partial:
            store.remove(os.path.join(run_dir, n))
        if made_on:
            restore(kept_dir, run_dir)
        else:
            # As train.py runs the stage: seeded, under the run's precision; no ppo.png per run
            # (the suite's figures draw the runs, python -m lab.plot any run's curves).
            stages.run_stage(cfg, st, stamp, base=base, run_dir=run_dir, log=quiet, plot=False)
            # Last: a run killed before this line is done again.
            rec = run_record(run_dir, stamp, unplotted(stages.files(cfg, st.outputs)))
            store.save_json(os.path.join(run_dir, RECORD), rec)
            made_now = True
    # A finished run not yet kept (or kept under another stamp) is kept.
    if kept_dir and not made_on and not kept_run(kept_dir, stamp):
        rec = store.load_json(os.path.join(run_dir, RECORD))
        keep(run_dir, kept_dir, rec, threads, cfg.run.device)
    restored = made_on is not None
    # A run reused from its folder was made by an earlier command: its kept record names which.
    if kept_dir and not made_now and not restored:
        made_on = kept_run(kept_dir, stamp)
    return ppo_row(cond, seed, store.load_json(os.path.join(run_dir, "ppo.json")), made_on,
                   restored)


def ppo_row(cond, seed, s, made_on, restored):
    """A PPO run's row for results.jsonl from its ppo.json (s); made_on: what made it when an
    earlier command did (kept_run's line), restored: whether it came back from the kept runs."""
    return dict(condition=cond, seed=seed, kept=made_on, restored=restored, **s["final"],
                kl_coef_final=s["kl_coef_final"],
                seconds=s["seconds"], ref=s.get("ref"), entropy=s["entropy"],
                s_per_iter=s["ref"]["seconds_per_iter"], critic_mb=s["critic_bytes"] / 1e6,
                **bestofk_cells(s["bestofk"]))


def quiet(line):
    """A run's log lines, dropped: results.md holds what a suite reports."""


def pool_run(job):
    """one_run in a worker; whatever stops it comes back as a RunError. imap waits for ever on a
    SystemExit (it ends the worker unseen by the pool) or an exception pickle cannot rebuild."""
    try:
        return one_run(job)
    except RunError:
        raise
    except BaseException as e:
        why = " ".join(f"{type(e).__name__}: {e}".split())
        raise RunError(f"run {job[0]} seed {job[1]}: {why} (--jobs=1 shows where)", 1)


def baseline_row(cfg, base, seed):
    """The pretrained model, scored exactly as each run's final actor is (same prompts, same
    sampling seed): where every condition starts from."""
    run = cfg.run
    enc = tokenizer.load_tokenizer(base, cfg.world.tokenizer)
    actor, ref, rm = stages.load_models(base, run.device)
    stages.seed_everything(seed + 1)
    heldout = data.load_prompts(base)["heldout"]
    # In the runs' precision.
    with autocast(run.device, run.dtype):
        final, _ = evaluate_policy(actor, enc, heldout, run, ref, rm, cfg.eval.n_eval)
        # As run_ppo samples each actor's best-of-k.
        stages.seed_everything(seed + 2)
        b = best_of_k(actor, enc, heldout, run, cfg.eval.bestofk_n, cfg.eval.pass_gold,
                      cfg.eval.n_eval, pass_gold_hard=cfg.eval.pass_gold_hard)
    return dict(condition="pretrained", seed=seed, **final, kl_coef_final=None, seconds=0.0,
                entropy=float("nan"), s_per_iter=0.0, critic_mb=0.0, **bestofk_cells(b))


def flags_before(cond, opts):
    """A condition's flags before its own (CONDITIONS'), each list over the one before: the main
    run's budget, its suite's (SUITE_FLAGS), the condition's (BUDGETS), --quick's, the user's,
    and the stages' flags of its base (BASES)."""
    flags = override(DEFAULTS + SUITE_FLAGS.get(opts["suite"], []), BUDGETS.get(cond, []))
    flags = override(flags, QUICK if opts["quick"] else [])
    return override(override(flags, opts["user"]), base_flags(cond))


def base_flags(cond):
    """The flags of the stages before PPO that a condition changes (BASES); none for most."""
    return BASES[cond][1] if cond in BASES else []


def make_base(rest, main, vdir, flags):
    """The base of BASES' conditions in vdir: train.py's stages up to the reward model under rest
    + flags. Unless the flags reseed, the main run's stages before the first one the flags change
    (world, pretraining, reference, and the preference pairs unless --n_pairs changes) are copied
    in first with their records, so only what the flags change is made."""
    os.makedirs(vdir, exist_ok=True)
    cfg = train.parse(override(rest, flags + ["--stage=all", f"--out_dir={vdir}"]))
    cfg.run.fresh = False
    reseeded = any(f.startswith("--seed=") for f in flags)
    if not reseeded and not os.path.exists(os.path.join(vdir, "stages.json")):
        # The stages before the first one whose fields the flags name are kept, with their records.
        named = {f[2:].partition("=")[0] for f in flags}
        kept = []
        for st in stages.STAGES:
            if named & set(st.fields):
                break
            kept.append(st)
        for n in dict.fromkeys(n for st in kept for n in st.outputs):
            if os.path.exists(os.path.join(main, n)):
                shutil.copy(os.path.join(main, n), os.path.join(vdir, n))
        recs = records.load_records(main)
        store.save_json(os.path.join(vdir, "stages.json"),
                        {st.name: recs[st.name] for st in kept if st.name in recs})
    train.run_stages(cfg, upto="reward")


def bon_pool(cfg, base, n_prompts, n):
    """Best-of-n's pool: n samples of base's pretrained model for each of n_prompts held-out
    prompts (spread over the subjects), each with its gold and proxy score: {prompt: [(text,
    gold, proxy)]}. Its own seed (--seed + 3)."""
    run = cfg.run
    enc = tokenizer.load_tokenizer(base, cfg.world.tokenizer)
    actor, ref, rm = stages.load_models(base, run.device)
    heldout = data.load_prompts(base)["heldout"]
    prompts = heldout[::max(1, len(heldout) // n_prompts)][:n_prompts]
    rows = [p for p in prompts for _ in range(n)]
    stages.seed_everything(run.seed + 3)
    with autocast(run.device, run.dtype):
        _, examples = evaluate_policy(actor, enc, rows, run, ref, rm, len(rows))
    pool = {}
    for p, text, gold, proxy in examples:
        pool.setdefault(p, []).append((text, gold, proxy))
    return pool


def overopt_plan(order):
    """The roles of the overopt suite's conditions in `order`, for tables.overopt_tables."""
    frees = [c for c in order if c.startswith("free")]
    pens = [c for c in order if c.startswith("long_")]
    own = {}
    for c in pens:
        # A penalised run's own β = 0 run: the same base, λ and advantage.
        if c.endswith("_lam1"):
            twin = "free_lam1"
        elif "rloo" in c:
            twin = "free_rloo"
        elif c.startswith("long_adaptive_"):
            twin = "free_" + c[len("long_adaptive_"):]
        else:
            twin = "free"
        if twin in order:
            own[c] = twin
    models = {"main": "long_adaptive - free"}
    models.update({b: f"long_adaptive_{b} - free_{b}" for b in BASE_OF if b.startswith("model")})
    # The default penalty also against the slower β = 0 runs (their frontier is higher).
    also = [("long_adaptive", f"free{lr}") for lr in FREE_LRS if lr and "long_adaptive" in order
            and f"free{lr}" in order]
    # The default penalty against the controls (β = 0 with a price on length or an entropy bonus).
    controls = [("long_adaptive", c) for c in order if c.startswith(("free_len_", "free_ent_"))
                and "long_adaptive" in order]
    # The key pair on the other proxies, the main one first (overopt_report adds each reward
    # model's accuracy).
    proxies = {"main": dict(pair="long_adaptive - free", about="the main run's")}
    proxies.update({b: dict(pair=f"long_adaptive_{b} - free_{b}", about=" ".join(BASE_OF[b][1]))
                    for b in BASE_OF if not b.startswith("model")})
    return dict(free=frees, stops={f"stop_{k:g}": k for k in STOP_KLS if f"stop_{k:g}" in order},
                stop_of="free", penalised=pens, own_free=own, also=also + controls,
                controls=controls, models=models,
                betas=[f"long_{b}" for b in LONG_BETAS if f"long_{b}" in order],
                proxies=proxies)


def bon_sizes(opts):
    """Best-of-n's pool: up to 48 held-out prompts (as many as there are) dealt into 4 pools, 256
    samples each (--quick: 2 pools of 2 prompts x 32)."""
    return (2, 2, 32) if opts["quick"] else (4, 12, 256)


def overopt_groups(order):
    """The bases the overopt tables read, by group (group_of's: "main", or a BASES folder's
    name), the main one first."""
    return ["main"] + list(dict.fromkeys(BASES[c][0] for c in order if c in BASES))


def overopt_config(cfg, seeds, pool, group):
    """What the overopt tables' kept evaluations of one base's pretrained model depend on besides
    the base (archive's)."""
    ev = cfg.eval
    return archive.pretrained_config(cfg, seeds, dict(
        tables="overopt", group=group, pool=list(pool), bestofk_n=ev.bestofk_n,
        pass_gold=ev.pass_gold, pass_gold_hard=ev.pass_gold_hard))


def overopt_pretrained(cfg, rest, b, group, seeds, pool, row_seeds):
    """What the overopt tables read of the pretrained model in base folder b (group: its
    group's name): its evaluation on each seed's held-out stream, where each run's gains start
    ("starts"); best-of-n's curves over pool (pools, prompts per pool, samples per prompt), none
    for another pretrained model ("bon"); its final evaluation's rows for row_seeds ("rows", the
    seeds whose pretrained row is not kept otherwise); its reward model's accuracy as the reward
    stage measured it ("reward"). JSON, keyed by seed as text."""
    flags = next((f for name, f in BASE_OF.values() if name == group), [])
    out = dict(starts={}, bon=None, rows={}, reward=None)
    for seed in seeds:
        scfg = train.parse(override(override(rest, flags), [f"--seed={seed}", f"--out_dir={b}"]))
        enc = tokenizer.load_tokenizer(b, scfg.world.tokenizer)
        actor, ref, rm = stages.load_models(b, scfg.run.device)
        heldout = data.load_prompts(b)["heldout"]
        with autocast(scfg.run.device, scfg.run.dtype):
            out["starts"][str(seed)] = during_ppo(actor, enc, heldout, scfg.run, ref, rm,
                                                  scfg.eval)
    if not group.startswith("model"):
        pools, per_pool, n = pool
        ns = [2 ** i for i in range(int(math.log2(n)) + 1)]
        samples = bon_pool(cfg, b, pools * per_pool, n)
        prompts = list(samples)
        parts = [{p: samples[p] for p in prompts[i::pools]} for i in range(pools)]
        out["bon"] = dict(pools=[overopt.bon_curve(g, ns) for g in parts],
                          all=overopt.bon_curve(samples, ns))
    out["rows"] = {str(s): baseline_row(cfg, b, s) for s in row_seeds}
    if os.path.exists(os.path.join(b, "reward.json")):
        stats = store.load_json(os.path.join(b, "reward.json"))
        out["reward"] = {k: stats[k] for k in ("acc_noisy", "acc_gold", "n_val")}
    return out


def overopt_inputs(opts, cfg, rest, base, adir, order, rows, pool):
    """overopt_pretrained for each base of the suite (overopt_groups), each kept under --kept's
    SUBDIR/pretrained with its base's input hashes, so --tables_only rebuilds the tables without
    the bases. Returns {group: what overopt_pretrained returns}."""
    seeds = sorted({r["seed"] for r in rows if not r["condition"].startswith("pretrained")})
    # The main model's pretrained row of the first seed is kept with the others' (pretrained_rows).
    have = {r["seed"] for r in rows if r["condition"] == "pretrained"}
    out = {}
    for g in overopt_groups(order):
        started = time.time()
        b = base if g == "main" else os.path.join(adir, "bases", g)
        row_seeds = [s for s in seeds if s not in have] if g == "main" else []
        out[g] = overopt_pretrained(cfg, rest, b, g, seeds, pool, row_seeds)
        if opts["kept"]:
            pcfg = train.parse(override(rest, ["--stage=ppo", f"--out_dir={b}"]))
            inputs = stages.stamp(pcfg, stages.BY_NAME["ppo"])["inputs"]
            archive.keep_pretrained(os.path.join(opts["kept"], opts["subdir"], "pretrained"),
                                    overopt_config(cfg, seeds, pool, g), inputs, out[g],
                                    time.time() - started, cfg.run.device)
    return out


def overopt_report(pre, adir, order, rows, run_dir, made, stem="overopt"):
    """--suite=overopt (and controls): each run's evaluation trajectory from its metrics.jsonl
    (gains over its base's pretrained model evaluated on the same stream: pre, overopt_inputs'),
    best-of-n from pre, the tables (tables.overopt_tables) into STEM.md and STEM.json, and
    STEM.png (stem: the suite's name). made: made_by's (stamp, line). Returns the markdown."""
    bon = {g: p["bon"] for g, p in pre.items() if p["bon"] is not None}
    trajs = {}
    for cond in (c for c in order if c != "pretrained"):
        start = pre[BASES[cond][0] if cond in BASES else "main"]["starts"]
        for r in (r for r in rows if r["condition"] == cond):
            metrics = store.load_json(os.path.join(run_dir(cond, r["seed"]), "metrics.jsonl"),
                                      lines=True)
            trajs.setdefault(cond, {})[r["seed"]] = overopt.trajectory(metrics,
                                                                       start[str(r["seed"])])
    # The pretrained model's final evaluation on each seed's stream, as each run's is scored.
    rows = rows + [dict(row, seed=int(s)) for s, row in pre["main"]["rows"].items()]
    plan = overopt_plan(order)
    # Each proxy's reward model, as its reward stage measured it on its held-out pairs.
    for b, p in plan["proxies"].items():
        stats = pre.get("main" if b == "main" else BASE_OF[b][0], {}).get("reward")
        if stats:
            p.update(stats)
    plan["proxies"] = {b: p for b, p in plan["proxies"].items() if "acc_gold" in p}
    md, res = overopt_tables(bon, trajs, rows, plan)
    md = f"# ablate.py {' '.join(sys.argv[1:])}\n\n{md}\n{made[1]}\n"
    res["trajectories"] = {c: {str(s): t for s, t in v.items()} for c, v in trajs.items()}
    res["made_by"] = made[0]
    store.save_json(os.path.join(adir, f"{stem}.json"), res)
    curves = {}
    for name, r in bon.items():
        c = r["all"]
        curves[f"best-of-n ({name})"] = dict(d=c["d"], gold=c["gold"], proxy=c["proxy"],
                                             fit=overopt.fit(c["d"], c["gold"], "bon"),
                                             form="bon")
    for cond, per_seed in trajs.items():
        # The mean over seeds, up to the shortest trajectory (a stopped run ends early).
        short = min(len(t["kl"]) for t in per_seed.values())
        mean = {k: np.mean([t[k][:short] for t in per_seed.values()], 0)
                for k in ("kl", "gold", "proxy")}
        d = np.sqrt(np.maximum(mean["kl"], 0))
        curves[cond] = dict(d=d, gold=mean["gold"], proxy=mean["proxy"], form="rl",
                            fit=overopt.fit(d, mean["gold"], "rl"))
    overopt.plot(curves, os.path.join(adir, f"{stem}.png"))
    store.write_text(os.path.join(adir, f"{stem}.md"), md)
    return md


def folder(cond):
    """The folder a condition's runs live in: its twin's when SAME_AS names one (same flags, same
    runs)."""
    return SAME_AS.get(cond, cond)


def write_examples(cfg, base, adir, order, seed, made_line, n=3):
    """examples.md: what the pretrained model and each condition's first-seed actor write for the
    same held-out prompts, with the same sampling noise, and the gold verdict on each; made_line
    (made_by's) last."""
    run = cfg.run
    enc = tokenizer.load_tokenizer(base, cfg.world.tokenizer)
    heldout = data.load_prompts(base)["heldout"]
    # Spread over the held-out subjects.
    prompts = heldout[::max(1, len(heldout) // n)][:n]
    runs = [("pretrained", os.path.join(base, "pretrain.pt"))]
    runs += [(c, os.path.join(adir, folder(c), f"seed{seed}", "actor.pt")) for c in order
             if c != "pretrained" and (c not in SAME_AS or SAME_AS[c] not in order)]
    lines = [f"# What each actor writes (seed {seed}, temperature {run.temperature})\n"]
    for name, path in runs:
        if not os.path.exists(path):
            lines.append(f"\n## {name}\n\n(a kept run: its weights were not kept)")
            continue
        model, _ = load_checkpoint(path, run.device)
        # The same sampling noise for every actor.
        stages.seed_everything(seed + 2)
        lines.append(f"\n## {name}\n")
        for p, r in zip(prompts, sample_texts(model, enc, prompts, run)):
            v = data.judge(p, r)
            note = "" if v["wellformed"] else " (not well-formed)"
            text = r.replace(data.EOT, " <eot>").strip()
            lines.append(f"- gold {v['score']:+.2f}{note}: `{p.strip()}` | {text}")
    lines += ["", made_line]
    store.write_text(os.path.join(adir, "examples.md"), "\n".join(lines) + "\n")


def made_by(started, rows, jobs, threads, device):
    """(stamp, line) of a suite's tables (provenance): this command's wall time from `started` to
    the end of its runs, and the runs' own seconds summed, runs reused from earlier commands
    included."""
    made = provenance.stamp(time.time() - started, threads, device)
    made["runs_seconds"] = round(sum(r["seconds"] for r in rows), 1)
    line = (provenance.line(made, "this command's wall time to the end of its runs")
            + f" The runs' own times sum to {provenance.duration(made['runs_seconds'])}, {jobs} "
            "at a time.")
    # Runs made by an earlier command (restored from lab/runs, or reused from their folders and
    # kept there): on which machine, at which commit.
    runs = [r for r in rows if not r["condition"].startswith("pretrained")]
    kept = {}
    for r in runs:
        if r.get("kept"):
            kept[r["kept"]] = kept.get(r["kept"], 0) + 1
    if kept:
        made["kept"] = kept
        # One entry per machine and commit ("CPU (...), commit X"), its runs' first and last dates.
        dates = {}
        for m, k in kept.items():
            machine, date = m.rsplit(", ", 1)
            dates.setdefault(machine, []).extend([date] * k)
        where = "; ".join(f"{m}, {min(d)}" + (f" to {max(d)}" if max(d) != min(d) else "")
                          + f" ({len(d)} run{'s' * (len(d) > 1)})" for m, d in dates.items())
        # How they came back: restored from the kept runs, or reused from their run folders.
        restored = sum(1 for r in runs if r.get("restored"))
        how = f"{restored} restored from the kept runs rather than run, the others reused"
        if restored == sum(kept.values()):
            how = "all restored from the kept runs rather than run"
        elif restored == 0:
            how = "reused"
        if restored < sum(kept.values()):
            how += " from their run folders"
        line += (f" {sum(kept.values())} of the {len(runs)} runs were made by earlier commands and "
                 f"kept ({how}); they were made on {where}.")
    return made, line


def _worker_init(parent):
    """Each worker: Ctrl-C is the parent's to handle, and the worker dies with its parent, even a
    kill -9 of it. Linux: the kernel sends SIGKILL on the parent's death (prctl PR_SET_PDEATHSIG).
    Everywhere: every file write first checks the parent (store.stop_writing_if_orphaned), which
    also catches a parent that died before prctl."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if sys.platform.startswith("linux"):
        import ctypes
        # The first argument, 1, is PR_SET_PDEATHSIG.
        ctypes.CDLL(None).prctl(1, int(signal.SIGKILL), 0, 0, 0)
    store.stop_writing_if_orphaned(parent)


def pretrained_rows(opts, rest, cfg, base, adir, order, threads):
    """The pretrained models' rows, scored as each run's final actor is (baseline_row): the main
    run's ("pretrained") and each other model's of the models suite ("pretrained_MODEL"); each
    kept under --kept's SUBDIR/pretrained with its base's input hashes, so --tables_only rebuilds
    them without the base."""
    seed0 = cfg.run.seed
    models = [m for m in MODELS if any(f"{c}_{m}" in order for c in MODEL_CONDITIONS)]
    out = []
    for name, b in [("pretrained", base)] + [(f"pretrained_{m}", os.path.join(
            adir, "bases", BASE_OF[m][0])) for m in models]:
        started = time.time()
        row = dict(baseline_row(cfg, b, seed0), condition=name)
        out.append(row)
        if opts["kept"]:
            pcfg = train.parse(override(rest, ["--stage=ppo", f"--out_dir={b}"]))
            inputs = stages.stamp(pcfg, stages.BY_NAME["ppo"])["inputs"]
            archive.keep_pretrained(os.path.join(opts["kept"], opts["subdir"], "pretrained"),
                                    pretrained_config(cfg), inputs, dict(row=row),
                                    time.time() - started, cfg.run.device)
    return out


def pretrained_config(cfg):
    """What a kept pretrained row depends on besides its base (archive's)."""
    ev = cfg.eval
    return archive.pretrained_config(cfg, [cfg.run.seed], dict(
        bestofk_n=ev.bestofk_n, pass_gold=ev.pass_gold, pass_gold_hard=ev.pass_gold_hard))


def twins_of(cond, order):
    """The conditions in `order` that run as cond does, in its folder (SAME_AS): cond under other
    names, so no comparison with it (est_k1 and ref_full are adaptive)."""
    return [c for c in order if c != cond and folder(c) == folder(cond)]


def report(opts, cfg, rows, order, adir, run_dir, stamp_line, runs):
    """results.md (and the suite's results_SUITE.md, results_ref.md), scores.png, frontier.png,
    beta.png and bestofk.png (--plots=false: none) into adir from the rows (the pretrained rows
    first, then one per condition and seed as run, a SAME_AS condition under its twin's name);
    run_dir(cond, seed): the folder holding a run's metrics.jsonl; stamp_line: made_by's; runs:
    how many PPO runs.
    Returns (the tables, the report without its made-by line, rows as the tables read them)."""
    pre = [r for r in rows if r["condition"].startswith("pretrained")]
    ran = [r for r in rows if not r["condition"].startswith("pretrained")]
    # Every condition's rows, a SAME_AS condition's taken from its twin's runs.
    named = [dict(r, condition=c) for c in order for r in ran if r["condition"] == folder(c)]
    rows = pre[:1] + named + pre[1:]
    store.save_json(os.path.join(adir, "results.jsonl"), rows, lines=True)
    models = [r["condition"][len("pretrained_"):] for r in pre[1:]]
    order = ["pretrained"] + order
    # The main base's conditions: a BASES condition has its own models, so its own tables.
    main = [c for c in order if c not in BASES]
    # Best-of-k, entropy and cost columns.
    gold = any(c in SUITES["verifiable"] for c in order)
    # k = 1, 2, 4, ... up to --bestofk_n.
    ks = [int(c[5:]) for c in rows[0] if c.startswith("best_")]
    against = "gold_adaptive" if "gold_adaptive" in order else DEFAULT_CONDITION
    columns = dict(zip(("columns", "paired"), verifiable_columns(max(ks)))) if gold else {}
    # Pairs by seed are made within the main base; the baseline's SAME_AS twins are no comparison.
    table = summarise(rows, main, base=against, same=twins_of(against, main), **columns)
    # The models suite's conditions on each pretrained model, the model as the unit.
    table += models_table(rows, [c for c in MODEL_CONDITIONS if c in order], ["main"] + models)
    if gold:
        heading = ("\nBest of k (expected best gold among k samples per prompt), pass@k "
                   f"(gold > {cfg.eval.pass_gold}) and hard@k (pass@k at gold > "
                   f"{cfg.eval.pass_gold_hard}, the same samples), mean over seeds:\n\n")
        table += heading + bestofk_table(rows, main)
    body = (f"# ablate.py {' '.join(sys.argv[1:])}\n\n{runs} PPO runs. Mean [Student-t 95 % "
            "interval] over the seeds listed (n = their number); held-out prompts.\n\n"
            f"{table}{beta_table(run_dir, rows, order)}")
    # What made the tables: the machine, the commit, this command and its wall time.
    report_md = body + "\n" + stamp_line + "\n"
    cheap = any(c in SUITES["cheap"] for c in order)
    ref_report = ""
    if cheap:
        ref_report = (f"# ablate.py {' '.join(sys.argv[1:])}\n\nMaking the reference cheap; "
                      "mean [Student-t 95 % interval] over seeds; held-out prompts.\n\n"
                      f"{ref_table(rows, main)}\n{stamp_line}\n")
    store.write_text(os.path.join(adir, "results.md"),
                     report_md + ("\n" + ref_report if cheap else ""))
    # A suite's tables survive the next command.
    if not opts["user_conditions"]:
        store.write_text(os.path.join(adir, f"results_{opts['suite']}.md"), report_md)
        if cheap:
            store.write_text(os.path.join(adir, "results_ref.md"), ref_report)
    # --plots=false: the tables alone.
    if not cfg.run.plots:
        return table, body, rows
    plot(rows, adir, main, run_dir)
    # The pretrained model against each actor.
    if gold:
        curves = bestofk_curves(rows, main, cfg.eval.pass_gold, cfg.eval.pass_gold_hard, ks)
        plot_bestofk(curves, os.path.join(adir, "bestofk.png"))
    return table, body, rows


def build_bases(opts, rest, base, order):
    """The main run's stages up to the reward model in base (built when missing), and the bases of
    the conditions in `order` whose reward model or pretrained model differ (BASES), under
    SUBDIR/bases. Returns (SUBDIR's folder, {condition: its base's folder})."""
    main_run = train.parse(override(rest, ["--stage=all"]))
    # --fresh redoes this command's ablation runs, never the main run.
    main_run.run.fresh = False
    try:
        train.run_stages(main_run, upto="reward")
    except RunError as e:
        raise RunError(f"{e} (with python train.py --out_dir={base}; "
                       "ablate.py's --fresh redoes only its own runs)", e.code) from None
    adir = os.path.join(base, opts["subdir"])
    os.makedirs(adir, exist_ok=True)
    made = {}
    for c in (c for c in order if c in BASES):
        name, flags = BASES[c]
        made[c] = os.path.join(adir, "bases", name)
        make_base(rest, base, made[c], flags)
    return adir, made


def ablate(opts, rest):
    cfg = train.parse(rest)
    base = cfg.run.out_dir
    started = time.time()
    # The main run's folder, made when missing (a fresh checkout has no out/), as train.py's.
    with train.open_folder(cfg):
        order = opts["conditions"].split(",")
        adir, made = build_bases(opts, rest, base, order)
        seed0 = cfg.run.seed
        threads = 1 if opts["jobs"] > 1 else 0
        # A SAME_AS condition runs once, in its twin's folder.
        # One job per condition and seed; its kept copy lives under
        # <kept>/<suite>/<condition>/seed<n>/inputs_<hash> (None: nothing is kept).
        jobs = []
        for c in dict.fromkeys(map(folder, order)):
            for seed in range(seed0, seed0 + opts["seeds"]):
                kept = None
                if opts["kept"]:
                    kept = os.path.join(opts["kept"], opts["subdir"], c, f"seed{seed}")
                jobs.append((c, seed, flags_before(c, opts), made.get(c, base),
                             os.path.join(adir, c, f"seed{seed}"), threads, kept))
        t0, rows = time.time(), []
        print(f"ablate: {len(jobs)} PPO runs ({opts['jobs']} at a time) into {adir}", flush=True)
        pool = None
        if opts["jobs"] > 1:
            context = multiprocessing.get_context("spawn")
            pool = context.Pool(opts["jobs"], _worker_init, (os.getpid(),))
        try:
            for row in (pool.imap(pool_run, jobs) if pool else map(one_run, jobs)):
                rows.append(row)
                print(f"  {row['condition']:16s} seed {row['seed']}: gold {row['gold_mean']:+.2f} "
                      f"proxy {row['proxy_mean']:+.2f} kl {row['kl']:.2f} ({row['seconds']:.0f}s, "
                      f"total {time.time() - t0:.0f}s)", flush=True)
        finally:
            if pool:
                # No orphans, whatever happened.
                pool.terminate()
                pool.join()
        rows = pretrained_rows(opts, rest, cfg, base, adir, order, threads) + rows

        def run_dir(cond, seed):
            return os.path.join(adir, folder(cond), f"seed{seed}")
        stamp_line = made_by(started, rows, opts["jobs"], threads, cfg.run.device)
        table, body, rows = report(opts, cfg, rows, order, adir, run_dir, stamp_line[1],
                                   len(jobs))
        # The overopt tables, also of some of its conditions (--conditions: overopt.md only).
        if opts["suite"] in OVEROPT:
            pool = bon_sizes(opts)
            # The line that says what made it comes once, after the overopt tables.
            pre = overopt_inputs(opts, cfg, rest, base, adir, order, rows, pool)
            overopt_md = body + "\n" + overopt_report(pre, adir, order, rows, run_dir,
                                                       stamp_line, opts["suite"])
            if not opts["user_conditions"]:
                store.write_text(os.path.join(adir, f"results_{opts['suite']}.md"), overopt_md)
        # Another base has its own world and tokenizer.
        write_examples(cfg, base, adir, ["pretrained"] + [c for c in order if c not in BASES],
                       seed0, stamp_line[1])
        print(table)


def make_pretrained(opts, rest, cfg, order):
    """--tables_only --make_pretrained: this machine's pretrained models (train.py's stages, built
    where missing: the main run's in --out_dir, the others' under SUBDIR/bases) evaluated as the
    suite's command evaluates them, in this process, and kept in the archive: the pretrained rows,
    and the overopt suites' evaluations. On a CPU that rebuilds the archive's bases, what the
    tables lack of them; on another, its own (kept beside, read with --base)."""
    base = cfg.run.out_dir
    with train.open_folder(cfg):
        adir, _ = build_bases(opts, rest, base, order)
        rows = pretrained_rows(opts, rest, cfg, base, adir, order, 0)
        if opts["suite"] in OVEROPT:
            seeds = range(cfg.run.seed, cfg.run.seed + opts["seeds"])
            rows += [dict(condition=c, seed=s) for c in order for s in seeds]
            overopt_inputs(opts, cfg, rest, base, adir, order, rows, bon_sizes(opts))


def group_of(key):
    """The base a run of (condition, seed) is made on: "main", or its BASES folder's name."""
    return BASES[key[0]][0] if key[0] in BASES else "main"


def tables_only(opts, rest):
    """--tables_only: the suite's tables and figures rebuilt from the kept runs (lab/runs, or
    --kept) and the pretrained models' kept rows alone, on any CPU, without training (archive.py
    says which kept run stands for which; one base per pretrained model: --base names the main
    one's where the archive holds several); the figures also into docs/figures/SUITE_NAME.png.
    What the archive lacks is named, and nothing written. The overopt suites (OVEROPT) also read
    each base's kept evaluations for their own tables (overopt_inputs')."""
    started = time.time()
    threads = 1 if opts["jobs"] > 1 else 0
    cfg = train.parse(rest)
    order = opts["conditions"].split(",")
    if opts["make_pretrained"]:
        make_pretrained(opts, rest, cfg, order)
    # The runs' configs hold the threads they ran with.
    if threads:
        torch.set_num_threads(threads)
    seeds = range(cfg.run.seed, cfg.run.seed + opts["seeds"])
    found = {}
    for c in dict.fromkeys(map(folder, order)):
        for seed in seeds:
            rcfg = train.parse(override(flags_before(c, opts), CONDITIONS[c] + [f"--seed={seed}"]))
            found[(c, seed)] = archive.candidates(
                os.path.join(opts["kept"], opts["subdir"], c, f"seed{seed}"), rcfg,
                stages.BY_NAME["ppo"], KEPT)
    chosen, missing, bases = archive.choose_groups(found, group_of, opts["base"])
    lacks = [f"{c}/seed{seed}" for c, seed in missing]
    models = [m for m in MODELS if any(f"{c}_{m}" in order for c in MODEL_CONDITIONS)]
    pre = []
    for name, group in [("pretrained", "main")] + [(f"pretrained_{m}", BASE_OF[m][0])
                                                   for m in models]:
        kept = None
        if bases.get(group):
            kept = archive.kept_pretrained(os.path.join(opts["kept"], opts["subdir"],
                                                        "pretrained"),
                                           pretrained_config(cfg), base=bases[group])
        if kept is None:
            lacks.append(f"{name} (the pretrained model's row)")
        else:
            pre.append(dict(kept["values"]["row"], condition=name))
    overopt_pre = {}
    for g in (overopt_groups(order) if opts["suite"] in OVEROPT else []):
        kept = None
        if bases.get(g):
            kept = archive.kept_pretrained(
                os.path.join(opts["kept"], opts["subdir"], "pretrained"),
                overopt_config(cfg, list(seeds), bon_sizes(opts), g), base=bases[g])
        if kept is None:
            lacks.append(f"{g} (the pretrained model's evaluations for the overopt tables)")
        else:
            overopt_pre[g] = kept["values"]
    if lacks:
        raise archive.lacking(os.path.join(opts["kept"], opts["subdir"]), lacks, len(found))
    # In the order the suite runs them.
    rows = []
    for c, seed in found:
        where, rec = chosen[(c, seed)]
        s = store.load_json(os.path.join(where, "ppo.json"))
        rows.append(ppo_row(c, seed, s, archive.made_on(rec), True))
    rows = pre + rows

    def run_dir(cond, seed):
        return chosen[(folder(cond), seed)][0]
    adir = os.path.join(cfg.run.out_dir, opts["subdir"])
    os.makedirs(adir, exist_ok=True)
    stamp_line = made_by(started, rows, opts["jobs"], threads, cfg.run.device)
    table, body, rows = report(opts, cfg, rows, order, adir, run_dir, stamp_line[1], len(found))
    names = ["scores.png", "frontier.png", "beta.png", "bestofk.png"]
    if opts["suite"] in OVEROPT:
        overopt_md = body + "\n" + overopt_report(overopt_pre, adir, order, rows, run_dir,
                                                   stamp_line, opts["suite"])
        names.append(f"{opts['suite']}.png")
        if not opts["user_conditions"]:
            store.write_text(os.path.join(adir, f"results_{opts['suite']}.md"), overopt_md)
    # The figures, also where the documents show them: a whole suite's only (a few of its
    # conditions would replace its figures).
    # --figures= (empty): nowhere (the check's own runs).
    for name in ([] if opts["user_conditions"] or not opts["figures"] else names):
        png = os.path.join(adir, name)
        if os.path.exists(png) and os.path.getmtime(png) >= started:
            os.makedirs(opts["figures"], exist_ok=True)
            with open(png, "rb") as f:
                store.write_bytes(os.path.join(opts["figures"], f"{opts['subdir']}_"
                                               f"{opts['suite']}_{name}"), f.read())
    print(table)


def main(argv):
    opts, rest = parse(argv)
    try:
        if opts["check"]:
            lines, ok = check.check(os.path.abspath(opts["kept"]))
            print("\n".join(lines))
            if not ok:
                die("--check: the answers' tables and the archive's differ, or the archive "
                    "cannot rebuild some (listed above)", 1)
        elif opts["tables_only"]:
            tables_only(opts, rest)
        else:
            ablate(opts, rest)
    except RunError as e:
        die(str(e), e.code)
    except KeyboardInterrupt:
        die("interrupted; finished runs are kept and the same command goes on from there", 130)


if __name__ == "__main__":
    run_main(main, sys.argv[1:])
