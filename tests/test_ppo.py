"""PPO through the code the pipeline runs: make_experience and ppo_update against slow per-row computations
(each response alone, unpadded, one full forward, GAE as an explicit sum), plus GAE, clipping and masking."""
import copy
import pytest
import torch
from torch.nn import functional as F
from model import GPT, GPTConfig, response_logits, token_logprobs
from machinery.optim import StepGuard
from sequences import pad_left, response_mask
from reward import ScalarModel, response_values
from ref import Reference
from kl import KLConfig, kl_full
import ppo

EOS = 3


def test_gae_equals_brute_force_sum():
    torch.manual_seed(0)
    B, R, gamma, lam = 4, 7, 0.9, 0.8
    rewards, values = torch.randn(B, R), torch.randn(B, R)
    lengths = [7, 3, 1, 5]
    mask = torch.arange(R)[None] < torch.tensor(lengths)[:, None]
    adv, ret = ppo.compute_gae(rewards, values, mask, gamma, lam)
    for b, n in enumerate(lengths):
        V = lambda t: values[b, t].item() if t < n else 0.0               # the episode ends after token n-1
        for t in range(R):
            expect = 0.0
            if t < n:
                # A_t = Σ_l (γλ)^l δ_{t+l},  δ_k = r_k + γ V_{k+1} - V_k
                expect = sum((gamma * lam) ** (k - t) * (rewards[b, k].item() + gamma * V(k + 1) - V(k))
                             for k in range(t, n))
            assert abs(adv[b, t].item() - expect) < 1e-5
            assert abs(ret[b, t].item() - (expect + V(t))) < 1e-5


def test_whiten_over_real_tokens_only():
    x = torch.tensor([[1.0, 2.0, 3.0, 100.0]])
    m = torch.tensor([[True, True, True, False]])
    w = ppo.whiten(x, m)
    assert w[0, 3] == 0 and abs(w[0, :3].mean()) < 1e-6 and abs(w[0, :3].pow(2).mean() - 1) < 1e-4


def test_gradient_is_zero_where_clipped_in_the_improving_direction():
    old = torch.zeros(1, 4)
    new = torch.log(torch.tensor([[1.5, 1.5, 0.5, 0.5]])).requires_grad_(True)
    adv = torch.tensor([[1.0, -1.0, -1.0, 1.0]])
    loss, clipfrac, _, _ = ppo.policy_loss(new, old, adv, torch.ones(1, 4, dtype=torch.bool), cliprange=0.2)
    loss.backward()
    g = new.grad[0]
    assert g[0] == 0 and g[2] == 0               # ratio 1.5 with A > 0, ratio 0.5 with A < 0: clipped
    assert g[1] != 0 and g[3] != 0               # moving away from the improving direction is never clipped
    assert clipfrac.item() == 0.5


def test_value_loss_clips_far_predictions():
    values, returns = torch.zeros(1, 2), torch.tensor([[1.0, 1.0]])
    vpred = torch.tensor([[0.5, -0.5]], requires_grad=True)       # both moved 0.5 from the rollout's values
    loss, _ = ppo.value_loss(vpred, values, returns, torch.ones(1, 2, dtype=torch.bool), 0.2)
    loss.backward()
    assert vpred.grad[0, 0] == 0 and vpred.grad[0, 1] != 0       # toward the return beyond the clip: no gradient
    vpred2 = torch.tensor([[1.5, 0.0]], requires_grad=True)       # overshoot beyond clip: max picks the clipped
    loss2, _ = ppo.value_loss(vpred2, values, returns, torch.ones(1, 2, dtype=torch.bool), 0.2)
    loss2.backward()
    assert vpred2.grad[0, 0] == 0



