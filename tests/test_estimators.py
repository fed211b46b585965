"""Where the KL goes, exactly: every estimator as a detached reward and as a loss, on a tiny autoregressive policy
whose sequences are all enumerated, so each expected gradient is computed exactly (weights π(y), no sampling).

The policy: vocabulary {0, 1, 2}, token 2 is end-of-text, at most 3 tokens; its logits are free parameters, one
vector per prefix (a tabular policy). The reference is another such table. The quantity the penalty stands for is
the sequence-level KL(π_θ‖π_ref) = Σ_y π(y) log π(y)/π_ref(y); its gradient by autograd is the truth.
The per-token penalties go through the functions PPO runs: kl.per_token_kl on model.token_logprobs, the reward form
through kl.shaped_rewards and ppo.compute_gae (values 0, λ = 1: the advantages are the returns), the loss form
summed over the response as ppo_update sums it. Then what is proved for which γ, λ and values (the exact values
V^π by enumeration), and which loss + reward pairs are exact.
"""
import itertools
import pytest
import torch
from kl import kl_full, per_token_kl, shaped_rewards
from model import token_logprobs
from sequences import response_mask
from ppo import compute_gae

V, EOS = 3, 2


def responses(T):
    """Every distinct response (B, T): stops at the first end-of-text, padded after it with end-of-text."""
    out = []
    for n in range(1, T + 1):
        for body in itertools.product([t for t in range(V) if t != EOS], repeat=n - 1):
            out.append(list(body) + [EOS] * (T - n + 1))              # ends with end-of-text at position n-1
    out += [list(b) for b in itertools.product([0, 1], repeat=T)]      # truncated: no end-of-text
    resp = torch.tensor(out)                                          # (B, T)
    prefixes = {p: i for i, p in enumerate(sorted({tuple(r[:t].tolist()) for r in resp for t in range(T)}))}
    idx = torch.tensor([[prefixes[tuple(r[:t].tolist())] for t in range(T)] for r in resp])   # (B, T) prefix row
    return resp, response_mask(resp, EOS), idx, len(prefixes)


RESP, MASK, IDX, N_PREFIX = responses(3)


def policy(seed, n=N_PREFIX, scale=1.5):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, V, generator=g) * scale                     # (prefixes, V) logits per prefix


def forward(theta, ref, w):
    resp, mask, idx, _ = w
    logits, logits_ref = theta[idx], ref[idx]                          # (B, T, V)
    return logits, logits_ref, token_logprobs(logits, resp), token_logprobs(logits_ref, resp), mask


def true_gradient(theta, ref, w=(RESP, MASK, IDX, N_PREFIX)):
    _, _, logp, logp_ref, mask = forward(theta, ref, w)
    seq_logp, seq_logp_ref = (logp * mask).sum(1), (logp_ref * mask).sum(1)          # (B,) log π(y), log π_ref(y)
    assert torch.allclose(seq_logp.exp().sum(), torch.tensor(1.0))    # the enumeration covers every response
    kl_seq = (seq_logp.exp() * (seq_logp - seq_logp_ref)).sum()
    return torch.autograd.grad(kl_seq, theta)[0]


def reward_form(name, theta, ref, gamma=1.0, w=(RESP, MASK, IDX, N_PREFIX), lam=1.0, values=None):
    """E_y[Σ_t ∇log π(y_t|s_t) · A_t] where the rewards are -kl_t (detached), A the GAE(γ, λ) advantages with
    `values` (one per prefix; default 0: with λ = 1 the return from t on, with γ = 0 each token's own penalty).
    Returns ∇ of the expected penalty."""
    logits, logits_ref, logp, logp_ref, mask = forward(theta, ref, w)
    with torch.no_grad():
        kl = per_token_kl(name, logp, logp_ref, logits, logits_ref, mask)            # (B, T)
        rewards = shaped_rewards(torch.zeros(len(mask)), kl, mask, beta=1.0)        # -kl_t, score 0
        v = torch.zeros_like(rewards) if values is None else values[w[2]]           # (B, T) V(s_t)
        advantages, _ = compute_gae(rewards, v, mask, gamma, lam)
        weight = (logp * mask).sum(1).exp()                                          # (B,) π(y), not differentiated
    surrogate = (weight[:, None] * advantages * logp * mask).sum()                   # expected policy gradient
    return -torch.autograd.grad(surrogate, theta)[0]                                 # the penalty's, not the reward's


