"""--dtype=bf16 and --dtype=auto: bf16 autocast that casts each weight once per optimizer step and never reads a
stale copy, a frozen reference cast once (bit for bit autocast's own cast), the exact start of PPO (KL 0, ratio 1)
under bf16, and auto resolved before anything is stamped. The bf16 casts are counted with a dispatch mode."""
import copy
from types import SimpleNamespace
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
import ppo
from machinery import optim
from options import anchors
from machinery.precision import auto_dtype
from kl import KLConfig
from model import GPT, GPTConfig, response_logits
from machinery.optim import StepGuard
from machinery.precision import autocast, cast_once
from sequences import pad_left
from options.cheap_ref import make_reference, RefConfig
from ref import Reference
from reward import ScalarModel, response_values

EOS = 49
CFG = GPTConfig(block_size=40, vocab_size=50, n_layer=2, n_head=2, n_embd=32)


class CountCasts(TorchDispatchMode):
    """Counts the casts to bf16 of each given tensor (by storage) while active: {name: casts}."""

    def __init__(self, named):
        super().__init__()
        self.names = {t.untyped_storage().data_ptr(): n for n, t in named}
        self.counts = dict.fromkeys(self.names.values(), 0)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.ops.aten._to_copy.default and kwargs.get("dtype") == torch.bfloat16:
            name = self.names.get(args[0].untyped_storage().data_ptr())
            if name is not None:
                self.counts[name] += 1
        return func(*args, **kwargs)


def models(seed=0):
    """An actor, a critic and a reward model (random heads), left-padded prompts of different lengths, responses."""
    torch.manual_seed(seed)
    actor = GPT(CFG).eval()
    critic, rm = ScalarModel(copy.deepcopy(actor)), ScalarModel(copy.deepcopy(actor)).requires_grad_(False)
    for m in (critic, rm):
        torch.nn.init.normal_(m.head.weight, 0, 0.5)
    q, qm = pad_left([[1, 2, 4, 5], [5, 6], [7, 8, 9], [10]], EOS)
    with autocast("cpu", "bf16"):
        resp, _ = actor.generate(q, 10, temperature=0.7, eos=EOS, mask=qm)
    return actor, critic, rm, q, qm, resp


def linear_weights(model):
    return [(n, p) for n, p in model.named_parameters() if p.dim() == 2 and "wpe" not in n]   # wte: the lm_head


class Tokens:
    """A stand-in tokenizer for ppo.rollout: end-of-text is EOS, other ids decode as letters."""
    eot_token = EOS

    def decode(self, ids):
        return "".join(chr(97 + i % 26) for i in ids)


def test_a_rollout_casts_each_weight_once_not_once_per_token():
    """ppo.rollout, as PPO samples: generate inside one cast_once window."""
    actor, _, _, q, qm, _ = models()
    run = SimpleNamespace(response_length=10, temperature=0.7)
    with autocast("cpu", "bf16"), CountCasts(actor.named_parameters()) as c:
        resp, _ = ppo.rollout(actor, Tokens(), ["a"] * 4, q, qm, run)
    # Several forwards (prefill + one per token after the first), so once per forward would show.
    assert resp.shape[1] > 2
    assert {n: c.counts[n] for n, _ in linear_weights(actor)} == {n: 1 for n, _ in linear_weights(actor)}
    assert c.counts["wpe.weight"] == 0 and all(c.counts[n] == 0 for n in c.counts if "ln_" in n)   # left in fp32


def test_each_ppo_step_casts_each_weight_once_and_reads_the_weights_of_the_step_before(monkeypatch):
    """Under bf16 autocast held around the whole update (as train.py holds it around the PPO stage), with the ptx
    loss on (the actor read twice per step): every forward of every minibatch equals that forward on a fresh copy of
    the weights it had then (nothing cached before), and each actor weight is cast once per optimizer step."""
    actor, critic, rm, q, qm, resp = models()
    ref = Reference(actor)
    cfg = ppo.PPOConfig(ppo_epochs=2, minibatch_size=2, ptx_coef=0.5, ppo_lr=1e-2, vf_lr=1e-2)   # steps bf16 sees
    x = torch.randint(0, 50, (2, 12))
    seen = []

    def recording(fn):
        def record(model, *args):
            out = fn(model, *args)
            seen.append((fn, copy.deepcopy(model), args, out.detach().clone()))
            return out
        return record
    with autocast("cpu", "bf16"):
        batch, _ = ppo.make_experience(actor, critic, ref, ref, rm, q, qm, resp, EOS, 0.1, KLConfig(), cfg, 0.7)
        monkeypatch.setattr(ppo, "response_logits", recording(response_logits))
        monkeypatch.setattr(ppo, "response_values", recording(response_values))
        opts = optim.make_optimizers(actor, critic, cfg)
        with CountCasts(linear_weights(actor)) as c:
            ppo.ppo_update(actor, critic, opts, (StepGuard("a"), StepGuard("c")), batch, cfg, 0.7,
                           ptx_batch=lambda: (x, x))
    steps = cfg.ppo_epochs * 2
    assert c.counts == {n: steps for n, _ in linear_weights(actor)}
    assert len(seen) == 2 * steps
    for fn, then, args, out in seen:
        with autocast("cpu", "bf16"):
            assert torch.equal(fn(then, *args), out)
    firsts = [then for fn, then, _, _ in seen if fn is response_logits]
    assert not torch.equal(firsts[0].lm_head.weight, firsts[1].lm_head.weight)     # the weights did move


