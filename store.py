"""State on disk that cannot go stale or half-written: atomic writes, loads that name the file, a
run lock, and the stage records that say which config and which input files each output was made
from.

Every file tether writes goes to a temporary name in the same folder and is renamed into place, so
a kill leaves either the old file or the new one, never a torn one. `out_dir/stages.json` holds
one record per finished stage: {"config": {field: value}, "inputs": {file: sha256}, "outputs":
{file: sha256}}; train.py compares it with the current flags and files before any work. `Lock`
keeps a second run out of a folder (released by the OS on kill). A worker process whose parent is
gone writes nothing more (`stop_writing_if_orphaned`, used by ablate.py).
Left out: locking on network file systems, garbage collection of old run folders.
"""
import ast, contextlib, hashlib, io, json, os, signal, threading
import torch

from errors import RunError


@contextlib.contextmanager
def _hold_ctrl_c():
    """Ctrl-C is held until the file is whole, then raised: torch.save's C++ writer, interrupted
    mid-write, raises a RuntimeError ("unexpected pos"), not KeyboardInterrupt, and the run would
    die with a traceback."""
    # Off the main thread, or where SIGINT has another handler (e.g. ablate's workers ignore it),
    # nothing is held.
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
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


# Set in ablate.py's workers: the process whose death stops this one before its next write.
_parent = None


def stop_writing_if_orphaned(parent_pid):
    """For a worker process: from now on every write first checks that parent_pid is still this
    process's parent; when it is not (the parent was killed), the process exits at once and writes
    nothing more. Checked now too."""
    global _parent
    _parent = parent_pid
    _check_parent()


def _check_parent():
    if _parent is not None and os.getppid() != _parent:
        # No cleanup that writes: nobody is left to read the results.
        os._exit(1)


def os_error(e):
    """The OSError behind an exception (itself, or what it was raised from or during), or None.
    torch.save's C++ writer turns a full disk into RuntimeError("... unexpected pos ..."), raised
    while the OSError is handled."""
    while e is not None and not isinstance(e, OSError):
        e = e.__cause__ or e.__context__
    return e


def cannot_write(path, e):
    """The one line for a write the disk refused: the path and the cause (no space left, a
    read-only file system, permission denied). Exit code 1: the run itself failed; what was saved
    before is kept."""
    return RunError(f"cannot write {path}: {e.strerror or e} (what was saved before is kept: "
                    "free space or make the folder writable, then the same command goes on from "
                    "there)", 1)


def _atomic(path, write, mode):
    _check_parent()
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        # Ctrl-C here: the new file is written, then the interrupt.
        with _hold_ctrl_c():
            with open(tmp, mode) as f:
                write(f)
                f.flush()
                os.fsync(f.fileno())
            # The rename is atomic on POSIX and Windows: the old file or the new one, never a torn
            # one.
            os.replace(tmp, path)
    except Exception as e:
        if os_error(e) is None:
            raise
        raise cannot_write(path, os_error(e)) from None
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def write_text(path, text):
    _atomic(path, lambda f: f.write(text), "w")


def write_bytes(path, data):
    _atomic(path, lambda f: f.write(data), "wb")


def save_json(path, obj, lines=False):
    """A JSON file, or (lines=True) one JSON object per line."""
    text = "".join(json.dumps(o) + "\n" for o in obj) if lines else json.dumps(obj, indent=1)
    write_text(path, text)


def load_json(path, lines=False):
    try:
        with open(path) as f:
            return [json.loads(line) for line in f] if lines else json.load(f)
    except (OSError, ValueError) as e:
        raise RunError(f"cannot read {path} ({type(e).__name__}): delete it, and the same command "
                       "makes it again")


