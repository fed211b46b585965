"""A tiny ablation: every condition runs and reports finite numbers; finished runs are reused; bad options and
Ctrl-C are one line, and Ctrl-C leaves no worker behind."""
import json, math, os, re, shutil, signal, subprocess, sys, time
import numpy as np
import pytest
import train
from lab import ablate, tables
from machinery import provenance, store
from pipeline import stages
from machinery.config import flat
from conftest import TINY

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_every_condition_appears_with_finite_values_and_finished_runs_are_reused(run):
    argv = ["--preset=smoke", "--plots=false", f"--out_dir={run}", "--quick", "--ppo_iters=2", "--n_eval=8", "--jobs=1"]
    ablate.main(argv)
    adir = os.path.join(run, "ablate_quick")          # --quick's own folder: it never replaces main-budget runs
    assert not os.path.exists(os.path.join(run, "ablate"))
    rows = store.load_json(os.path.join(adir, "results.jsonl"), lines=True)
    assert {r["condition"] for r in rows} == set(ablate.SUITES["core"]) | {"pretrained"}      # the default suite
    for r in rows:
        for c in tables.COLUMNS:
            assert math.isfinite(r[c]), (r["condition"], c)
    table = open(os.path.join(adir, "results.md")).read()
    assert all(f"| {c} | 1337 |" in table for c in ablate.SUITES["core"])
    assert open(os.path.join(adir, "results_core.md")).read() == table      # the suite's own copy
    beta = [line for line in table.split("β over the run")[1].splitlines() if line.startswith("| ")][1:]
    assert [line.split(" | ")[0][2:] for line in beta] == ["adaptive", "band", "linear_decay", "est_k1", "est_k3",
                                                           "est_full_reward", "est_full_loss"]   # β moves in these
    with open(os.path.join(adir, "adaptive", "seed1337", "metrics.jsonl")) as f:
        last = [float(x) for x in beta[0].strip(" |").split(" | ")[1:]][-1]
        assert last == pytest.approx(json.loads(f.readlines()[-1])["objective/kl_coef"], abs=1e-4)
    examples = open(os.path.join(adir, "examples.md")).read()
    assert "## pretrained" in examples and "## no_kl" in examples
    no_kl = next(r for r in rows if r["condition"] == "no_kl")
    assert no_kl["kl_coef_final"] == 0.0
    actor = os.path.join(adir, "no_kl", "seed1337", "actor.pt")
    mtime = os.path.getmtime(actor)
    ablate.main(argv)                                                   # same config: every run reused
    assert store.load_json(os.path.join(adir, "results.jsonl"), lines=True) == rows
    assert os.path.getmtime(actor) == mtime
    twin = os.path.join(adir, "est_k3", "seed1337", "actor.pt")
    mtime = os.path.getmtime(twin)
    new = ["est_k1_reward", "est_k3_reward", "est_k2_loss", "est_seq_mean", "ref_sync", "ptx_no_kl", "adaptive_fast"]
    core = open(os.path.join(adir, "results_core.md")).read()
    ablate.main(argv + [f"--conditions={','.join(new)}"])              # SAME_AS twins reuse core's runs
    again = store.load_json(os.path.join(adir, "results.jsonl"), lines=True)
    assert [r["condition"] for r in again] == ["pretrained"] + new and os.path.getmtime(twin) == mtime
    assert open(os.path.join(adir, "results_core.md")).read() == core       # --conditions: no suite file
    assert not os.path.exists(os.path.join(adir, "est_k3_reward"))
    assert all(math.isfinite(r[c]) for r in again for c in tables.COLUMNS)
    k3 = next(r for r in rows if r["condition"] == "est_k3")
    assert {k: v for k, v in k3.items() if k != "condition"} == \
        {k: v for k, v in again[2].items() if k != "condition"}


def test_the_verifiable_suite_reports_best_of_k_and_what_the_critic_costs(run):
    """Gold-reward and critic-free conditions through ablate.py: best-of-k and pass@k for every k the evaluation
    holds (the pretrained row too), never worse with more tries; no critic bytes without a critic; and the
    paired differences against gold_adaptive."""
    argv = ["--preset=smoke", f"--out_dir={run}", "--ppo_iters=2", "--n_eval=16", "--bestofk_n=4",
            "--conditions=gold_adaptive,gold_grpo_no_kl", "--subdir=ablate_verifiable", "--jobs=1", "--seeds=2"]
    ablate.main(argv)
    adir = os.path.join(run, "ablate_verifiable")
    rows = {(r["condition"], r["seed"]): r for r in store.load_json(os.path.join(adir, "results.jsonl"), lines=True)}
    for r in rows.values():
        assert [r[f"pass_{k}"] for k in (1, 2, 4)] == sorted(r[f"pass_{k}"] for k in (1, 2, 4))   # more tries, more
        assert [r[f"best_{k}"] for k in (1, 2, 4)] == sorted(r[f"best_{k}"] for k in (1, 2, 4))   # passes, best higher
        assert "best_8" not in r                                               # n = 4 samples: k <= 4 only
        assert all(r[f"hard_{k}"] <= r[f"pass_{k}"] for k in (1, 2, 4))         # a higher bar, the same samples
        if r["condition"] != "pretrained":                                     # the run's own numbers, read back
            made = store.load_json(os.path.join(adir, r["condition"], f"seed{r['seed']}", "ppo.json"))["bestofk"]
            assert [r[f"hard_{k}"] for k in (1, 2, 4)] == made["pass_at_hard"]
    assert rows["gold_grpo_no_kl", 1337]["critic_mb"] == 0 < rows["gold_adaptive", 1337]["critic_mb"]
    assert not os.path.exists(os.path.join(adir, "gold_grpo_no_kl", "seed1337", "critic.pt"))
    table = open(os.path.join(adir, "results.md")).read()
    assert "| best_4 |" in table and "Paired differences against gold_adaptive" in table
    assert "| gold_grpo_no_kl | 2 |" in table and "Best of k" in table and "| hard@4 |" in table
    assert "| hard_4 |" in table and table.rstrip().splitlines()[-1].startswith("Made by `python ")
    pytest.importorskip("matplotlib")
    assert os.path.exists(os.path.join(adir, "bestofk.png"))


