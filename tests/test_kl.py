"""KL estimators, reward shaping and β controllers."""
import math
import pytest
import torch
from torch.nn import functional as F
import kl


def test_k1_and_k3_are_unbiased_for_the_full_kl():
    torch.manual_seed(0)
    for _ in range(3):
        logits, logits_ref = torch.randn(12) * 1.5, torch.randn(12) * 1.5
        exact = kl.kl_full(logits[None, None], logits_ref[None, None]).item()
        logp, logq = F.log_softmax(logits, -1), F.log_softmax(logits_ref, -1)
        y = torch.multinomial(logp.exp(), 200_000, replacement=True)            # tokens sampled from π_θ
        for est in (kl.kl_k1, kl.kl_k3):
            v = est(logp[y], logq[y])
            se = v.std().item() / math.sqrt(len(v))
            assert abs(v.mean().item() - exact) < 4 * se + 1e-4, est.__name__
        k2 = kl.kl_k2(logp[y], logq[y]).mean().item()
        assert k2 >= 0


def test_only_k1_as_a_reward_gives_the_gradient_of_the_kl():
    """One step, all tokens enumerated: the expected score-function gradient E_y[∇log π(y) · kl(y)] of a detached
    per-token reward equals ∇KL for k1; for the exact KL (the same for every y) it is zero; for k3 it is neither."""
    torch.manual_seed(1)
    theta, logits_ref = torch.randn(10, requires_grad=True), torch.randn(10)
    true_grad, = torch.autograd.grad(kl.kl_full(theta, logits_ref), theta)
    logp = F.log_softmax(theta, -1)
    p, logp_ref = logp.exp().detach(), F.log_softmax(logits_ref, -1)

    def reinforce(per_token):                                 # Σ_y π(y) kl(y) ∇log π(y), kl detached
        surrogate = (p * per_token.detach() * logp).sum()
        return torch.autograd.grad(surrogate, theta, retain_graph=True)[0]

    full = kl.kl_full(theta, logits_ref).expand(10)
    assert torch.allclose(reinforce(kl.kl_k1(logp, logp_ref)), true_grad, atol=1e-6)
    assert torch.allclose(reinforce(full), torch.zeros(10), atol=1e-6)
    assert not torch.allclose(reinforce(kl.kl_k3(logp, logp_ref)), true_grad, atol=1e-2)


def test_k3_and_full_never_negative():
    torch.manual_seed(1)
    a, b = torch.randn(64, 20, 30) * 3, torch.randn(64, 20, 30) * 3
    assert (kl.kl_full(a, b) >= -1e-6).all() and kl.kl_full(a, a).abs().max() == 0
    lp, lq = torch.randn(10000) * 4, torch.randn(10000) * 4
    assert (kl.kl_k3(lp, lq) >= 0).all() and (kl.kl_k2(lp, lq) >= 0).all()
    assert (kl.kl_k1(lp, lq) < 0).any()                                       # k1 per token can be negative


def test_full_matches_a_loop_over_the_vocabulary():
    torch.manual_seed(2)
    a, b = torch.randn(2, 3, 7), torch.randn(2, 3, 7)
    p, q = a.softmax(-1), b.softmax(-1)
    for i in range(2):
        for t in range(3):
            expect = sum(p[i, t, v] * math.log(p[i, t, v] / q[i, t, v]) for v in range(7))
            assert abs(kl.kl_full(a, b)[i, t].item() - expect) < 1e-5


def test_shaped_rewards_by_hand():
    klv = torch.tensor([[1.0, 2.0, 3.0, 4.0], [0.5, 0.5, 0.5, 0.5]])
    mask = torch.tensor([[True, True, False, False], [True, True, True, True]])   # row 0 ends at t=1
    r = kl.shaped_rewards(torch.tensor([10.0, -1.0]), klv, mask, beta=0.1)
    torch.testing.assert_close(r, torch.tensor([[-0.1, 10.0 - 0.2, 0.0, 0.0], [-0.05, -0.05, -0.05, -1.05]]))


def test_sequence_placement_by_hand():
    klv = torch.tensor([[1.0, 2.0, 3.0, 4.0], [0.5, 0.5, 0.5, 0.5]])
    mask = torch.tensor([[True, True, False, False], [True, True, True, True]])   # row 0 ends at t=1
    scores = torch.tensor([10.0, -1.0])
    r = kl.shaped_rewards(scores, klv, mask, beta=0.1, placement="sequence")
    # The whole penalty where the score is, nothing before it: the token placement's row sums.
    torch.testing.assert_close(r, torch.tensor([[0.0, 10.0 - 0.3, 0.0, 0.0], [0.0, 0.0, 0.0, -1.2]]))
    torch.testing.assert_close(r.sum(1), kl.shaped_rewards(scores, klv, mask, beta=0.1).sum(1))


def test_sequence_placement_only_in_the_reward():
    import train
    with pytest.raises(SystemExit):
        train.parse(["--kl_placement=sequence", "--kl_in=loss"])
    assert train.parse(["--kl_placement=sequence"]).kl.kl_placement == "sequence"


def test_adaptive_controller_by_hand():
    c = kl.AdaptiveKLController(0.1, target=6.0, horizon=10000)
    c.update(9.0, 64)                                    # error 0.5 clipped to 0.2
    assert c.value == pytest.approx(0.1 * (1 + 0.2 * 64 / 10000))
    v = c.value
    c.update(6.6, 64)                                    # error 0.1
    assert c.value == pytest.approx(v * (1 + 0.1 * 64 / 10000))
    v = c.value
    c.update(0.0, 100)                                   # error -1 clipped to -0.2
    assert c.value == pytest.approx(v * (1 - 0.2 * 100 / 10000))


def test_band_controller_by_hand():
    c = kl.BandKLController(0.02, low=2.0, high=6.0)
    c.update(7.0, 64); assert c.value == pytest.approx(0.024)
    c.update(4.0, 64); assert c.value == pytest.approx(0.024)
    c.update(1.0, 64); c.update(1.0, 64); assert c.value == pytest.approx(0.02 / 1.2)


def test_linear_decay_and_fixed_by_hand():
    c = kl.LinearDecayKLController(0.1, 0.001, total=100)
    assert c.value == 0.1
    c.update(123.0, 50); assert c.value == pytest.approx(0.0505)
    c.update(0.0, 50); assert c.value == pytest.approx(0.001)
    c.update(0.0, 50); assert c.value == pytest.approx(0.001)
    f = kl.FixedKLController(0.3); f.update(100.0, 64); assert f.value == 0.3


def test_make_controller_rejects_unknown():
    with pytest.raises(ValueError, match="unknown kl_ctl"):
        kl.make_kl_controller(kl.KLConfig(kl_ctl="pid"), 100)
