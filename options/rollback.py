"""The KL rollback (`--kl_max`): a rollout too far from the reference brings back the last state
under the limit, with β raised, and the rollout is redone from there.

    python train.py --kl_max=8       # no rollout ends more than about 8 nats from π_ref
    python -m pytest -q tests/test_ref.py

`Rollback` keeps the last state whose rollout was under kl_max: the actor's trainable part, the
critic, both optimizers, the β controller, and a moving anchor (it moved with the actor, so it
comes back with it). PPO makes one call per iteration, `guard`: it asks `above(kl)` of the
iteration's first rollout, calls `restore` when it is above (β x rollback_beta_factor, again at
each restore) and redoes the rollout; a rollout under the limit is kept (`keep_if_under`). A run
stops with one line where a restore cannot help: the first rollout is above (there is no state
yet), or one state was restored rollback_max_in_row times in a row (β alone cannot hold an update
whose own step leaves kl_max; at π_θ = π_ref the KL's gradient is 0).
--stop_kl=K is early stopping with the reference as its yardstick: the same kept state, restored
once with β unchanged, and PPO stops there (`stops`), so the actor saved and evaluated is the last
one whose rollout was at most K nats from π_ref. With β = 0 it is early stopping at a KL budget.
Left out: rolling back several states, lowering the learning rate instead of raising β.
"""
import copy
from dataclasses import asdict, dataclass, replace

from kl import load_controller
from machinery import dist
from machinery.config import arg
from machinery.errors import RunError
from machinery.state import load_trainable, trainable_state


@dataclass
class RollbackConfig:
    kl_max: float = arg(0.0, ">=0", "rollback when a rollout's exact KL to the reference exceeds "
                        "this (nats/sequence; 0 = off; a first rollout above it stops the run, "
                        "exit 2)")
    rollback_beta_factor: float = arg(2.0, ">0", "β is multiplied by this at each rollback")
    stop_kl: float = arg(0.0, ">=0", "stop PPO at the first rollout whose exact KL to the "
                         "reference exceeds this, keeping the last actor under it (nats/sequence;"
                         " 0 = off): the reference as a yardstick only")
    rollback_max_in_row: int = arg(5, ">0", "stop the run after this many rollbacks in a row to "
                                   "one state (more β cannot hold an update whose own step "
                                   "leaves kl_max)")


def check(cfg):
    """Why cfg.rollback's values cannot work, in one line; None when they can (train.parse)."""
    factor = cfg.rollback.rollback_beta_factor
    if factor < 1:
        return f"bad value for --rollback_beta_factor: {factor} (must be >= 1: β never falls)"
    if cfg.rollback.stop_kl and cfg.rollback.kl_max:
        return "--stop_kl and --kl_max both go back to a state under a KL: choose one"
    return None


def clone(state):
    return {k: v.clone() for k, v in state.items()}


def make_rollback(cfg, actor, critic, opts, kl_ctl, anchor):
    """A Rollback guarding the run's actor, critic (None: grpo, rloo), optimizers, β controller and
    anchor: for --kl_max > 0, or for --stop_kl > 0 (the limit is stop_kl and a restore leaves β as
    it was: the run stops there); None when both are off."""
    guarded = (actor, critic, opts, kl_ctl, anchor)
    if cfg.stop_kl:
        limit = replace(cfg, kl_max=cfg.stop_kl, rollback_beta_factor=1.0)
        return Rollback(limit, guarded, stops=True)
    if not cfg.kl_max:
        return None
    return Rollback(cfg, guarded)


def guard(limit, it, batch, info, redo):
    """PPO's one call: iteration it's rollout (batch, info: ppo.make_experience's), judged by
    `limit` (None: off). Above the limit, the last state under it comes back (β raised) and
    `redo()` makes the rollout and its experience again from there; --stop_kl stops instead:
    (None, None). A rollout under the limit becomes the state to come back to. info gains
    kl_before_rollback, the mean exact KL of the rollout first judged (torchrun: one decision for
    all ranks)."""
    kl_first = info["kl_exact"].mean().item()
    if limit is not None and limit.above(dist.all_reduce(kl_first, "mean")):
        limit.restore()
        if limit.stops:
            limit.stopped = (it, kl_first)
            return None, None
        batch, info = redo()
    if limit is not None:
        limit.keep_if_under(dist.all_reduce(info["kl_exact"].mean().item(), "mean"))
    info["kl_before_rollback"] = kl_first
    return batch, info


