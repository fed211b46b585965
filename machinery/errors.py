"""The error every file raises, on the ground floor: it imports nothing of the project, so any
file may use it.

`RunError` is a failure found while running that the user can act on; `die` is bad input, caught
before any work. Both end as one line on stderr, `error: ...`, and an exit code (2: bad input or
stale state, nothing was changed; 1: the run itself failed). Under torchrun every rank finds the
same error; rank 0 alone prints it (`die`).
Not run on its own. Left out: error hierarchies, tracebacks for the user.
"""
import os, sys, time


class RunError(Exception):
    """A failure the user can act on. train.py and lab/ablate.py print its one line and exit with
    `code` (2: bad input or stale state, nothing was changed; 1: the run itself failed, e.g.
    diverged)."""

    def __init__(self, msg, code=2):
        super().__init__(msg)
        self.code = code

    # Keeps the code across lab/ablate.py's worker processes.
    def __reduce__(self):
        return RunError, (str(self), self.code)


# Seconds a rank other than 0 waits, silent, for torchrun to stop it after rank 0's line.
RANK0_GRACE = 10.0


def die(msg, code=2):
    """One line on stderr and exit `code`. Under torchrun (RANK set, read here: dist.py stands on
    this file) a rank other than 0 stays silent and waits: rank 0 prints the line and exits, and
    torchrun then stops the other ranks. Exiting at once instead could let torchrun stop rank 0
    before its line is out. Should rank 0 not stop within RANK0_GRACE seconds (an error only this
    rank met), this rank prints its own line."""
    if int(os.environ.get("RANK", 0)):
        time.sleep(RANK0_GRACE)
    print(f"error: {msg}", file=sys.stderr)
    sys.exit(code)
