"""Does DPO need the reference, and is its gap to PPO the loss or the data? DPO at five β, IPO at
two τ (and TRL's per-token IPO), DPO with the reference's log-probs replaced by zeros, and online
DPO (the policy's own pairs each round, judged by the reward model or by the simulated human, with
and without the reference), over several seeds, each evaluated on held-out prompts as it trains,
each endpoint read against PPO's frontier of fixed-β endpoints at the same KL (PPO's adaptive β
beside them), with best-of-n by the proxy.

    python -m lab.dpo_suite                  # 5 seeds x 27 arms, and 3 of them on two more
                                             # pretrained models -> out/dpo_suite/
                                             # (dpo.md, dpo.json, frontier.png, examples.md)
    python -m lab.dpo_suite --subdir=dpo_epochs --arms=frontier --dpo_epochs=4 \
        --dpo_eval_every=26 --models=        # the offline arms (FRONTIER) over 4 passes over the
                                             # pairs, evaluated 13 times each, the online arms
                                             # and PPO's fixed βs -> out/dpo_epochs/
    python -m lab.dpo_suite --quick          # one seed, short runs -> out/dpo_suite_quick/
    python -m lab.dpo_suite --arms=dpo_0.1,noref_0.1 --seeds=2 --dpo_epochs=2
                                             # any train.py flag passes through
    python -m lab.dpo_suite --jobs=1         # one run at a time, in this process
                                             # (default: 2 processes, 1 thread each)
    python -m lab.dpo_suite --bon=12x256     # best-of-n's pool: prompts x samples (the default)
    python -m lab.dpo_suite --models=        # the main pretrained model only
    python -m lab.dpo_suite --kept=          # no kept runs taken or kept (default: lab/runs)
    python -m lab.dpo_suite --subdir=dpo_epochs --arms=frontier --dpo_epochs=4 \
        --dpo_eval_every=26 --models= --tables_only
                                             # the tables and figure from lab/runs alone, on any
                                             # CPU, without training (--base=HASH: the pretrained
                                             # model's, where the archive holds several;
                                             # --make_pretrained: also the pretrained model's
                                             # evaluations it lacks, on a CPU that rebuilds it;
                                             # --figures=: the figure into out/ only)

Online arms (online_*) run --online_rounds rounds of --online_prompts prompts x 2 answers (PPO's
60 x 64 by default), evaluated every 6 rounds; --dpo_epochs and --dpo_batch_size reach the offline
arms only, --dpo_judge and --online_* the online ones (arm_flags).
The pretrained model, frozen reference, reward model and prefs.jsonl are --out_dir's (built by
train.py's stages when missing), so only the method differs between arms. Run k has --seed + k:
DPO's batch order and its evaluations' sampling, or PPO's rollouts; the base is the same for
every seed, so the intervals hold the variation of the method's own randomness, not that of
another pretrained model. DPO trains on the reward model's training split; its held-out split
gives the implicit reward's accuracy. Every arm is evaluated every --dpo_eval_every DPO steps
(--eval_every PPO iterations) on --eval_n held-out samples drawn from the evaluation's own stream,
so each run draws a curve of exact KL to the reference against gold; then the final evaluation
(--n_eval samples), as the report's.
Each run folder holds what train.py's stage writes but its plot (python -m lab.plot draws a run's
curves) and a run.json, written last, that records config, inputs, code and outputs (as
stages.json does); a run whose record matches is reused, a killed one resumes from its
dpo_state.pt (ppo_state.pt), so an interrupted suite goes on where it stopped. As ablate.py's,
each finished run's result json, metrics and record are also kept in
lab/runs/SUBDIR/[MODEL/]ARM/seedN/inputs_HASH (SUBDIR dpo_suite, or dpo_suite_quick; for the
main run folder, out/, only, unless --kept names a folder), and a run missing from out/ whose
kept record matches is restored from there instead of being run; the weights are not kept
(examples.md says so for a kept run). The pretrained model's evaluations (where every curve starts,
and best-of-n's curve) are kept under lab/runs/SUBDIR/pretrained/inputs_HASH, so --tables_only
rebuilds the tables and the figure from the archive on any CPU (lab/archive.py).
Tables: the mean over seeds with a Student-t 95 % interval (tables.t_ci, n = the seeds listed).
Gold at equal KL (`at_equal_kl`): every endpoint (an offline arm at the end of each epoch, any
other arm at the end of its budget) against the frontier of PPO's fixed-β endpoints (PPO_FIXED:
β = 0 to 1, one frontier per seed) at that run's own KL, Welch's Δ, the table's comparisons one
family read as different, equivalent (margin tables.MARGINS) or undecided; frontier.png draws
every endpoint.
--models (default model2,model3: ablate.BASE_OF's, world, pretraining, preferences and reward
model reseeded, made under out/dpo_suite/bases/) runs the arms of README's claim (MODEL_ARMS: DPO
and DPO without the reference at β = 0.1, PPO's default) on other pretrained models as well, and
tables.models_table reads the claim with the model as the unit (each against PPO, and without the
reference against with it); the curves and best-of-n are the main model's.
Left out: DPO past one epoch by default, a β search for IPO.
"""
# Ctrl-C while the imports below load torch (seconds) is one line and exit 130.
if __name__ == "__main__":
    from machinery.errors import ctrl_c_while_starting
    ctrl_c_while_starting()
import multiprocessing, os, sys, time
import numpy as np
import torch

import data, dpo, tokenizer, train
from machinery import records, store
from pipeline import stages
from machinery.config import check_once, override
from machinery.errors import RunError, die, run_main
from options.evaluate import during_ppo
from ref import load_checkpoint
from lab import ablate, archive, overopt
from lab.tables import (MARGINS, bestofk_cells, endpoint_frontier, family_cells, margins_line,
                        models_table, paired_stats, t_cell, t_ci, three_verdicts, welch_ci,
                        welch_stats)

