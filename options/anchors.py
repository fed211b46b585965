"""Moving anchors: the penalty's reference when it is not the frozen π_ref (`--ref_update`).

    python train.py --ref_update=sync --ref_sync_every=10    # TR-DPO's soft update, on a copy
    python -m pytest -q tests/test_anchors.py

The KL penalty is paid to `Anchor.current`, which moves around each update (`Anchor.moving`, the
one call PPO makes):
    frozen   π_ref itself, for the whole run (the default)
    rolling  the previous iteration's policy, a frozen snapshot taken before each update
    sync     a copy of π_ref moved towards the actor every ref_sync_every iterations:
             π_anchor <- α·π_θ + (1-α)·π_anchor (TR-DPO)
    reset    the copy set to the actor every ref_reset_every iterations (ProRL)
The frozen π_ref never changes: sync and reset move a copy, and the final evaluation measures the
KL to π_ref. A moving anchor is saved in ppo_state.pt and brought back by the KL rollback with the
actor it moved with.
Left out: an exponential moving average every iteration (sync with every=1 is one), anchors for
the reward model.
"""
import contextlib
from dataclasses import dataclass
import torch

from ref import Reference
from machinery.config import arg


@dataclass
class AnchorConfig:
    ref_update: str = arg("frozen", help="the penalty's reference: frozen (π_ref), rolling (the "
                          "previous iteration's policy), sync (π_ref <- α·π_θ + (1-α)·π_ref every "
                          "ref_sync_every iterations) or reset (π_ref <- π_θ every ref_reset_every "
                          "iterations)", choices=["frozen", "rolling", "sync", "reset"])
    ref_sync_alpha: float = arg(0.6, "(0,1]", "sync: α, the actor's weight in the new reference "
                                "(TR-DPO)")
    ref_sync_every: int = arg(10, ">0", "sync: iterations between soft updates")
    ref_reset_every: int = arg(20, ">0", "reset: iterations between hard resets to the actor "
                               "(ProRL)")


def check(cfg):
    """Why cfg.anchor's values cannot work, in one line; None when they can (train.parse)."""
    kind, update = cfg.ref.ref, cfg.anchor.ref_update
    if kind != "full" and update != "frozen":
        return (f"--ref_update={update} moves a full copy of the actor: it needs --ref=full, "
                f"not --ref={kind}")
    return None


@torch.no_grad()
def mix(ref, actor, alpha):
    """ref's model <- α·actor + (1-α)·ref's model, tensor by tensor (TR-DPO's soft update); α = 1
    copies the actor exactly."""
    new = dict(actor.named_parameters())
    # Each tensor once: tied embeddings must not be mixed twice.
    for k, v in ref.model.named_parameters():
        if alpha == 1:
            v.copy_(new[k])
        else:
            v.lerp_(new[k].to(v.dtype), alpha)


class Anchor:
    """The penalty's reference: `current` is `frozen` (π_ref) until rolling, sync or reset
    replaces it with a reference of its own."""

    def __init__(self, frozen, cfg):
        self.frozen = frozen
        self.current = frozen
        self.cfg = cfg
        self.snapshot = None

    @contextlib.contextmanager
    def moving(self, actor, it):
        """PPO's one call, around iteration `it`'s update: `before_update`, the update, then
        `after_update` (the frozen π_ref: nothing happens)."""
        self.before_update(actor)
        yield
        self.after_update(actor, it)

    def before_update(self, actor):
        """rolling: this iteration's policy, frozen, to be the next iteration's anchor."""
        if self.cfg.ref_update == "rolling":
            self.snapshot = Reference(actor)

    def after_update(self, actor, it):
        """After iteration `it`'s update: rolling takes its snapshot; sync and reset move their
        copy every N iterations (the first time, a copy of π_ref is made to move)."""
        if self.cfg.ref_update == "rolling":
            self.current = self.snapshot
        every = {"sync": self.cfg.ref_sync_every, "reset": self.cfg.ref_reset_every}
        n = every.get(self.cfg.ref_update)
        if n and (it + 1) % n == 0:
            if self.current is self.frozen:
                self.current = Reference(self.frozen.model)
            alpha = self.cfg.ref_sync_alpha if self.cfg.ref_update == "sync" else 1.0
            mix(self.current, actor, alpha)

    def state_dict(self):
        """The moving anchor's weights; None while it is the frozen π_ref."""
        if self.current is self.frozen:
            return None
        return self.current.model.state_dict()

    def load_state_dict(self, state, actor):
        """Back to a saved anchor (None: the frozen π_ref); a new one is made from `actor`."""
        if state is None:
            self.current = self.frozen
            return
        if self.current is self.frozen:
            self.current = Reference(actor)
        self.current.model.load_state_dict(state)