def tiny(seed=0):
    """A random actor, a reference that differs from it, a critic and a reward model with random heads, prompts of
    different lengths (left-padded) and sampled responses: row 0 ends early, row 1 is truncated (no end-of-text)."""
    torch.manual_seed(seed)
    cfg = GPTConfig(block_size=40, vocab_size=50, n_layer=2, n_head=2, n_embd=32)
    ref_model = GPT(cfg).eval()
    actor = copy.deepcopy(ref_model)
    with torch.no_grad():
        for p in actor.parameters():
            p.add_(0.05 * torch.randn_like(p))                      # the actor has moved away from the reference
    critic, rm = ScalarModel(copy.deepcopy(ref_model)), ScalarModel(copy.deepcopy(ref_model))
    for m in (critic, rm):
        torch.nn.init.normal_(m.head.weight, 0, 0.5)
        torch.nn.init.normal_(m.head.bias, 0, 0.5)
    prompts = [[1, 2, 4, 5], [5, 6], [7, 8, 9], [10]]
    q, qm = pad_left(prompts, EOS)
    resp, _ = actor.generate(q, 10, temperature=0.7, eos=EOS, mask=qm)
    resp[0, 4:] = EOS                                               # ends at index 4
    resp[1] = torch.where(resp[1] == EOS, 11, resp[1])              # truncated: no end-of-text at all
    return actor, Reference(ref_model), critic, rm, prompts, q, qm, resp


def slow_row(model, prompt, response, T):
    """Log-probs (n,) of `response` after `prompt`, from one full forward of that row alone, no padding."""
    seq = torch.tensor([prompt + response])
    logits = model(seq)[0][0, len(prompt) - 1:-1] / T
    return F.log_softmax(logits, -1).gather(1, torch.tensor(response)[:, None])[:, 0]


def slow_experience(actor, ref, critic, rm, prompts, resp, beta, gamma, lam, penalty, T, placement="token",
                    length=0.0):
    """make_experience, the slow way: every row alone, GAE as an explicit sum, whitening over all real tokens;
    placement sequence: the summed penalty at the last token alone; length: a price per real token."""
    rows = []
    for p, r in zip(prompts, resp.tolist()):
        n = r.index(EOS) + 1 if EOS in r else len(r)               # real tokens, end-of-text included
        r = r[:n]
        with torch.no_grad():
            lp, lp_ref = slow_row(actor, p, r, T), slow_row(ref.model, p, r, T)
            seq = torch.tensor([p + r])
            values = critic(seq)[0, len(p) - 1:-1]
            score = rm(seq)[0, -1].item() - (penalty if EOS not in r else 0.0) - length * n
        rewards = -beta * (lp - lp_ref)
        if placement == "sequence":
            rewards = torch.zeros(n)
            rewards[-1] = -beta * (lp - lp_ref).sum()
        rewards[-1] += score
        V = lambda t: values[t].item() if t < n else 0.0
        adv = [sum((gamma * lam) ** (k - t) * (rewards[k].item() + gamma * V(k + 1) - V(k)) for k in range(t, n))
               for t in range(n)]
        rows.append(dict(n=n, old=lp, values=values, rewards=rewards, score=score, adv=torch.tensor(adv),
                         returns=torch.tensor(adv) + values))
    allv = torch.cat([r["adv"] for r in rows])
    for r in rows:
        r["whitened"] = (r["adv"] - allv.mean()) / allv.var(unbiased=False).add(1e-8).sqrt()
    return rows


@pytest.mark.parametrize("gamma, lam, T, placement, length", [(0.9, 0.8, 0.7, "token", 0.0),
                                                              (1.0, 0.95, 1.0, "token", 0.0),
                                                              (0.9, 0.8, 0.7, "sequence", 0.0),
                                                              (1.0, 1.0, 0.7, "sequence", 0.0),
                                                              (0.9, 0.8, 0.7, "token", 0.05)])