BETAS = ("0.05", "0.1", "0.3", "1", "5")
TAUS = ("0.1", "1")
# Online DPO's rounds: PPO's 60 iterations of 64 answers; evaluated every 6, as PPO's arms.
ONLINE = ["--dpo_pairs=online", "--dpo_eval_every=6"]
# arm -> its flags: DPO at each β, IPO at each τ (and TRL's per-token IPO at τ 0.1), DPO without
# the reference at each β; online DPO judged by the reward model at two β and without the
# reference, and judged by the simulated human with and without it.
ARMS = {**{f"dpo_{b}": [f"--dpo_beta={b}"] for b in BETAS},
        **{f"ipo_{t}": ["--dpo_loss=ipo", f"--ipo_tau={t}"] for t in TAUS},
        "ipomean_0.1": ["--dpo_loss=ipo", "--ipo_tau=0.1", "--dpo_logps=mean"],
        **{f"noref_{b}": ["--dpo_reference=none", f"--dpo_beta={b}"] for b in BETAS},
        "online_0.1": ONLINE + ["--dpo_beta=0.1"],
        "online_0.3": ONLINE + ["--dpo_beta=0.3"],
        "online_noref_0.1": ONLINE + ["--dpo_beta=0.1", "--dpo_reference=none"],
        "online_gold_0.1": ONLINE + ["--dpo_beta=0.1", "--dpo_judge=gold"],
        "online_gold_noref_0.1": ONLINE + ["--dpo_beta=0.1", "--dpo_judge=gold",
                                           "--dpo_reference=none"]}
# PPO's arms: ablate.py's conditions of the same names. The fixed βs (β = 0 included) are PPO's
# frontier of endpoints, against which every DPO arm is read at equal KL.
PPO_FIXED = {"ppo_no_kl": "no_kl", "ppo_fixed_0.05": "fixed_0.05",
             **{f"ppo_beta_{b}": f"beta_{b}" for b in ("0.001", "0.01", "0.03", "0.1", "0.3", "1")}}
PPO_ARMS = {"ppo_adaptive": "adaptive", **PPO_FIXED}
# --arms=frontier: the offline arms run over several epochs (--dpo_epochs), the online arms and
# PPO's fixed βs, on one frontier (TRL's IPO, ipomean_0.1, beside ipo_0.1 is not among them yet).
FRONTIER = ("dpo_0.1", "dpo_0.3", "ipo_0.1", "noref_0.1", "online_0.1", "online_0.3",
            "online_noref_0.1", "online_gold_0.1", "online_gold_noref_0.1", *PPO_FIXED)
# Every arm: the suite's default.
DEFAULT_ARMS = ",".join(list(ARMS) + list(PPO_ARMS))
# The arms that also run on the other pretrained models (--models).
MODEL_ARMS = ("dpo_0.1", "noref_0.1", "ppo_adaptive")
# One epoch of the default 10,800 training pairs is 338 steps: 12 evaluations; PPO's 60
# iterations: 10.
SUITE_FLAGS = ["--dpo_eval_every=28", "--eval_every=6"]
QUICK = ["--dpo_epochs=0.1", "--dpo_eval_every=7", "--rollout_batch=32", "--ppo_iters=12",
         "--eval_every=3", "--n_eval=64", "--online_rounds=12", "--online_prompts=16"]
# Where --tables_only puts its figure: a tracked file the documents show.
FIGURES = ablate.FIGURES
# What a kept DPO run keeps: its result json first (ablate.keep reads its seconds), its metrics.
KEPT = ("dpo.json", "dpo_metrics.jsonl")


# What the arms set, each its own way: from the command line they would relabel an arm (a user's
# --dpo_logps=mean would make ipo_0.1 ipomean_0.1), so they are refused there. The evaluations'
# spacing is the suite's (the online arms evaluate every 6 rounds whatever --dpo_eval_every says).
ARM_FIELDS = ("dpo_loss", "dpo_beta", "ipo_tau", "dpo_reference", "dpo_logps", "dpo_pairs",
              "dpo_judge")


def arm_flags(arm, rest):
    """An arm's train.py flags: the suite's and the user's, less those of the other source of
    pairs (--dpo_epochs and --dpo_batch_size reach the offline arms, --dpo_judge and --online_*
    the online ones, neither the PPO arms), then the arm's own."""
    own = ARMS[arm] if arm in ARMS else ablate.CONDITIONS[PPO_ARMS[arm]]
    other = dpo.OFFLINE_ONLY if "--dpo_pairs=online" in own else dpo.ONLINE_ONLY
    return override([a for a in rest if a[2:].partition("=")[0] not in other], own)


def shared(rest):
    """The flags as the suite's own parses read them (the main run, the evaluations' streams): the
    online arms' flags left out, as the offline and PPO arms get them."""
    return [a for a in rest if a[2:].partition("=")[0] not in dpo.ONLINE_ONLY]


