"""The error every file raises, on the ground floor: it imports nothing of the project, so any file may use it.

`RunError` is a failure found while running that the user can act on; `die` is bad input, caught before any work.
Both end as one line on stderr, `error: ...`, and an exit code (2: bad input or stale state, nothing was changed;
1: the run itself failed). Not run on its own. Left out: error hierarchies, tracebacks for the user.
"""
import sys


class RunError(Exception):
    """A failure the user can act on. train.py and ablate.py print its one line and exit with `code`
    (2: bad input or stale state, nothing was changed; 1: the run itself failed, e.g. diverged)."""

    def __init__(self, msg, code=2):
        super().__init__(msg)
        self.code = code

    def __reduce__(self):                               # keeps the code across ablate.py's worker processes
        return RunError, (str(self), self.code)


def die(msg, code=2):
    print(f"error: {msg}", file=sys.stderr)
    sys.exit(code)