def loss_form(name, theta, ref, w=(RESP, MASK, IDX, N_PREFIX)):
    """E_y[∇ Σ_t kl_t(y)]: the estimator differentiated, summed over the response (ppo_update's kl_in=loss)."""
    logits, logits_ref, logp, logp_ref, mask = forward(theta, ref, w)
    kl = per_token_kl(name, logp, logp_ref, logits, logits_ref, mask)                # (B, T)
    weight = (logp * mask).sum(1).exp().detach()                                     # sampled from π_θ
    return torch.autograd.grad((weight * torch.where(mask, kl, 0.0).sum(1)).sum(), theta)[0]


@pytest.fixture(params=[0, 1, 2])
def pair(request):
    theta = policy(10 + request.param).requires_grad_(True)
    return theta, policy(20 + request.param)


def close(a, b):
    return torch.allclose(a, b, atol=1e-6, rtol=1e-5)


def far(a, b):
    return (a - b).norm() > 0.05 * b.norm()                           # a clear margin, not rounding


def test_the_enumeration_is_every_response_once():
    assert len(RESP) == 1 + 2 + 4 + 8 and len({tuple(r) for r in RESP.tolist()}) == len(RESP)


def test_k1_in_the_reward_is_the_true_gradient(pair):
    theta, ref = pair
    g = true_gradient(theta, ref)
    assert g.norm() > 0.1
    assert close(reward_form("k1", theta, ref), g)


def test_other_estimators_in_the_reward_are_biased(pair):
    theta, ref = pair
    g = true_gradient(theta, ref)
    for name in ("k2", "k3", "full", "seq_mean"):
        assert far(reward_form(name, theta, ref), g), name


def test_k1_as_a_loss_has_zero_expected_gradient(pair):
    theta, ref = pair
    assert close(loss_form("k1", theta, ref), torch.zeros_like(theta))


def test_k2_as_a_loss_is_k1_in_the_reward_with_per_token_credit_only(pair):
    """k2's gradient is k1_t ∇log π_t: k1 as a reward credited to its own token only (γ = 0), which is also the
    full KL as a loss. With more than one step that is not the sequence KL's gradient: it misses the later terms."""
    theta, ref = pair
    k2 = loss_form("k2", theta, ref)
    assert close(k2, reward_form("k1", theta, ref, gamma=0.0))
    assert close(k2, loss_form("full", theta, ref))
    assert far(k2, true_gradient(theta, ref))


def test_k2_as_a_loss_is_the_true_gradient_for_a_single_step():
    """The bandit case (one token) is where 'k2 as a loss = k1 in the reward = the KL's gradient' is exact."""
    w = responses(1)
    theta, ref = policy(3, w[3]).requires_grad_(True), policy(4, w[3])
    g = true_gradient(theta, ref, w)
    assert g.norm() > 0.1
    assert close(loss_form("k2", theta, ref, w), g) and close(reward_form("k1", theta, ref, w=w), g)
    assert far(loss_form("k3", theta, ref, w), g)


def test_k3_as_a_loss_is_biased(pair):
    """GRPO's form: the gradient of k3 is (1 - π_ref/π) ∇log π, whose expectation is the forward KL's, not ours."""
    theta, ref = pair
    g = true_gradient(theta, ref)
    k3 = loss_form("k3", theta, ref)
    assert far(k3, g) and far(k3, loss_form("k2", theta, ref))
    logits, logits_ref, logp, _, mask = forward(theta, ref, (RESP, MASK, IDX, N_PREFIX))
    forward_kl = kl_full(logits_ref, logits)                          # (B, T) KL(π_ref‖π_θ) at each position
    weight = (logp * mask).sum(1).exp().detach()
    expect = torch.autograd.grad((weight * torch.where(mask, forward_kl, 0.0).sum(1)).sum(), theta)[0]
    assert close(k3, expect)                                          # each position's forward-KL gradient