def parse(argv):
    """dpo_suite's own flags; every other is a train.py flag, checked by train.parse up front."""
    if "--help" in argv or "-h" in argv:
        print(__doc__)
        sys.exit(0)
    check_once(argv)
    opts = dict(quick=False, seeds=5, arms=DEFAULT_ARMS, jobs=2,
                bon="12x256", models=",".join(ablate.MODELS), kept=ablate.KEPT_DIR, subdir="",
                tables_only=False, base="", make_pretrained=False, figures=FIGURES)
    user = []
    for a in argv:
        name, _, value = a[2:].partition("=")
        if a.startswith("--") and name in opts:
            yes_no = name in ("quick", "tables_only", "make_pretrained")
            try:
                kind = ablate.BOOLS.__getitem__ if yes_no else type(opts[name])
                opts[name] = kind(value.lower() if yes_no else value)
            except (KeyError, ValueError):
                die(f"bad value for --{name}: {value!r}")
        else:
            user.append(a)
    given = [a for a in user if a[2:].partition("=")[0] in ARM_FIELDS]
    if given:
        die(f"{given[0].partition('=')[0]} is set by each arm: choose the arms with --arms "
            f"(ARMS in lab/dpo_suite.py)")
    # --arms=frontier: the over-epochs suite's arms (FRONTIER).
    if opts["arms"] == "frontier":
        opts["arms"] = ",".join(FRONTIER)
    arms = opts["arms"].split(",")
    unknown = [a for a in arms if a not in ARMS and a not in PPO_ARMS]
    if unknown:
        die(f"unknown arm {unknown[0]!r} (choose {', '.join(list(ARMS) + list(PPO_ARMS))})")
    if len(set(arms)) < len(arms):
        die(f"--arms names {max(arms, key=arms.count)!r} twice")
    models = [m for m in opts["models"].split(",") if m]
    unknown = [m for m in models if m not in ablate.MODELS]
    if unknown:
        die(f"unknown model {unknown[0]!r} in --models (choose {', '.join(ablate.MODELS)})")
    if len(set(models)) < len(models):
        die(f"--models names {max(models, key=models.count)!r} twice")
    opts["models"] = models
    if opts["seeds"] < 1 or opts["jobs"] < 1:
        die(f"--seeds and --jobs must be >= 1 (got {opts['seeds']} and {opts['jobs']})")
    prompts, _, per = opts["bon"].partition("x")
    if not (prompts.isdigit() and per.isdigit() and int(prompts) > 0 and int(per) > 1):
        die(f"bad value for --bon: {opts['bon']!r} (PROMPTSxSAMPLES, e.g. 12x256)")
    opts["bon"] = (int(prompts), int(per))
    if opts["quick"]:
        opts["seeds"] = 1
        opts["bon"] = (4, 32)
        # The main model only, unless --models names others.
        if not any(a.startswith("--models=") for a in argv):
            opts["models"] = []
    rest = override(override(SUITE_FLAGS, QUICK if opts["quick"] else []), user)
    # Each arm's flags fail here, before any work.
    for a in arms:
        train.parse(arm_flags(a, rest))
    cfg = train.parse(shared(rest))
    if cfg.run.stage != "all":
        die(f"the suite runs the stages each arm needs: leave out --stage (got --stage="
            f"{cfg.run.stage})")
    if not cfg.dpo.dpo_eval_every or not cfg.eval.eval_every:
        die("the suite draws each run's curve from its evaluations: --dpo_eval_every and "
            "--eval_every must be > 0")
    if cfg.run.seed + opts["seeds"] > 2 ** 31:
        die(f"--seed={cfg.run.seed} with --seeds={opts['seeds']}: a run's seed would be >= 2^31")
    if not opts["subdir"]:
        opts["subdir"] = "dpo_suite_quick" if opts["quick"] else "dpo_suite"
    if os.sep in opts["subdir"] or opts["subdir"] in (".", ".."):
        die(f"bad value for --subdir: {opts['subdir']!r} (a folder name inside --out_dir)")
    d = os.path.join(cfg.run.out_dir, opts["subdir"])
    for folder in (cfg.run.out_dir, d):
        if store.not_a_folder(folder):
            die(f"--out_dir={cfg.run.out_dir}: {folder} {store.not_a_folder(folder)}")
    # Runs are kept for the main run folder only, unless --kept names a folder.
    named = any(a.startswith("--kept=") for a in argv)
    if not named and os.path.abspath(cfg.run.out_dir) != os.path.abspath(ablate.OUT_DEFAULT):
        opts["kept"] = ""
    if opts["kept"]:
        for d in (opts["kept"], os.path.join(opts["kept"], opts["subdir"])):
            if store.not_a_folder(d):
                die(f"--kept={opts['kept']}: {d} {store.not_a_folder(d)}")
    if opts["tables_only"] and not opts["kept"]:
        die("--tables_only reads the kept runs: name their folder with --kept=FOLDER")
    if opts["base"] and not opts["tables_only"]:
        die("--base chooses among the kept runs' pretrained models: it goes with --tables_only")
    if opts["make_pretrained"] and not opts["tables_only"]:
        die("--make_pretrained makes what --tables_only reads of the pretrained model: it goes "
            "with --tables_only")
    return opts, rest


def finished(run_dir, stamp, st):
    """True when run_dir's run.json was written under `stamp` (config, inputs, code) and the
    outputs it lists are as the run wrote them."""
    path = os.path.join(run_dir, ablate.RECORD)
    try:
        rec = store.load_json(path) if os.path.exists(path) else None
    except RunError:
        return False
    if rec is None or records.damaged_record(rec) or records.code_difference(rec, stamp):
        return False
    if records.first_difference(rec, stamp) is not None:
        return False
    return records.outputs_intact(run_dir, rec, [n for n in st.outputs if n != "dpo.png"])


def dpo_run(job):
    """One DPO (IPO) run in its own folder; its row. A finished run under the same stamp is
    reused; else a kept one (kept_dir) that matches is restored; any other is done again, from its
    dpo_state.pt when that was made under the same, and kept."""
    arm, seed, rest, base, run_dir, threads, kept_dir = job
    if threads:
        torch.set_num_threads(threads)
    cfg = train.parse(override(rest, [f"--seed={seed}", f"--out_dir={base}", "--stage=dpo"]))
    st = stages.BY_NAME["dpo"]
    stamp = stages.stamp(cfg, st)
    if kept_dir:
        kept_dir = ablate.kept_folder(kept_dir, stamp)
    made_on = None
    made_now = False
    if cfg.run.fresh or not finished(run_dir, stamp, st):
        if kept_dir and not cfg.run.fresh:
            made_on = ablate.kept_run(kept_dir, stamp, KEPT)
        # The temporary files a kill mid-write leaves.
        stray = [n for n in os.listdir(run_dir) if ".tmp" in n] if os.path.isdir(run_dir) else []
        partial = [st.partial] if cfg.run.fresh or made_on else []
        for n in [ablate.RECORD] + st.outputs + stray + partial:
            store.remove(os.path.join(run_dir, n))
        if made_on:
            ablate.restore(kept_dir, run_dir, KEPT)
        else:
            # No dpo.png per run: the suite draws its own figures (lab.plot draws any run's).
            stages.run_stage(cfg, st, stamp, base=base, run_dir=run_dir, log=ablate.quiet,
                             plot=False)
            # Every output the stage makes under this config, or no record (RunError).
            rec = ablate.run_record(run_dir, stamp, ablate.unplotted(stages.files(cfg, st.outputs)))
            store.save_json(os.path.join(run_dir, ablate.RECORD), rec)
            made_now = True
    # A finished run not yet kept (or kept under another stamp) is kept.
    if kept_dir and not made_on and not ablate.kept_run(kept_dir, stamp, KEPT):
        rec = store.load_json(os.path.join(run_dir, ablate.RECORD))
        ablate.keep(run_dir, kept_dir, rec, threads, cfg.run.device, KEPT)
    restored = made_on is not None
    # A run reused from its folder was made by an earlier command: its kept record names which.
    if kept_dir and not made_now and not restored:
        made_on = ablate.kept_run(kept_dir, stamp, KEPT)
    return dpo_row(arm, seed, store.load_json(os.path.join(run_dir, "dpo.json")), made_on,
                   restored)


