"""Progress while work runs: the time left on the training loops' log lines, and a counter that a
terminal shows in place while an evaluation samples.

    iter 40/500 | loss 3.912 | lr 3.2e-03 | 12.9k tok/s | eta 2m21s      (a line, to any stdout)
    evaluating: 100/200 samples | eta 0m04s                                (a terminal only)

The training loops (pretraining, the reward model, DPO, PPO) print whole lines every few steps
(--log_interval, --rm_log_every, --dpo_log_every, one per PPO iteration), to a terminal, a pipe or a
log file alike. Work that prints nothing else while it runs (the final evaluation, best-of-k,
lab/inspect_page.py's token page) shows a `counter` instead: rewritten in place with a carriage
return, erased once done, and written only when stdout is a terminal, in the main process (not in
lab/ablate.py's workers) and on rank 0 under torchrun. Tests, pipes, CI logs and workers see
nothing of it. Neither reads anything but the clock and counts the caller already has: what a run
computes is the same with or without them.
Left out: progress bars, rates smoothed over a window.
"""
import multiprocessing, os, sys, time


def fmt_time(s):
    """Seconds as `1m23s`, the loops' `eta` format."""
    return f"{int(s // 60)}m{int(s % 60):02d}s"


def eta(t0, done, total):
    """Seconds left when `done` of `total` units took from time t0 to now, at the same pace."""
    return (time.time() - t0) / max(done, 1) * (total - done)


def on_terminal():
    """True when a counter can show: stdout is a terminal, this is the main process (a worker of
    lab/ablate.py's pool shares its parent's terminal) and rank 0 under torchrun (RANK)."""
    main = multiprocessing.parent_process() is None and not int(os.environ.get("RANK", 0))
    return main and sys.stdout.isatty()


def counter(label, done, total, unit, t0):
    """On a terminal, `label: done/total unit | eta 0m12s` in place of the last counter (the time
    left once any unit is done, from t0); erased when done reaches total, so the lines printed
    after it read as they would without a terminal. Elsewhere nothing."""
    if not on_terminal():
        return
    if done >= total:
        # A carriage return, then erase to the end of the line.
        sys.stdout.write("\r\033[K")
    else:
        left = f" | eta {fmt_time(eta(t0, done, total))}" if done else ""
        sys.stdout.write(f"\r{label}: {done}/{total} {unit}{left}\033[K")
    sys.stdout.flush()
