"""GAE, the clipped objective, and the masking of everything after end-of-text."""
import copy
import torch
from torch.nn import functional as F
from model import GPT, GPTConfig, pad_left, response_logits
from reward import ScalarModel
from ref import Reference
from kl import kl_full
import ppo


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


def tiny():
    torch.manual_seed(0)
    actor = GPT(GPTConfig(block_size=40, vocab_size=50, n_layer=2, n_head=2, n_embd=32)).eval()
    critic = ScalarModel(copy.deepcopy(actor))
    torch.nn.init.normal_(critic.head.weight, 0, 0.1)
    q, qm = pad_left([[1, 2, 3, 4], [5, 6], [7, 8, 9], [10]], 0)
    resp, _ = actor.generate(q, 10, eos=3, mask=qm)
    resp[0, 4] = 3                                                  # make sure one row ends early
    resp[0, 5:] = 3
    return actor, critic, q, qm, resp


def make_batch(actor, critic, q, qm, resp, eos=3):
    mask = torch.cumsum((resp == eos).long(), 1) - (resp == eos).long() == 0
    with torch.no_grad():
        logits = response_logits(actor, q, qm, resp, 1.0)
        old = F.log_softmax(logits, -1).gather(2, resp[..., None]).squeeze(-1)
        values = critic(torch.cat([q, resp], 1), torch.cat([qm, torch.ones_like(mask)], 1))[:, q.size(1) - 1:-1]
    adv = torch.randn(resp.shape, generator=torch.Generator().manual_seed(5))
    return dict(query=q, query_mask=qm, response=resp, mask=mask, old_logprobs=old, values=values,
                advantages=ppo.whiten(adv, mask), returns=values + 1.0, ref_logits=logits.clone())


def test_first_minibatch_ratio_is_one_and_kl_to_reference_is_zero():
    actor, critic, q, qm, resp = tiny()
    ref = Reference(actor)
    b = make_batch(actor, critic, q, qm, resp)
    mb = torch.tensor([2, 0])                                      # a minibatch, as the update would draw it
    logits = response_logits(actor, q[mb], qm[mb], resp[mb], 1.0)
    new = F.log_softmax(logits, -1).gather(2, resp[mb][..., None]).squeeze(-1)
    ratio = torch.exp(new - b["old_logprobs"][mb])
    assert (ratio - 1).abs().max() < 1e-6
    assert kl_full(response_logits(actor, q, qm, resp, 1.0), ref.logits(q, qm, resp, 1.0)).abs().max() == 0


def test_tokens_after_end_of_text_change_nothing():
    actor, critic, q, qm, resp = tiny()
    b1 = make_batch(actor, critic, q, qm, resp)
    b2 = {k: v.clone() for k, v in b1.items()}
    after = ~b1["mask"]
    assert after.any()
    g = torch.Generator().manual_seed(9)
    b2["response"][after] = torch.randint(0, 50, (int(after.sum()),), generator=g)
    for k in ("old_logprobs", "values", "advantages", "returns"):
        b2[k][after] = torch.randn(int(after.sum()), generator=g) * 100
    cfg = ppo.PPOConfig(ppo_epochs=2, minibatch_size=2)
    results = []
    for batch in (b1, b2):
        a, c = copy.deepcopy(actor), copy.deepcopy(critic)
        opt = torch.optim.AdamW([{"params": a.parameters(), "lr": 1e-2}, {"params": c.parameters(), "lr": 1e-2}])
        torch.manual_seed(3)
        stats = ppo.ppo_update(a, c, opt, batch, cfg, 1.0, kl_coef=0.5, kl_in="loss")
        results.append((stats, [p.detach().clone() for p in list(a.parameters()) + list(c.parameters())]))
    (s1, p1), (s2, p2) = results
    for k in s1:
        assert abs(s1[k] - s2[k]) < 1e-5, k
    for x, y in zip(p1, p2):
        torch.testing.assert_close(x, y, atol=1e-6, rtol=1e-5)
    assert any(not torch.equal(x, y) for x, y in zip(p1, list(actor.parameters()) + list(critic.parameters())))