def test_a_suite_with_its_own_budget_has_its_own_folder():
    for argv, subdir in ((["--suite=overopt"], "ablate_overopt"), (["--suite=overopt", "--quick"], "ablate_overopt_quick"),
                         (["--suite=core"], "ablate"), (["--quick"], "ablate_quick"),
                         (["--suite=overopt", "--subdir=mine"], "mine")):
        assert ablate.parse(argv + ["--preset=smoke"])[0]["subdir"] == subdir, argv


def test_suites_name_known_conditions_and_all_is_their_union():
    """`all` is the union of the suites that run at the main budget; a suite with its own budget (SUITE_FLAGS:
    overopt) is not in it, and each of its BASES conditions names a base and flags that parse."""
    assert all(c in ablate.CONDITIONS for suite in ablate.SUITES.values() for c in suite)
    plain = [s for s in ablate.SUITES if s != "all" and s not in ablate.SUITE_FLAGS]
    assert set(ablate.SUITES["all"]) == set().union(*(ablate.SUITES[s] for s in plain))
    assert "overopt" in ablate.SUITE_FLAGS and not set(ablate.SUITES["overopt"]) <= set(ablate.SUITES["all"])
    for c, (name, flags) in ablate.BASES.items():                    # another base: overopt's or models'
        in_suite = c in ablate.SUITES["overopt"] or c in ablate.SUITES["models"]
        assert in_suite and name and train.parse(flags + ablate.CONDITIONS[c])
    for m in ablate.MODELS:                              # a model's run: the main one's config but the base's seed
        for c in ablate.MODEL_CONDITIONS:
            there = flat(train.parse(ablate.base_flags(f"{c}_{m}") + ablate.CONDITIONS[f"{c}_{m}"]))
            here = flat(train.parse(ablate.base_flags(c) + ablate.CONDITIONS[c]))
            assert {k for k in here if here[k] != there[k]} == {"seed"} and there["seed"] != here["seed"]
    assert set(ablate.MODEL_CONDITIONS) <= set(ablate.SUITES["models"]) and len(ablate.MODELS) == 2
    for c, twin in ablate.SAME_AS.items():                              # twins have the very same config
        assert flat(train.parse(ablate.CONDITIONS[c])) == flat(train.parse(ablate.CONDITIONS[twin])), c
    opts, rest = ablate.parse(["--suite=all", "--preset=smoke", "--n_layer=3"])   # every flag parses (shared_2: 3+)
    assert opts["conditions"].split(",") == ablate.SUITES["all"]


def test_bootstrap_interval_on_known_cases():
    mean, lo, hi = tables.bootstrap_ci([2.0, 2.0, 2.0])
    assert mean == lo == hi == 2.0
    rng = np.random.default_rng(5)
    x = rng.normal(1.0, 2.0, 400)
    mean, lo, hi = tables.bootstrap_ci(x)                              # the normal interval: mean ± 1.96 σ/√n
    half = 1.96 * x.std() / np.sqrt(len(x))
    assert lo == pytest.approx(mean - half, abs=0.03) and hi == pytest.approx(mean + half, abs=0.03)
    assert tables.bootstrap_ci(x) == (mean, lo, hi)                     # a fixed seed: the same table every time
    m, lo3, hi3 = tables.bootstrap_ci([1.0, 2.0, 6.0])
    assert (m, lo3, hi3) == (3.0, 1.0, 6.0)         # 3 seeds: each extreme resample has mass 1/27 > 2.5 %: [min, max]


def test_paired_differences_read_as_one_family_of_three_verdicts():
    """summarise: each condition minus the baseline seed by seed (an unpaired seed left out), each column's
    comparisons one Holm family, each cell its mean, 95 % t interval and verdict, as
    tables.family_cells gives them against the margins stated (gold 0.25, KL a fifth of the baseline's)."""
    rows = [dict(condition=c, seed=s, gold_mean=g, kl=k) for c, s, g, k in
            [("adaptive", 1, 0.0, 5.0), ("adaptive", 2, 1.0, 5.0), ("adaptive", 3, 2.0, 5.0),
             ("a", 1, 0.5, 9.0), ("a", 2, 1.5, 9.1), ("a", 3, 2.5, 9.2),              # +0.5 every seed: different
             ("b", 1, 1.0, 5.0), ("b", 2, 0.0, 5.2), ("b", 3, 2.0, 4.8), ("b", 4, 9.0, 1.0),   # +1, -1, 0: undecided
             ("c", 1, 0.01, 5.01), ("c", 2, 1.0, 4.99), ("c", 3, 1.99, 5.0),    # within ±0.01: equivalent
             ("d", 1, 0.3, 5.0), ("d", 2, 1.5, 5.0), ("d", 3, 2.4, 5.0)]]   # p 0.02 alone, not in a family of 4
    md = tables.summarise(rows, ["adaptive", "a", "b", "c", "d"], paired=("gold_mean", "kl"), columns=["gold_mean", "kl"])
    stats = [tables.paired_stats(tables.paired_diffs(rows, c, "adaptive", col)) for c in "abcd"
             for col in ("gold_mean", "kl")]
    # Each column's four comparisons are one family.
    gold, kl = tables.family_cells(stats[0::2], [0.25] * 4), tables.family_cells(stats[1::2], [1.0] * 4)
    cells = [c for pair in zip(gold, kl) for c in pair]
    for k, c in enumerate("abcd"):
        assert f"| {c} | 3 | {cells[2 * k]} | {cells[2 * k + 1]} |" in md
    assert cells[0].endswith("different") and cells[2].endswith("undecided") and cells[4].endswith("equivalent")
    assert cells[6].endswith("undecided") and tables.family_cells(stats[6:7], [0.25])[0].endswith("different")
    assert "each column's 4 comparisons one family (Holm)" in md and "gold_mean ±0.25, kl ±1" in md
    assert tables.paired_diffs(rows, "b", "adaptive", "gold_mean") == [1.0, -1.0, 0.0]       # seed 4 unpaired
    # The seeds the table's spread asks for: the median of its comparisons' SDs of Δ gold.
    sds = [float(np.std(tables.paired_diffs(rows, c, "adaptive", "gold_mean"), ddof=1)) for c in "abcd"]
    assert tables.spread_line(sds, 0.25, "3") in md and "(this table: n = 3)" in md
    # The baseline under another name (a SAME_AS twin, est_k1 = adaptive) is no comparison: its row says
    # so, and neither the families nor the spread line count it.
    twin = rows + [dict(r, condition="e") for r in rows if r["condition"] == "adaptive"]
    md2 = tables.summarise(twin, ["adaptive", "a", "b", "e", "c", "d"], paired=("gold_mean", "kl"),
                           columns=["gold_mean", "kl"], same=["e"])
    assert "| e | 3 | the same runs as adaptive | — |" in md2
    assert md2.split("Paired differences")[1].replace("| e | 3 | the same runs as adaptive | — |\n", "") == \
        md.split("Paired differences")[1]
    # A suite without the baseline is compared with its first condition, which may be the twin itself
    # (the estimators suite: est_k1_reward, adaptive's twin): then there is no twin row.
    first = tables.summarise(twin, ["e", "a", "b", "c", "d"], paired=("gold_mean", "kl"), columns=["gold_mean", "kl"],
                             same=["e"])
    assert "against e (same seeds)" in first and "the same runs" not in first


