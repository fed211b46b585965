"""Cheap references and the KL rollback (ref.py), through the code the PPO stage runs: quantization error bounds
per block, quantized and half-precision logits against the full reference's, the LoRA reference bit-identical to
the pretrained model before and after PPO, shared blocks that never move, bytes by hand, and the rollback restoring
the last good state bit for bit, also across a resume; on tiny models through train_ppo: the moving anchor restored
with the actor, the undone rollout's KL logged, a spin stopped after rollback_max_in_row, a first rollout above."""
import copy, os, statistics
import pytest
import torch
import data, ppo, tokenizer, train
from machinery import store
from machinery import optim
from options import anchors, cheap_ref, rollback
from ref import Reference, first_change, load_reference
from model import response_logits
from sequences import encode_prompts
from ref import load_checkpoint
from kl import FixedKLController, kl_full
from machinery.errors import RunError
from tests.test_dist import Letters, models
from tests.test_train import ppo_run, read


def test_int8_error_is_at_most_half_a_step_per_block():
    torch.manual_seed(0)
    w = torch.randn(37, 29) * torch.rand(37, 1) * 3                 # rows of different scales; 1073 = 33·32 + 17
    w[5, 3] = 40.0                                                  # an outlier: only its own block pays for it
    block = 32
    codes, absmax = cheap_ref.quantize(w, "int8", block)
    back = cheap_ref.dequantize(codes, absmax, "int8", block, w.shape)
    flat, err = w.reshape(-1), (back - w).abs().reshape(-1)
    assert codes.dtype == torch.int8 and codes.numel() == 34 * block and back.shape == w.shape
    for b in range(34):                                             # block by block, the slow way
        blk = flat[b * block:(b + 1) * block]
        assert absmax[b] == blk.abs().max()
        assert err[b * block:(b + 1) * block].max() <= blk.abs().max() / 127 / 2 * (1 + 1e-6)
    assert err[5 * 29 + 3] < 1e-5                                   # the absmax itself is exact


def test_nf4_levels_are_normal_quantiles_and_error_is_at_most_half_the_largest_gap():
    levels = cheap_ref.nf4_levels()
    nd, p = statistics.NormalDist(), 1 - 0.5 * (1 / 30 + 1 / 32)
    pos = [nd.inv_cdf(p + (0.5 - p) * i / 8) for i in range(8)]      # linspace(p, ½, 9)[:-1]
    neg = [-nd.inv_cdf(p + (0.5 - p) * i / 7) for i in range(7)]     # linspace(p, ½, 8)[:-1], mirrored
    slow = sorted(v / max(pos) for v in pos + neg + [0.0])
    torch.testing.assert_close(levels, torch.tensor(slow), atol=1e-6, rtol=0)
    assert len(set(levels.tolist())) == 16 and levels[0] == -1 and levels[-1] == 1 and 0.0 in levels.tolist()
    torch.manual_seed(1)
    w, block = torch.randn(45, 7), 16                               # 315 weights: the last block and byte padded
    codes, absmax = cheap_ref.quantize(w, "nf4", block)
    back = cheap_ref.dequantize(codes, absmax, "nf4", block, w.shape)
    assert codes.dtype == torch.uint8 and codes.numel() == 20 * block // 2     # two codes per byte
    half_gap = (levels[1:] - levels[:-1]).max() / 2
    flat, err = w.reshape(-1), (back - w).abs().reshape(-1)
    for b in range(20):
        blk = flat[b * block:(b + 1) * block]
        assert err[b * block:(b + 1) * block].max() <= half_gap * blk.abs().max() * (1 + 1e-6)
        for x, y in zip(blk.tolist(), back.reshape(-1)[b * block:(b + 1) * block].tolist()):   # the nearest level
            assert abs(y / absmax[b].item() - min(levels.tolist(), key=lambda v: abs(v - x / absmax[b].item()))) < 1e-6


def real_batch(run, n=12, length=30):
    """The smoke run's pretrained model, ref.pt's model, and its samples on held-out prompts."""
    enc = tokenizer.load_tokenizer(run, "bpe")
    pre, _ = load_checkpoint(os.path.join(run, "pretrain.pt"))
    ref_model, _ = load_checkpoint(os.path.join(run, "ref.pt"))
    torch.manual_seed(0)
    q, qm = encode_prompts(enc, data.load_prompts(run)["heldout"][:n])
    resp, _ = pre.generate(q, length, eos=enc.eot_token, mask=qm)
    return pre, ref_model, q, qm, resp


