"""The KL rollback (`--kl_max`): a rollout too far from the reference brings back the last state
under the limit, with β raised, and the rollout is redone from there.

    python train.py --kl_max=8       # no rollout ends more than about 8 nats from π_ref
    python -m pytest -q tests/test_rollback.py

`Rollback` keeps the last state whose rollout was under kl_max: the actor's trainable part, the
critic, both optimizers, the β controller, and a moving anchor (it moved with the actor, so it
comes back with it). PPO asks `above(kl)` of each iteration's first rollout, calls `restore` when
it is above (β x rollback_beta_factor, again at each restore) and redoes the rollout; a rollout
under the limit is kept (`keep`). A run stops with one line where a restore cannot help: the first
rollout is above (there is no state yet), or one state was restored rollback_max_in_row times in
a row (β alone cannot hold an update whose own step leaves kl_max; at π_θ = π_ref the KL's
gradient is 0).
--stop_kl=K is early stopping with the reference as its yardstick: the same kept state, restored
once with β unchanged, and PPO stops there (`stops`), so the actor saved and evaluated is the last
one whose rollout was at most K nats from π_ref. With β = 0 it is early stopping at a KL budget.
Left out: rolling back several states, lowering the learning rate instead of raising β.
"""
import copy
from dataclasses import asdict, dataclass, replace

from config import arg
from errors import RunError
from kl import load_controller
from state import load_trainable, trainable_state


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


def make_rollback(cfg):
    """A Rollback for --kl_max > 0, or for --stop_kl > 0 (the limit is stop_kl and a restore leaves
    β as it was: the run stops there); None when both are off."""
    if cfg.stop_kl:
        return Rollback(replace(cfg, kl_max=cfg.stop_kl, rollback_beta_factor=1.0), stops=True)
    if not cfg.kl_max:
        return None
    return Rollback(cfg)


class Rollback:
    def __init__(self, cfg, stops=False):
        # --stop_kl: the first rollout above the limit ends the run after `restore`.
        self.stops = stops
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

    def stop_line(self, it, kl):
        """--stop_kl's log line when iteration it's (0-based) rollout, `kl` nats from the
        reference, ended the run."""
        return (f"ppo: stopped at iteration {it + 1}: its rollout is {kl:.2f} nats from the "
                f"reference, above --stop_kl={self.kl_max}; the actor that made iteration {it}'s "
                "rollout is kept")

    def keep_if_under(self, kl, actor, critic, opts, kl_ctl, anchor):
        """A rollout `kl` nats from the reference, at most kl_max: its state is the one to come
        back to. critic None: grpo, rloo."""
        if kl > self.kl_max:
            return
        moving = anchor.state_dict()
        self.state = dict(actor=trainable_state(actor), kl_ctl=asdict(kl_ctl),
                          critic=None if critic is None else clone(critic.state_dict()),
                          opts=[copy.deepcopy(o.state_dict()) for o in opts],
                          anchor=None if moving is None else clone(moving))

    def restore(self, actor, critic, opts, kl_ctl, anchor):
        """The kept state back into the models, the optimizers, the controller and the anchor,
        with β (and a linear controller's start and end) x factor."""
        s = self.state
        load_trainable(actor, s["actor"])
        if critic is not None:
            critic.load_state_dict(s["critic"])
        # A copy: the optimizer would update the kept state in place.
        for o, sd in zip(opts, s["opts"]):
            o.load_state_dict(copy.deepcopy(sd))
        # The linear controller recomputes `value` from start and end.
        raised = dict(s["kl_ctl"])
        for k in ("value", "start", "end"):
            if k in raised:
                raised[k] = raised[k] * self.factor
        load_controller(kl_ctl, raised)
        # The raised β is kept: a second restore to this state raises it again.
        s["kl_ctl"] = asdict(kl_ctl)
        self.count += 1
        self.in_row += 1
        # A moving anchor comes back with the actor it moved with (None: the frozen π_ref).
        anchor.load_state_dict(s["anchor"], actor)

    def state_dict(self):
        return dict(state=self.state, count=self.count, in_row=self.in_row)

    def load_state_dict(self, d):
        self.state = d["state"]
        self.count = d["count"]
        self.in_row = d["in_row"]
