"""The error every file raises, on the ground floor: it imports nothing of the project, so any
file may use it.

`RunError` is a failure found while running that the user can act on; `die` is bad input, caught
before any work. Both end as one line on stderr, `error: ...`, and an exit code (2: bad input or
stale state, nothing was changed; 1: the run itself failed). Under torchrun every rank finds the
same error; rank 0 alone prints it (`die`). Ctrl-C is one line and exit 130 at any moment of a
command: while it imports torch (`ctrl_c_while_starting`), and anywhere its main lets a
KeyboardInterrupt out (`run_main`).
Not run on its own. Left out: error hierarchies, tracebacks for the user.
"""
import os, signal, sys, time


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


def _stopped_while_starting(signum, frame):
    print("error: interrupted while starting; nothing was done", file=sys.stderr)
    # Nothing to clean up yet: no file is open, no stage has begun.
    os._exit(130)


def ctrl_c_while_starting():
    """For a command, before its imports: a Ctrl-C meanwhile (torch takes seconds to import) is
    one line and exit 130, where Python would print a traceback from inside the import.
    run_main gives Ctrl-C back to Python."""
    signal.signal(signal.SIGINT, _stopped_while_starting)


def run_main(main, argv):
    """A command's main(argv), with Python's own Ctrl-C (a KeyboardInterrupt, which each main
    turns into its own line) and one line, exit 130, for an interrupt that main lets out
    (between its steps, before its try). Exits with main's return value when it is an int."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        code = main(argv)
    except KeyboardInterrupt:
        die("interrupted; what was saved is kept, and the same command goes on from there", 130)
    except BrokenPipeError:
        # The reader of the output has gone (`| head`): nothing more to say, and nowhere to say it.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(0)
    sys.exit(code if isinstance(code, int) else 0)