def test_the_baseline_s_twins_are_the_conditions_that_run_in_its_folder():
    order = ["pretrained", "adaptive", "est_k1", "no_kl", "est_k1_reward", "ref_full", "est_k3_reward", "est_k3"]
    assert ablate.twins_of("adaptive", order) == ["est_k1", "est_k1_reward", "ref_full"]
    assert ablate.twins_of("est_k1", order) == ["adaptive", "est_k1_reward", "ref_full"]
    assert ablate.twins_of("gold_adaptive", order + ["gold_adaptive"]) == []


@pytest.mark.parametrize("sd, half", [(0.175, 0.125), (0.1, 0.125), (1.0, 0.1), (0.01, 0.125)])
def test_the_seeds_a_spread_asks_for_are_the_fewest_whose_half_width_is_within_half_the_margin(sd, half):
    """tables.seeds_for against the half-width written out: at n it is at most `half`, at n - 1 it is not."""
    def half_width(n):
        return tables.t_quantile(0.975, n - 1) * sd / math.sqrt(n)
    n = tables.seeds_for(sd, half)
    assert half_width(n) <= half and (n == 2 or half_width(n - 1) > half)
    assert tables.seeds_for(5.0, 0.01) is None                                      # past 1,000 seeds
    assert tables.seeds_for(0.0, 0.125) == 2


def test_the_models_table_takes_each_models_mean_as_the_unit():
    """Each model's paired difference against adaptive, then over the models: the numbers by hand."""
    gold = {("adaptive", "main"): [1.0, 2.0], ("no_kl", "main"): [-1.0, 0.0],       # -2, -2: mean -2
            ("adaptive", "model2"): [2.0, 2.0], ("no_kl", "model2"): [1.0, 2.0],    # -1, 0: mean -0.5
            ("pretrained", "main"): [0.5], ("pretrained", "model2"): [0.25]}
    rows = [dict(condition=c if m == "main" else f"{c}_{m}", seed=1337 + i, gold_mean=g, kl=2.0 * g,
                 wellformed_rate=0.5) for (c, m), gs in gold.items() for i, g in enumerate(gs)]
    md = tables.models_table(rows, ["no_kl", "adaptive"], ["main", "model2", "model3"])   # model3 never ran
    line = next(x for x in md.splitlines() if x.startswith("| no_kl |"))
    # Over 2 models: mean -1.25, s = 1.5/√2, t(0.975, 1) = 12.7062: half = 12.7062 · 0.75 = 9.5297.
    assert "| 2 / 2 | -0.50 / +1.50 | -1.0 / 3.0 | 0.50 / 0.50 | -2.00 / -0.50 |" in line
    assert "-1.250 [-10.780, +8.280] undecided" in line
    # Between the models' means: s = 1.0607; seeds alone: (0/√2 + 0.7071/√2) / 2 = 0.25.
    assert line.endswith("| 1.06 / 0.25 |")
    assert md.count("| pretrained | 1 / 1 | +0.50 / +0.25 |") == 1 and "(main, model2;" in md
    assert tables.models_table(rows, ["no_kl"], ["main"]) == ""            # one model: no such table
    for r in rows:                                                         # a column only some rows have
        if r["condition"] == "no_kl_model2":
            r["acc"] = 0.25 + (r["seed"] - 1337) / 2
    md = tables.models_table(rows, ["no_kl"], ["main", "model2"], extra=(("acc", ".3f", "accuracy"),))
    assert "| well-formed | accuracy | Δ gold per model |" in md
    assert "| 0.50 / 0.50 | - / 0.500 | -2.00 / -0.50 |" in md


def test_the_models_suite_runs_each_condition_on_another_pretrained_model(tiny_run):
    """Through ablate.py on the tiny smoke run: no_kl and adaptive on the main model and on model2 (its own base,
    reseeded), each model's pretrained model scored, and the models table beside the main table."""
    run = tiny_run
    ablate.main([*TINY, f"--out_dir={run}", "--ppo_iters=1", "--rollout_batch=8", "--n_eval=8",
                 "--bestofk_n=4", "--jobs=1", "--seeds=2", "--subdir=models_t",
                 "--conditions=no_kl,adaptive,no_kl_model2,adaptive_model2"])
    adir = os.path.join(run, "models_t")
    base2 = os.path.join(adir, "bases", "model2")
    assert records_of(base2)["pretrain"]["config"]["seed"] == 4242              # world and pretraining reseeded
    rows = store.load_json(os.path.join(adir, "results.jsonl"), lines=True)
    assert {(r["condition"], r["seed"]) for r in rows} >= {("adaptive_model2", 1338), ("no_kl", 1337),
                                                           ("pretrained_model2", 1337)}
    made = store.load_json(os.path.join(adir, "adaptive_model2", "seed1337", "run.json"))
    assert made["inputs"]["pretrain.pt"] == records_of(base2)["pretrain"]["outputs"]["pretrain.pt"]
    assert made["inputs"]["pretrain.pt"] != records_of(run)["pretrain"]["outputs"]["pretrain.pt"]
    md = open(os.path.join(adir, "results.md")).read()
    assert "The same conditions on 2 pretrained models (main, model2;" in md
    assert re.search(r"\| no_kl \| 2 / 2 \| \S+ / \S+ \|", md) and "| pretrained | 1 / 1 |" in md
    assert "| no_kl_model2 |" not in md.split("The same conditions")[0]        # the main table: the main model


def records_of(folder):
    return store.load_json(os.path.join(folder, "stages.json"))


