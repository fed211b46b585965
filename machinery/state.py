"""Resumable state: model checkpoints, RNG states, the trainable-only load, and the states from
which pretraining and PPO go on after an interruption.

    python train.py     # killed and run again: pretraining and PPO go on where they stopped
    python -m pytest -q tests/test_state.py   # killed and resumed: an uninterrupted run's numbers

A checkpoint (pretrain.pt, ref.pt, actor.pt) is a GPT's config and weights, written atomically
(store.py) and loaded with weights_only=True onto the chosen device. A resumable state
(pretrain_ckpt.pt, ppo_state.pt) also holds the optimizers, the generators, every torchrun rank's
RNG states and the stamp it was made under: a state under another stamp (config, inputs or code)
is never resumed. RNG states are kept on the CPU.
Left out: sharded checkpoints, resuming the preferences and reward stages half way.
"""
from dataclasses import asdict
import torch

from machinery import dist, store

# What pretrain_ckpt.pt and ppo_state.pt hold besides their stamp.
PRETRAIN_STATE = ["iter", "model", "opt", "gen", "rng", "log", "seconds", "skipped"]
PPO_STATE = ["iter", "actor", "critic", "opts", "skipped", "kl_ctl", "prompt_gen", "rng",
             "pen_ref", "rollback", "metrics"]


def rng_states():
    """Torch's CPU and CUDA generator states, for a resumable state."""
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []
    return dict(torch=torch.get_rng_state(), cuda=cuda)


def set_rng_states(s):
    torch.set_rng_state(s["torch"])
    if s["cuda"]:
        torch.cuda.set_rng_state_all(s["cuda"])


def trainable_state(model):
    """Clones of the parameters an optimizer moves (all of them for a full actor; adapters or top
    blocks else)."""
    return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


def load_trainable(model, state):
    """Loads the trainable parameters only: frozen ones (the reference's) never come from a
    checkpoint."""
    names = {n for n, p in model.named_parameters() if p.requires_grad}
    model.load_state_dict({k: v for k, v in state.items() if k in names}, strict=False)


# ---- pretraining ----
def save_pretrain_state(path, stamp, it, model, opt, gen, log, seconds, skipped):
    """pretrain_ckpt.pt after iteration `it`. Every rank calls it (the RNG states are gathered);
    rank 0 writes."""
    states = dist.gather_objects((gen.get_state(), rng_states()))
    if dist.is_main():
        store.save_torch(dict(stamp=stamp, iter=it, model=model.state_dict(),
                              opt=opt.state_dict(), gen=dist.unzip(states, 0),
                              rng=dist.unzip(states, 1), log=log, seconds=seconds,
                              skipped=skipped), path)


def load_pretrain_state(path, stamp, model, opt, gen, guard):
    """A state made under `stamp` back into model, opt, gen, guard and the RNGs. Returns
    (iteration, log, seconds) to go on from; (0, [], 0.0) to start over."""
    s, why = store.load_resumable(path, stamp, PRETRAIN_STATE)
    if s is None:
        if why != "missing":
            print(f"pretrain: {path} is {why}; starting over")
        return 0, [], 0.0
    model.load_state_dict(s["model"])
    opt.load_state_dict(s["opt"])
    gen.set_state(dist.mine(s["gen"], path))
    set_rng_states(dist.mine(s["rng"], path))
    guard.skipped = s["skipped"]
    print(f"pretrain: resuming from {path} after iteration {s['iter']}")
    return s["iter"], s["log"], s["seconds"]


# ---- PPO ----
def save_ppo_state(path, stamp, it, metrics, actor, critic, opts, guards, kl_ctl, gens, anchor,
                   rollback):
    """ppo_state.pt after iteration `it`: what a resumed run needs to end as an uninterrupted
    one. gens: (prompt generator, ptx generator). Every rank calls it; rank 0 writes."""
    prompt_gen, ptx_gen = gens
    rng = dist.gather_objects(dict(rng_states(), ptx=ptx_gen.get_state()))
    if not dist.is_main():
        return
    store.save_torch(dict(stamp=stamp, iter=it, actor=actor.state_dict(),
                          critic=None if critic is None else critic.state_dict(),
                          opts=[o.state_dict() for o in opts], skipped=[g.skipped for g in guards],
                          kl_ctl=asdict(kl_ctl), prompt_gen=prompt_gen.get_state(), rng=rng,
                          pen_ref=anchor.state_dict(),
                          rollback=None if rollback is None else rollback.state_dict(),
                          metrics=metrics), path)


def load_ppo_state(path, stamp, log, actor, critic, opts, guards, kl_ctl, gens, anchor, rollback):
    """A state made under `stamp` back into everything PPO trains and draws from. Returns
    (metrics so far, iteration to go on from); ([], 0) to start over."""
    s, why = store.load_resumable(path, stamp, PPO_STATE)
    if s is None:
        if why != "missing":
            log(f"ppo: {path} is {why}; starting over")
        return [], 0
    prompt_gen, ptx_gen = gens
    # Frozen weights come from ref.pt, not from the state.
    load_trainable(actor, s["actor"])
    if critic is not None:
        critic.load_state_dict(s["critic"])
    for o, sd in zip(opts, s["opts"]):
        o.load_state_dict(sd)
    for g, n in zip(guards, s["skipped"]):
        g.skipped = n
    # The β controller's fields, as kl.load_controller sets them.
    for k, v in s["kl_ctl"].items():
        setattr(kl_ctl, k, v)
    anchor.load_state_dict(s["pen_ref"], actor)
    if rollback is not None:
        rollback.load_state_dict(s["rollback"])
    prompt_gen.set_state(s["prompt_gen"])
    # torchrun: this rank's streams.
    rng = dist.mine(s["rng"], path)
    set_rng_states(rng)
    ptx_gen.set_state(rng["ptx"])
    log(f"ppo: resuming from {path} after iteration {s['iter']}")
    return s["metrics"], s["iter"]


# ---- DPO ----
DPO_STATE = ["iter", "actor", "opt", "skipped", "gen", "order", "rng", "metrics"]


def save_dpo_state(path, stamp, step, metrics, actor, opt, guard, gen, order):
    """dpo_state.pt after `step`: the actor's trainable part, its optimizer, the batch (online: the
    prompts') generator and this epoch's permutation, the RNG states (online DPO samples), the
    metrics so far."""
    store.save_torch(dict(stamp=stamp, iter=step, actor=trainable_state(actor),
                          opt=opt.state_dict(), skipped=guard.skipped, gen=gen.get_state(),
                          order=order, rng=rng_states(), metrics=metrics), path)


def load_dpo_state(path, stamp, log, actor, opt, guard, gen):
    """A state made under `stamp` back into actor, opt, guard and gen. Returns (metrics so far,
    step to go on from, this epoch's permutation); ([], 0, None) to start over."""
    s, why = store.load_resumable(path, stamp, DPO_STATE)
    if s is None:
        if why != "missing":
            log(f"dpo: {path} is {why}; starting over")
        return [], 0, None
    load_trainable(actor, s["actor"])
    opt.load_state_dict(s["opt"])
    guard.skipped = s["skipped"]
    gen.set_state(s["gen"])
    set_rng_states(s["rng"])
    log(f"dpo: resuming from {path} after step {s['iter']}")
    return s["metrics"], s["iter"], s["order"]