def cfg_for(kind, *flags):
    return train.parse(["--preset=smoke", f"--ref={kind}", *flags]).ref


@pytest.mark.parametrize("kind, tol, kl_tol", [("bf16", 0.2, 1e-3), ("fp16", 0.02, 1e-5), ("int8", 0.1, 1e-4),
                                               ("nf4", 1.5, 0.02)])      # about 3x what the smoke model shows
def test_cheap_reference_logits_are_close_to_the_full_ones_on_real_samples(run, kind, tol, kl_tol):
    pre, ref_model, q, qm, resp = real_batch(run)
    full = response_logits(pre, q, qm, resp, 0.7)                                          # (B, R, V)
    actor, ref = cheap_ref.make_reference(pre, Reference(ref_model), cfg_for(kind, "--quant_block=32"))
    assert actor is pre and not ref.exact
    cheap = ref.logits(q, qm, resp, 0.7)
    assert cheap.dtype == torch.float32                              # the KL is taken in fp32
    diff = (cheap - full).abs().max().item()
    assert 0 < diff < tol, diff
    assert 0 < kl_full(full, cheap).mean() < kl_tol                 # nats per token
    if kind in ("int8", "nf4"):                                      # the slow way: dequantized weights, a plain GPT
        plain = copy.deepcopy(pre)
        for b, qb in zip(plain.blocks, ref.model.blocks):
            for lin, ql in [(b.attn.c_attn, qb.attn.c_attn), (b.attn.c_proj, qb.attn.c_proj), (b.mlp[0], qb.mlp[0]),
                            (b.mlp[2], qb.mlp[2])]:
                assert isinstance(ql, cheap_ref.QuantLinear)
                lin.weight.data = cheap_ref.dequantize(ql.codes, ql.absmax, kind, 32, lin.weight.shape)
        torch.testing.assert_close(cheap, response_logits(plain, q, qm, resp, 0.7), atol=1e-5, rtol=1e-5)