def test_the_cheap_reference_table(run):
    """The reference table (in results.md; a suite's also in results_ref.md): one row per condition, from the runs'
    ppo.json (bytes, step-0 KL, KL to the full and to the run's own reference, rollbacks)."""
    ablate.main(["--preset=smoke", "--plots=false", f"--out_dir={run}", "--quick", "--ppo_iters=2", "--n_eval=8", "--jobs=1",
                 "--conditions=ref_int8,rollback", "--subdir=ablate_ref"])
    adir = os.path.join(run, "ablate_ref")
    rows = {r["condition"]: r for r in store.load_json(os.path.join(adir, "results.jsonl"), lines=True)}
    assert rows["ref_int8"]["ref"]["kind"] == "int8" and rows["ref_int8"]["ref"]["kl_step0"] > 0
    assert rows["rollback"]["ref"]["bytes"] > rows["ref_int8"]["ref"]["bytes"] > 0
    assert not os.path.exists(os.path.join(adir, "results_ref.md"))     # a suite's table, not a --conditions one
    lines = open(os.path.join(adir, "results.md")).read().splitlines()
    row = next(line for line in lines if line.startswith("| `ref_int8` |")).split(" | ")
    assert float(row[1].split()[0]) == pytest.approx(rows["ref_int8"]["ref"]["bytes"] / 1e6, abs=0.01)
    assert any(line.startswith("| `rollback` |") for line in lines)


@pytest.mark.parametrize("argv, message", [(["--conditions=no_kl,magic"], "unknown condition"),
                                           (["--suite=huge"], "bad value for --suite"),
                                           (["--conditions=no_kl,no_kl"], "twice"), (["--seeds=0"], ">= 1"),
                                           (["--seeds=x"], "bad value"), (["--ppo_iters=0"], "--ppo_iters"),
                                           (["--suite=nope"], "bad value for --suite"),
                                           (["--check"], "goes with --tables_only"),
                                           (["--make_pretrained"], "goes with --tables_only"),
                                           (["--tables_only", "--check=maybe"], "bad value for --check"),
                                           (["--suite=controls", "--length_penalty=-1"], "--length_penalty")])
def test_bad_options_are_a_clear_error(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        ablate.main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and message in err and err.count("\n") == 1


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads /proc to find the workers")
def test_ctrl_c_stops_every_worker(run):
    """Ctrl-C once both workers are inside a PPO run that cannot end first (100000 iterations), not after a sleep
    (under load they may not have started yet): one line on stderr, exit 130, the workers gone when the parent is
    (it joins them), then nothing of the process group left."""
    adir = os.path.join(run, "ablate_int")
    p = subprocess.Popen([sys.executable, "-m", "lab.ablate", "--preset=smoke", "--plots=false", f"--out_dir={run}", "--subdir=ablate_int",
                          "--conditions=no_kl,fixed_0.5", "--ppo_iters=100000", "--jobs=2"], cwd=ROOT,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))   # as from a terminal
    try:
        for line in p.stdout:
            if line.startswith("ablate:"):
                break
        runs = lambda: [s for c in os.listdir(adir) for s in os.listdir(os.path.join(adir, c))] \
            if os.path.isdir(adir) else []
        until(lambda: len(runs()) == 2, p)                             # 4 runs, 2 workers: each is inside one
        workers = [pid for pid, (_, ppid, _, cmd) in processes().items() if ppid == p.pid and "spawn_main" in cmd]
        assert len(workers) == 2 and all(ignores_sigint(w) for w in workers)   # Ctrl-C is the parent's to handle
        os.killpg(p.pid, signal.SIGINT)                                # what a terminal's Ctrl-C does
        rc = p.wait(timeout=120)
        assert [w for w in workers if w in alive_in_group(p.pid)] == []    # reaped by the parent before it exited
        assert rc == 130
        err = p.stderr.read()
        assert err.startswith("error: interrupted") and err.count("\n") == 1, err
        until(lambda: alive_in_group(p.pid) == [])                     # the rest (multiprocessing's tracker) too
    finally:
        try:
            os.killpg(p.pid, signal.SIGKILL)                           # a failed test leaves no process behind
        except ProcessLookupError:
            pass


def until(condition, p=None, limit=300):
    """Wait for `condition`, polling; the limit only turns a hang into a failure (no test waits for it to pass)."""
    deadline = time.monotonic() + limit
    while not condition():
        assert time.monotonic() < deadline and (p is None or p.poll() is None), "waited too long"
        time.sleep(0.05)


def ignores_sigint(pid):
    """From the kernel's mask of ignored signals: under load a SIGTERM may kill a worker before its traceback."""
    with open(f"/proc/{pid}/status") as f:
        mask = next(line for line in f if line.startswith("SigIgn:")).split()[1]
    return bool(int(mask, 16) >> (signal.SIGINT - 1) & 1)


def processes():
    """pid -> (state, parent pid, process group, command line), for every process in /proc."""
    out = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        out[int(pid)] = (fields[0], int(fields[1]), int(fields[2]), cmd)
    return out


def alive_in_group(pgid):
    """Processes of a process group that still run (zombies, dead but not yet reaped, do not count)."""
    return [pid for pid, (state, _, group, _) in processes().items() if group == pgid and state != "Z"]