def test_make_experience_equals_a_slow_per_row_computation(gamma, lam, T, placement, length):
    actor, ref, critic, rm, prompts, q, qm, resp = tiny()
    beta, penalty = 0.3, 0.7
    cfg = ppo.PPOConfig(gamma=gamma, lam=lam, missing_eos_penalty=penalty, length_penalty=length)
    kl_cfg = KLConfig(kl_placement=placement)
    batch, info = ppo.make_experience(actor, critic, ref, ref, rm, q, qm, resp, EOS, beta, kl_cfg, cfg, T)
    slow = slow_experience(actor, ref, critic, rm, prompts, resp, beta, gamma, lam, penalty, T, placement,
                           length)
    close = lambda a, b: torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)
    assert [int(m.sum()) for m in batch["mask"]] == [r["n"] for r in slow] == [5, 10, *[r["n"] for r in slow[2:]]]
    for b, r in enumerate(slow):
        n = r["n"]
        close(batch["old_logprobs"][b, :n], r["old"])                 # the actor's, at the right positions
        close(batch["values"][b, :n], r["values"])                    # V(s_t) before each token, not after
        close(info["rewards"][b, :n], r["rewards"])                   # -β·k1 per token, the score at the last
        close(info["scores"][b], torch.tensor(r["score"]))            # read at the last real token, eos penalty
        close(batch["advantages"][b, :n], r["whitened"])              # GAE(γ, λ), then whitened
        close(batch["returns"][b, :n], r["returns"])
        assert (info["rewards"][b, n:] == 0).all() and not batch["mask"][b, n:].any()
    assert info["truncated"].tolist() == [False, True] + [EOS not in r for r in resp[2:].tolist()]
    assert (info["kl_exact"] > 0).all()                               # this actor is not the reference


def test_the_critic_s_value_of_response_token_t_is_its_scalar_after_the_prefix_before_t():
    """response_values (make_experience's values, ppo_update's vpred) at response position t: the
    value of the state before token t is emitted, the critic's scalar at the last token of
    prompt + response[:t], from a forward of that prefix alone (no padding). Prompts of 4 lengths
    (left-padded), a response that ends early, a truncated one."""
    _, _, critic, _, prompts, q, qm, resp = tiny()
    assert len({len(p) for p in prompts}) == 4 and EOS not in resp[1] and resp[0, 4] == EOS
    with torch.no_grad():
        got = response_values(critic, q, qm, resp)
        assert got.shape == resp.shape
        for b, p in enumerate(prompts):
            for t in range(resp.size(1)):
                prefix = torch.tensor([p + resp[b, :t].tolist()])
                torch.testing.assert_close(got[b, t], critic(prefix)[0, -1], atol=1e-5, rtol=1e-5)


def test_rolling_reference_penalises_the_kl_to_its_own_reference():
    """pen_ref (the previous policy) is what the penalty and kl_pen use; kl_exact stays the KL to the frozen one."""
    actor, ref, critic, rm, prompts, q, qm, resp = tiny()
    cfg, k = ppo.PPOConfig(), KLConfig(kl_estimator="full")
    _, info = ppo.make_experience(actor, critic, ref, Reference(actor), rm, q, qm, resp, EOS, 0.3, k, cfg, 1.0)
    assert info["kl_pen"].abs().max() < 1e-6 and (info["kl_exact"] > 0).all()
    assert info["kl"].abs().max() < 1e-6                               # actor == pen_ref: nothing to pay
    _, frozen = ppo.make_experience(actor, critic, ref, ref, rm, q, qm, resp, EOS, 0.3, k, cfg, 1.0)
    torch.testing.assert_close(frozen["kl_pen"], frozen["kl_exact"])
    assert (frozen["kl"].sum(1) > 0).all()


def update(actor, critic, batch, cfg, beta=0.0, kl_cfg=None, seed=3, lr=1e-2):
    a, c = copy.deepcopy(actor), copy.deepcopy(critic)
    opts = tuple(torch.optim.AdamW(m.parameters(), lr=lr, weight_decay=0.0) for m in (a, c))
    torch.manual_seed(seed)
    stats = ppo.ppo_update(a, c, opts, (StepGuard("a"), StepGuard("c")), batch, cfg, 0.7, beta, kl_cfg)
    return a, c, stats


def test_update_starts_at_ratio_one_and_the_critic_cannot_slow_the_actor():
    actor, ref, critic, rm, prompts, q, qm, resp = tiny()
    cfg = ppo.PPOConfig(ppo_epochs=2, minibatch_size=2)
    batch, _ = ppo.make_experience(actor, critic, ref, ref, rm, q, qm, resp, EOS, 0.3, KLConfig(), cfg, 0.7)
    a1, c1, s1 = update(actor, critic, batch, cfg)
    assert s1["ratio_dev_first"] < 1e-5                                 # old log-probs are the rollout policy's
    assert any(not torch.equal(x, y) for x, y in zip(a1.parameters(), actor.parameters()))
    far = dict(batch, returns=batch["returns"] * 1000 + 500)           # a huge value loss
    a2, c2, s2 = update(actor, critic, far, cfg)
    for x, y in zip(a1.parameters(), a2.parameters()):                  # separate clips: the actor's step is the same
        assert torch.equal(x, y)
    assert any(not torch.equal(x, y) for x, y in zip(c1.parameters(), c2.parameters()))