def test_bytes_held_by_each_reference_by_hand(run):
    pre, _, _, _, _ = real_batch(run, n=1, length=2)
    n = sum(p.numel() for p in pre.parameters())                    # tied: the embedding counted once
    lin = [m for b in pre.blocks for m in (b.attn.c_attn, b.attn.c_proj, b.mlp[0], b.mlp[2])]
    n_lin = sum(m.weight.numel() for m in lin)
    top = sum(p.numel() for m in [pre.blocks[1], pre.ln_f] for p in m.parameters())
    lora = sum(8 * (m.in_features + m.out_features) for m in lin)
    expect = dict(full=4 * n, bf16=2 * n, int8=4 * (n - n_lin) + n_lin + 4 * n_lin // 64,
                  nf4=4 * (n - n_lin) + n_lin // 2 + 4 * n_lin // 64 + 4 * 16 * len(lin), lora=0, shared_1=4 * top)
    train_n = dict(lora=lora, shared_1=top)
    for kind, b in expect.items():
        actor, r = cheap_ref.make_reference(copy.deepcopy(pre), load_reference(os.path.join(run, "ref.pt"), "cpu"),
                                            cfg_for(kind))
        mem = cheap_ref.memory_bytes(actor, r)
        assert mem["ref"] == b, kind
        assert mem["trainable"] == 16 * train_n.get(kind, n), kind


def capture(monkeypatch):
    """The (actor, reference) pairs run_ppo builds, then the (actor's, critic's) optimizers train_ppo makes."""
    made, make, make_opts = [], cheap_ref.make_reference, optim.make_optimizers

    def recording(*a):
        actor, ref = make(*a)
        made.append((actor, ref))
        return actor, ref
    monkeypatch.setattr(cheap_ref, "make_reference", recording)
    monkeypatch.setattr(optim, "make_optimizers", lambda *a: made.append(make_opts(*a)) or made[-1])
    return made


def test_lora_reference_is_the_pretrained_model_bit_for_bit_before_and_after_ppo(run, tmp_path, monkeypatch):
    pre, _, q, qm, resp = real_batch(run)
    expect = response_logits(pre, q, qm, resp, 1.0)
    made = capture(monkeypatch)
    summary, rows = ppo_run(run, tmp_path, "--ref=lora", "--lora_rank=4", "--lora_alpha=32", "--ppo_lr=3e-3",
                            "--ppo_iters=2", "--n_eval=8")
    actor, ref = made[0]
    assert ref.model is actor and torch.equal(ref.logits(q, qm, resp, 1.0), expect)      # after PPO, bit for bit
    assert not torch.equal(response_logits(actor, q, qm, resp, 1.0), expect)            # while the actor moved
    assert rows[0]["objective/kl_exact"] == 0.0 and rows[-1]["objective/kl_exact"] > 0               # it starts exactly there
    assert summary["reference_unchanged"] and summary["ref"]["bytes"] == 0
    trained = {n for n, p in actor.named_parameters() if p.requires_grad}
    assert trained and all("lora_" in n for n in trained)            # only the adapters are trained
    adapters = {id(p) for n, p in actor.named_parameters() if "lora_" in n}
    assert {id(p) for g in made[1][0].param_groups for p in g["params"]} == adapters    # ... and in the optimizer
    assert all(m.lora_A.shape[0] == 4 and m.scale == 8 for m in actor.modules() if isinstance(m, cheap_ref.LoRALinear))
    merged, _ = load_checkpoint(os.path.join(tmp_path, "actor.pt"))  # actor.pt: a plain GPT, adapters merged
    torch.testing.assert_close(response_logits(merged, q, qm, resp, 1.0), response_logits(actor, q, qm, resp, 1.0),
                               atol=1e-4, rtol=1e-4)


def test_shared_blocks_get_no_gradient_and_never_move(run, tmp_path, monkeypatch):
    pre = load_checkpoint(os.path.join(run, "pretrain.pt"))[0].state_dict()
    made = capture(monkeypatch)
    summary, rows = ppo_run(run, tmp_path, "--ref=shared_1", "--ppo_lr=3e-3", "--ppo_iters=2", "--n_eval=8")
    actor, ref = made[0]
    assert rows[0]["objective/kl_exact"] == 0.0 and rows[-1]["objective/kl_exact"] > 0 and summary["reference_unchanged"]
    for name in ["wte", "wpe", "blocks.0"]:                          # shared: one tensor, no gradient, unchanged
        mod_a, mod_r = actor.get_submodule(name), ref.model.get_submodule(name)
        for (k, pa), pr in zip(mod_a.named_parameters(), mod_r.parameters()):
            assert pa is pr and pa.grad is None and not pa.requires_grad
            assert torch.equal(pa, pre[f"{name}.{k}"])
    assert ref.model.lm_head.weight is actor.wte.weight
    moved = [k for k in pre if k.startswith(("blocks.1", "ln_f")) and not torch.equal(actor.state_dict()[k], pre[k])]
    assert moved and all(torch.equal(ref.model.state_dict()[k], pre[k]) for k in pre)   # the top moved, its copy not
    top = {id(p) for m in [actor.blocks[1], actor.ln_f] for p in m.parameters()}
    assert {id(p) for g in made[1][0].param_groups for p in g["params"]} == top          # what the optimizer moves


def test_half_reference_starts_near_but_not_at_zero(run, tmp_path):
    summary, rows = ppo_run(run, tmp_path, "--ref=bf16", "--ppo_iters=1", "--n_eval=8")
    assert 0 < rows[0]["objective/kl_exact"] < 0.05                        # the rollout's exact KL to the bf16 copy
    r = summary["ref"]
    assert 0 < r["kl_step0"] < 0.05 and r["kl_own_ref"] != summary["final"]["kl"]   # final: to the fp32 reference


@pytest.mark.parametrize("flag, message", [("--ref=int4", "bad value for --ref"), ("--ref=shared_2", "--n_layer=2"),
                                           ("--rollback_beta_factor=0.5", "must be >= 1")])
def test_bad_reference_flags_are_refused(flag, message, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        train.main(["--preset=smoke", f"--out_dir={tmp_path}", flag])
    err = capsys.readouterr().err
    assert e.value.code == 2 and message in err and err.count("\n") == 1 and not os.listdir(tmp_path)


# ---- the KL rollback ----
def state_after(run, out, iters, *flags):
    """ppo_state.pt of a run stopped right after iteration `iters`: actor, critic, optimizers, controller."""
    def stop(line):
        if line.startswith(f"iter {iters + 1}/"):
            raise KeyboardInterrupt
    with pytest.raises(KeyboardInterrupt):
        ppo_run(run, out, *flags, log=stop)
    return store.load_torch(os.path.join(out, "ppo_state.pt"))


FLAGS = ["--ppo_iters=4", "--ppo_lr=6e-4", "--kl_ctl=fixed", "--init_kl_coef=0.02", "--save_interval=1",
         "--plots=false"]


@pytest.fixture(scope="module")
def excursion(run, tmp_path_factory):
    """A run whose KL grows (no guard), the state after its first iteration, and the same run with --kl_max between
    the KL of its 2nd and 3rd rollouts, recording what each restore leaves in the models."""
    out = tmp_path_factory.mktemp("rollback")
    _, free = ppo_run(run, out / "free", *FLAGS)
    k = [r["objective/kl_exact"] for r in free]
    assert k[1] < k[2]
    kl_max = (k[1] + k[2]) / 2                                       # iteration 3's rollout is above, 2's below
    good = state_after(run, out / "good", 1, *FLAGS)                 # the state iteration 2 started from
    restored, restore = [], rollback.Rollback.restore

    def recording(self):
        out = restore(self)
        restored.append(copy.deepcopy((self.actor.state_dict(), self.critic.state_dict(),
                                       [o.state_dict() for o in self.opts], self.kl_ctl.value)))
        return out
    with pytest.MonkeyPatch.context() as m:
        m.setattr(rollback.Rollback, "restore", recording)
        flags = [*FLAGS, f"--kl_max={kl_max}", "--rollback_beta_factor=3"]
        summary, rows = ppo_run(run, out / "guarded", *flags)
    return dict(k=k, kl_max=kl_max, good=good, restored=restored, summary=summary, rows=rows, flags=flags, out=out)


def test_rollback_restores_the_last_state_under_the_limit_bit_for_bit(excursion):
    k, kl_max, good, rows = excursion["k"], excursion["kl_max"], excursion["good"], excursion["rows"]
    assert [r["policy/rollbacks"] for r in rows][:3] == [0, 0, 1] and excursion["summary"]["ref"]["rollbacks"] >= 1
    assert [r["objective/kl_exact"] for r in rows[:2]] == k[:2]             # identical until the excursion
    actor, critic, opts, beta = excursion["restored"][0]
    assert actor.keys() == good["actor"].keys() and all(torch.equal(actor[n], good["actor"][n]) for n in actor)
    assert all(torch.equal(critic[n], good["critic"][n]) for n in critic)
    for o, g in zip(opts, good["opts"]):
        assert o["state"].keys() == g["state"].keys()
        assert all(torch.equal(o["state"][i][s], g["state"][i][s]) for i in o["state"] for s in o["state"][i])
    assert beta == pytest.approx(3 * good["kl_ctl"]["value"]) and rows[2]["objective/kl_coef"] == beta
    assert rows[2]["objective/kl_exact"] < kl_max                          # the redone rollout is from the good state


def test_restores_in_a_row_to_one_state_keep_raising_beta():
    # A redone rollout can still be above kl_max; the next restore goes back to the same state and must raise β
    # again (factor², then factor³), or the run would return to the same β for ever.
    actor, critic = torch.nn.Linear(2, 2), torch.nn.Linear(2, 1)
    opts = [torch.optim.AdamW(actor.parameters()), torch.optim.AdamW(critic.parameters())]
    kl_ctl = FixedKLController(0.01)
    anchor = anchors.Anchor(None, anchors.AnchorConfig())
    rb = rollback.Rollback(rollback.RollbackConfig(rollback_beta_factor=2.0), (actor, critic, opts, kl_ctl, anchor))
    rb.keep_if_under(0.0)
    betas = []
    for _ in range(3):
        kl_ctl.value = 0.5                                           # whatever the controller did since
        rb.restore()
        betas.append(kl_ctl.value)
    assert betas == pytest.approx([0.02, 0.04, 0.08]) and rb.count == 3


def test_rollback_survives_a_resume(run, excursion):
    cut = excursion["out"] / "cut"
    state_after(run, cut, 2, *excursion["flags"])                    # killed before the rollback at iteration 3
    again, rows = ppo_run(run, cut, *excursion["flags"])
    strip = lambda rs: [{k: v for k, v in r.items() if not k.startswith("time/")} for r in rs]
    assert strip(rows) == strip(excursion["rows"]) and again["final"] == excursion["summary"]["final"]


# ---- the rollback's edges, on test_dist's tiny models through train_ppo itself ----
def tiny_loop(out, *flags, exact=True, inflate=()):
    """train_ppo, 4 iterations of the tiny models (the actor starts as the reference, or, exact=False, moved away
    from a cheap-like reference). inflate: make_experience calls whose rollout KL is raised by 100 nats (a planted
    excursion). Returns (rows of metrics.jsonl, per call: actor state, penalty anchor state, rollout KL)."""
    moved, ref, critic, rm = models()
    actor = moved if not exact else copy.deepcopy(ref.model).requires_grad_(True)
    ref = Reference(ref.model, exact=exact, copy=False)
    cfg = train.parse(["--preset=smoke", "--ppo_iters=4", "--rollout_batch=8", "--minibatch_size=4",
                       "--response_length=8", "--kl_ctl=fixed", "--init_kl_coef=0.01", "--device=cpu", *flags])
    calls, make = [], ppo.make_experience

    def recording(**kw):
        batch, info = make(**kw)
        actor, pen_ref = kw["actor"], kw["pen_ref"]
        if len(calls) in inflate:
            info = dict(info, kl_exact=info["kl_exact"] + 100)
        calls.append(copy.deepcopy((actor.state_dict(), pen_ref.model.state_dict(), info["kl_exact"].mean().item())))
        return batch, info
    with pytest.MonkeyPatch.context() as m:
        m.setattr(ppo, "make_experience", recording)
        torch.manual_seed(0)
        ppo.train_ppo(actor, critic.requires_grad_(True), ref, rm, Letters(), ["abc", "de", "fghij", "k"], cfg,
                      str(out), dict(test=1), log=lambda s: None)
    return read(str(out), "metrics.jsonl"), calls


def same(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("anchor", ["rolling", "--ref_update=sync --ref_sync_every=1",
                                    "--ref_update=reset --ref_reset_every=1"])
def test_a_restore_brings_back_the_moving_anchor_and_logs_the_kl_it_undid(tmp_path, anchor):
    """Iteration 3's rollout is planted 100 nats above --kl_max: the redone rollout (call 4) must see the actor
    *and* the penalty's anchor of iteration 2's rollout (call 2), the state kept; the anchor moved since (sync and
    reset mix the actor in after every update, rolling holds the last policy). The row logs the KL it undid."""
    flags = ["--ref_update=rolling"] if anchor == "rolling" else anchor.split()
    rows, calls = tiny_loop(tmp_path, "--kl_max=50", "--ppo_lr=1e-2", *flags, inflate=(2,))
    assert [r["policy/rollbacks"] for r in rows] == [0, 0, 1, 1] and len(calls) == 5
    assert same(calls[3][0], calls[1][0]) and same(calls[3][1], calls[1][1])     # actor and anchor: call 2's
    assert not same(calls[2][1], calls[1][1])                        # the anchor had moved: a real restore
    assert rows[2]["policy/kl_before_rollback"] == pytest.approx(calls[2][2]) and calls[2][2] > 100
    assert rows[2]["objective/kl_exact"] == pytest.approx(calls[3][2]) and calls[3][2] < 50
    assert [r["policy/kl_before_rollback"] for r in rows[:2] + rows[3:]] == \
        [r["objective/kl_exact"] for r in rows[:2] + rows[3:]]             # no restore: the same rollout


def test_a_rollback_that_cannot_help_stops_the_run_after_max_in_row(tmp_path):
    """The issue's spin, reproduced: one update at this learning rate leaves --kl_max from the starting model, where
    the KL and its gradient are 0, so raising β cannot help; each iteration restored the start, β doubling. Now
    --rollback_max_in_row=2 restores in a row, then one line, exit 1, naming what to change."""
    with pytest.raises(RunError) as e:
        tiny_loop(tmp_path, "--kl_max=0.01", "--ppo_lr=3e-2", "--rollback_max_in_row=2")
    assert e.value.code == 1 and "2 times in a row" in str(e.value) and "--ppo_lr" in str(e.value)
    rows = read(str(tmp_path), "metrics.jsonl")
    assert [r["policy/rollbacks"] for r in rows] == [0, 1, 2]        # iterations 2 and 3 restored; 4 stopped
    assert [r["objective/kl_exact"] for r in rows] == [0, 0, 0]            # every rollout logged is the start's
    assert all(r["policy/kl_before_rollback"] > 0.01 for r in rows[1:])    # the excursions, visible
    assert [r["objective/kl_coef"] for r in rows] == pytest.approx([0.01, 0.02, 0.04])


def test_a_first_rollout_above_kl_max_stops_the_run(tmp_path):
    """A cheap reference can start above --kl_max (its step-0 KL): the rollback would have no state to go back to
    and silently never engage. One line, exit 2, before any update."""
    with pytest.raises(RunError) as e:
        tiny_loop(tmp_path, "--kl_max=0.01", exact=False)
    assert e.value.code == 2 and "first rollout" in str(e.value) and "--kl_max=0.01" in str(e.value)
    assert not os.path.exists(tmp_path / "metrics.jsonl")


# ---- the proof that the reference stayed frozen ----
def test_first_change_names_the_tensor_against_a_loop_over_every_tensor():
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.LayerNorm(4), torch.nn.BatchNorm1d(4))
    expected = {k: v.clone() for k, v in m.state_dict().items()}
    assert first_change(m.state_dict(), expected) is None
    for name in expected:                                       # each weight and buffer, one at a time
        changed = {k: v.clone() for k, v in expected.items()}
        if changed[name].is_floating_point():
            changed[name].view(-1)[-1] += 1e-7 * (1 + changed[name].view(-1)[-1].abs())
        else:
            changed[name] += 1
        slow = [k for k in expected if not torch.equal(expected[k], changed[k])]
        assert slow == [name] and name in first_change(changed, expected)
    widened = dict(expected, **{"0.weight": expected["0.weight"].double()})
    assert "torch.float64" in first_change(widened, expected)      # the same values in another dtype
    assert "1.bias" in first_change({k: v for k, v in expected.items() if k != "1.bias"}, expected)


# A dtype changed mid-run would break the next forward: it is changed after the last update.
@pytest.mark.parametrize("kind, tamper, named, at", [
    ("full", lambda m: m.blocks[0].attn.c_attn.weight.data.add_(1e-3), "blocks.0.attn.c_attn.weight", 1),
    ("full", lambda m: setattr(m.ln_f, "weight", torch.nn.Parameter(m.ln_f.weight.data.double(),
                                                                    requires_grad=False)), "ln_f.weight", 2),
    ("int8", lambda m: m.blocks[1].mlp[0].codes.add_(1), "blocks.1.mlp.0.codes", 1),
    ("lora", lambda m: m.blocks[0].attn.c_proj.base.weight.data.mul_(1.01), "blocks.0.attn.c_proj.base.weight",
     1),
])
def test_a_reference_changed_during_ppo_stops_the_run_naming_the_tensor(run, tmp_path, capsys, monkeypatch,
                                                                          kind, tamper, named, at):
    """A weight, a buffer (int8's codes) or a dtype of the reference written to during PPO: the after-PPO check
    (ref.check_unchanged) stops the run with one line naming the tensor, exit 1, keeps no actor and removes the
    state a rerun would resume, so the same command redoes PPO."""
    from test_state import copy_run, refused
    out = copy_run(run, tmp_path)
    store.remove(os.path.join(out, "actor.pt"))
    after = anchors.Anchor.after_update

    def tampering(self, actor, it):
        if it == at:
            tamper(self.frozen.model)
        return after(self, actor, it)
    monkeypatch.setattr(anchors.Anchor, "after_update", tampering)
    extra = ["--ppo_lr=3e-3"] if kind == "lora" else []
    err = refused(["--preset=smoke", f"--out_dir={out}", "--stage=ppo", f"--ref={kind}", *extra], capsys,
                  code=1)
    assert "the reference changed during PPO" in err and named in err
    assert not os.path.exists(os.path.join(out, "actor.pt")) and not os.path.exists(os.path.join(out, "ppo_state.pt"))