def dpo_row(arm, seed, s, made_on, restored):
    """A DPO run's row from its dpo.json (s), as ablate.ppo_row makes a PPO run's."""
    return dict(condition=arm, seed=seed, kept=made_on, restored=restored, **s["final"],
                **s["implicit"],
                seconds=s["seconds"], steps=s["steps"], **bestofk_cells(s["bestofk"]))


def one_run(job):
    """A DPO arm's run, or a PPO arm's (ablate.one_run under its condition); whatever stops it
    comes back as a RunError, as in ablate.pool_run."""
    arm = job[0]
    try:
        if arm in ARMS:
            return dpo_run(job)
        row = ablate.one_run((PPO_ARMS[arm],) + job[1:])
        return dict(row, condition=arm)
    except RunError:
        raise
    except BaseException as e:
        why = " ".join(f"{type(e).__name__}: {e}".split())
        raise RunError(f"run {arm} seed {job[1]}: {why} (--jobs=1 shows where)", 1)


def trajectory(rows, start, x):
    """A run's evaluations (its metrics rows' eval/ columns), from the pretrained model's on the
    same stream (`start`, at step 0): lists of x (step or iter), kl, gold, length, eos."""
    evals = [r for r in rows if "eval/kl" in r]
    names = dict(kl="eval/kl", gold="eval/gold_mean", length="eval/response_length",
                 eos="eval/eos_rate", distinct="eval/distinct_2")
    out = {k: [start[v]] + [r[v] for r in evals] for k, v in names.items()}
    out["x"] = [0] + [r[x] for r in evals]
    # Offline DPO: the passes over the pairs at each evaluation, and the implicit reward's
    # held-out accuracy there (none at the start: the pretrained model has no implicit reward).
    if evals and "epoch" in evals[0]:
        out["epoch"] = [0.0] + [r["epoch"] for r in evals]
        out["acc_noisy"] = [None] + [r.get("eval/implicit_acc_noisy") for r in evals]
    return out


def epoch_change(t, last):
    """A run's gold at the end of epoch `last` minus at the end of the first; None when it was not
    evaluated at both."""
    if not {1.0, float(last)} <= set(t["epoch"]):
        return None
    return t["gold"][t["epoch"].index(float(last))] - t["gold"][t["epoch"].index(1.0)]


def by_epoch(trajs, order):
    """With more than one pass over the pairs: each offline arm at the end of each epoch (the
    evaluation made there), gold, exact KL and the implicit reward's held-out accuracy, then the
    change in gold from the first epoch's end to the last's, per run (does gold fall while the KL
    grows?), and each epoch's end against the one before, seed by seed, the table's comparisons
    one family (arms of two runs or more); empty when no arm ran past one epoch."""
    arms = [a for a in order if a in trajs and all("epoch" in t for t in trajs[a].values())]
    last = {a: min(int(t["epoch"][-1]) for t in trajs[a].values()) for a in arms}
    arms = [a for a in arms if last[a] > 1]
    if not arms:
        return ""
    top = max(last.values())
    md = ["", "By epoch: each run's evaluation at the end of each pass over the training pairs "
          "(gold / exact KL / the implicit reward's accuracy on the first --eval_n held-out pairs, "
          "noisy labels), the mean over seeds:", "",
          "| arm | " + " | ".join(f"epoch {e}" for e in range(1, top + 1))
          + " | Δ gold, last − first epoch |", "|---" * (top + 2) + "|"]
    for arm in arms:
        ts = list(trajs[arm].values())
        cells = []
        for e in range(1, top + 1):
            at = [t["epoch"].index(float(e)) if float(e) in t["epoch"] else None for t in ts]
            if None in at:
                cells.append("—")
                continue
            cells.append(" / ".join(t_cell([t[k][i] for t, i in zip(ts, at)], fmt)
                                    for k, fmt in (("gold", "{:+.2f}"), ("kl", "{:.1f}"),
                                                   ("acc_noisy", "{:.2f}"))))
        # A run evaluated at the end of its first and its last epoch (every run, as dpo.py
        # evaluates at each epoch's end): the change between them.
        change = [epoch_change(t, last[arm]) for t in ts]
        md.append(f"| {arm} | " + " | ".join(cells) + " | " + t_cell(change) + " |")
    # Each epoch against the one before, run by run (exploratory: added once the first runs of the
    # over-epochs suite had been seen); the table's gold comparisons are one family.
    steps, stats, kl_moves = [], [], []
    # Two runs or more: a difference with an interval.
    for arm in (a for a in arms if len(trajs[a]) >= 2):
        ts = list(trajs[arm].values())
        for e in range(2, last[arm] + 1):
            at = [(t["epoch"].index(float(e - 1)), t["epoch"].index(float(e))) for t in ts]
            steps.append((arm, e))
            stats.append(paired_stats([t["gold"][j] - t["gold"][i] for t, (i, j) in zip(ts, at)]))
            kl_moves.append(t_cell([t["kl"][j] - t["kl"][i] for t, (i, j) in zip(ts, at)],
                                   "{:+.1f}"))
    if not stats:
        return "\n".join(md) + "\n"
    cells = family_cells(stats, [MARGINS["gold_mean"]] * len(stats), "{:+.2f}")
    md += ["", "Each epoch's end against the one before, run by run (same seed): Δ gold [Student-t "
           "95 %] and its verdict, Δ KL (nats); exploratory, added once the first runs had been "
           "seen:", "", "| arm | epochs | Δ gold | Δ KL |", "|---" * 4 + "|"]
    md += [f"| {arm} | {e - 1} → {e} | {c} | {k} |" for (arm, e), c, k in zip(steps, cells,
                                                                             kl_moves)]
    md += ["", margins_line(["gold_mean"], [MARGINS["gold_mean"]], len(stats))]
    return "\n".join(md) + "\n"