def gone(pid):
    """True when pid has exited (a zombie, dead but not yet reaped, counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def files_in(folder):
    """{path: (size, mtime)} of every file under folder."""
    return {os.path.join(d, n): (os.path.getsize(os.path.join(d, n)), os.path.getmtime(os.path.join(d, n)))
            for d, _, names in os.walk(folder) for n in names}


def same_numbers(a, b):
    """Rows of results.jsonl, wall-clock times (seconds, seconds per iteration) left out."""
    drop = lambda r: {k: ({**v, "seconds_per_iter": 0} if k == "ref" and v else v) for k, v in r.items()
                      if k not in ("seconds", "s_per_iter")}
    return [drop(r) for r in a] == [drop(r) for r in b]


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads /proc to find the workers")
def test_a_kill_9_of_ablate_stops_its_workers_and_the_rerun_ends_as_a_clean_run(run):
    flags = ["--preset=smoke", "--plots=false", f"--out_dir={run}", "--conditions=no_kl,fixed_0.5", "--seeds=1", "--ppo_iters=2",
             "--n_eval=8", "--jobs=2"]
    p = subprocess.Popen([sys.executable, "-m", "lab.ablate", *flags, "--subdir=ablate_kill"], cwd=ROOT,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    adir = os.path.join(run, "ablate_kill")
    runs = [os.path.join(adir, c, "seed1337") for c in ("no_kl", "fixed_0.5")]
    deadline = time.time() + 300
    while not any(os.path.exists(os.path.join(d, "metrics.jsonl")) for d in runs):    # a worker is inside a run
        assert p.poll() is None and time.time() < deadline
        time.sleep(0.02)
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    t = time.time()
    while alive_in_group(p.pid) and time.time() < t + 3:
        time.sleep(0.05)
    assert alive_in_group(p.pid) == []                                 # the workers died with their parent
    before = files_in(adir)
    time.sleep(1)
    assert files_in(adir) == before                                    # and nothing was written after the kill
    assert not {"actor.pt", "critic.pt", "run.json"} & {os.path.basename(f) for f in before}
    # The reruns in this process (one torch thread here, as each worker had: the same runs).
    here = [f for f in flags if f != "--jobs=2"] + ["--jobs=1"]
    ablate.main(here + ["--subdir=ablate_kill"])                       # the killed runs are done again
    ablate.main(here + ["--subdir=ablate_kill_clean"])                 # the same runs, never interrupted
    rows, clean = (store.load_json(os.path.join(run, s, "results.jsonl"), lines=True)
                   for s in ("ablate_kill", "ablate_kill_clean"))
    assert same_numbers(rows, clean) and len(rows) == 3


WORKER = """import os, sys, time
from machinery import store
store.stop_writing_if_orphaned(int(sys.argv[1]))        # as ablate's workers do; no prctl here
store.write_text(sys.argv[2] + "/ready", "")           # the parent is alive: writes go through
while not os.path.exists(sys.argv[2] + "/go"):
    time.sleep(0.01)