def test_a_bf16_forward_after_an_optimizer_step_reads_the_new_weights():
    """The pretraining pattern (forward, step, forward) inside one stage-wide bf16 autocast: the forward after the
    step gives what a fresh copy of the stepped weights gives (the cache of a stage-wide context would not)."""
    torch.manual_seed(0)
    m = GPT(CFG).train()
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
    x = torch.randint(0, 50, (3, 16))
    with autocast("cpu", "bf16"):
        for _ in range(2):
            _, loss = m(x, x)
            StepGuard("pretraining").backward_and_step(loss, opt, list(m.parameters()), 1.0)
        after = m(x)[0]
        assert torch.equal(after, copy.deepcopy(m)(x)[0])


def test_a_step_inside_cast_once_is_refused():
    torch.manual_seed(0)
    m = GPT(CFG)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    x = torch.randint(0, 50, (2, 8))
    with autocast("cpu", "bf16"), pytest.raises(RuntimeError, match="changed inside cast_once"):
        with cast_once(m):
            m(x, x)[1].backward()
            opt.step()
    with cast_once(m):                                  # fp32: nothing is cast, nothing checked
        m(x, x)[1].backward()
        opt.step()


@pytest.mark.parametrize("kind", ["full", "shared_1", "int8"])
def test_the_reference_s_bf16_copy_gives_autocast_s_own_numbers_bit_for_bit(kind):
    """Reference.logits under bf16 autocast reads a copy whose matmul weights were cast once; its logits equal those
    of the reference's own fp32 weights, which autocast casts at every forward. After the weights change in place
    (mix: a sync anchor; load_state_dict: a rollback or a resume) the copy is remade from the new ones."""
    actor, _, _, q, qm, resp = models()
    _, ref = make_reference(copy.deepcopy(actor), Reference(actor), RefConfig(ref=kind))
    plain = ref.logits(q, qm, resp, 0.7)
    assert ref.cast is None and torch.equal(plain, response_logits(ref.model, q, qm, resp, 0.7))   # fp32: no copy
    torch.manual_seed(1)
    moved = copy.deepcopy(actor)
    with torch.no_grad():
        for p in moved.parameters():
            p.add_(0.05 * torch.randn_like(p))
    other = make_reference(copy.deepcopy(moved), Reference(moved), RefConfig(ref=kind))[1].model.state_dict()
    lins = [(n, m) for n, m in ref.model.named_modules() if isinstance(m, torch.nn.Linear)]   # int8: lm_head alone
    for change in (lambda: None, lambda: anchors.mix(ref, moved, 0.5), lambda: ref.model.load_state_dict(other)):
        change()
        with autocast("cpu", "bf16"):
            got = ref.logits(q, qm, resp, 0.7)
            own = response_logits(ref.model, q, qm, resp, 0.7)        # autocast casts the fp32 weights itself
            with CountCasts([(n, t) for _, m in lins for n, t in m.named_parameters()]) as c:
                again = ref.logits(q, qm, resp, 0.7)
        assert torch.equal(got, own) and torch.equal(again, own) and got.dtype == torch.float32
        assert not any(c.counts.values())                             # cast once: not again at the next forward
    fast = ref.cast[1]
    assert lins and all(torch.equal(fast.get_submodule(n).weight, m.weight.to(torch.bfloat16)) for n, m in lins)
    assert fast.wte.weight is ref.model.wte.weight and fast.wte.weight.dtype == torch.float32   # embeddings: fp32
    assert all(a is b for a, b in zip(fast.blocks[0].ln_1.parameters(), ref.model.blocks[0].ln_1.parameters()))


