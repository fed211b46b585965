"""Moving anchors and the data anchor, through the PPO stage's own code at --preset=smoke: --ref_update=sync moves
a copy of the reference to α·actor + (1-α)·reference every N iterations, reset copies the actor, both survive a
resume; --ptx_coef adds exactly ptx_coef x the language-model loss's gradient to the actor's step."""
import copy, os
import pytest
import torch
import ppo, train
from machinery import store
from pipeline import stages
from kl import KLConfig
from machinery.optim import StepGuard
from test_ppo import EOS, tiny


def ppo_run(run, out, *flags, log=lambda s: None):
    cfg = train.parse(["--preset=smoke", f"--out_dir={run}", *flags])
    stages.seed_everything(cfg.run.seed)
    s = stages.run_ppo(cfg, run, str(out), stages.stamp(cfg, stages.BY_NAME["ppo"]), log=log, plot=False)
    return s, [{k: v for k, v in r.items() if not k.startswith("time/")}
               for r in store.load_json(os.path.join(out, "metrics.jsonl"), lines=True)]


def stopped_at_3_and_resumed(run, out, *flags):
    """The PPO stage interrupted as iteration 3 ends (before its state is saved), then run again: (summary, rows)
    of the resumed run, after checking it resumed and redid only iteration 3."""
    def stop_at_3(line):
        if line.startswith("iter 3/"):
            raise KeyboardInterrupt
    with pytest.raises(KeyboardInterrupt):
        ppo_run(run, out, *flags, log=stop_at_3)
    lines = []
    again, resumed = ppo_run(run, out, *flags, log=lines.append)
    assert lines[0].startswith("ppo: resuming") and len(lines) == 2          # only iteration 3 was redone
    return again, resumed


SYNC = ["--ref_update=sync", "--ref_sync_every=2", "--ref_sync_alpha=0.3", "--ptx_coef=0.2", "--ppo_iters=3",
        "--plots=false"]


def test_sync_moves_a_copy_and_resume_keeps_it_and_the_ptx_stream(run, tmp_path):
    seen = {}

    def at_iter_3(line):                              # ppo_state.pt now holds the state after iteration 2
        if line.startswith("iter 3/"):
            seen["state"] = store.load_torch(os.path.join(tmp_path / "a", "ppo_state.pt"))
    summary, rows = ppo_run(run, tmp_path / "a", *SYNC, log=at_iter_3)
    s, ref = seen["state"], store.load_torch(os.path.join(run, "ref.pt"))["model"]
    assert s["iter"] == 2 and s["pen_ref"] is not None
    for k, v in s["pen_ref"].items():                 # α·actor + (1-α)·reference, tensor by tensor
        if v.is_floating_point():
            torch.testing.assert_close(v, 0.3 * s["actor"][k] + 0.7 * ref[k], atol=1e-6, rtol=1e-5)
    assert any(not torch.equal(v, ref[k]) for k, v in s["pen_ref"].items())
    assert rows[1]["objective/kl_penalized"] == pytest.approx(rows[1]["objective/kl_exact"], rel=1e-6)  # not yet moved
    assert rows[2]["objective/kl_penalized"] < 0.9 * rows[2]["objective/kl_exact"]                    # moved at 2
    assert all(r["loss/ptx_avg"] > 0 for r in rows) and summary["reference_unchanged"] is True

    again, resumed = stopped_at_3_and_resumed(run, tmp_path / "b", *SYNC)
    assert resumed == rows and again["final"] == summary["final"]


def test_reset_makes_the_kl_to_the_anchor_zero_right_after(run, tmp_path):
    _, rows = ppo_run(run, tmp_path, "--ref_update=reset", "--ref_reset_every=2", "--ppo_iters=3")
    assert rows[1]["objective/kl_penalized"] == pytest.approx(rows[1]["objective/kl_exact"], rel=1e-6)
    assert rows[2]["objective/kl_penalized"] == 0.0 and rows[2]["objective/kl_exact"] > 0


def sgd_step(actor, critic, batch, cfg, ptx_batch):
    a, c = copy.deepcopy(actor), copy.deepcopy(critic)
    opts = tuple(torch.optim.SGD(m.parameters(), lr=1.0) for m in (a, c))
    torch.manual_seed(3)
    ppo.ppo_update(a, c, opts, (StepGuard("a"), StepGuard("c")), batch, cfg, 0.7, 0.0, KLConfig(), ptx_batch)
    return a


def test_ptx_adds_the_language_model_gradient():
    """One minibatch, plain SGD (lr 1), no clipping: the step with ptx_coef differs from the step without by exactly
    -ptx_coef x ∇ (LM loss on the pretraining windows); with ptx_coef = 0 no window is even drawn."""
    actor, ref, critic, rm, prompts, q, qm, resp = tiny()
    g = torch.Generator().manual_seed(5)
    x = torch.randint(0, 50, (3, 12), generator=g)
    y = torch.randint(0, 50, (3, 12), generator=g)
    cfg = ppo.PPOConfig(ppo_epochs=1, minibatch_size=4, max_grad_norm=1e9)
    batch, _ = ppo.make_experience(actor, critic, ref, ref, rm, q, qm, resp, EOS, 0.3, KLConfig(), cfg, 0.7)

    def never():
        raise AssertionError("ptx_coef=0 drew a pretraining batch")
    plain = sgd_step(actor, critic, batch, cfg, never)
    mixed = sgd_step(actor, critic, batch, ppo.PPOConfig(ppo_epochs=1, minibatch_size=4, max_grad_norm=1e9,
                                                         ptx_coef=0.5), lambda: (x, y))
    lm = copy.deepcopy(actor)
    lm(x, y)[1].backward()
    for p0, p1, pl in zip(plain.parameters(), mixed.parameters(), lm.parameters()):
        torch.testing.assert_close(p1 - p0, -0.5 * pl.grad, atol=1e-5, rtol=1e-4)
    assert any(pl.grad.abs().max() > 1e-3 for pl in lm.parameters())