store.write_text(sys.argv[2] + "/late", "")             # the parent is gone: this must never be written
"""


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads /proc")
def test_a_worker_whose_parent_is_gone_writes_nothing_more(tmp_path):
    """The portable half: without the kernel's help (no prctl), the next write of an orphaned worker ends it."""
    middle = subprocess.Popen([sys.executable, "-c", "import os, subprocess, sys, time; subprocess.Popen([sys.executable,"
                               f" '-c', {WORKER!r}, str(os.getpid()), {str(tmp_path)!r}], cwd={ROOT!r}); "
                               "time.sleep(120)"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                              start_new_session=True)
    deadline = time.time() + 120
    while not (tmp_path / "ready").exists():
        assert time.time() < deadline
        time.sleep(0.02)
    worker = alive_in_group(middle.pid)
    os.kill(middle.pid, signal.SIGKILL); middle.wait()
    (tmp_path / "go").write_text("")
    t = time.time()
    while not all(gone(w) for w in worker) and time.time() < t + 10:
        time.sleep(0.02)
    assert all(gone(w) for w in worker) and not (tmp_path / "late").exists()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_worker_dies_with_its_parent_even_between_writes(tmp_path):
    """The Linux half: ablate's pool initializer asks the kernel to kill a worker when its parent dies, so a worker
    busy in a long computation (no write to check at) stops at once too."""
    parent = subprocess.Popen([sys.executable, "-c", "import multiprocessing, os, time\nfrom lab import ablate\n"
                               "if __name__ == '__main__':\n"
                               "    pool = multiprocessing.get_context('spawn').Pool(1, ablate._worker_init, (os.getpid(),))\n"
                               "    print(pool.apply(os.getpid), flush=True)\n"      # the worker is set up
                               "    pool.apply_async(time.sleep, (120,)); time.sleep(120)"],
                              cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                              start_new_session=True)
    worker = int(parent.stdout.readline())
    assert not gone(worker)
    os.kill(parent.pid, signal.SIGKILL); parent.wait()
    t = time.time()
    while not gone(worker) and time.time() < t + 3:
        time.sleep(0.02)
    assert gone(worker)


def test_a_damaged_run_is_done_again_alone_and_fresh_never_touches_the_main_run(run):
    argv = ["--preset=smoke", f"--out_dir={run}", "--conditions=no_kl,fixed_0.5", "--seeds=1", "--ppo_iters=2",
            "--n_eval=8", "--jobs=1", "--subdir=ablate_state", "--plots=false"]
    adir = os.path.join(run, "ablate_state")
    ablate.main(argv)
    rows = store.load_json(os.path.join(adir, "results.jsonl"), lines=True)
    d = {c: os.path.join(adir, c, "seed1337") for c in ("no_kl", "fixed_0.5")}
    done = lambda c: os.path.getmtime(os.path.join(d[c], "ppo.json"))
    first = done("no_kl")
    with open(os.path.join(d["no_kl"], "metrics.jsonl"), "a") as f:
        f.write('{"iter": ')                                           # a torn line (today: a JSON traceback)
    os.remove(os.path.join(d["fixed_0.5"], ablate.RECORD))             # a run finished before records existed
    kept = files_in(d["fixed_0.5"])
    ablate.main(argv)
    assert same_numbers(store.load_json(os.path.join(adir, "results.jsonl"), lines=True), rows)
    assert done("no_kl") > first                                       # the damaged run, again
    assert {f: v for f, v in files_in(d["fixed_0.5"]).items() if not f.endswith(ablate.RECORD)} == kept   # reused
    stamp = store.load_json(os.path.join(d["fixed_0.5"], "ppo.json"))["stamp"]
    assert ablate.finished(d["fixed_0.5"], stamp)                      # its record was written from its files
    for name in ("actor.pt", "critic.pt"):                             # critic.pt: ablate itself never reads it
        with open(os.path.join(d["fixed_0.5"], name), "r+b") as f:
            head = f.read(4); f.seek(0); f.write(b"junk")
        assert not ablate.finished(d["fixed_0.5"], stamp)              # its hash no longer matches the record
        os.rename(os.path.join(d["fixed_0.5"], ablate.RECORD), os.path.join(d["fixed_0.5"], "kept.json"))
        assert not ablate.finished(d["fixed_0.5"], stamp)              # no record: it is loaded, and refused
        os.rename(os.path.join(d["fixed_0.5"], "kept.json"), os.path.join(d["fixed_0.5"], ablate.RECORD))
        with open(os.path.join(d["fixed_0.5"], name), "r+b") as f:
            f.write(head)
    assert ablate.finished(d["fixed_0.5"], stamp)
    with open(os.path.join(d["fixed_0.5"], "actor.pt"), "r+b") as f:
        f.write(b"junk")                                               # today: "cannot load ..., (--fresh)"
    main = ["actor.pt", "critic.pt", "metrics.jsonl", "ppo.json", "report.md", "stages.json", "pretrain.pt"]
    hashes = {n: store.file_hash(os.path.join(run, n)) for n in main}
    first = {c: done(c) for c in d}
    ablate.main(argv[:2] + ["--conditions=fixed_0.5"] + argv[3:] + ["--fresh"])   # this command's run, from scratch
    assert {n: store.file_hash(os.path.join(run, n)) for n in main} == hashes     # the main run untouched
    assert done("fixed_0.5") > first["fixed_0.5"] and done("no_kl") == first["no_kl"]
    assert same_numbers(store.load_json(os.path.join(adir, "results.jsonl"), lines=True), rows[:1] + rows[2:])


def test_a_main_run_made_otherwise_is_train_pys_to_redo(run, capsys):
    """The main run's stages belong to train.py: ablate.py says so, since its own --fresh redoes only its runs."""
    with pytest.raises(SystemExit) as e:
        ablate.main(["--preset=smoke", f"--out_dir={run}", "--n_pairs=100", "--conditions=no_kl", "--seeds=1"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1
    assert "n_pairs" in err and f"python train.py --out_dir={run}" in err and "only its own runs" in err



@pytest.mark.parametrize("argv, message", [
    (["--seed=2147483646", "--seeds=3"], "--seed=2147483646 with --seeds=3"),
    (["--seeds=2147483647"], "--seed=1337 with --seeds=2147483647"),
    (["--seeds=2", "--seeds=3"], "--seeds is given twice"),
    (["--quick", "--quick=false"], "--quick is given twice"),
    (["--quick=bogus"], "bad value for --quick"), (["--quick=yes"], "bad value for --quick")])
def test_bad_own_flags_are_refused_before_any_work(argv, message, tmp_path, capsys):
    """Every run's seed (the base seed + k, k < --seeds) in [0, 2^31), a boolean of true, false, 1
    or 0, each flag once: checked by parse, before anything is built."""
    with pytest.raises(SystemExit) as e:
        ablate.parse(["--preset=smoke", f"--out_dir={tmp_path / 'out'}"] + argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and message in err and err.count("\n") == 1, err
    assert not (tmp_path / "out").exists()


def test_a_boolean_flag_takes_true_false_1_or_0():
    cases = [("", True), ("=true", True), ("=1", True), ("=False", False), ("=0", False)]
    for value, quick in cases:
        assert ablate.parse(["--preset=smoke", f"--quick{value}"])[0]["quick"] is quick


def test_every_run_gives_train_parse_each_flag_once(run, monkeypatch):
    """--quick's budget, a condition's KL flags and each run's seed and folder replace the user's
    flags of the same name, never repeat them: train.py takes each flag once."""
    parse, parsed = train.parse, []

    def once(argv):
        names = [a.partition("=")[0] for a in argv]
        assert len(set(names)) == len(names), argv
        parsed.append(argv)
        return parse(argv)

    # No baseline row, and the first run stops as soon as its flags are parsed (--jobs=1: here).
    def stop(*a, **k):
        raise KeyboardInterrupt

    def no_row(*a):
        return {}
    monkeypatch.setattr(train, "parse", once)
    monkeypatch.setattr(stages, "run_ppo", stop)
    monkeypatch.setattr(ablate, "baseline_row", no_row)
    with pytest.raises(SystemExit):
        ablate.main(["--preset=smoke", "--plots=false", f"--out_dir={run}", "--quick", "--ppo_iters=1", "--n_eval=8",
                     "--init_kl_coef=0.3", "--stage=ppo", "--conditions=no_kl", "--jobs=1",
                     "--subdir=ablate_once"])
    last = parsed[-1]
    assert "--seed=1337" in last and f"--out_dir={run}" in last and "--init_kl_coef=0" in last


FAILING = """import sys
from lab import ablate
from pipeline import stages


class Odd(Exception):
    '''An exception pickle cannot rebuild: its __init__ wants two arguments, its args hold one.'''

    def __init__(self, a, b):
        super().__init__(a)


def fails(*a, **k):
    {body}


# At the top of the file: the spawned workers run it too, before their first job.
stages.run_ppo = fails
if __name__ == "__main__":
    ablate.main(sys.argv[1:])
"""


@pytest.mark.parametrize("body", ["sys.exit(2)", "raise Odd('odd', 1)"])
def test_a_worker_that_fails_ends_ablate_with_one_line(body, run, tmp_path):
    """A SystemExit in a worker (errors.die's) ended the worker unseen by the pool, and an exception
    pickle cannot rebuild ended the pool's result thread: either way ablate waited for ever."""
    script = tmp_path / "failing.py"
    script.write_text(FAILING.replace("{body}", body))
    flags = ["--preset=smoke", "--plots=false", f"--out_dir={run}", "--quick", "--ppo_iters=1", "--n_eval=8",
             "--conditions=no_kl,fixed_0.5", "--jobs=2", "--subdir=ablate_fails"]
    p = subprocess.Popen([sys.executable, str(script), *flags], cwd=ROOT,
                         env=dict(os.environ, PYTHONPATH=ROOT), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 1 and err.count("\n") == 1 and err.startswith("error: run "), err
        assert "no_kl seed 1337" in err or "fixed_0.5 seed 1337" in err
    finally:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_the_overopt_suite_without_evaluations_is_refused_before_any_work(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        ablate.main(["--suite=overopt", "--eval_every=0", "--preset=smoke", f"--out_dir={tmp_path}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1 and "--eval_every=0" in err[0] and not os.listdir(tmp_path)


def test_a_kept_run_stands_in_for_a_run_a_fresh_checkout_lacks(run, tmp_path, monkeypatch, capsys):
    """A finished run's ppo.json, metrics.jsonl and record are kept (lab/runs; here --kept): with the
    run folders gone, as in a fresh checkout, the same command reuses them, runs nothing and says so
    under the tables; a kept file changed, a kept run made by other code or under another config is
    done again, and kept."""
    kept = tmp_path / "kept"
    conds = ("no_kl", "fixed_0.5", "adaptive")
    argv = ["--preset=smoke", "--plots=false", f"--out_dir={run}", "--quick", "--ppo_iters=2", "--n_eval=8",
            "--jobs=1", f"--conditions={','.join(conds)}", "--subdir=ablate_kept", f"--kept={kept}"]
    ablate.main(argv)
    adir = os.path.join(run, "ablate_kept")
    rows = store.load_json(os.path.join(adir, "results.jsonl"), lines=True)
    assert not any(r["kept"] for r in rows[1:])                         # all made by this command
    ablate.main(argv)
    # Run again, the runs are reused from their folders: the table names what made them.
    reused = store.load_json(os.path.join(adir, "results.jsonl"), lines=True)
    assert all(r["kept"] and not r["restored"] for r in reused[1:])
    assert ("3 of the 3 runs were made by earlier commands and kept (reused from their run "
            "folders); they were made on ") in open(os.path.join(adir, "results.md")).read()

    elsewhere = "0" * 16                                                # another CPU's pretrained model

    def kept_file(cond, name):
        # This CPU's run, kept under its inputs' digest (beside another CPU's, made below).
        seed_dir = kept / "ablate_kept" / cond / "seed1337"
        [key] = [k for k in os.listdir(seed_dir)
                 if json.load(open(seed_dir / k / "run.json"))["inputs"]["pretrain.pt"] != elsewhere]
        return seed_dir / key / name
    assert sorted(os.listdir(kept_file("no_kl", ""))) == ["metrics.jsonl", "ppo.json", "run.json"]  # no weights
    # Another CPU's run of no_kl: the same config and code, other base models (its inputs' hashes).
    rec = json.load(open(kept_file("no_kl", "run.json")))
    rec["inputs"]["pretrain.pt"] = elsewhere
    seed_dir = kept / "ablate_kept" / "no_kl" / "seed1337"
    other = seed_dir / os.path.basename(ablate.kept_folder(str(seed_dir), rec))
    shutil.copytree(kept_file("no_kl", ""), other)
    # Its own numbers (another base scores otherwise): a table that mixed it in would show them.
    summary = json.load(open(other / "ppo.json"))
    summary["final"]["gold_mean"] += 5.0
    store.save_json(str(other / "ppo.json"), summary)
    rec["outputs"]["ppo.json"] = store.file_hash(str(other / "ppo.json"))
    store.save_json(str(other / "run.json"), rec)
    theirs = files_in(str(other))
    made = json.load(open(kept_file("no_kl", "run.json")))["made_on"]      # what made it, with the record
    assert made["cpu"] == provenance.cpu_model() and made["seconds"] == round(rows[1]["seconds"], 1)

    def again():
        shutil.rmtree(adir)                                             # a fresh checkout: no run folders
        ablate.main(argv)
        return store.load_json(os.path.join(adir, "results.jsonl"), lines=True)

    def actors():
        return {c for c in conds if os.path.exists(os.path.join(adir, c, "seed1337", "actor.pt"))}

    def without_kept(rs):
        return [{k: v for k, v in r.items() if k not in ("kept", "restored")} for r in rs]
    restored = again()
    assert actors() == set() and all(r["kept"] for r in restored[1:])    # nothing ran
    assert without_kept(restored) == without_kept(rows)
    table = open(os.path.join(adir, "results.md")).read()
    assert ("3 of the 3 runs were made by earlier commands and kept (all restored from the kept runs "
            "rather than run); they were made on ") in table
    assert "(a kept run: its weights were not kept)" in open(os.path.join(adir, "examples.md")).read()
    # From the kept runs alone, into a folder without any base (as on a CPU that builds another): the same
    # tables (the other CPU's run of no_kl is not mixed in: one base for the table), the figures also where the
    # documents show them.
    bare = tmp_path / "bare"
    bare.mkdir()
    monkeypatch.setattr(ablate, "FIGURES", str(tmp_path / "figures"))
    only = [a for a in argv if not a.startswith("--out_dir=")] + [f"--out_dir={bare}", "--tables_only"]
    # The figures drawn (the runs above drew none).
    drawn = [a for a in only if a != "--plots=false"]
    ablate.main(drawn)
    assert open(bare / "ablate_kept" / "results.md").read().split("\nMade by")[0] == table.split("\nMade by")[0]
    assert sorted(os.listdir(bare)) == ["ablate_kept"]
    assert not (tmp_path / "figures").exists()                         # a few conditions: not published
    # The suite named (its conditions these three): its figures are published where the documents show them.
    monkeypatch.setitem(ablate.SUITES, "core", list(conds))
    ablate.main([a for a in drawn if not a.startswith("--conditions=")])
    assert (tmp_path / "figures" / "ablate_kept_core_scores.png").stat().st_size > 0
    # --check: the tables an answer quotes, against the same command's tables from the archive; one cell
    # changed in the answer is named (file, table, row, column) and the command exits 1.
    from lab import check
    docs = tmp_path / "docs"
    (docs / "answers").mkdir(parents=True)
    (docs / "ANSWER.md").write_text("# index\n")
    quoted = table.split("\nMade by")[0]
    (docs / "answers" / "a.md").write_text("Some prose.\n\n" + quoted)

    def in_process(command, out_dir, kept_dir):
        try:
            ablate.main(check.argv_of(command, out_dir, kept_dir)[1:])
        except SystemExit as e:
            return f"exit {e.code}"
        return None
    monkeypatch.setattr(check, "ROOT", str(docs))
    monkeypatch.setattr(check, "as_a_user", in_process)
    monkeypatch.setattr(check, "COMMANDS", [["lab.ablate", *(a for a in argv if not a.startswith(
        ("--out_dir=", "--kept=")))]])
    ablate.main(only + ["--check"])
    assert "0 differences" in capsys.readouterr().out
    row = next(line for line in quoted.splitlines() if line.startswith("| fixed_0.5 |"))
    head = next(h for _, h, rows in check.tables(quoted) if check.cells(row) in rows)
    first = row.split(" | ")[2]
    (docs / "answers" / "a.md").write_text(quoted.replace(row, row.replace(first, first + "1", 1)))
    with pytest.raises(SystemExit) as e:
        ablate.main(only + ["--check"])
    out = capsys.readouterr().out
    assert e.value.code == 1 and "answers/a.md, the table at line" in out
    assert f"row 'fixed_0.5', column '{head[2]}': the text has '{first}1'" in out
    path = kept_file("no_kl", "metrics.jsonl")
    with open(path, "a") as f:
        f.write(" ")                                                    # a kept file changed: redone
    rec = json.load(open(kept_file("fixed_0.5", "run.json")))
    rec["code"][next(iter(rec["code"]))] = "0" * 16                      # made by other code: redone
    store.save_json(str(kept_file("fixed_0.5", "run.json")), rec)
    rec = json.load(open(kept_file("adaptive", "run.json")))
    rec["config"]["ppo_lr"] = 1e-5                                      # another config: redone
    store.save_json(str(kept_file("adaptive", "run.json")), rec)
    redone = again()
    assert actors() == set(conds) and not any(r["kept"] for r in redone[1:])
    assert "made by earlier commands" not in open(os.path.join(adir, "results.md")).read()
    assert [(r["gold_mean"], r["kl"]) for r in redone] == [(r["gold_mean"], r["kl"]) for r in rows]
    assert all(r["kept"] for r in again()[1:])                          # kept again, as they were redone
    assert actors() == set()
    assert kept_file("no_kl", "metrics.jsonl") == path                  # in the same place, over the stale one
    assert files_in(str(other)) == theirs                               # and never over another CPU's
    # The pretrained model's evaluations gone from the archive: --make_pretrained makes them again on a machine
    # that has the base (here the smoke run's), keeps them, and the tables are the same.
    shutil.rmtree(kept / "ablate_kept" / "pretrained")
    here = [a for a in only if not a.startswith("--out_dir=")] + [f"--out_dir={run}", "--make_pretrained"]
    ablate.main(here)
    assert (kept / "ablate_kept" / "pretrained").is_dir()
    # The pretrained row as before (the runs' rows moved: they were redone above, with their own times).
    made_again = open(os.path.join(adir, "results.md")).read()
    before = [line for line in table.splitlines() if line.startswith("| pretrained |")]
    assert before and [line for line in made_again.splitlines() if line.startswith("| pretrained |")] == before
    # What the archive lacks is named in one line, and nothing is written.
    shutil.rmtree(kept_file("adaptive", ""))
    shutil.rmtree(kept / "ablate_kept" / "pretrained")
    os.remove(bare / "ablate_kept" / "results.md")
    with pytest.raises(SystemExit) as e:
        ablate.main(only)
    err = capsys.readouterr().err
    assert e.value.code != 0 and len(err.strip().splitlines()) == 1
    assert "lacks adaptive/seed1337, pretrained (the pretrained model's row) (of 3 runs" in err
    assert not os.path.exists(bare / "ablate_kept" / "results.md")


def test_runs_are_kept_only_for_the_main_run_folder_unless_kept_says_where(tmp_path, capsys):
    assert ablate.parse(["--preset=smoke"])[0]["kept"] == ablate.KEPT_DIR
    assert ablate.parse(["--preset=smoke", f"--out_dir={tmp_path}"])[0]["kept"] == ""
    assert ablate.parse(["--preset=smoke", "--kept="])[0]["kept"] == ""
    (tmp_path / "file").write_text("")
    with pytest.raises(SystemExit) as e:
        ablate.parse(["--preset=smoke", f"--out_dir={tmp_path / 'out'}", f"--kept={tmp_path / 'file'}"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "--kept=" in err and "is a file" in err and err.count("\n") == 1
    # dpo_suite takes --kept the same way.
    from lab import dpo_suite
    smoke = ["--preset=smoke", "--eval_every=1"]
    assert dpo_suite.parse(smoke)[0]["kept"] == ablate.KEPT_DIR
    assert dpo_suite.parse(smoke + [f"--out_dir={tmp_path}"])[0]["kept"] == ""
    assert dpo_suite.parse(smoke + [f"--out_dir={tmp_path}", "--kept=k"])[0]["kept"] == "k"
    assert dpo_suite.parse(smoke + ["--kept="])[0]["kept"] == ""


def test_the_suite_line_names_each_machine_and_commit_of_its_kept_runs_once():
    """made_by groups the kept runs by machine and commit (a dirty tree apart from a clean one), with
    the first and last dates of each group's runs and their count."""
    cpu = "Intel X (AVX-512 yes, native bf16 no)"
    kept = [f"{cpu}, commit abc, 2026-12-04 15:33 UTC", f"{cpu}, commit abc, 2026-12-04 13:33 UTC",
            f"{cpu}, commit abc, 2026-12-04 13:33 UTC", f"{cpu}, commit abc with uncommitted changes, "
            "2026-12-04 16:00 UTC", None]
    rows = [dict(condition="pretrained", seconds=0, kept=None)]
    rows += [dict(condition=f"c{i}", seconds=1, kept=k, restored=i < 2) for i, k in enumerate(kept)]
    line = ablate.made_by(time.time(), rows, 2, 1, "cpu")[1]
    assert ("4 of the 5 runs were made by earlier commands and kept (2 restored from the kept runs "
            "rather than run, the others reused from their run folders); they were made on "
            f"{cpu}, commit abc, 2026-12-04 13:33 UTC to 2026-12-04 15:33 UTC (3 runs); "
            f"{cpu}, commit abc with uncommitted changes, 2026-12-04 16:00 UTC (1 run).") in line


@pytest.mark.parametrize("suite", ["ablate", "dpo_suite"])
def test_a_suite_makes_the_main_run_folder_a_fresh_checkout_lacks(tmp_path, monkeypatch, suite):
    """A fresh checkout has no out/: each suite makes its --out_dir (as train.py does) and goes on
    to the main run's stages, here stopped as they start."""
    from lab import dpo_suite

    class StagesReached(Exception):
        pass

    out = tmp_path / "new" / "out"

    # The folder is there when the stages start (a command stopped before any stage wrote leaves no
    # new folder behind: store.Lock).
    def stages_reached(*args, **kwargs):
        assert out.is_dir()
        raise StagesReached

    monkeypatch.setattr(train, "run_stages", stages_reached)
    main = ablate.main if suite == "ablate" else dpo_suite.main
    with pytest.raises(StagesReached):
        main(["--preset=smoke", f"--out_dir={out}", "--seeds=1", "--jobs=1", "--eval_every=1"])
