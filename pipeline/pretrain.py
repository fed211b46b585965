"""Pretraining: the GPT learns the generated world's reviews by next-token prediction.

    python train.py --stage=pretrain        # the loop below, then samples judged by the gold scorer
    python train.py --optimizer=adamw --max_iters=900   # AdamW instead of Muon (optim.py)

`train_gpt` is nanoGPT's loop: random windows of block_size + 1 tokens from train.bin, Muon + AdamW
(or AdamW alone) with linear warmup and a cosine to min_lr, a gradient clip, and every eval_interval
iterations a validation loss and a resumable state (state.py), so an interrupted run goes on where
it stopped. Every log_interval iterations, and at each evaluation, a line: loss, tokens per second,
the time left. Under torchrun each rank trains on its share of batch_size, from its own windows.
Left out: gradient accumulation, learning-rate finding, data loaders with workers.
"""
from dataclasses import dataclass, replace
import time
import numpy as np
import torch

import data
from model import GPT
from machinery import dist, optim, state, tblog
from machinery.config import arg
from machinery.progress import fmt_time


@dataclass
class PretrainConfig:
    # Muon reaches the quality bar in 500 iterations; AdamW needs 900 (answers/tokens-flops-trl.md).
    max_iters: int = arg(500, ">0")
    batch_size: int = arg(32, ">0")
    lr: float = arg(4e-3, ">0", "peak learning rate (warmup, then cosine to min_lr)")
    min_lr: float = arg(4e-4, ">=0", "the cosine's floor (--optimizer=muon: Muon's floor is "
                        "muon_lr x min_lr / lr)")
    warmup_iters: int = arg(50, ">=0")
    weight_decay: float = arg(0.1, ">=0", "AdamW's decoupled weight decay (on every parameter "
                              "AdamW trains)")
    optimizer: str = arg("muon", help="muon: Muon on the blocks' 2-D weight matrices, AdamW "
                         "(--lr, --weight_decay) on the rest; adamw: AdamW on every parameter "
                         "(with --max_iters=900 it meets the same bar; optim.pretrain_optimizer)",
                         choices=["adamw", "muon"])
    muon_lr: float = arg(0.02, ">0", "--optimizer=muon: Muon's peak lr (Keller Jordan's 0.02; the "
                         "update is scaled by sqrt(max(1, rows/cols)) per matrix), on the same "
                         "warmup + cosine as --lr")
    muon_momentum: float = arg(0.95, "[0,1)", "--optimizer=muon: Muon's Nesterov momentum")
    muon_weight_decay: float = arg(0.01, ">=0", "--optimizer=muon: Muon's decoupled weight decay "
                                   "(a step shrinks by muon lr x this; Keller Jordan's example "
                                   "uses 0.01)")
    grad_clip: float = arg(1.0, ">0")
    eval_interval: int = arg(100, ">0", "iterations between validation losses and resumable "
                             "checkpoints")
    # About 0.3 s an iteration at the default on 2 cores (153 s for 500, README): a line every 3 s.
    log_interval: int = arg(10, ">0", "iterations between log lines (loss, tokens/s, eta; each "
                            "evaluation prints one too); display only, the run computes the same")
    eval_iters: int = arg(10, ">0", "validation batches per estimate")
    n_samples: int = arg(200, "[1,100000]", "samples for the well-formed rate and gold score")
    compile: bool = arg(False, help="torch.compile the model for pretraining (fixed shapes: it "
                        "pays there; PPO's shapes change every step, so the other stages run "
                        "eagerly)")


def log_line(row, max_iters, lr, speed, eta):
    """The line printed every log_interval iterations and at each evaluation (with `val`): loss,
    learning rate, thousands of tokens per second and the time left."""
    val = f" | val {row['val_loss']:.3f}" if "val_loss" in row else ""
    return (f"iter {row['iter']}/{max_iters} | loss {row['loss']:.3f}{val} | lr {lr:.1e} | "
            f"{speed:.1f}k tok/s | eta {fmt_time(eta)}")