class Rollback:
    def __init__(self, cfg, guarded, stops=False):
        # What a restore brings back: (actor, critic, optimizers, β controller, anchor).
        self.actor, self.critic, self.opts, self.kl_ctl, self.anchor = guarded
        # --stop_kl: the first rollout above the limit ends the run after `restore`.
        self.stops = stops
        # --stop_kl, once it has: (the 0-based iteration, its rollout's KL).
        self.stopped = None
        self.kl_max = cfg.kl_max
        self.factor = cfg.rollback_beta_factor
        self.max_in_row = cfg.rollback_max_in_row
        self.state = None
        self.count = 0
        self.in_row = 0

    def above(self, kl):
        """True when a rollout `kl` nats from the reference must be undone; RunError when it
        cannot be."""
        if kl <= self.kl_max:
            # An update stayed under the limit: progress.
            self.in_row = 0
            return False
        flag = "--stop_kl" if self.stops else "--kl_max"
        if self.state is None:
            raise RunError(f"the first rollout is {kl:.3g} nats from the reference, above "
                           f"{flag}={self.kl_max}, so there is no state to return to: raise "
                           f"{flag}, or use --ref=full")
        if self.in_row == self.max_in_row:
            raised = self.factor ** self.in_row
            raise RunError(f"the KL rollback restored one state {self.in_row} times in a row (β x"
                           f"{raised:.3g}) and each update from it left --kl_max={self.kl_max}: "
                           "lower --ppo_lr, raise --kl_max, or allow more with "
                           "--rollback_max_in_row", 1)
        return True

    def stop_line(self):
        """--stop_kl's log line, once a rollout above the limit has ended the run."""
        it, kl = self.stopped
        return (f"ppo: stopped at iteration {it + 1}: its rollout is {kl:.2f} nats from the "
                f"reference, above --stop_kl={self.kl_max}; the actor that made iteration {it}'s "
                "rollout is kept")

    def keep_if_under(self, kl):
        """A rollout `kl` nats from the reference, at most kl_max: its state is the one to come
        back to."""
        if kl > self.kl_max:
            return
        moving = self.anchor.state_dict()
        critic = self.critic
        self.state = dict(actor=trainable_state(self.actor), kl_ctl=asdict(self.kl_ctl),
                          critic=None if critic is None else clone(critic.state_dict()),
                          opts=[copy.deepcopy(o.state_dict()) for o in self.opts],
                          anchor=None if moving is None else clone(moving))

    def restore(self):
        """The kept state back into the models, the optimizers, the controller and the anchor,
        with β (and a linear controller's start and end) x factor."""
        s = self.state
        load_trainable(self.actor, s["actor"])
        if self.critic is not None:
            self.critic.load_state_dict(s["critic"])
        # A copy: the optimizer would update the kept state in place.
        for o, sd in zip(self.opts, s["opts"]):
            o.load_state_dict(copy.deepcopy(sd))
        # The linear controller recomputes `value` from start and end.
        raised = dict(s["kl_ctl"])
        for k in ("value", "start", "end"):
            if k in raised:
                raised[k] = raised[k] * self.factor
        load_controller(self.kl_ctl, raised)
        # The raised β is kept: a second restore to this state raises it again.
        s["kl_ctl"] = asdict(self.kl_ctl)
        self.count += 1
        self.in_row += 1
        # A moving anchor comes back with the actor it moved with (None: the frozen π_ref).
        self.anchor.load_state_dict(s["anchor"], self.actor)

    def state_dict(self):
        return dict(state=self.state, count=self.count, in_row=self.in_row)

    def load_state_dict(self, d):
        self.state = d["state"]
        self.count = d["count"]
        self.in_row = d["in_row"]
