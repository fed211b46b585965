"""State on disk that cannot go stale or half-written: atomic writes, loads that name the file, a run lock,
and the stage records that say which config and which input files each output was made from.

Every file tether writes goes to a temporary name in the same folder and is renamed into place, so a kill leaves
either the old file or the new one, never a torn one. `out_dir/stages.json` holds one record per finished stage:
{"config": {field: value}, "inputs": {file: sha256}, "outputs": {file: sha256}}; train.py compares it with the
current flags and files before any work. `Lock` keeps a second run out of a folder (released by the OS on kill).
A worker process whose parent is gone writes nothing more (`stop_writing_if_orphaned`, used by ablate.py).
Left out: locking on network file systems, garbage collection of old run folders.
"""
import contextlib, hashlib, json, os, signal, threading
import torch

from errors import RunError


@contextlib.contextmanager
def _hold_ctrl_c():
    """Ctrl-C is held until the file is whole, then raised: torch.save's C++ writer, interrupted mid-write, raises
    a RuntimeError ("unexpected pos"), not KeyboardInterrupt, and the run would die with a traceback."""
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGINT) is not signal.default_int_handler:    # e.g. ablate's workers ignore it
        yield
        return
    held = []
    signal.signal(signal.SIGINT, lambda *_: held.append(1))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if held:
        raise KeyboardInterrupt


_parent = None          # set in ablate.py's workers: the process whose death stops this one before its next write


def stop_writing_if_orphaned(parent_pid):
    """For a worker process: from now on every write first checks that parent_pid is still this process's parent;
    when it is not (the parent was killed), the process exits at once and writes nothing more. Checked now too."""
    global _parent
    _parent = parent_pid
    _check_parent()


def _check_parent():
    if _parent is not None and os.getppid() != _parent:
        os._exit(1)                                 # no cleanup that writes: nobody is left to read the results


def _atomic(path, write, mode):
    _check_parent()
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        with _hold_ctrl_c():                        # Ctrl-C here: the new file is written, then the interrupt
            with open(tmp, mode) as f:
                write(f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)                   # atomic on POSIX and Windows
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def write_text(path, text):
    _atomic(path, lambda f: f.write(text), "w")


def write_bytes(path, data):
    _atomic(path, lambda f: f.write(data), "wb")


def save_json(path, obj, lines=False):
    """A JSON file, or (lines=True) one JSON object per line."""
    write_text(path, "".join(json.dumps(o) + "\n" for o in obj) if lines else json.dumps(obj, indent=1))


def load_json(path, lines=False):
    try:
        with open(path) as f:
            return [json.loads(line) for line in f] if lines else json.load(f)
    except (OSError, ValueError) as e:
        raise RunError(f"cannot read {path} ({type(e).__name__}): delete it, or redo its stage (--fresh)")


