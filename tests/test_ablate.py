"""A tiny ablation: every condition runs and reports finite numbers; finished runs are reused; bad options and
Ctrl-C are one line, and Ctrl-C leaves no worker behind."""
import math, os, signal, subprocess, sys, time
import pytest
import ablate, store

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_every_condition_appears_with_finite_values_and_finished_runs_are_reused(run):
    argv = ["--preset=smoke", f"--out_dir={run}", "--quick", "--ppo_iters=2", "--n_eval=8"]
    ablate.main(argv)
    adir = os.path.join(run, "ablate")
    rows = store.load_json(os.path.join(adir, "results.jsonl"), lines=True)
    assert {r["condition"] for r in rows} == set(ablate.SUITES["core"]) | {"pretrained"}     # the default suite
    for r in rows:
        for c in ablate.COLUMNS:
            assert math.isfinite(r[c]), (r["condition"], c)
    table = open(os.path.join(adir, "results.md")).read()
    assert all(f"| {c} |" in table for c in ablate.SUITES["core"])
    examples = open(os.path.join(adir, "examples.md")).read()
    assert "## pretrained" in examples and "## no_kl" in examples
    no_kl = next(r for r in rows if r["condition"] == "no_kl")
    assert no_kl["kl_coef_final"] == 0.0
    actor = os.path.join(adir, "no_kl", "seed1337", "actor.pt")
    mtime = os.path.getmtime(actor)
    ablate.main(argv)                                                   # same config: every run reused
    assert store.load_json(os.path.join(adir, "results.jsonl"), lines=True) == rows
    assert os.path.getmtime(actor) == mtime


def test_the_cheap_reference_table(run):
    """results_ref.md: one row per condition, from the runs' ppo.json (bytes, step-0 KL, KL to the full and to
    the run's own reference, rollbacks)."""
    ablate.main(["--preset=smoke", f"--out_dir={run}", "--quick", "--ppo_iters=2", "--n_eval=8", "--jobs=1",
                 "--conditions=ref_int8,rollback", "--subdir=ablate_ref"])
    adir = os.path.join(run, "ablate_ref")
    rows = {r["condition"]: r for r in store.load_json(os.path.join(adir, "results.jsonl"), lines=True)}
    assert rows["ref_int8"]["ref"]["kind"] == "int8" and rows["ref_int8"]["ref"]["kl_step0"] > 0
    assert rows["rollback"]["ref"]["bytes"] > rows["ref_int8"]["ref"]["bytes"] > 0
    lines = open(os.path.join(adir, "results_ref.md")).read().splitlines()
    row = next(line for line in lines if line.startswith("| `ref_int8` |")).split(" | ")
    assert float(row[1].split()[0]) == pytest.approx(rows["ref_int8"]["ref"]["bytes"] / 1e6, abs=0.01)
    assert any(line.startswith("| `rollback` |") for line in lines)


@pytest.mark.parametrize("argv, message", [(["--conditions=no_kl,magic"], "unknown condition"),
                                           (["--suite=huge"], "bad value for --suite"),
                                           (["--conditions=no_kl,no_kl"], "twice"), (["--seeds=0"], ">= 1"),
                                           (["--seeds=x"], "bad value"), (["--ppo_iters=0"], "--ppo_iters")])
def test_bad_options_are_a_clear_error(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        ablate.main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and message in err and err.count("\n") == 1


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads /proc to find the workers")
def test_ctrl_c_stops_every_worker(run):
    p = subprocess.Popen([sys.executable, "ablate.py", "--preset=smoke", f"--out_dir={run}", "--subdir=ablate_int",
                          "--conditions=no_kl,fixed_0.5", "--ppo_iters=50", "--jobs=2"], cwd=ROOT,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))   # as from a terminal
    for line in p.stdout:
        if line.startswith("ablate:"):
            break
    time.sleep(3)                                                      # the workers are running now
    os.killpg(p.pid, signal.SIGINT)                                    # what a terminal's Ctrl-C does
    assert p.wait(timeout=60) == 130
    err = p.stderr.read()
    assert err.startswith("error: interrupted") and err.count("\n") == 1, err
    time.sleep(0.5)
    assert alive_in_group(p.pid) == []                                 # no worker left running


def alive_in_group(pgid):
    """Processes of a process group that still run (zombies, dead but not yet reaped, do not count)."""
    alive = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            alive.append(int(pid))
    return alive
