"""A tiny ablation: every condition runs and reports finite numbers; finished runs are reused; bad options and
Ctrl-C are one line, and Ctrl-C leaves no worker behind."""
import json, math, os, signal, subprocess, sys, time
import numpy as np
import pytest
import ablate, store, train
from config import flat

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_every_condition_appears_with_finite_values_and_finished_runs_are_reused(run):
    argv = ["--preset=smoke", f"--out_dir={run}", "--quick", "--ppo_iters=2", "--n_eval=8"]
    ablate.main(argv)
    adir = os.path.join(run, "ablate_quick")          # --quick's own folder: it never replaces main-budget runs
    assert not os.path.exists(os.path.join(run, "ablate"))
    rows = store.load_json(os.path.join(adir, "results.jsonl"), lines=True)
    assert {r["condition"] for r in rows} == set(ablate.SUITES["core"]) | {"pretrained"}      # the default suite
    for r in rows:
        for c in ablate.COLUMNS:
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
    assert all(math.isfinite(r[c]) for r in again for c in ablate.COLUMNS)
    k3 = next(r for r in rows if r["condition"] == "est_k3")
    assert {k: v for k, v in k3.items() if k != "condition"} == \
        {k: v for k, v in again[2].items() if k != "condition"}


def test_suites_name_known_conditions_and_all_is_their_union():
    assert all(c in ablate.CONDITIONS for suite in ablate.SUITES.values() for c in suite)
    assert set(ablate.SUITES["all"]) == set().union(*(ablate.SUITES[s] for s in ablate.SUITES if s != "all"))
    for c, twin in ablate.SAME_AS.items():                              # twins have the very same config
        assert flat(train.parse(ablate.CONDITIONS[c])) == flat(train.parse(ablate.CONDITIONS[twin])), c
    opts, rest = ablate.parse(["--suite=all", "--preset=smoke", "--n_layer=3"])   # every flag parses (shared_2: 3+)
    assert opts["conditions"].split(",") == ablate.SUITES["all"]


def test_bootstrap_interval_on_known_cases():
    mean, lo, hi = ablate.bootstrap_ci([2.0, 2.0, 2.0])
    assert mean == lo == hi == 2.0
    rng = np.random.default_rng(5)
    x = rng.normal(1.0, 2.0, 400)
    mean, lo, hi = ablate.bootstrap_ci(x)                              # the normal interval: mean ± 1.96 σ/√n
    half = 1.96 * x.std() / np.sqrt(len(x))
    assert lo == pytest.approx(mean - half, abs=0.03) and hi == pytest.approx(mean + half, abs=0.03)
    assert ablate.bootstrap_ci(x) == (mean, lo, hi)                     # a fixed seed: the same table every time
    m, lo3, hi3 = ablate.bootstrap_ci([1.0, 2.0, 6.0])
    assert (m, lo3, hi3) == (3.0, 1.0, 6.0)         # 3 seeds: each extreme resample has mass 1/27 > 2.5 %: [min, max]


def test_paired_differences_and_not_separated():
    rows = [dict(condition=c, seed=s, gold_mean=g) for c, s, g in
            [("adaptive", 1, 0.0), ("adaptive", 2, 1.0), ("adaptive", 3, 2.0),
             ("a", 1, 0.5), ("a", 2, 1.5), ("a", 3, 2.5),                # +0.5 on every seed: separated
             ("b", 1, 1.0), ("b", 2, 0.0), ("b", 3, 2.0), ("b", 4, 9.0)]]   # +1, -1, 0: crosses 0; seed 4 unpaired
    a, b = ablate.paired_ci(rows, "a", "adaptive", "gold_mean"), ablate.paired_ci(rows, "b", "adaptive", "gold_mean")
    assert a == (0.5, 0.5, 0.5, 3) and "not separated" not in ablate.verdict(a)
    assert b[0] == 0.0 and b[1] < 0 < b[2] and b[3] == 3 and ablate.verdict(b).endswith("not separated")


def test_the_cheap_reference_table(run):
    """The reference table (in results.md; a suite's also in results_ref.md): one row per condition, from the runs'
    ppo.json (bytes, step-0 KL, KL to the full and to the run's own reference, rollbacks)."""
    ablate.main(["--preset=smoke", f"--out_dir={run}", "--quick", "--ppo_iters=2", "--n_eval=8", "--jobs=1",
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
                                           (["--suite=nope"], "bad value for --suite")])
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
    p = subprocess.Popen([sys.executable, "ablate.py", "--preset=smoke", f"--out_dir={run}", "--subdir=ablate_int",
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