def test_bf16_ppo_starts_exactly_at_the_reference_with_ratio_one(run, tmp_path):
    """train_ppo at smoke size under --dtype=bf16 (inside the stage's autocast, as train.py runs it): the first
    rollout is exactly 0 nats from the reference (the actor's weights cast by autocast, the reference's copy cast
    once) and the first minibatch of every update has ratio exactly 1."""
    import tokenizer, train, data
    from pipeline import stages
    cfg = train.parse(["--preset=smoke", f"--out_dir={run}", "--dtype=bf16", "--ppo_iters=2"])
    stages.seed_everything(cfg.run.seed)
    with autocast(cfg.run.device, cfg.run.dtype):
        actor, ref, rm = stages.load_models(run, cfg.run.device)
        critic = copy.deepcopy(rm).requires_grad_(True)
        enc = tokenizer.load_tokenizer(run, cfg.world.tokenizer)
        rows, _ = ppo.train_ppo(actor, critic, ref, rm, enc, data.load_prompts(run)["train"], cfg, str(tmp_path),
                                stages.stamp(cfg, stages.BY_NAME["ppo"]), log=lambda s: None)
    assert ref.cast is not None                                        # the reference scored through its copy
    assert rows[0]["objective/kl_exact"] == 0.0 and rows[1]["objective/kl_exact"] > 0
    assert [r["policy/ratio_dev_first"] for r in rows] == [0.0, 0.0]


@pytest.mark.parametrize("caps, cuda, want", [({"avx512_bf16": True}, True, "bf16"), ({"amx_bf16": True}, False, "bf16"),
                                              ({"avx2": True, "avx512_f": True}, False, "fp32")])
def test_auto_picks_bf16_where_it_is_native_and_is_resolved_before_anything_is_stamped(caps, cuda, want, run,
                                                                                       monkeypatch):
    import train
    from pipeline import stages
    monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: caps)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: cuda or including_emulation)
    assert auto_dtype("cpu")[0] == want and auto_dtype("cuda")[0] == ("bf16" if cuda else "fp32")
    cfg = train.parse(["--preset=smoke", f"--out_dir={run}", "--device=cpu", "--dtype=auto"])
    assert cfg.run.dtype == want                                       # what autocast and every stamp see
    assert all(stages.stamp(cfg, st)["config"].get("dtype", want) == want for st in stages.STAGES)


def test_a_stage_says_which_dtype_ran_and_auto_reuses_or_refuses_by_what_it_resolves_to(run, tmp_path, monkeypatch,
                                                                                         capsys):
    import shutil, train
    out = str(tmp_path / "run")
    shutil.copytree(run, out)                                          # made with --dtype=fp32
    monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: {})     # auto -> fp32: the same stages
    train.main(["--preset=smoke", f"--out_dir={out}", "--dtype=auto"])
    assert "---- stage ppo: done with this config, kept ----" in capsys.readouterr().out
    train.main(["--preset=smoke", f"--out_dir={out}", "--dtype=auto", "--stage=reference"])
    assert "---- stage reference ---- (fp32)" in capsys.readouterr().out
    monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: {"avx512_bf16": True})   # auto -> bf16: refused
    with pytest.raises(SystemExit) as e:
        train.main(["--preset=smoke", f"--out_dir={out}", "--dtype=auto"])
    assert e.value.code == 2 and "now --dtype=bf16" in capsys.readouterr().err


def test_an_ablation_run_and_its_baseline_run_in_the_precision_their_records_name(run, tmp_path, monkeypatch):
    """ablate.py calls the PPO stage's code outside train.py's loop: --dtype=bf16 must still reach it (its stamp says
    bf16), and the pretrained baseline it is compared with is scored in the same precision."""
    import train
    from lab import ablate
    from pipeline import stages
    seen = []

    def stop(*args, **kw):                                    # what the precision is where the work would start
        seen.append(torch.is_autocast_enabled("cpu"))
        raise KeyboardInterrupt
    monkeypatch.setattr(stages, "run_ppo", stop)
    monkeypatch.setattr(ablate, "evaluate_policy", stop)
    for dtype in ("fp32", "bf16"):
        flags = ["--preset=smoke", f"--dtype={dtype}"]
        with pytest.raises(KeyboardInterrupt):
            ablate.one_run(("adaptive", 1, flags, run, str(tmp_path / dtype), 0, None))
        with pytest.raises(KeyboardInterrupt):
            ablate.baseline_row(train.parse(flags + [f"--out_dir={run}"]), run, 1)
    assert seen == [False, False, True, True]
