"""Bad input that once did work before it was refused, or left something behind: an endless --config or
--readme (/dev/zero) is refused after reading at most its cap; an --out_dir whose name is not valid UTF-8 is
refused before the evaluation, with the folder's files unchanged, by train.py and the lab's commands alike; a
refused command leaves no folder (nor lock) it made; --config without --out_dir says which folder it runs in."""
import json, os, resource, shutil, subprocess, sys
import pytest

import train
from machinery import config, store
from test_state import SMOKE, hashes, refused

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _memory_cap():
    # A reader of the whole of /dev/zero would take the machine's memory: 6 GB is enough for torch.
    resource.setrlimit(resource.RLIMIT_AS, (6 << 30, 6 << 30))


def command(argv, timeout=120):
    """argv (str or bytes words) run from the project's folder: (exit code, stderr's lines)."""
    r = subprocess.run([sys.executable, *argv], cwd=ROOT, capture_output=True, timeout=timeout,
                       preexec_fn=_memory_cap)
    return r.returncode, r.stderr.decode("utf-8", "backslashreplace").strip().splitlines()


@pytest.mark.parametrize("argv, why", [
    (["train.py", "--preset=smoke", "--config=/dev/zero"], "--config=/dev/zero: over 1 MB"),
    (["-m", "lab.claims", "--readme=/dev/zero"], "/dev/zero is over 10 MB: not a README"),
])
def test_an_endless_config_or_readme_is_refused_at_once(tmp_path, argv, why):
    code, err = command(argv + [f"--out_dir={tmp_path / 'out'}"], timeout=60)
    assert code == 2 and len(err) == 1 and why in err[0], err
    assert not (tmp_path / "out").exists()


def test_a_config_over_its_cap_is_refused(tmp_path, capsys):
    path = tmp_path / "config.json"
    # 1 MB is the cap.
    path.write_text("{}" + " " * (1 << 20))
    assert "over 1 MB" in refused(SMOKE + [f"--config={path}", f"--out_dir={tmp_path / 'out'}"], capsys)
    assert not (tmp_path / "out").exists()


def not_utf8(tmp_path, name):
    """A path under tmp_path whose last name is `name` followed by bytes that are not UTF-8, as Python holds it."""
    return os.fsdecode(os.fsencode(str(tmp_path)) + b"/" + name.encode() + b"\xff\xfe")


def test_an_out_dir_not_in_utf8_is_refused_before_the_evaluation(run, tmp_path):
    """The report names its folder in text: such a folder would cost the whole evaluation, then the old report."""
    out = not_utf8(tmp_path, "run")
    shutil.copytree(run, out)
    before = hashes(out)
    code, err = command(["train.py", *SMOKE, "--stage=report", b"--out_dir=" + os.fsencode(out)])
    assert code == 2 and len(err) == 1 and "is not valid UTF-8" in err[0], err
    assert hashes(out) == before


# Each lab command as `python -m` starts it (its __main__ block, a real sys.argv and stderr), the four in one process
# so that torch is imported once; train.py's test above goes through a command line of bytes.
EACH = """import json, runpy, sys
for name, argv in json.loads(sys.argv[1]):
    sys.argv = [name] + argv
    code = 0
    try:
        runpy.run_module(name, run_name="__main__", alter_sys=True)
    except SystemExit as e:
        code = e.code
    print(f"==== {name} exit {code}", file=sys.stderr, flush=True)
"""


def test_the_labs_commands_refuse_an_out_dir_not_in_utf8(tmp_path):
    out = not_utf8(tmp_path, "lab")
    labs = {"lab.ablate": SMOKE, "lab.seeds": SMOKE, "lab.dpo_suite": SMOKE + ["--ppo_iters=6"], "lab.bench": []}
    runs = [[name, argv + [f"--out_dir={out}"]] for name, argv in labs.items()]
    code, err = command(["-c", EACH, json.dumps(runs)])
    assert code == 0, err
    said = []
    for line in err:
        if line.startswith("==== "):
            assert len(said) == 1 and "--out_dir=" in said[0] and "is not valid UTF-8" in said[0], (line, said)
            assert line.endswith(" exit 2"), line
            said = []
        else:
            said.append(line)
    assert [line.split()[1] for line in err if line.startswith("==== ")] == list(labs)
    assert os.listdir(tmp_path) == []


def test_a_refused_command_leaves_no_folder_or_lock_it_made(tmp_path, capsys):
    """--stage=dpo in a new folder needs every earlier stage: refused, and the folders made on the way are gone; in
    an empty folder that was there, the folder stays, empty."""
    new = tmp_path / "new" / "deeper"
    assert "needs stage world" in refused(SMOKE + ["--stage=dpo", f"--out_dir={new}"], capsys)
    assert os.listdir(tmp_path) == []
    empty = tmp_path / "empty"
    empty.mkdir()
    assert "needs stage world" in refused(SMOKE + ["--stage=ppo", f"--out_dir={empty}"], capsys)
    assert os.listdir(empty) == []


def test_a_lock_held_by_another_run_is_not_removed(tmp_path):
    """The lock of a folder left empty goes only when this command made it."""
    out = str(tmp_path)
    with store.Lock(out):
        pass
    assert os.listdir(out) == []
    open(os.path.join(out, ".lock"), "w").close()
    with store.Lock(out):
        pass
    assert os.listdir(out) == [".lock"]


def test_config_without_out_dir_says_it_runs_in_the_runs_own_folder(run, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(config, "_SAID", set(), raising=False)
    cfg = train.parse([f"--config={run}/config.json"])
    out = capsys.readouterr().out
    assert cfg.run.out_dir == run and f"--out_dir={run}, from --config={run}/config.json" in out
    train.parse([f"--config={run}/config.json", f"--out_dir={tmp_path}"])
    assert "note" not in capsys.readouterr().out
