"""What made a table: the machine (CPU model, AVX-512, native bf16, cores, threads), the commit,
the date, the command and its wall time. train.py's report and every results file of lab/ablate.py
and lab/bench.py end with this line, and their JSON carries it as "made_by".

    python -m machinery.provenance       # this machine's line, as a table would carry it

The commit is the checkout's HEAD, marked "with uncommitted changes" when a tracked file differs
from it; outside a git checkout it reads "unknown". A stage's code is pinned separately, by the
hashes in stages.json: a run reused from an earlier commit was made by the same code.
Left out: the versions of python and numpy, the GPU's clock and driver.
"""
import datetime, os, platform, shlex, subprocess, sys
import torch

from machinery.precision import auto_dtype


def cpu_model():
    """The CPU's model name as the OS reports it (Linux: /proc/cpuinfo)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def commit():
    """(HEAD's hash, whether a tracked file differs from it, None if git could not say);
    ("unknown", False) outside git."""
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        head = subprocess.run(["git", "-C", here, "rev-parse", "--short=12", "HEAD"],
                              capture_output=True, text=True, timeout=10)
        status = subprocess.run(["git", "-C", here, "status", "--porcelain",
                                 "--untracked-files=no"], capture_output=True, text=True,
                                timeout=10)
    except (OSError, subprocess.SubprocessError):
        return "unknown", False
    if head.returncode != 0:
        return "unknown", False
    if status.returncode != 0:
        return head.stdout.strip(), None
    return head.stdout.strip(), bool(status.stdout.strip())


def command():
    """This process's command line, as a user would type it: `python train.py ...`, or `python -m
    lab.ablate ...` for a module run with -m."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    if spec is not None and spec.name not in ("__main__", ""):
        return "python -m " + shlex.join([spec.name] + sys.argv[1:])
    return "python " + shlex.join([os.path.basename(sys.argv[0])] + sys.argv[1:])


def cores():
    """The cores this process may run on (its affinity where the OS tells it)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count()


def stamp(seconds, threads=None, device="cpu", cmd=None):
    """The record of what made a table: machine, commit, date (UTC), command, wall seconds.
    threads: the torch threads each run had (default: this process's)."""
    caps = torch.cpu.get_capabilities()
    head, dirty = commit()
    made = dict(cpu=cpu_model(), avx512=bool(caps.get("avx512_f")),
                native_bf16=auto_dtype("cpu")[0] == "bf16", cores=cores(),
                threads=threads or torch.get_num_threads(), device=device,
                torch=torch.__version__, commit=head, uncommitted=dirty,
                date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                command=cmd or command(), seconds=round(float(seconds), 1))
    if device.startswith("cuda") and torch.cuda.is_available():
        made["device"] = f"{device} ({torch.cuda.get_device_name(device)})"
    return made


def duration(seconds):
    """1 h 05 min, 4 min 55 s, 38 s."""
    s = int(round(seconds))
    if s >= 3600:
        return f"{s // 3600} h {s % 3600 // 60:02d} min"
    if s >= 60:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s} s"


def line(made, what="wall time"):
    """The stamp as one markdown line under a table."""
    yes = {True: "yes", False: "no"}
    notes = {True: " with uncommitted changes", False: "", None: " (working tree not read)"}
    head = made["commit"] + notes[made["uncommitted"]]
    return (f"Made by `{made['command']}` on {made['cpu']} (AVX-512 {yes[made['avx512']]}, "
            f"native bf16 {yes[made['native_bf16']]}; {made['cores']} cores, {made['threads']} "
            f"torch threads; {made['device']}; torch {made['torch']}), commit {head}, "
            f"{made['date']}; {what} {duration(made['seconds'])}.")


def main(argv):
    if "--help" in argv or "-h" in argv:
        print(__doc__.strip())
        sys.exit(0)
    print(line(stamp(0.0), "wall time"))


if __name__ == "__main__":
    main(sys.argv[1:])
