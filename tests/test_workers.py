"""tests/workers.py, the two test processes: every selected test runs in exactly one of them, a failure in
either fails the run, and a test the workers both missed fails it too."""
import os, re, shutil, subprocess, sys

HERE = os.path.dirname(os.path.abspath(__file__))

CONFTEST = """import workers
PIPELINE_RUNS = workers.PIPELINE_RUNS

def pytest_addoption(parser):
    workers.add_option(parser)

def pytest_configure(config):
    config.pluginmanager.register(workers, "workers")
"""

# Each test appends its name and its process to a shared file. The first waits until another
# process has written there: the first worker holds test_file0.py until the second has claimed
# test_file1.py, so each worker surely runs a file (test_file1.py is the second's).
BODY = """import os, time
def _note(name):
    path = os.environ["SEEN"]
    with open(path, "a") as f:
        f.write(f"{name} {os.getpid()}\\n")
    deadline = time.time() + 60
    while name == "test_0_0" and os.environ.get("WAIT") and time.time() < deadline:
        if any(line.split()[1] != str(os.getpid()) for line in open(path).read().splitlines()):
            break
        time.sleep(0.05)
"""


def project(tmp_path, failing=()):
    """Six test files of five tests each beside a copy of workers.py; the tests named in failing
    fail."""
    shutil.copy(os.path.join(HERE, "workers.py"), tmp_path / "workers.py")
    (tmp_path / "conftest.py").write_text(CONFTEST)
    for f in range(6):
        tests = [BODY]
        for t in range(5):
            name = f"test_{f}_{t}"
            fail = f"\n    assert False, 'planted in {name}'" if name in failing else ""
            tests.append(f"def {name}():\n    _note('{name}'){fail}\n")
        (tmp_path / f"test_file{f}.py").write_text("\n".join(tests))
    return tmp_path


def pytest_in(folder, *args):
    env = dict(os.environ, SEEN=str(folder / "seen.txt"), WAIT="1" if "--workers=2" in args else "")
    env.pop("TETHER_TEST_WORKER", None)
    # No installed plugin is needed here (each costs every run its import).
    env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args], cwd=folder,
                          env=env, capture_output=True, text=True, timeout=300)


def seen(folder):
    rows = [line.split() for line in (folder / "seen.txt").read_text().splitlines()]
    return [name for name, _ in rows], {pid for _, pid in rows}


def test_two_workers_run_every_test_once_and_a_file_stays_in_one_process(tmp_path):
    p = pytest_in(project(tmp_path), "--workers=2")
    assert p.returncode == 0, p.stdout
    names, pids = seen(tmp_path)
    assert sorted(names) == sorted(f"test_{f}_{t}" for f in range(6) for t in range(5))
    assert "2 workers: 30 passed" in p.stdout and len(pids) == 2
    rows = [line.split() for line in (tmp_path / "seen.txt").read_text().splitlines()]
    by_file = {}
    for name, pid in rows:
        by_file.setdefault(name.split("_")[1], set()).add(pid)
    assert all(len(p) == 1 for p in by_file.values())


def test_a_failure_in_either_worker_fails_the_run_and_is_shown(tmp_path):
    # test_0_1 fails in the first worker, test_1_0 in the second.
    p = pytest_in(project(tmp_path, ("test_0_1", "test_1_0")), "--workers=2")
    assert p.returncode == 1, p.stdout
    assert "2 workers: 2 failed, 28 passed" in p.stdout and "worker 1 of 2 (exit 1)" in p.stdout
    assert "planted in test_0_1" in p.stdout and "planted in test_1_0" in p.stdout


def test_a_test_no_worker_ran_fails_the_run(tmp_path):
    """A worker that skips a file it never claimed (a broken claim) is caught: the run names the tests."""
    folder = project(tmp_path)
    text = (folder / "workers.py").read_text()
    broken = text.replace('if me["count"] > 1 and not claimed(module(item)):',
                          'if me["count"] > 1 and (not claimed(module(item)) or "file3" in item.nodeid):')
    assert broken != text
    (folder / "workers.py").write_text(broken)
    p = pytest_in(folder, "--workers=2")
    assert p.returncode == 1
    assert len(re.findall(r"NOT RUN by any worker: test_file3.py::test_3_\d", p.stdout)) == 5


def test_one_worker_runs_everything_in_its_own_process_and_a_bad_count_is_refused(tmp_path):
    """--workers=1, and auto where no test trains a pipeline (the fast loop): one process runs all (auto's second
    worker is never started)."""
    for args in (["--workers=1"], []):
        folder = tmp_path / f"w{len(args)}"
        folder.mkdir()
        p = pytest_in(project(folder), *args)
        assert p.returncode == 0 and "30 passed" in p.stdout and "workers" not in p.stdout
        assert len(seen(folder)[1]) == 1
    p = pytest_in(folder, "--workers=two")
    assert p.returncode == 4 and "--workers=two" in p.stderr