def test_a_per_token_loss_needs_the_reward_term_for_the_later_positions(pair):
    """∇E[Σ_t KL_t(s_t)] = E[Σ_t ∇KL_t] (full as a loss) + E[Σ_t ∇log π_t · Σ_{t'≥t} KL_t'] (full as a reward):
    the loss alone misses how a token changes the states after it; both together are exact."""
    theta, ref = pair
    g = true_gradient(theta, ref)
    assert far(loss_form("full", theta, ref), g)
    assert close(loss_form("full", theta, ref) + reward_form("full", theta, ref), g)


def test_the_mean_over_the_response_is_not_the_sequence_kl(pair):
    theta, ref = pair
    g = true_gradient(theta, ref)
    assert far(reward_form("seq_mean", theta, ref), g)
    assert far(loss_form("seq_mean", theta, ref) + reward_form("seq_mean", theta, ref), g)


# ---- what is proved, for which γ, λ and values; and the combined placements ----
def true_values(theta, ref):
    """V(s) of the penalty reward -k1 under π_θ, per prefix, by enumeration: Σ_y π(y) (its return from s on) over
    the responses through s, divided by π(s). γ = 1; returns summed by hand (no GAE)."""
    _, _, logp, logp_ref, mask = forward(theta.detach(), ref, (RESP, MASK, IDX, N_PREFIX))
    rewards = -(logp - logp_ref) * mask                                             # (B, T)
    returns = rewards.flip(1).cumsum(1).flip(1)                                     # (B, T) Σ_{t' >= t} r_t'
    weight = (logp * mask).sum(1).exp()[:, None].expand_as(returns)                 # (B, T) π(y)
    num = torch.zeros(N_PREFIX).index_add(0, IDX[MASK], (weight * returns)[MASK])
    den = torch.zeros(N_PREFIX).index_add(0, IDX[MASK], weight[MASK])
    return num / den.clamp(min=1e-30)                                               # (prefixes,)


@pytest.mark.parametrize("lam, values, exact", [(1.0, "random", True), (0.7, "true", True), (0.0, "true", True),
                                                (0.7, "random", False), (0.0, "random", False)])
def test_k1_in_the_reward_is_exact_for_gamma_1_with_lambda_1_or_the_true_values(pair, lam, values, exact):
    """With γ = 1 and λ = 1 any values that depend on the state alone are a baseline (expectation 0); with λ < 1
    the advantages are exact only when the values are V^π of the penalty (the enumerated truth), else biased."""
    theta, ref = pair
    g = true_gradient(theta, ref)
    v = true_values(theta, ref) if values == "true" else policy(30, scale=2.0)[:, 0]
    got = reward_form("k1", theta, ref, lam=lam, values=v)
    assert close(got, g) if exact else far(got, g)


def test_a_discount_below_1_is_not_the_sequence_kl_gradient(pair):
    """γ < 1 weighs a token's later penalties by γ^(t'-t): not the sequence KL's gradient (5.7-57 % off at γ = 0.5,
    1.3-13 % at γ = 0.9, on these three pairs)."""
    theta, ref = pair
    g = true_gradient(theta, ref)
    assert far(reward_form("k1", theta, ref, gamma=0.5), g) and not close(reward_form("k1", theta, ref, gamma=0.9), g)


PLACES = [None, "k1", "k2", "k3", "full", "seq_mean"]
EXACT = {(None, "k1"), ("k1", "k1"), ("k2", "full"), ("full", "full"), ("k3", "k3")}


