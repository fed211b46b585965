"""Data parallelism under torchrun: the few helpers every stage uses, and nothing else.

    # 2 processes (gloo on CPU, nccl on CUDA)
    torchrun --standalone --nproc_per_node=2 train.py --preset=smoke
    # 1 process: every helper is a no-op
    python train.py

torchrun starts N copies of train.py and sets RANK, LOCAL_RANK and WORLD_SIZE. Each rank trains on
its own share of every batch (pretraining windows, reward-model pairs, PPO rollouts); after each
backward `average_gradients` leaves every rank with the mean gradient of all ranks, which is what
DistributedDataParallel does, so the replicas stay identical. Rank 0 alone prints, writes files and
runs the stages that do not train (world, reference, preferences, report); the other ranks wait at
a barrier. Every collective here must be reached by every rank in the same order: a decision that
could differ between ranks (skip a non-finite step) is itself all-reduced first.
Why not the DistributedDataParallel wrapper: it averages gradients only for what runs through its
forward(), and the PPO update reaches the actor and the critic through hidden()/lm_head/from_hidden
(only the response positions, one forward for both log-probs and entropy); routing that through
forward() would change ppo.py's and model.py's interfaces for every reader. One flat all-reduce per
optimizer step in StepGuard covers every stage in one place.
Left out: overlapping the all-reduce with backward (DDP's buckets), multi-node rendezvous, sharded
optimizers.
"""
import os, sys
import torch
import torch.distributed as td

from machinery.errors import RunError

# Where numbers are reduced: nccl reduces CUDA tensors only.
DEVICE = "cpu"


def world():
    """Number of processes (1 without torchrun). Read from the environment, so it is known before
    any stage."""
    return int(os.environ.get("WORLD_SIZE", 1))


def check_divisible(sizes):
    """Why the processes cannot share these batches equally ({flag name: batch size}), in one line;
    None when they can (train.py's parse calls it: each rank takes an equal share of every
    batch)."""
    n = world()
    for name, v in sizes.items():
        if v % n:
            return (f"--{name}={v} is not divisible by the {n} processes torchrun started "
                    f"(--nproc_per_node)")
    return None


def rank():
    return int(os.environ.get("RANK", 0))


def is_main():
    return rank() == 0


def active():
    return td.is_available() and td.is_initialized() and td.get_world_size() > 1


def init(device):
    """Under torchrun: join the process group (nccl on CUDA, gloo on CPU), pin this rank to its GPU,
    and silence stdout on ranks other than 0. Returns the device this rank uses. Without torchrun:
    the device, unchanged."""
    global DEVICE
    if world() == 1:
        return device
    if device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        device = f"cuda:{torch.cuda.current_device()}"
    if not td.is_initialized():
        td.init_process_group("nccl" if device.startswith("cuda") else "gloo")
    DEVICE = device
    if not is_main():
        # One log, rank 0's; errors still reach stderr.
        sys.stdout = open(os.devnull, "w")
    return device


def close():
    if active():
        td.destroy_process_group()


def barrier():
    if active():
        td.barrier()


def seed_rank(seed):
    """A different sampling stream per rank (after the replicas were built identically from one
    seed)."""
    if world() > 1:
        torch.manual_seed(seed + 1000003 * rank())


def all_reduce(x, op="sum"):
    """x (a tensor, or a number) reduced over every rank: sum, mean, max or min. A tensor is reduced
    in place."""
    if not torch.is_tensor(x):
        if not active():
            return x
        t = torch.tensor(float(x), dtype=torch.float64, device=DEVICE)
        return all_reduce(t, op).item()
    if active():
        td.all_reduce(x, {"sum": td.ReduceOp.SUM, "mean": td.ReduceOp.SUM, "max": td.ReduceOp.MAX,
                          "min": td.ReduceOp.MIN}[op])
        if op == "mean":
            x /= td.get_world_size()
    return x


def all_ranks(flag):
    """True when flag is true on every rank: a decision every rank then takes alike."""
    return bool(all_reduce(1.0 if flag else 0.0, "min")) if active() else flag


def average_gradients(params):
    """After backward: every rank's .grad becomes the mean over ranks, in one flat all-reduce (DDP's
    arithmetic). A parameter without a gradient counts as zero, so every rank sends a vector of the
    same length."""
    if not active():
        return
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    flat = torch.cat([p.grad.reshape(-1) for p in params])  # (sum of parameter sizes,)
    all_reduce(flat, "mean")
    for p, g in zip(params, flat.split([p.numel() for p in params])):
        p.grad.copy_(g.view_as(p))


def broadcast_object(obj):
    """Rank 0's obj on every rank (any picklable value)."""
    if not active():
        return obj
    box = [obj]
    td.broadcast_object_list(box, src=0)
    return box[0]


def gather_objects(obj):
    """[rank 0's obj, rank 1's, ...] on every rank; without torchrun obj itself (no list)."""
    if not active():
        return obj
    out = [None] * td.get_world_size()
    td.all_gather_object(out, obj)
    return out


def mine(gathered, name):
    """This rank's entry of what gather_objects saved into the file `name`. RunError when another
    number of processes saved it: no rank could get its own random streams back."""
    n = len(gathered) if isinstance(gathered, list) else 1
    if n != world():
        raise RunError(f"{name} was saved by {n} process(es): resume it with as many, or delete it")
    return gathered[rank()] if isinstance(gathered, list) else gathered


def unzip(gathered, i):
    """Field i of each rank's tuple in what gather_objects returned (the tuple's field itself in 1
    process)."""
    return [g[i] for g in gathered] if isinstance(gathered, list) else gathered[i]


def reduce_row(row, same=(), summed=(), maxed=()):
    """A metrics row of this rank's numbers -> the row over all ranks: the mean (each rank holds an
    equal share of the batch), except keys in `summed` (sum), `maxed` (max) and `same` (equal on
    every rank by construction)."""
    if not active():
        return row
    keys = [k for k in row if k not in same]
    for op, group in (("sum", [k for k in keys if k in summed]),
                      ("max", [k for k in keys if k in maxed]),
                      ("mean", [k for k in keys if k not in summed and k not in maxed])):
        if group:
            numbers = [float(row[k]) for k in group]
            values = torch.tensor(numbers, dtype=torch.float64, device=DEVICE)
            v = all_reduce(values, op)
            row.update(zip(group, v.tolist()))
    return row
