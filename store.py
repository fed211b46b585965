"""State on disk that cannot go stale or half-written: atomic writes, loads that name the file, a run lock,
and the stage records that say which config and which input files each output was made from.

Every file tether writes goes to a temporary name in the same folder and is renamed into place, so a kill leaves
either the old file or the new one, never a torn one. `out_dir/stages.json` holds one record per finished stage:
{"config": {field: value}, "inputs": {file: sha256}, "outputs": {file: sha256}}; train.py compares it with the
current flags and files before any work. `Lock` keeps a second run out of a folder (released by the OS on kill).
Left out: locking on network file systems, garbage collection of old run folders.
"""
import hashlib, json, os
import torch

from config import RunError


def _atomic(path, write, mode):
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        with open(tmp, mode) as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)                       # atomic on POSIX and Windows
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
    h = lambda names: {n: file_hash(os.path.join(out_dir, n)) for n in names}
    return dict(config=config, inputs=h(inputs), outputs=h(outputs))


def outputs_intact(out_dir, record):
    """True when every output the record names exists with the hash the stage wrote."""
    return all(os.path.exists(os.path.join(out_dir, n)) and file_hash(os.path.join(out_dir, n)) == h
               for n, h in record["outputs"].items())


def first_difference(record, config, input_hashes):
    """The first way the current config or inputs differ from a record, as words; None when they match."""
    for k, v in config.items():
        if k in record["config"] and record["config"][k] != v:
            return f"--{k}={record['config'][k]}, now --{k}={v}"
        if k not in record["config"]:
            return f"no --{k}, now --{k}={v}"
    for n, h in input_hashes.items():
        if record["inputs"].get(n) != h:
            return f"another {n} (it has changed since)"
    return None
