"""Two test processes on a machine with two cores, with no plugin to install.

`python -m pytest -q` starts a second pytest on the same selection and each process takes whole test
files from a shared list, the first to reach a file claiming it (so a file's fixtures are made in
one process, once). The models here are small: one torch thread each in two processes does more
than two threads in one. The first process waits for the other, prints its summary (its whole log
when it failed), and fails the run unless every selected test ran in one of them.

    python -m pytest -q                # two processes where the machine has two cores or more
    python -m pytest -q --workers=1    # every test in this process (for -s, --pdb, a debugger)

Left out: pytest-xdist's test-by-test scheduling, crash recovery and remote workers."""
import fcntl, json, os, shutil, signal, subprocess, sys, tempfile
import pytest

# Set in a worker this file started: "INDEX COUNT FOLDER", the folder holding the claims.
ENV = "TETHER_TEST_WORKER"

# The slowest files first: a file is run whole by the worker that claims it, and a slow file
# claimed last keeps one worker running while the other has nothing left. The order is the files'
# own times in one process (--workers=1 --durations=0 on a 2-core AMD EPYC, AVX2), longest first,
# but test_edits.py second: it makes its own pipelines, so the second worker starts while the
# first makes the smoke run the other files share (made_once).
SLOW_FIRST = ["test_ablate.py", "test_edits.py", "test_state.py", "test_dpo.py", "test_train.py",
              "test_disk.py", "test_dist.py", "test_overopt.py", "test_pretrain_optim.py",
              "test_intervals.py", "test_online.py", "test_ref.py", "test_bad_input.py",
              "test_claims.py", "test_sample.py", "test_ecosystem.py", "test_seeds.py",
              "test_profile.py", "test_change_a_flag.py", "test_readme.py"]

# This process's part: its index, the worker count, the claims' folder, the files it owns or
# left to another, what each of its tests ended as, and the workers it started.
me = dict(index=0, count=1, folder=None, mine=set(), theirs=set(), outcomes={}, started=[])


def add_option(parser):
    """--workers, added by conftest.py (which registers this file as a plugin)."""
    parser.addoption("--workers", default="auto",
                     help="test processes: auto (2 where the machine has 2 or more cores and a "
                          "selected test trains a pipeline), or a number; 1 runs every test here")


# The fixtures that train a whole pipeline (conftest.py): a selection without them (the fast loop)
# ends before a second process would have collected its tests.
PIPELINE_RUNS = {"run", "tiny_run"}


def count_wanted(config, items):
    """The number of processes the run asks for: 1 with -s or --pdb (a terminal is one process's)."""
    value = config.getoption("--workers")
    if config.getoption("capture") == "no" or config.getoption("usepdb"):
        return 1
    if value == "auto":
        pipelines = any(PIPELINE_RUNS & set(item.fixturenames) for item in items)
        return 2 if (os.cpu_count() or 1) >= 2 and pipelines else 1
    if not value.isdigit() or int(value) < 1:
        raise pytest.UsageError(f"--workers={value}: auto or a whole number of processes, 1 or more")
    return int(value)


def one_thread():
    """One torch thread in this process and in every process its tests start (torch, where not
    yet imported, reads OMP_NUM_THREADS when it is)."""
    os.environ["OMP_NUM_THREADS"] = "1"
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(1)


def pytest_configure(config):
    if ENV in os.environ:
        index, count, folder = os.environ[ENV].split(" ", 2)
        me.update(index=int(index), count=int(count), folder=folder)
        one_thread()


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(session, config, items):
    """After -m and -k have chosen the tests: slow files first, and the other workers started."""
    if ENV not in os.environ:
        count = count_wanted(config, items)
        if count == 1:
            return
        me.update(count=count, folder=tempfile.mkdtemp(prefix="tether-workers-"))
        one_thread()
        start_workers(config)
    order = {name: i for i, name in enumerate(SLOW_FIRST)}
    items.sort(key=lambda item: order.get(os.path.basename(module(item)), len(order)))