@pytest.mark.parametrize("estimator", ["k2", "k3", "full"])
def test_kl_as_a_loss_pulls_the_actor_to_the_reference(estimator):
    """Advantages 0: only the KL term moves the actor, and it lowers the estimator on the batch's tokens (for
    `full`, the exact KL); β = 0 leaves the actor where it is."""
    actor, ref, critic, rm, prompts, q, qm, resp = tiny()
    cfg, k = ppo.PPOConfig(ppo_epochs=3, minibatch_size=4), KLConfig(kl_in="loss", kl_estimator=estimator)
    batch, info = ppo.make_experience(actor, critic, ref, ref, rm, q, qm, resp, EOS, 0.3, k, cfg, 0.7)
    assert (info["non_score"] == 0).all()                              # nothing was put in the rewards
    batch = dict(batch, advantages=torch.zeros_like(batch["advantages"]))
    moved, _, s = update(actor, critic, batch, cfg, beta=1.0, kl_cfg=k, lr=1e-3)
    still, _, _ = update(actor, critic, batch, cfg, beta=0.0, kl_cfg=k)
    assert all(torch.equal(x, y) for x, y in zip(still.parameters(), actor.parameters()))
    kl_after = lambda m: ppo.make_experience(m, critic, ref, ref, rm, q, qm, resp, EOS, 0.3, k, cfg, 0.7)[1]["kl"]
    assert kl_after(moved).sum() < 0.9 * info["kl"].sum()
    assert s["kl_loss"] > 0


def test_kl_loss_is_summed_over_the_response():
    """The loss form's units are the reward form's: Σ_t kl_t per sequence, averaged over sequences."""
    actor, ref, critic, rm, prompts, q, qm, resp = tiny()
    cfg, k = ppo.PPOConfig(ppo_epochs=1, minibatch_size=4), KLConfig(kl_in="loss", kl_estimator="full")
    batch, info = ppo.make_experience(actor, critic, ref, ref, rm, q, qm, resp, EOS, 0.3, k, cfg, 0.7)
    _, _, s = update(actor, critic, batch, cfg, beta=0.0, kl_cfg=k)     # one minibatch = the whole batch
    assert s["kl_loss"] == pytest.approx(info["kl_exact"].mean().item(), rel=1e-5)


def test_tokens_after_end_of_text_change_nothing():
    actor, ref, critic, rm, prompts, q, qm, resp = tiny()
    cfg, k = ppo.PPOConfig(ppo_epochs=2, minibatch_size=2), KLConfig(kl_in="loss", kl_estimator="full")
    b1, _ = ppo.make_experience(actor, critic, ref, ref, rm, q, qm, resp, EOS, 0.3, k, cfg, 0.7)
    b2 = {key: v.clone() for key, v in b1.items()}
    after = ~b1["mask"]
    assert after.any()
    g = torch.Generator().manual_seed(9)
    b2["response"][after] = torch.randint(0, 50, (int(after.sum()),), generator=g)
    for key in ("old_logprobs", "values", "advantages", "returns", "ref_logprobs"):
        b2[key][after] = torch.randn(int(after.sum()), generator=g) * 100
    b2["ref_logits"][after] = torch.randn(int(after.sum()), 50, generator=g) * 100
    (a1, c1, s1), (a2, c2, s2) = update(actor, critic, b1, cfg, 0.5, k), update(actor, critic, b2, cfg, 0.5, k)
    for key in s1:
        assert abs(s1[key] - s2[key]) < 1e-5, key
    for x, y in zip(list(a1.parameters()) + list(c1.parameters()), list(a2.parameters()) + list(c2.parameters())):
        torch.testing.assert_close(x, y, atol=1e-6, rtol=1e-5)