def endpoints(trajs, order):
    """Every run's endpoints, {label: {seed: (kl, gold)}}: an offline arm's evaluation at the end
    of each epoch (the end of a run of that many epochs: the learning rate is constant and each
    epoch's batches are drawn alike whatever the number of epochs), labelled "ARM, epoch E"; any
    other arm's last evaluation (the end of its budget: PPO's iterations, online DPO's rounds),
    labelled ARM. An offline arm of less than one epoch is labelled by its arm, as the others; one
    that ends past its last whole epoch (2.5 epochs) gives its whole epochs only."""
    out = {}
    for arm in order:
        for seed, t in trajs[arm].items():
            ends = [e for e in range(1, int(t.get("epoch", [0])[-1]) + 1)
                    if float(e) in t["epoch"]]
            for e in ends:
                i = t["epoch"].index(float(e))
                out.setdefault(f"{arm}, epoch {e}", {})[seed] = (t["kl"][i], t["gold"][i])
            if not ends:
                out.setdefault(arm, {})[seed] = (t["kl"][-1], t["gold"][-1])
    return out


def at_equal_kl(ends, ppo, start_gold, bon, margin):
    """Gold at equal KL: each endpoint of every arm but PPO's fixed βs, read against PPO's
    frontier of fixed-β endpoints (tables.endpoint_frontier over the `ppo` arms' endpoints, one
    frontier per seed) at that run's own KL, the PPO seed of the same number (the arms share no
    randomness: Welch's Δ). The table's comparisons are one family (tables.three_verdicts: Holm,
    against ±margin gold). Best-of-n by the proxy beside it, read on its curve at the arm's mean
    KL.
    Returns (markdown, {label: verdict})."""
    fronts = {}
    for arm in ppo:
        for seed, point in ends.get(arm, {}).items():
            fronts.setdefault(seed, []).append(point)
    bon_kl = bon["kl_pool"]
    bon_gold = [start_gold + g for g in bon["gold"]]
    labels, stats, cells = [], [], {}
    for label, runs in ends.items():
        if label in ppo:
            continue
        mine, theirs = [], []
        for seed, (kl, gold) in runs.items():
            f = endpoint_frontier(fronts.get(seed, []), [kl])[0]
            if f is not None:
                mine.append(gold)
                theirs.append(f)
        kls = [k for k, _ in runs.values()]
        mean_kl = float(np.mean(kls))
        # Best-of-n's curve is one pool's, without seeds: its value at the arm's mean KL, where
        # the curve reaches it.
        bon_cell = "-"
        if bon_kl[0] <= mean_kl <= bon_kl[-1]:
            bon_cell = f"{float(np.interp(mean_kl, bon_kl, bon_gold)):+.2f}"
        cells[label] = [label, str(len(runs)), t_cell(kls, "{:.2f}"),
                        t_cell([g for _, g in runs.values()]), t_cell(theirs) if theirs else "-",
                        "-", "under 2 runs inside PPO's range" if len(mine) < 2 else "",
                        bon_cell]
        if len(mine) >= 2:
            d, lo, hi = welch_ci(mine, theirs)
            cells[label][5] = f"{d:+.2f} [{lo:+.2f}, {hi:+.2f}]" + (
                f" ({len(mine)} of {len(runs)})" if len(mine) < len(runs) else "")
            labels.append(label)
            stats.append(welch_stats(mine, theirs))
    words = dict(zip(labels, (w for w, _, _ in three_verdicts(stats, margin))))
    md = ["", f"Gold at equal KL against PPO's frontier: every endpoint (an offline arm at the end "
          f"of each epoch, any other arm at the end of its budget) against the frontier of PPO's "
          f"fixed-β endpoints ({', '.join(a for a in ppo if a in ends)}; one frontier per seed, "
          f"linear between neighbouring βs) read at that run's own KL; Δ gold by Welch with its "
          f"95 % interval, n the seeds inside PPO's range; the verdicts one family of "
          f"{len(stats)} (Holm), margin ±{margin:g} gold; best-of-n by the proxy at the arm's "
          f"mean KL:", "",
          "| endpoint | seeds | KL | gold | PPO at that KL | Δ gold | verdict | best-of-n |",
          "|---" * 8 + "|"]
    for label, row in cells.items():
        row[6] = row[6] or words[label]
        md.append("| " + " | ".join(row) + " |")
    return "\n".join(md) + "\n", words


def online_table(metrics, order):
    """The online arms' pairs, per round, the mean over rounds then over seeds: pairs kept, ties
    dropped, and how often the judge's choice agrees with the simulated human's."""
    arms = [a for a in order if a in metrics
            and any("pairs/n" in r for rs in metrics[a].values() for r in rs)]
    if not arms:
        return ""
    cols = (("pairs/n", "{:.1f}"), ("pairs/ties", "{:.1f}"),
            ("pairs/judge_agrees_with_gold", "{:.3f}"))
    md = ["", "Online rounds: per round the pairs kept, the ties left out, and the share of kept "
          "pairs whose chosen answer the simulated human also prefers (the mean over rounds, then "
          "over seeds):", "", "| arm | pairs | ties | judge agrees with gold |", "|---" * 4 + "|"]
    for arm in arms:
        means = []
        for col, fmt in cols:
            per_run = []
            for rs in metrics[arm].values():
                v = [r[col] for r in rs if r.get(col) is not None]
                per_run.append(float(np.mean(v)) if v else None)
            means.append(t_cell(per_run, fmt))
        md.append(f"| {arm} | " + " | ".join(means) + " |")
    return "\n".join(md) + "\n"