def _all_finite(obj):
    if isinstance(obj, torch.Tensor):
        return not obj.is_floating_point() or bool(torch.isfinite(obj).all())
    if isinstance(obj, dict):
        return all(_all_finite(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return all(_all_finite(v) for v in obj)
    return True                                         # numbers in logs may be NaN; weights may not


def save_torch(obj, path):
    """torch.save, atomically; refuses to write a NaN or inf into a checkpoint."""
    if not _all_finite(obj):
        raise RunError(f"refusing to write a non-finite value into {path}: the run diverged (lower the lr)", 1)
    _atomic(path, lambda f: torch.save(obj, f), "wb")


def load_torch(path, device="cpu"):
    """torch.load(weights_only=True): plain tensors and containers only. A failure names the file."""
    try:
        return torch.load(path, map_location=device, weights_only=True)
    except Exception as e:
        raise RunError(f"cannot load {path} ({type(e).__name__}): delete it, or redo its stage (--fresh)")


def file_hash(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()[:16]


def not_a_folder(path):
    """Why `path` is not, and cannot become, a folder (a file there, or a file on the way to it), in a few words;
    None when it is one or can be made. Asked before any work, by every command that writes into a folder."""
    if os.path.exists(path):
        return None if os.path.isdir(path) else "is a file, not a folder"
    up = os.path.dirname(os.path.abspath(path))
    while not os.path.exists(up):
        up = os.path.dirname(up)
    return None if os.path.isdir(up) else f"cannot be made ({up} is a file)"


def remove(path):
    if os.path.exists(path):
        os.remove(path)


class Lock:
    """An exclusive lock on out_dir/.lock for the life of a run; a second run on the folder stops at once."""

    def __init__(self, out_dir):
        self.path = os.path.join(out_dir, ".lock")

    def __enter__(self):
        self.f = open(self.path, "a+")
        try:
            import fcntl
            fcntl.flock(self.f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except ImportError:                         # no fcntl (Windows): run without the lock
            pass
        except OSError:
            self.f.close()
            raise RunError(f"another run is using {os.path.dirname(self.path) or '.'} (its lock {self.path} is "
                           "held): wait for it, or use another --out_dir")
        return self

    def __exit__(self, *exc):
        self.f.close()                              # closing the file releases the lock
        return False


# ---- stage records ----
def records_path(out_dir):
    return os.path.join(out_dir, "stages.json")


def load_records(out_dir):
    return load_json(records_path(out_dir)) if os.path.exists(records_path(out_dir)) else {}


def make_record(out_dir, config, inputs, outputs):
    """The record of a finished stage; an optional output that was not made (a plot) is not in it."""
    paths = lambda names: [(n, os.path.join(out_dir, n)) for n in names]
    h = lambda names: {n: file_hash(p) for n, p in paths(names) if os.path.exists(p)}
    return dict(config=config, inputs=h(inputs), outputs=h(outputs))


def outputs_intact(out_dir, record):
    """True when every output the record names exists with the hash the stage wrote."""
    return all(os.path.exists(os.path.join(out_dir, n)) and file_hash(os.path.join(out_dir, n)) == h
               for n, h in record["outputs"].items())


def first_difference(record, stamp):
    """The first way a stamp (current config and input hashes) differs from a record, in words; None if none.
    A field the record lacks was added to the code after it was made; the code it was made with behaved as the
    field's default does (the rule for a new field), so it matches at that default (stamp["defaults"]) and only
    there: adding a flag does not make every finished output stale, and using it does."""
    for k, v in stamp["config"].items():
        if k not in record["config"]:
            if k in stamp.get("defaults", {}) and stamp["defaults"][k] == v:
                continue
            return f"no --{k}, now --{k}={v}"
        if record["config"][k] != v:
            return f"--{k}={record['config'][k]}, now --{k}={v}"
    for n, h in stamp["inputs"].items():
        if record["inputs"].get(n) != h:
            return f"another {n} (it has changed since)"
    return None


def plan(stages, target, out_dir, records, stamp_of):
    """Which stages to run, in order, for `target` ("all" or a stage name); and which finished ones are kept.
    With "all": a stage runs when its outputs are missing or damaged, and then every later stage runs too.
    With a name: that stage runs, and every earlier one must be finished. A finished stage that is kept must have
    been made with the current config and inputs: else RunError, before anything is written."""
    todo, kept = [], []
    for st in stages:
        rec = records.get(st.name)
        intact = rec is not None and outputs_intact(out_dir, rec)
        if target == st.name or (target == "all" and (todo or not intact)):
            todo.append(st)                           # once one stage runs, every later one is made again
            if target == st.name:
                break
            continue
        if not intact:
            raise RunError(f"stage {target} needs stage {st.name}'s outputs in {out_dir}: run --stage={st.name} "
                           "first (or every stage: no --stage)")
        diff = first_difference(rec, stamp_of(st))
        if diff:
            raise RunError(f"stage {st.name} in {out_dir} was made with {diff}: add --fresh to redo every stage, "
                           f"--stage={st.name} to redo it and what follows, or use another --out_dir")
        kept.append(st.name)
    return todo, kept
