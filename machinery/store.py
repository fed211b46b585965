"""Files on disk that cannot be half-written: atomic writes, loads that name the file, file hashes
and a run lock.

Every file tether writes goes to a temporary name in the same folder and is renamed into place, so
a kill leaves either the old file or the new one, never a torn one (the records of what made each
file are in records.py). `Lock` keeps a second run out of a folder (released by the OS on kill).
A worker process whose parent is gone writes nothing more (`stop_writing_if_orphaned`, used by
lab/ablate.py).
Left out: locking on network file systems, garbage collection of old run folders.
"""
import contextlib, hashlib, io, json, os, re, signal, threading
import torch

from machinery.errors import RunError


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


# Set in lab/ablate.py's workers: the process whose death stops this one before its next write.
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


def not_a_folder(path):
    """Why `path` is not, and cannot become, a folder (a name that is not valid UTF-8, a file
    there, or a file on the way to it), in a few words; None when it is one or can be made. Asked
    before any work, by every command that writes into a folder."""
    # A name of bytes that are not UTF-8 (Python holds them as surrogates) cannot be written into a
    # text file, and reports and records name their folder: refused before the work, not after.
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        return ("is not valid UTF-8: the reports and records written there name their folder "
                "(use a UTF-8 name)")
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


# What a write killed half way leaves (`_atomic`'s temporary name, `unwritable`'s probe).
STRAY = re.compile(r"(.+\.tmp|\.write_test)\d+")


def remove_strays(folder):
    """The files a writer killed half way left in `folder` (FILE.tmpPID, a probe), removed: called
    by the one process that holds the folder's lock, so no writer is alive to own them."""
    for n in os.listdir(folder):
        if STRAY.fullmatch(n) and os.path.isfile(os.path.join(folder, n)):
            remove(os.path.join(folder, n))


class Lock:
    """An exclusive lock on out_dir/.lock for the life of a run; a second run on the folder stops
    at once. Once it is held, what a killed run's writes left half way is removed (remove_strays).
    sample.py, which writes nothing, takes no lock. A command that leaves nothing in out_dir but
    a lock it made (it was refused before any stage wrote) removes that lock on exit, and with
    `made` (the outermost folder it made for out_dir: out_dir itself, or a folder above it) the
    folders it made too."""

    def __init__(self, out_dir, made=None):
        self.path = os.path.join(out_dir, ".lock")
        self.made = made
        self.new = False
        self.f = None

    def __enter__(self):
        self.new = not os.path.exists(self.path)
        try:
            self.f = open(self.path, "a+")
        except OSError as e:
            raise RunError(f"cannot write in {os.path.dirname(self.path) or '.'} "
                           f"({e.strerror}: its lock {self.path}): use a folder this process "
                           "may write, or another --out_dir")
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
        remove_strays(os.path.dirname(self.path) or ".")
        return self

    def __exit__(self, *exc):
        folder = os.path.abspath(os.path.dirname(self.path) or ".")
        # A folder left empty but for the lock this command made: the lock goes while it is still
        # held, so no other run can take it in between.
        try:
            empty = self.f is not None and self.new and os.listdir(folder) == [".lock"]
            if empty:
                os.remove(self.path)
        except OSError:
            # The folder or its lock went meanwhile: nothing of it is this command's to remove.
            empty = False
        # Closing the file releases the lock.
        if self.f is not None:
            self.f.close()
        # Then each folder made on the way, from out_dir up to `made`; rmdir leaves one that
        # another process has written into since.
        unmade = empty and self.made is not None
        while unmade:
            try:
                os.rmdir(folder)
            except OSError:
                break
            unmade = folder != os.path.abspath(self.made)
            folder = os.path.dirname(folder)
        return False