def tables(rows, trajs, order, bon):
    """dpo.md's tables: the final evaluation; the second half of training (does gold fall while
    KL grows?); best-of-n."""
    md = ["| arm | seeds | gold | KL | proxy | length | end-of-text | well-formed | distinct-2 | "
          "ppl under ref | implicit acc. (noisy) | (gold) |", "|---" * 12 + "|"]
    for arm in order:
        rs = [r for r in rows if r["condition"] == arm]

        def col(name, fmt="{:+.2f}"):
            return t_cell([r.get(name) for r in rs], fmt)
        md.append(f"| {arm} | {len(rs)} | {col('gold_mean')} | {col('kl', '{:.2f}')} | "
                  f"{col('proxy_mean')} | {col('response_length', '{:.1f}')} | "
                  f"{col('eos_rate', '{:.2f}')} | {col('wellformed_rate', '{:.2f}')} | "
                  f"{col('distinct_2', '{:.3f}')} | {col('ref_ppl', '{:.2f}')} | "
                  f"{col('acc_noisy', '{:.3f}')} | {col('acc_gold', '{:.3f}')} |")
    md += ["", "Over the second half of training (the last evaluation minus the one at half way), "
           "per run, then the mean over seeds: gold falling while KL grows is overoptimisation:",
           "", "| arm | Δ gold | Δ KL | Δ length | Δ distinct-2 |", "|---" * 5 + "|"]
    for arm in order:
        ts = list(trajs[arm].values())

        def half(k, fmt="{:+.2f}"):
            return t_cell([t[k][-1] - t[k][len(t[k]) // 2] for t in ts], fmt)
        md.append(f"| {arm} | {half('gold')} | {half('kl')} | {half('length', '{:+.1f}')} | "
                  f"{half('distinct', '{:+.3f}')} |")
    md += ["", "Best-of-n by the proxy on the pretrained model (the exact KL of the pool's "
           "best-of-n; gold gain over n = 1):", "", "| n | KL | gold gain |", "|---|---|---|"]
    md += [f"| {n} | {k:.2f} | {g:+.2f} |" for n, k, g in zip(bon["n"], bon["kl_pool"],
                                                              bon["gold"])]
    return "\n".join(md) + "\n"


def models_tables(rows, order, models):
    """With --models: DPO with and without the reference against PPO's default on each pretrained
    model, and without the reference against with it at the same β (tables.models_table: each
    model's mean over seeds the unit); empty without other models."""
    ppo = next((a for a in order if a == "ppo_adaptive"), None)
    md = ""
    for arm in (a for a in order if a.startswith("dpo_") and a in MODEL_ARMS):
        noref = "noref_" + arm[len("dpo_"):]
        acc = (("acc_gold", ".3f", "implicit reward's accuracy (gold)"),)
        if ppo:
            md += models_table(rows, [a for a in (ppo, arm, noref) if a in order],
                               ["main"] + models, base=ppo, extra=acc)
        if noref in order:
            md += models_table(rows, [arm, noref], ["main"] + models, base=arm, extra=acc)
    return md


def plot(ends, order, ppo, bon, start_gold, png):
    """frontier.png: gold against exact KL to the reference at every endpoint, the mean over seeds
    with Student-t 95 % intervals both ways: PPO's fixed βs joined in order of KL (its frontier),
    each offline arm's epochs joined in order (numbered), every other arm a point, and best-of-n
    by the proxy; skipped without matplotlib."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, ax = plt.subplots(figsize=(9, 6))

    def mean_ci(values):
        if len(values) < 2:
            return float(values[0]), 0.0
        mean, lo, hi = t_ci(values)
        return mean, hi - mean
    styles = {"dpo": "o", "ipo": "s", "nor": "v", "ppo": "D", "onl": "*"}
    groups = [ppo] + [[a] for a in order if a not in ppo]
    for i, arms in enumerate(groups):
        labels = [label for label in ends for a in arms
                  if label == a or label.startswith(a + ", epoch ")]
        if not labels:
            continue
        points = [[mean_ci([p[k] for p in ends[label].values()]) for k in (0, 1)]
                  for label in labels]
        # PPO's βs in order of KL (a frontier); an offline arm's epochs in their own order.
        if arms is ppo:
            points.sort(key=lambda p: p[0][0])
        kl = [p[0][0] for p in points]
        gold = [p[1][0] for p in points]
        name = "PPO, fixed β" if arms is ppo else arms[0]
        ax.errorbar(kl, gold, xerr=[p[0][1] for p in points], yerr=[p[1][1] for p in points],
                    color="black" if arms is ppo else f"C{i % 10}", marker=styles[name[:3].lower()],
                    linestyle="-" if len(kl) > 1 else "none", capsize=2, label=name)
        if len(labels) > 1 and arms is not ppo:
            for label, x, y in zip(labels, kl, gold):
                ax.annotate(label.rpartition(" ")[2], (x, y), fontsize=7,
                            textcoords="offset points", xytext=(3, 3))
    ax.plot(bon["kl_pool"], [start_gold + g for g in bon["gold"]], color="grey",
            linestyle="--", marker=".", label="best-of-n (proxy)")
    ax.set_xscale("symlog", linthresh=1)
    ax.set_xlabel("exact KL to the reference at the end (nats / sequence)")
    ax.set_ylabel("gold (held-out, mean over seeds)")
    ax.set_title("Gold against KL: each method's endpoints (offline arms numbered by epoch)",
                 fontsize=10)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    store.save_figure(fig, png)
    plt.close(fig)


def examples(cfg, base, adir, order, seed, n=3):
    """examples.md: what the first seed's actor of each DPO arm writes for n held-out prompts."""
    import sample
    enc = tokenizer.load_tokenizer(base, cfg.world.tokenizer)
    heldout = data.load_prompts(base)["heldout"]
    prompts = heldout[::max(1, len(heldout) // n)][:n]
    lines = ["# What each arm's actor writes (first seed, the same sampling noise)", ""]
    for arm in [a for a in order if a in ARMS]:
        path = os.path.join(adir, arm, f"seed{seed}", "dpo_actor.pt")
        if not os.path.exists(path):
            lines += [f"## {arm}", "", "(a kept run: its weights were not kept)", ""]
            continue
        model, _ = load_checkpoint(path)
        run = sample.Run(model=model, enc=enc, response_length=cfg.run.response_length)
        # With its end-of-text where it ended, as the simulated human reads it.
        texts = [run.sample(p, seed=seed, end_of_text=True)[0] for p in prompts]
        lines += [f"## {arm}", ""] + [f"- `{p.strip()}` → {' '.join(t.split())!r} (gold "
                                      f"{data.gold_score(p, t):+.2f})"
                                      for p, t in zip(prompts, texts)] + [""]
    store.write_text(os.path.join(adir, "examples.md"), "\n".join(lines))


def placed(opts, order, seed0):
    """The suite's runs, [(model, arm, seed, where)]: every arm on the main model, MODEL_ARMS' on
    the others (--models); where = [MODEL/]ARM/seedN, the run's folder under SUBDIR and its kept
    one under --kept's SUBDIR."""
    models = ["main"] + [m for m in opts["models"] if set(order) & set(MODEL_ARMS)]
    out = []
    for m in models:
        for a in (a for a in order if m == "main" or a in MODEL_ARMS):
            for seed in range(seed0, seed0 + opts["seeds"]):
                where = [a, f"seed{seed}"] if m == "main" else [m, a, f"seed{seed}"]
                out.append((m, a, seed, where))
    return out


def pretrained_evals(opts, rest, cfg, base):
    """The pretrained model's evaluation on each seed's stream (where every curve starts) and
    best-of-n by the proxy on its pool (--bon); kept under --kept's SUBDIR/pretrained, so
    --tables_only rebuilds the tables without the base. Returns (starts {seed: eval/ columns},
    bon)."""
    started = time.time()
    enc = tokenizer.load_tokenizer(base, cfg.world.tokenizer)
    actor, ref, rm = stages.load_models(base, cfg.run.device)
    heldout = data.load_prompts(base)["heldout"]
    starts = {}
    for seed in range(cfg.run.seed, cfg.run.seed + opts["seeds"]):
        scfg = train.parse(override(shared(rest), [f"--seed={seed}"]))
        starts[seed] = during_ppo(actor, enc, heldout, scfg.run, ref, rm, scfg.eval)
    # Best-of-n's pool: 12 prompts x 256 samples (--quick: 4 x 32).
    prompts, per = opts["bon"]
    ns = [2 ** i for i in range(int(np.log2(per)) + 1)]
    bon = overopt.bon_curve(ablate.bon_pool(cfg, base, prompts, per), ns)
    if opts["kept"]:
        # Under the base's input hashes, as the DPO runs on it are kept.
        dcfg = train.parse(override(shared(rest), ["--stage=dpo"]))
        inputs = stages.stamp(dcfg, stages.BY_NAME["dpo"])["inputs"]
        archive.keep_pretrained(os.path.join(opts["kept"], opts["subdir"], "pretrained"),
                                pretrained_config(cfg, opts), inputs,
                                dict(starts={str(k): v for k, v in starts.items()}, bon=bon),
                                time.time() - started, cfg.run.device)
    return starts, bon


def pretrained_config(cfg, opts):
    """What the kept pretrained evaluations depend on besides the base (archive's)."""
    seeds = range(cfg.run.seed, cfg.run.seed + opts["seeds"])
    return archive.pretrained_config(cfg, seeds, dict(bon=list(opts["bon"])))


def report(opts, rows, metrics, starts, bon, order, adir, made, figure=None):
    """dpo.md, results.jsonl, dpo.json and frontier.png into adir from the rows, each main-model
    run's metrics rows ({arm: {seed: rows}}) and the pretrained model's evaluations (starts, bon);
    made: made_by's (stamp, line). figure: also a copy of frontier.png there. Returns dpo.md."""
    trajs = {}
    for arm in order:
        x = "step" if arm in ARMS else "iter"
        for seed, m in metrics[arm].items():
            trajs.setdefault(arm, {})[seed] = trajectory(m, starts[seed], x)
    # Every endpoint against PPO's frontier of fixed βs, when the suite ran two or more.
    ends = endpoints(trajs, order)
    ppo = [a for a in order if a in PPO_FIXED]
    start_gold = float(np.mean([s["eval/gold_mean"] for s in starts.values()]))
    equal_kl = ""
    if len(ppo) >= 2:
        equal_kl = at_equal_kl(ends, ppo, start_gold, bon, MARGINS["gold_mean"])[0]
    md = (f"# python -m lab.dpo_suite {' '.join(sys.argv[1:])}\n\n{len(rows)} runs; the mean "
          f"over seeds [Student-t 95 % interval, n = {opts['seeds']}]; held-out prompts.\n\n"
          + tables(rows, trajs, order, bon) + equal_kl + by_epoch(trajs, order)
          + online_table(metrics, order)
          + models_tables(rows, order, opts["models"])
          + "\n" + made[1] + "\n")
    store.write_text(os.path.join(adir, "dpo.md"), md)
    store.save_json(os.path.join(adir, "results.jsonl"), rows, lines=True)
    store.save_json(os.path.join(adir, "dpo.json"), dict(rows=rows, trajectories={
        a: {str(s): t for s, t in v.items()} for a, v in trajs.items()}, bon=bon,
        starts={str(s): v for s, v in starts.items()}, made_by=made[0]))
    png = os.path.join(adir, "frontier.png")
    plot(ends, order, ppo, bon, start_gold, png)
    if figure and os.path.exists(png):
        os.makedirs(os.path.dirname(figure), exist_ok=True)
        with open(png, "rb") as f:
            store.write_bytes(figure, f.read())
    return md


def suite(opts, rest):
    cfg = train.parse(shared(rest))
    base = cfg.run.out_dir
    started = time.time()
    # The main run's folder, made when missing (a fresh checkout has no out/), as train.py's.
    with train.open_folder(cfg):
        main_run = train.parse(override(shared(rest), ["--stage=all"]))
        main_run.run.fresh = False
        train.run_stages(main_run, upto="reward")
        adir = os.path.join(base, opts["subdir"])
        os.makedirs(adir, exist_ok=True)
        order = opts["arms"].split(",")
        seed0 = cfg.run.seed
        threads = 1 if opts["jobs"] > 1 else 0
        runs = placed(opts, order, seed0)
        # The other pretrained models' bases (train.py's stages, reseeded) and run folders.
        bases = {"main": (base, adir)}
        for m in dict.fromkeys(m for m, _, _, _ in runs if m != "main"):
            name, flags = ablate.BASE_OF[m]
            bases[m] = (os.path.join(adir, "bases", name), os.path.join(adir, m))
            ablate.make_base(shared(rest), base, bases[m][0], flags)
        # A row's condition: its arm, with the model's name after it on another model.
        jobs, names = [], []
        for m, a, seed, where in runs:
            b, folder = bases[m]
            kept = os.path.join(opts["kept"], opts["subdir"], *where) if opts["kept"] else None
            jobs.append((a, seed, arm_flags(a, rest), b, os.path.join(folder, *where[-2:]),
                         threads, kept))
            names.append(a if m == "main" else f"{a}_{m}")
        print(f"dpo_suite: {len(jobs)} runs ({opts['jobs']} at a time) into {adir}", flush=True)
        rows, pool = [], None
        if opts["jobs"] > 1:
            context = multiprocessing.get_context("spawn")
            pool = context.Pool(opts["jobs"], ablate._worker_init, (os.getpid(),))
        try:
            for name, row in zip(names, pool.imap(one_run, jobs) if pool else map(one_run, jobs)):
                row["condition"] = name
                rows.append(row)
                print(f"  {row['condition']:16s} seed {row['seed']}: gold {row['gold_mean']:+.2f} "
                      f"kl {row['kl']:.2f} len {row['response_length']:.1f} "
                      f"({row['seconds']:.0f}s, total {time.time() - started:.0f}s)", flush=True)
        finally:
            if pool:
                pool.terminate()
                pool.join()
        made = ablate.made_by(started, rows, opts["jobs"], threads, cfg.run.device)
        starts, bon = pretrained_evals(opts, rest, cfg, base)
        metrics = {}
        for m, a, seed, where in runs:
            if m == "main":
                name = "dpo_metrics.jsonl" if a in ARMS else "metrics.jsonl"
                metrics.setdefault(a, {})[seed] = store.load_json(
                    os.path.join(adir, *where, name), lines=True)
        print(report(opts, rows, metrics, starts, bon, order, adir, made))
        examples(cfg, base, adir, order, seed0)


def run_config(arm, seed, rest):
    """A run's config as the suite gives it (dpo_run's, or ablate.one_run's for a PPO arm), its
    stage and the names of its kept files."""
    own = [f"--seed={seed}"]
    if arm in ARMS:
        return train.parse(override(arm_flags(arm, rest), own + ["--stage=dpo"])), \
            stages.BY_NAME["dpo"], KEPT
    flags = override(arm_flags(arm, rest), ablate.CONDITIONS[PPO_ARMS[arm]] + own)
    return train.parse(flags), stages.BY_NAME["ppo"], ablate.KEPT


def first(key):
    """A key's first element (a run's model: "main" or another's name)."""
    return key[0]


def tables_only(opts, rest):
    """--tables_only: the suite's tables and figure rebuilt from the kept runs (lab/runs, or
    --kept) and the pretrained model's kept evaluations alone, on any CPU, without training
    (archive.py says which kept run stands for which); frontier.png also into
    docs/figures/SUBDIR_frontier.png. What the archive lacks is named, and nothing written."""
    started = time.time()
    threads = 1 if opts["jobs"] > 1 else 0
    cfg = train.parse(shared(rest))
    if opts["make_pretrained"]:
        # As the suite's command makes them: the main run's stages, then its evaluations, kept.
        with train.open_folder(cfg):
            main_run = train.parse(override(shared(rest), ["--stage=all"]))
            main_run.run.fresh = False
            train.run_stages(main_run, upto="reward")
            pretrained_evals(opts, rest, cfg, cfg.run.out_dir)
    # The runs' configs hold the threads they ran with.
    if threads:
        torch.set_num_threads(threads)
    order = opts["arms"].split(",")
    runs = placed(opts, order, cfg.run.seed)
    where_of = {(m, a, seed): where for m, a, seed, where in runs}
    found = {}
    for m, a, seed, where in runs:
        rcfg, st, names = run_config(a, seed, rest)
        found[(m, a, seed)] = archive.candidates(
            os.path.join(opts["kept"], opts["subdir"], *where), rcfg, st, names)
    # One base per pretrained model (the key's first element: "main" or the model's name).
    chosen, missing, bases = archive.choose_groups(found, first, opts["base"])
    pre = None
    if bases.get("main"):
        pre = archive.kept_pretrained(os.path.join(opts["kept"], opts["subdir"], "pretrained"),
                                      pretrained_config(cfg, opts), base=bases["main"])
    lacks = ["/".join(where_of[k]) for k in missing]
    if pre is None:
        lacks.append("pretrained (the pretrained model's evaluations)")
    if lacks:
        raise archive.lacking(os.path.join(opts["kept"], opts["subdir"]), lacks, len(runs))
    rows, metrics = [], {}
    for m, a, seed, where in runs:
        folder, rec = chosen[(m, a, seed)]
        name = a if m == "main" else f"{a}_{m}"
        if a in ARMS:
            row = dpo_row(name, seed, store.load_json(os.path.join(folder, KEPT[0])),
                          archive.made_on(rec), True)
        else:
            row = ablate.ppo_row(name, seed, store.load_json(os.path.join(folder, "ppo.json")),
                                 archive.made_on(rec), True)
        rows.append(row)
        if m == "main":
            kept_metrics = KEPT[1] if a in ARMS else ablate.KEPT[1]
            metrics.setdefault(a, {})[seed] = store.load_json(
                os.path.join(folder, kept_metrics), lines=True)
    starts = {int(k): v for k, v in pre["values"]["starts"].items()}
    made = ablate.made_by(started, rows, opts["jobs"], threads, cfg.run.device)
    adir = os.path.join(cfg.run.out_dir, opts["subdir"])
    os.makedirs(adir, exist_ok=True)
    # The figure where the documents show it: the suite's own arms only (a few of them would
    # replace it).
    figure = None
    if opts["figures"] and opts["arms"] in (DEFAULT_ARMS, ",".join(FRONTIER)):
        figure = os.path.join(opts["figures"], f"{opts['subdir']}_frontier.png")
    print(report(opts, rows, metrics, starts, pre["values"]["bon"], order, adir, made, figure))


def main(argv):
    opts, rest = parse(argv)
    try:
        if opts["tables_only"]:
            tables_only(opts, rest)
        else:
            suite(opts, rest)
    except RunError as e:
        die(str(e), e.code)
    except KeyboardInterrupt:
        die("interrupted; finished runs are kept and the same command goes on from there", 130)


if __name__ == "__main__":
    run_main(main, sys.argv[1:])