def _all_finite(obj):
    if isinstance(obj, torch.Tensor):
        return not obj.is_floating_point() or bool(torch.isfinite(obj).all())
    if isinstance(obj, dict):
        return all(_all_finite(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return all(_all_finite(v) for v in obj)
    # Numbers in logs may be NaN; weights may not.
    return True


def save_torch(obj, path):
    """torch.save, atomically; refuses to write a NaN or inf into a checkpoint."""
    if not _all_finite(obj):
        raise RunError(f"refusing to write a non-finite value into {path}: the run diverged "
                       "(lower the lr)", 1)
    _atomic(path, lambda f: torch.save(obj, f), "wb")


def load_torch(path, device="cpu"):
    """torch.load(weights_only=True): plain tensors and containers only. A failure names the
    file."""
    try:
        return torch.load(path, map_location=device, weights_only=True)
    except Exception as e:
        raise RunError(f"cannot load {path} ({type(e).__name__}): delete it, and the same command "
                       "makes it again")


def load_resumable(path, stamp, keys):
    """A checkpoint to go on from: (its contents, None) when `path` holds a dict with every name in
    `keys` made under `stamp` (the same config, inputs and code); else (None, why in a few words):
    missing, damaged (it cannot be read, or lacks what the code writes) or made under another
    stamp. Nothing is deleted here: the stage starts over and overwrites it."""
    if not os.path.exists(path):
        return None, "missing"
    try:
        state = load_torch(path)
    except RunError:
        return None, "damaged: it cannot be read"
    if not isinstance(state, dict) or not set(keys) | {"stamp"} <= set(state):
        return None, "damaged: it lacks what the stage writes"
    if state["stamp"] != stamp:
        return None, "made under another config, inputs or code"
    return state, None


def file_hash(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()[:16]


def _drop_docstrings(tree):
    """The tree without the docstring of its module, classes and functions (a body left empty
    gets `pass`)."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            first = node.body[0] if node.body else None
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
                    and isinstance(first.value.value, str):
                node.body = node.body[1:] or [ast.Pass()]
    return tree


def code_digest(tree):
    """A hash of Python code as the interpreter runs it: the parsed tree without docstrings, so an
    edit of a comment, a docstring or the layout keeps it, and any other edit changes it. `tree`:
    ast.parse's, or a node."""
    text = ast.dump(_drop_docstrings(tree))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def not_a_folder(path):
    """Why `path` is not, and cannot become, a folder (a file there, or a file on the way to it),
    in a few words; None when it is one or can be made. Asked before any work, by every command
    that writes into a folder."""
    if os.path.exists(path):
        return None if os.path.isdir(path) else "is a file, not a folder"
    up = os.path.dirname(os.path.abspath(path))
    while not os.path.exists(up):
        up = os.path.dirname(up)
    return None if os.path.isdir(up) else f"cannot be made ({up} is a file)"


def save_figure(fig, path):
    """A matplotlib figure as a PNG, written whole like every other file."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    write_bytes(path, buf.getvalue())


def remove(path):
    try:
        if os.path.exists(path):
            os.remove(path)
    except OSError as e:
        raise RunError(f"cannot remove {path}: {e.strerror}", 1) from None


def unwritable(folder):
    """Why nothing can be written into `folder` (a read-only file system, permission denied), in a
    few words; None when a file can be made there. Asked before any work by every command that
    writes into a folder."""
    probe = os.path.join(folder, f".write_test{os.getpid()}")
    try:
        os.close(os.open(probe, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        os.remove(probe)
    except OSError as e:
        return e.strerror
    return None


class Lock:
    """An exclusive lock on out_dir/.lock for the life of a run; a second run on the folder stops
    at once. read_only=True (the sample and inspect stages): a folder where the lock cannot be made
    (a read-only file system) is read without it, since no run can write there either."""

    def __init__(self, out_dir, read_only=False):
        self.path = os.path.join(out_dir, ".lock")
        self.read_only = read_only
        self.f = None

    def __enter__(self):
        try:
            self.f = open(self.path, "a+")
        except OSError as e:
            if not self.read_only:
                raise RunError(f"cannot write in {os.path.dirname(self.path) or '.'} "
                               f"({e.strerror}: its lock {self.path}): use a folder this process "
                               "may write, or another --out_dir")
            return self
        try:
            import fcntl
            fcntl.flock(self.f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except ImportError:
            # No fcntl (Windows): run without the lock.
            pass
        except OSError:
            self.f.close()
            raise RunError(f"another run is using {os.path.dirname(self.path) or '.'} (its lock "
                           f"{self.path} is held): wait for it, or use another --out_dir")
        return self

    def __exit__(self, *exc):
        # Closing the file releases the lock.
        if self.f is not None:
            self.f.close()
        return False


# ---- stage records ----
def records_path(out_dir):
    return os.path.join(out_dir, "stages.json")


def damaged_record(rec):
    """Why `rec` is not a record as make_record writes it, in a few words; None when it is one."""
    if not isinstance(rec, dict):
        return f"a {type(rec).__name__}, not a record"
    for part in ("config", "inputs", "outputs"):
        if not isinstance(rec.get(part), dict):
            return f"no {part}"
    if not isinstance(rec.get("defaults", {}), dict) or not isinstance(rec.get("code", {}), dict):
        return "its defaults or code are not a mapping"
    hashes = list(rec["inputs"].values()) + list(rec["outputs"].values())
    if not all(isinstance(h, str) for h in hashes):
        return "a hash that is not a string"
    return None


def load_records(out_dir, notes=None):
    """stages.json's records, {stage: record}. A record that cannot be read, or that does not have
    the shape make_record writes, is left out, as if its stage had not run (the stage is redone);
    each such one adds a line to `notes` when given. Nothing is deleted here."""
    p = records_path(out_dir)
    if not os.path.exists(p):
        return {}
    notes = [] if notes is None else notes
    try:
        records = load_json(p)
    except RunError:
        notes.append(f"{p} cannot be read: every stage is redone")
        return {}
    if not isinstance(records, dict):
        notes.append(f"{p} holds a {type(records).__name__}, not records: every stage is redone")
        return {}
    kept = {}
    for name, rec in records.items():
        why = damaged_record(rec)
        if why:
            notes.append(f"{p}: the record of stage {name} is damaged ({why}): it is redone")
        else:
            kept[name] = rec
    return kept


def make_record(out_dir, config, inputs, outputs, defaults=None, code=None):
    """The record of a finished stage: its config, the hashes of its input and output files and,
    as the list of fields the code knew, each field's code default, and the hash of each piece of
    code it ran. Every output named must exist (a stage that did not make one is not finished:
    RunError)."""
    missing = [n for n in outputs if not os.path.exists(os.path.join(out_dir, n))]
    if missing:
        raise RunError(f"{', '.join(missing)} was not made in {out_dir}: the stage is not "
                       "finished", 1)
    rec = dict(config=config, inputs={n: file_hash(os.path.join(out_dir, n)) for n in inputs},
               outputs={n: file_hash(os.path.join(out_dir, n)) for n in outputs})
    if defaults is not None:
        rec["defaults"] = defaults
    if code is not None:
        rec["code"] = code
    return rec


def outputs_intact(out_dir, record, expected=()):
    """True when every output the record names, and every one in `expected`, exists with the hash
    the stage wrote."""
    if not set(expected) <= set(record["outputs"]):
        return False
    for n, h in record["outputs"].items():
        p = os.path.join(out_dir, n)
        if not os.path.exists(p) or file_hash(p) != h:
            return False
    return True


def first_difference(record, stamp):
    """The first way a stamp (current config and input hashes) differs from a record, in words;
    None if none.
    - A field the record holds that the stage does not take (a flag removed or renamed since): a
      difference.
    - A field the record lacks but whose default it lists: a damaged record, a difference.
    - A field the record lacks and does not list was added to the code after the record was made.
      The code it was made with behaved as the field's default does (the rule for a new field), so
      it matches at that default (stamp["defaults"]) and only there: adding a flag keeps finished
      work, and using it does not."""
    for k, v in record["config"].items():
        if k not in stamp["config"]:
            return f"--{k}={v}, a flag this code's stage does not take"
    for k, v in stamp["config"].items():
        if k not in record["config"]:
            if k in record.get("defaults", {}):
                return f"no --{k} in its record (damaged), now --{k}={v}"
            if k in stamp.get("defaults", {}) and stamp["defaults"][k] == v:
                continue
            return f"no --{k}, now --{k}={v}"
        if record["config"][k] != v:
            return f"--{k}={record['config'][k]}, now --{k}={v}"
    for n, h in stamp["inputs"].items():
        if record["inputs"].get(n) != h:
            return f"another {n} (it has changed since)"
    return None


def code_difference(record, stamp):
    """The first project file (or function) whose code differs between the record and the stamp,
    or None. A record made before records held code counts as made by other code."""
    for n, h in stamp.get("code", {}).items():
        if record.get("code", {}).get(n) != h:
            return n
    return None


def plan(stages, target, out_dir, records, stamp_of, outputs_of, say=print):
    """Which stages to run, in order, for `target` ("all" or a stage name); and which finished ones
    are kept. With "all": a stage runs when its outputs (outputs_of(stage), under this config) are
    missing or damaged, and then every later stage runs too. With a name: that stage runs, and
    every earlier one must be finished. A finished stage that is kept must have been made with the
    current config and inputs: else RunError, before anything is written."""
    todo, kept = [], []
    for st in stages:
        rec = records.get(st.name)
        intact = rec is not None and outputs_intact(out_dir, rec, outputs_of(st))
        # An edit of the code a finished stage ran is never kept silently: with "all", that stage
        # is redone.
        edited = code_difference(rec, stamp_of(st)) if intact else None
        if edited and target == "all":
            if not todo:
                say(f"---- stage {st.name}: its code changed since it was made ({edited}): "
                    "redone ----")
            intact = False
        elif edited and target != st.name:
            raise RunError(f"stage {st.name} in {out_dir} was made by other code ({edited} "
                           "changed since): python train.py redoes it and what follows (or "
                           f"--stage={st.name})")
        # Once one stage runs, every later one is made again.
        if target == st.name or (target == "all" and (todo or not intact)):
            todo.append(st)
            if target == st.name:
                break
            continue
        if not intact:
            raise RunError(f"stage {target} needs stage {st.name}'s outputs in {out_dir}: run "
                           f"--stage={st.name} first (or every stage: no --stage)")
        diff = first_difference(rec, stamp_of(st))
        if diff:
            raise RunError(f"stage {st.name} in {out_dir} was made with {diff}: add --fresh to "
                           f"redo every stage, --stage={st.name} to redo it and what follows, or "
                           "use another --out_dir")
        kept.append(st.name)
    return todo, kept
