"""provenance.py: the line under every table. The machine's fields against /proc/cpuinfo, the
commit against git itself in a scratch repository (clean, a tracked file edited, outside git)."""
import importlib.util, os, shutil, subprocess

import pytest

from machinery import provenance

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def cpuinfo():
    if not os.path.exists("/proc/cpuinfo"):
        pytest.skip("no /proc/cpuinfo")
    return open("/proc/cpuinfo").read()


def test_the_machine_is_the_one_proc_cpuinfo_describes():
    info = cpuinfo()
    made = provenance.stamp(12.0, threads=3)
    flags = next((line for line in info.splitlines() if line.startswith("flags")), "flags:").split()
    model = next(line for line in info.splitlines() if line.startswith("model name"))
    assert made["cpu"] == model.split(":", 1)[1].strip()
    assert made["avx512"] == ("avx512f" in flags)
    assert made["native_bf16"] == ("avx512_bf16" in flags or "amx_bf16" in flags)
    assert made["cores"] == os.cpu_count() and made["threads"] == 3 and made["seconds"] == 12.0


def test_durations_read_as_a_person_writes_them():
    assert provenance.duration(38.4) == "38 s"
    assert provenance.duration(295) == "4 min 55 s"
    assert provenance.duration(3900) == "1 h 05 min"


def copy_into(folder):
    """provenance.py and what it imports, loaded from `folder` (its commit is that folder's)."""
    os.makedirs(folder, exist_ok=True)
    os.makedirs(os.path.join(folder, "machinery"), exist_ok=True)
    for name in ("machinery/provenance.py", "machinery/precision.py"):
        shutil.copy(os.path.join(HERE, name), os.path.join(folder, name))
    where = os.path.join(folder, "machinery", "provenance.py")
    spec = importlib.util.spec_from_file_location("provenance_copy", where)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def git(folder, *args):
    done = subprocess.run(["git", "-C", folder, *args], capture_output=True, text=True, check=True)
    return done.stdout.strip()


def test_the_commit_is_heads_and_an_edit_to_a_tracked_file_is_marked(tmp_path):
    if shutil.which("git") is None:
        pytest.skip("no git")
    repo = str(tmp_path / "repo")
    module = copy_into(repo)
    git(repo, "init", "-q")
    git(repo, "add", ".")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "first")
    head = git(repo, "rev-parse", "--short=12", "HEAD")
    assert module.commit() == (head, False)
    # An untracked file is not the code that ran; an edited tracked file is.
    open(os.path.join(repo, "notes.txt"), "w").write("x")
    assert module.commit() == (head, False)
    with open(os.path.join(repo, "machinery", "precision.py"), "a") as f:
        f.write("\n# edited\n")
    assert module.commit() == (head, True)
    line = module.line(module.stamp(75.0))
    assert f"commit {head} with uncommitted changes" in line and "1 min 15 s" in line


def test_outside_a_git_checkout_the_commit_is_unknown(tmp_path):
    module = copy_into(str(tmp_path / "plain"))
    assert module.commit() == ("unknown", False)
    assert "commit unknown," in module.line(module.stamp(1.0))