def test_which_loss_plus_reward_pairs_are_exact(pair):
    """Every (loss form, reward form) pair, each alone included (None: not paid there): ∇KL_seq =
    E[Σ_t ∇KL_t(s_t)] (a position's own KL) + E[Σ_t ∇log π_t Σ_{t'>t} KL_t'] (how a token moves the later
    positions). The reward pays the later part when its estimator is unbiased given the state (k1, k3, full); the
    loss and the reward's same-token term must add up to the own part: k1's same-token term is all of it (so the
    loss must vanish: none or k1), full's is 0 (the loss k2 or full supplies it), k3's is ∇KL_t - ∇KL(π_ref‖π)_t
    and k3 as a loss is ∇KL(π_ref‖π)_t. The five exact pairs, and no other."""
    theta, ref = pair
    g = true_gradient(theta, ref)
    for loss in PLACES:
        for reward in PLACES:
            if loss or reward:
                got = (loss_form(loss, theta, ref) if loss else 0) + (reward_form(reward, theta, ref) if reward else 0)
                assert close(got, g) if (loss, reward) in EXACT else far(got, g), (loss, reward)


# ---- the forward KL, KL(π_ref‖π_θ) at each position (kl_estimator=full_forward): which gradient is it? ----
PREFIXES = sorted({tuple(r[:t]) for r in RESP.tolist() for t in range(RESP.size(1))})     # responses()'s rows
STATES = [s for s in PREFIXES if EOS not in s]                      # every prefix a response token is drawn after


def per_state(theta, ref, reach_from):
    """Σ_s P(s) KL(π_ref(·|s)‖π_θ(·|s)) over the states themselves (no responses, no kl.py): P(s) the probability
    that the table `reach_from` (theta: differentiated; another tensor: held fixed) reaches s."""
    total = 0.0
    for s in STATES:
        reach = 1.0
        for j in range(len(s)):
            reach = reach * torch.softmax(reach_from[PREFIXES.index(s[:j])], -1)[s[j]]
        p_ref, i = torch.softmax(ref[PREFIXES.index(s)], -1), PREFIXES.index(s)
        total = total + reach * (p_ref * (p_ref.log() - torch.log_softmax(theta[i], -1))).sum()
    return total


def sequence_forward_kl_gradient(theta, ref):
    """∇ KL(π_ref‖π_θ) = ∇ Σ_y π_ref(y) log π_ref(y)/π_θ(y) over whole responses, by autograd."""
    _, _, logp, logp_ref, mask = forward(theta, ref, (RESP, MASK, IDX, N_PREFIX))
    seq_logp, seq_logp_ref = (logp * mask).sum(1), (logp_ref * mask).sum(1)                 # (B,)
    return torch.autograd.grad((seq_logp_ref.exp() * (seq_logp_ref - seq_logp)).sum(), theta)[0]


def test_the_forward_kl_as_a_loss_is_its_per_state_gradient_on_the_policys_own_states(pair):
    """full_forward as a loss = ∇_θ Σ_t E_{s_t~π_θ}[KL(π_ref(·|s_t)‖π_θ(·|s_t))] with the state distribution held
    at π_θ's (the states the actor samples), which is k3 as a loss in expectation. It is NOT ∇KL(π_ref‖π_θ) over
    sequences: that one is the same per-state gradient on the states π_ref reaches (checked here too)."""
    theta, ref = pair
    g = loss_form("full_forward", theta, ref)
    assert g.norm() > 0.1
    on_policy = torch.autograd.grad(per_state(theta, ref, theta.detach()), theta)[0]
    assert close(g, on_policy)
    assert close(loss_form("k3", theta, ref), g)                                        # same expectation
    seq = sequence_forward_kl_gradient(theta, ref)
    assert close(torch.autograd.grad(per_state(theta, ref, ref), theta)[0], seq)       # π_ref's states: exact
    assert far(g, seq)
    assert far(g, loss_form("full", theta, ref))                                        # not the reverse KL's


def test_the_forward_kl_in_the_reward_only_steers_which_states_are_reached(pair):
    """As a detached reward (refused by kl.check) it adds only the state-distribution part: with the loss form it
    makes the full derivative of Σ_t E_{s_t~π_θ}[KL_fwd(s_t)], and alone it is neither that nor ∇KL(π_ref‖π_θ)."""
    theta, ref = pair
    both = torch.autograd.grad(per_state(theta, ref, theta), theta)[0]                  # reach differentiated too
    r = reward_form("full_forward", theta, ref)
    assert close(r + loss_form("full_forward", theta, ref), both)
    assert far(r, sequence_forward_kl_gradient(theta, ref)) and far(r, both)