def train_gpt(cfg, stamp, n_vocab, bins, ckpt_path):
    """A GPT of cfg.gpt (vocabulary n_vocab) trained on the token files bins = {"train": path,
    "val": path}; resumes from ckpt_path when its stamp matches. Returns (model, log: a row per
    step, with the validation loss every eval_interval, seconds, skipped updates)."""
    run, pt = cfg.run, cfg.pretrain
    gcfg = replace(cfg.gpt, vocab_size=n_vocab)
    splits = {k: np.memmap(p, dtype=np.uint16, mode="r") for k, p in bins.items()}
    # torchrun: each rank its own windows, and its share of the batch.
    gen = torch.Generator().manual_seed(run.seed + 1000003 * dist.rank())
    batch_size = pt.batch_size // dist.world()

    def get_batch(split):
        # Random windows of block_size + 1 tokens: (B, T) inputs, (B, T) targets.
        return data.windows(splits[split], batch_size, gcfg.block_size, gen, run.device)

    @torch.no_grad()
    def val_loss():
        model.eval()
        losses = [model(*get_batch("val"))[1].item() for _ in range(pt.eval_iters)]
        model.train()
        # torchrun: over every rank's batches.
        return dist.all_reduce(float(np.mean(losses)), "mean")

    # The same model on every rank (one seed), then each rank its own dropout.
    model = GPT(gcfg).to(run.device)
    dist.seed_rank(run.seed)
    # Fixed shapes: compiled once.
    fwd = torch.compile(model) if pt.compile else model
    opt = optim.pretrain_optimizer(model, pt, run.dtype)
    guard = optim.StepGuard("pretraining")
    start, log, seconds = state.load_pretrain_state(ckpt_path, stamp, model, opt, gen, guard)
    tokens = pt.batch_size * gcfg.block_size
    print(f"pretrain: {model.num_params() / 1e6:.2f}M parameters, {pt.max_iters} iters of "
          f"{pt.batch_size}x{gcfg.block_size} tokens")
    model.train()
    t0 = time.time() - seconds
    # --log_to=tensorboard: this process's rows, as they come, in out_dir/tb/pretrain/ too.
    board = tblog.open_log(run.log_to, run.out_dir, "pretrain", start + 1)
    for it in range(start, pt.max_iters):
        # AdamW's lr is the one logged; every group follows the schedule from its own peak.
        lr = optim.scheduled_lr(it, pt, pt.lr, pt.min_lr)
        for g in opt.param_groups:
            g["lr"] = optim.scheduled_lr(it, pt, g["peak_lr"], g["min_lr"])
        _, loss = fwd(*get_batch("train"))
        guard.backward_and_step(loss, opt, list(model.parameters()), pt.grad_clip)
        # One row per step (pretrain_metrics.jsonl); an evaluation adds the validation loss.
        row = dict(iter=it + 1, loss=dist.all_reduce(loss.item(), "mean"), lr=lr,
                   elapsed=time.time() - t0)
        log.append(row)
        evaluated = (it + 1) % pt.eval_interval == 0 or it + 1 == pt.max_iters
        if evaluated:
            row["val_loss"] = val_loss()
        tblog.write(board, row, "iter")
        # The line reads what this step computed already: no draw, no evaluation of its own.
        if evaluated or (it + 1) % pt.log_interval == 0:
            dt = time.time() - t0
            speed = (it + 1 - start) * tokens / (dt - seconds) / 1e3
            eta = (dt - seconds) / (it + 1 - start) * (pt.max_iters - it - 1)
            print(log_line(row, pt.max_iters, lr, speed, eta), flush=True)
        if evaluated:
            state.save_pretrain_state(ckpt_path, stamp, it + 1, model, opt, gen, log, dt,
                                      guard.skipped)
    tblog.close(board)
    return model, log, time.time() - t0, guard.skipped