def test_k3_after_end_of_text_makes_no_nan_and_skips_no_step():
    """After end-of-text the models' log-probs can be anything. Plant there, at each position, the token the
    reference finds likeliest relative to the actor: at T = 0.01 log π_ref - log π exceeds 88 nats, where k3's exp
    overflows. Through make_experience and ppo_update (k3, as a reward and as a loss) nothing is NaN, no step is
    skipped, and the update is the one of the same batch with end-of-text repeated after it."""
    actor, ref, critic, rm, prompts, q, qm, _ = tiny()
    T = 0.01
    torch.manual_seed(1)
    resp, _ = actor.generate(q, 10, temperature=T, eos=EOS, mask=qm)        # near-greedy: real tokens likely
    mask = response_mask(resp, EOS)
    assert 0 < mask.sum() < mask.numel() and mask.all(1).any()              # ended and truncated rows
    planted = resp.clone()
    with torch.no_grad():
        for t in range(resp.size(1)):
            gap = F.log_softmax(ref.logits(q, qm, planted, T), -1) - \
                F.log_softmax(response_logits(actor, q, qm, planted, T), -1)                      # (B, R, V)
            planted[:, t] = torch.where(mask[:, t], planted[:, t], gap[:, t].argmax(-1))
        gap = ref.logprobs(q, qm, planted, T) - token_logprobs(response_logits(actor, q, qm, planted, T), planted)
    assert gap[~mask].max() > 89 and gap[mask].max() < 80                 # exp overflows after end-of-text only
    cfg = ppo.PPOConfig(ppo_epochs=1, minibatch_size=4)      # one step: at T = 0.01 a second pushes real tokens too
    for kl_in in ("reward", "loss"):
        k, after = KLConfig(kl_in=kl_in, kl_estimator="k3"), []
        for r in (resp, planted):
            batch, info = ppo.make_experience(actor, critic, ref, ref, rm, q, qm, r, EOS, 0.3, k, cfg, T)
            assert all(torch.isfinite(x).all() for x in [*batch.values(), *info.values()]
                       if torch.is_tensor(x) and x.is_floating_point())
            a, c = copy.deepcopy(actor), copy.deepcopy(critic)
            opts = tuple(torch.optim.AdamW(m.parameters(), lr=1e-3, weight_decay=0.0) for m in (a, c))
            guards = (StepGuard("a"), StepGuard("c"))
            torch.manual_seed(3)
            ppo.ppo_update(a, c, opts, guards, batch, cfg, T, 0.3, k)
            assert guards[0].skipped == guards[1].skipped == 0, kl_in
            after.append(list(a.parameters()))
        for x, y in zip(*after):
            torch.testing.assert_close(x, y, atol=1e-6, rtol=1e-5)


def test_a_non_finite_loss_skips_the_step_and_several_stop_the_run():
    model = torch.nn.Linear(2, 1)
    opt, guard = torch.optim.SGD(model.parameters(), lr=0.1), StepGuard("test")
    before = [p.clone() for p in model.parameters()]
    assert not guard.backward_and_step(model(torch.tensor([[float("nan"), 1.0]])).sum(), opt, list(model.parameters()), 1.0)
    assert guard.skipped == 1 and all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert guard.backward_and_step(model(torch.ones(1, 2)).sum(), opt, list(model.parameters()), 1.0)
    from machinery.errors import RunError
    with pytest.raises(RunError, match="diverged"):
        for _ in range(10):
            guard.backward_and_step(torch.tensor(float("inf"), requires_grad=True), opt, list(model.parameters()), 1.0)


def test_entropy_bonus_raises_the_entropy():
    actor, ref, critic, rm, prompts, q, qm, resp = tiny()
    cfg = ppo.PPOConfig(ppo_epochs=2, minibatch_size=4, ent_coef=1.0)
    batch, _ = ppo.make_experience(actor, critic, ref, ref, rm, q, qm, resp, EOS, 0.3, KLConfig(), cfg, 0.7)
    batch = dict(batch, advantages=torch.zeros_like(batch["advantages"]))     # only the bonus moves the actor
    entropy = lambda m: ppo.masked_mean(ppo.entropy_from_logits(response_logits(m, q, qm, resp, 0.7)), batch["mask"])
    moved, _, _ = update(actor, critic, batch, cfg, lr=1e-3)
    with torch.no_grad():
        assert entropy(moved) > entropy(actor) + 0.01