def start_workers(config):
    """The workers 1..count-1: the same command, each with its own temporary folder and log."""
    args = [a for a in config.invocation_params.args if not a.startswith("--basetemp")]
    for index in range(1, me["count"]):
        log = open(os.path.join(me["folder"], f"worker{index}.log"), "w")
        env = dict(os.environ, **{ENV: f"{index} {me['count']} {me['folder']}"})
        temp = os.path.join(me["folder"], f"tmp{index}")
        cmd = [sys.executable, "-m", "pytest", *args, f"--basetemp={temp}", "-p", "no:cacheprovider"]
        proc = subprocess.Popen(cmd, cwd=str(config.invocation_params.dir), env=env, stdout=log,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        me["started"].append((index, proc, log))


def module(item):
    return item.nodeid.split("::")[0]


def claimed(name):
    """True when this process owns the file `name`: it claimed it now or before; False when
    another worker did."""
    if name in me["mine"]:
        return True
    if name in me["theirs"]:
        return False
    path = os.path.join(me["folder"], name.replace("/", "__"))
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        me["theirs"].add(name)
        return False
    os.write(fd, str(me["index"]).encode())
    os.close(fd)
    me["mine"].add(name)
    return True


def made_once(name, make, out):
    """The folder `out` filled by make(folder): here, by make(out); with workers, made once in the
    claims' folder by the first worker to ask (the other waits on its lock), then copied to out,
    its files naming out where they named the folder it was made in. conftest.py's pipeline
    fixtures, some 30 s of training each, are made once so."""
    if me["count"] == 1:
        make(out)
        return out
    shared = os.path.join(me["folder"], f"made_{name}")
    with open(shared + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not os.path.exists(shared + ".done"):
            shutil.rmtree(shared, ignore_errors=True)
            make(shared)
            open(shared + ".done", "w").close()
    shutil.copytree(shared, out, dirs_exist_ok=True)
    # As if made in out: config.json's out_dir and report.md's command name the folder.
    for entry in os.listdir(out):
        path = os.path.join(out, entry)
        if entry.endswith((".json", ".md")) and os.path.isfile(path):
            with open(path, encoding="utf-8") as f:
                text = f.read()
            if shared in text:
                with open(path, "w", encoding="utf-8") as f:
                    f.write(text.replace(shared, out))
    return out


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item, nextitem):
    # Another worker's file: nothing run, nothing reported here.
    if me["count"] > 1 and not claimed(module(item)):
        return True
    return None


def pytest_runtest_logreport(report):
    # A test's outcome: failed if any of its phases failed, skipped if it was skipped.
    before = me["outcomes"].get(report.nodeid, "passed")
    if report.failed or before == "failed":
        me["outcomes"][report.nodeid] = "failed"
    elif report.skipped or before == "skipped":
        me["outcomes"][report.nodeid] = "skipped"
    else:
        me["outcomes"][report.nodeid] = "passed"


def pytest_sessionfinish(session, exitstatus):
    if me["count"] == 1:
        return
    if me["index"] > 0:
        done = os.path.join(me["folder"], f"done{me['index']}.json")
        with open(done, "w") as f:
            json.dump(me["outcomes"], f)
        return
    # The first process: the others' ends, then whether every selected test ran somewhere.
    interrupted = exitstatus == pytest.ExitCode.INTERRUPTED
    for index, proc, log in me["started"]:
        if interrupted:
            proc.send_signal(signal.SIGINT)
        proc.wait()
        log.close()
    if interrupted:
        return
    outcomes = dict(me["outcomes"])
    failed = False
    for index, proc, _ in me["started"]:
        done = os.path.join(me["folder"], f"done{index}.json")
        if os.path.exists(done):
            with open(done) as f:
                outcomes.update(json.load(f))
        failed = failed or proc.returncode not in (0, pytest.ExitCode.NO_TESTS_COLLECTED)
    missing = [item.nodeid for item in session.items if item.nodeid not in outcomes]
    me.update(missing=missing, total=outcomes, failed=failed)
    if failed or missing:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter):
    if me["count"] == 1 or me["index"] > 0 or "total" not in me:
        return
    tr = terminalreporter
    for index, proc, log in me["started"]:
        with open(log.name) as f:
            text = f.read()
        lines = text.rstrip().splitlines() or ["(no output)"]
        # A worker that failed shows its whole log; one that passed, its summary line.
        shown = text if proc.returncode not in (0, pytest.ExitCode.NO_TESTS_COLLECTED) else lines[-1]
        tr.write_sep("-", f"worker {index} of {me['count']} (exit {proc.returncode})")
        tr.write_line(shown.rstrip())
    counts = {}
    for outcome in me["total"].values():
        counts[outcome] = counts.get(outcome, 0) + 1
    tr.write_sep("-", f"{me['count']} workers: " + ", ".join(f"{n} {k}" for k, n in sorted(counts.items())))
    for nodeid in me["missing"]:
        tr.write_line(f"NOT RUN by any worker: {nodeid}")
    shutil.rmtree(me["folder"], ignore_errors=True)
