"""TensorBoard's view of the stages' logs: with --log_to=tensorboard every row a stage appends to
its JSONL (pretrain_metrics.jsonl, reward_metrics.jsonl, metrics.jsonl, dpo_metrics.jsonl) is also
written, as it is made, as TensorBoard scalars in the run's folder under tb/STAGE/.

    python train.py --log_to=tensorboard
    tensorboard --logdir out/tb          # then open http://localhost:6006

A tag is the JSONL's own key ("objective/kl_exact", "loss"); the step is the row's "iter" or
"step"; values that are not numbers are skipped. The JSONL stays the record: the events are a
view of it, written by one call (`write`) where each stage appends a row. A stage that starts over
removes its old events (with the flag off too); a resumed one writes only the rows of its own
process, and tells TensorBoard to hide what the killed process wrote past the state it resumes
from (purge_step), so each step shows once. Under torchrun rank 0 alone writes.
Left out: histograms, images, text and hparams; the rows of a stage made before the flag was on
(lab/plot.py draws any JSONL); other loggers (wandb, MLflow).
"""
import glob, os

from machinery import dist, store


def open_log(log_to, folder, stage, first=1):
    """A writer for `stage`'s rows into folder/tb/stage/, from step `first` on; None when log_to
    is "none", and on every rank but 0. first == 1: the stage starts over, and the events a former
    run of it left there are removed, the flag on or off (they would show a log that is gone).
    first > 1: a resumed stage; TensorBoard hides the events of step first and later that an
    earlier process wrote."""
    if not dist.is_main():
        return None
    where = os.path.join(folder, "tb", stage)
    if first <= 1:
        for old in glob.glob(os.path.join(where, "events.out.tfevents.*")):
            store.remove(old)
    if log_to == "none":
        return None
    # Imported here: the project runs without tensorboard (config.check refuses the flag then).
    from torch.utils.tensorboard import SummaryWriter
    return SummaryWriter(where, purge_step=first if first > 1 else None)


def is_number(value):
    """A value `write` writes: an int or a float (NaN and infinities too), not a bool."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def write(writer, row, step_key):
    """Every number of `row` but row[step_key] as a scalar tagged by its key, at step
    row[step_key], on disk at once (live); nothing without a writer."""
    if writer is None:
        return
    step = row[step_key]
    for key, value in row.items():
        if key != step_key and is_number(value):
            writer.add_scalar(key, value, step)
    writer.flush()


def close(writer):
    if writer is not None:
        writer.close()