def test_reward_model_keeps_the_first_rm_layers_blocks_of_a_copy():
    """--rm_layers=k (default 2 of 4): the reward model, and so the critic, reads the first k pretrained blocks only."""
    from reward import from_pretrained
    torch.manual_seed(0)
    lm = GPT(GPTConfig(block_size=16, vocab_size=50, n_layer=3, n_head=2, n_embd=32)).eval()
    other = copy.deepcopy(lm)
    with torch.no_grad():
        for p in other.blocks[2].parameters():                  # the top block differs
            p.add_(torch.randn_like(p))
    x = torch.randint(0, 50, (2, 10))
    two, two_other = from_pretrained(lm, 2).eval(), from_pretrained(other, 2).eval()
    assert len(two.trunk.blocks) == two.trunk.config.n_layer == 2
    assert torch.equal(two.trunk.hidden(x), two_other.trunk.hidden(x))             # the top block is not read
    full, full_other = from_pretrained(lm, 0).eval(), from_pretrained(other, 5).eval()      # 0 or > n_layer: all
    assert len(full.trunk.blocks) == len(full_other.trunk.blocks) == 3
    assert not torch.allclose(full.trunk.hidden(x), full_other.trunk.hidden(x))
    with torch.no_grad():
        next(two.parameters()).add_(1.0)                        # a copy: training it leaves the language model alone
    assert torch.equal(next(lm.parameters()), next(other.parameters()))


def test_metrics_shared_with_trl_are_trl_s_quantities_by_hand():
    """On a tiny batch (left padding, one early end, one truncated row, temperature 0.7), metrics_row against each
    response scored alone: objective/entropy is TRL's -Σ_t log π_θ_old(y_t) per response, averaged (not the
    per-token entropy, which is policy/entropy_avg); objective/kl is TRL's Σ_t (log π_θ_old - log π_ref) per
    response, averaged; val/explained_variance is CleanRL's 1 - Var(G - V)/Var(G) over the real tokens."""
    actor, ref, critic, rm, prompts, q, qm, resp = tiny()
    T, cfg, k = 0.7, ppo.PPOConfig(), KLConfig(kl_estimator="k1")
    batch, info = ppo.make_experience(actor, critic, ref, ref, rm, q, qm, resp, EOS, 0.3, k, cfg, T)
    stats = dict(entropy=1.0, clipfrac=0.0, approxkl=0.0, ratio_dev_first=0.0, pg_loss=0.0, vf_loss=0.0,
                 kl_loss=0.0, ptx_loss=0.0, vf_clipfrac=0.0, ratio=1.0, ratio_var=0.0)
    info = dict(info, kl_before_rollback=0.0, gold=torch.zeros(len(prompts)))
    guards = (StepGuard("a"), StepGuard("c"))
    row = ppo.metrics_row(0, info, stats, guards, None, 5e-5, 4, 1.0, 2.0)
    entropies, kls, values, returns = [], [], [], []
    for b, p in enumerate(prompts):
        r = resp[b].tolist()
        n = r.index(EOS) + 1 if EOS in r else len(r)
        logp = slow_row(actor, p, r[:n], T)
        logp_ref = slow_row(ref.model, p, r[:n], T)
        entropies.append(-logp.sum().item())
        kls.append((logp - logp_ref).sum().item())
        values += batch["values"][b, :n].tolist()
        returns += batch["returns"][b, :n].tolist()
    values, returns = torch.tensor(values, dtype=torch.float64), torch.tensor(returns, dtype=torch.float64)
    explained = 1 - (returns - values).var(unbiased=False) / returns.var(unbiased=False)
    assert row["objective/entropy"] == pytest.approx(sum(entropies) / len(entropies), rel=1e-5)
    assert row["objective/kl"] == pytest.approx(sum(kls) / len(kls), rel=1e-4, abs=1e-5)
    assert row["val/explained_variance"] == pytest.approx(explained.item(), rel=1e-4, abs=1e-5)
    assert row["policy/entropy_avg"] == 1.0 and row["episode"] == 4 and row["lr"] == 5e-5
