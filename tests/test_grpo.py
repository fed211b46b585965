"""Critic-free advantages (grpo.py) against loops over the groups, the path PPO runs them through (make_experience ->
ppo_update -> train_ppo, no critic anywhere), and best-of-k / pass@k (evaluate.py) against every k-subset."""
import copy, itertools, math, os, statistics
from types import SimpleNamespace
import pytest
import torch
from machinery.errors import RunError
from options.evaluate import best_of_k, expected_best, pass_at_k
from kl import KLConfig
from model import GPT, GPTConfig
from machinery.optim import StepGuard
from sequences import pad_left
from ref import Reference
from reward import ScalarModel
from tokenizer import make_encoding
import data, ppo, train
from machinery import optim, store
from options import grpo
from tests.test_dist import Letters                  # a stand-in tokenizer: letters a.. as ids 1.., end-of-text 0

EOS = 3


# ---- the baselines, one group at a time ----
def slow_grpo(r, scale):
    """Each group alone, in plain Python: (r - mean) / (sample std + ε), or r - mean."""
    out = []
    for g in r:
        mean, std = sum(g) / len(g), statistics.stdev(g)
        out += [(x - mean) / (std + grpo.EPS) if scale == "std" else x - mean for x in g]
    return out


def slow_rloo(r):
    """Each sample against the mean of the other G - 1 of its group."""
    return [x - sum(g[:i] + g[i + 1:]) / (len(g) - 1) for g in r for i, x in enumerate(g)]


@pytest.mark.parametrize("G", [2, 4, 5])
def test_group_advantages_equal_a_loop_over_groups(G):
    g = torch.Generator().manual_seed(G)
    rewards = torch.randn(3 * G, generator=g, dtype=torch.float64) * 2 + 1              # (B,) 3 groups
    groups = rewards.view(3, G).tolist()
    for scale in ("std", "none"):
        got = grpo.group_advantages(rewards, G, "grpo", scale)
        torch.testing.assert_close(got, torch.tensor(slow_grpo(groups, scale), dtype=torch.float64))
    torch.testing.assert_close(grpo.group_advantages(rewards, G, "rloo"), torch.tensor(slow_rloo(groups),
                                                                                      dtype=torch.float64))


def test_a_group_with_equal_rewards_gets_advantage_zero():
    rewards = torch.tensor([0.7] * 4 + [1.0, 2.0, 3.0, 4.0])                           # (B,) group 1 all equal
    for kind, scale in (("grpo", "std"), ("grpo", "none"), ("rloo", "std")):
        adv = grpo.group_advantages(rewards, 4, kind, scale)
        assert (adv[:4] == 0).all() and (adv[4:] != 0).all(), kind


def test_the_sequence_advantage_is_on_every_token_up_to_end_of_text():
    mask = torch.tensor([[True, True, False], [True, True, True]])                      # row 1 truncated
    adv = grpo.token_advantages(torch.tensor([0.5, -2.0]), mask)
    assert adv.tolist() == [[0.5, 0.5, 0.0], [-2.0, -2.0, -2.0]]


# ---- make_experience and ppo_update with no critic, groups of 4 ----
def tiny(seed=0):
    """An actor that has moved from its reference, a reward model with a random head; 2 prompts of different
    lengths (left-padded), each 4 times in a row; responses sampled, row 1 ends early, row 5 is truncated."""
    torch.manual_seed(seed)
    cfg = GPTConfig(block_size=40, vocab_size=50, n_layer=2, n_head=2, n_embd=32)
    ref_model = GPT(cfg).eval()
    actor = copy.deepcopy(ref_model)
    with torch.no_grad():
        for p in actor.parameters():
            p.add_(0.05 * torch.randn_like(p))
    rm = ScalarModel(copy.deepcopy(ref_model))
    torch.nn.init.normal_(rm.head.weight, 0, 0.5)
    prompts = [[1, 2, 4, 5]] * 4 + [[7, 8]] * 4
    q, qm = pad_left(prompts, EOS)
    resp, _ = actor.generate(q, 10, temperature=0.7, eos=EOS, mask=qm)
    resp[1, 3:] = EOS                                                                  # ends at index 3
    resp[5] = torch.where(resp[5] == EOS, 11, resp[5])                                 # no end-of-text at all
    return actor, Reference(ref_model), rm, q, qm, resp


@pytest.mark.parametrize("advantage, scale, kl_in", [("grpo", "std", "reward"), ("grpo", "none", "loss"),
                                                     ("rloo", "std", "reward")])
def test_make_experience_gives_each_group_its_own_baseline(advantage, scale, kl_in):
    """The sequence reward (score - β·Σ_t k1_t with the KL in the reward) of each row, its advantage by a loop over
    the two groups, on every real token, not whitened; values 0; --reward=gold with its normalisation."""
    actor, ref, rm, q, qm, resp = tiny()
    beta, gold, norm = 0.3, torch.tensor([1.0, 0.5, 0.5, 2.0, -1.0, 0.0, 3.0, 0.5]), (0.5, 2.0)
    cfg = ppo.PPOConfig(advantage=advantage, grpo_scale=scale, group_size=4, reward="gold", missing_eos_penalty=0.7)
    k = KLConfig(kl_in=kl_in)
    batch, info = ppo.make_experience(actor, None, ref, ref, rm, q, qm, resp, EOS, beta, k, cfg, 0.7, gold, norm)
    mask = batch["mask"]
    assert mask.sum(1)[1] == 4 and mask[5].all() and info["truncated"].tolist()[5]
    seq = []
    for b in range(8):                                                  # the sequence reward, row by row
        score = (gold[b].item() - norm[0]) / norm[1] - (0.7 if info["truncated"][b] else 0.0)
        kl = (batch["old_logprobs"][b] - ref.logprobs(q[b:b + 1], qm[b:b + 1], resp[b:b + 1], 0.7)[0])[mask[b]]
        seq.append(score - (beta * kl.sum().item() if kl_in == "reward" else 0.0))
    groups = [seq[:4], seq[4:]]
    expect = slow_rloo(groups) if advantage == "rloo" else slow_grpo(groups, scale)
    for b in range(8):
        torch.testing.assert_close(batch["advantages"][b][mask[b]], torch.full((int(mask[b].sum()),), expect[b]),
                                   atol=1e-5, rtol=1e-4)
        assert (batch["advantages"][b][~mask[b]] == 0).all()
    assert (batch["values"] == 0).all()
    torch.testing.assert_close(info["reward"] + info["non_score"], info["rewards"].sum(1))


def test_ppo_update_without_a_critic_trains_the_actor_alone():
    actor, ref, rm, q, qm, resp = tiny()
    cfg = ppo.PPOConfig(advantage="grpo", group_size=4, ppo_epochs=2, minibatch_size=4)
    batch, _ = ppo.make_experience(actor, None, ref, ref, rm, q, qm, resp, EOS, 0.3, KLConfig(), cfg, 0.7)
    opts = optim.make_optimizers(actor, None, cfg)
    assert len(opts) == 1 and sum(len(g["params"]) for g in opts[0].param_groups) == len(list(actor.parameters()))
    before = copy.deepcopy(actor)
    torch.manual_seed(3)
    stats = ppo.ppo_update(actor, None, opts, (StepGuard("a"), StepGuard("c")), batch, cfg, 0.7, 0.3, KLConfig())
    assert stats["vf_loss"] == 0 and stats["ratio_dev_first"] < 1e-5
    assert any(not torch.equal(x, y) for x, y in zip(before.parameters(), actor.parameters()))


@pytest.mark.parametrize("flags, message", [(["--advantage=grpo", "--group_size=3"], "--group_size >= 2 dividing"),
                                            (["--advantage=rloo", "--group_size=1"], "--group_size >= 2"),
                                            (["--kl_estimator=full_forward"], "--kl_in=loss")])
def test_bad_group_and_forward_kl_flags_are_refused(flags, message, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        train.main(["--preset=smoke", f"--out_dir={tmp_path}", *flags])
    err = capsys.readouterr().err
    assert e.value.code == 2 and message in err and err.count("\n") == 1 and not os.listdir(tmp_path)


# ---- train_ppo, no critic: groups of the same prompt, nothing of a critic in the optimizers or the state ----
def test_train_ppo_without_a_critic_samples_groups_and_saves_no_critic(tmp_path, monkeypatch):
    torch.manual_seed(0)
    ref_model = GPT(GPTConfig(block_size=24, vocab_size=50, n_layer=2, n_head=2, n_embd=32)).eval()
    rm = ScalarModel(copy.deepcopy(ref_model)).requires_grad_(False)
    torch.nn.init.normal_(rm.head.weight, 0, 0.5)
    actor = copy.deepcopy(ref_model).requires_grad_(True)
    cfg = train.parse(["--preset=smoke", "--ppo_iters=2", "--rollout_batch=8", "--minibatch_size=4", "--device=cpu",
                       "--response_length=6", "--advantage=grpo", "--group_size=4", "--kl_in=loss",
                       "--kl_estimator=k3", "--reward=gold"])
    seen, opts_made, make, make_opts = [], [], ppo.make_experience, optim.make_optimizers
    monkeypatch.setattr(ppo, "make_experience", lambda **kw: seen.append(kw) or make(**kw))
    monkeypatch.setattr(optim, "make_optimizers", lambda *a: opts_made.append(make_opts(*a)) or opts_made[-1])
    rows, _ = ppo.train_ppo(actor, None, Reference(ref_model), rm, Letters(), ["abc", "de", "fghij", "k"], cfg,
                            str(tmp_path), dict(test=1), log=lambda s: None, gold_norm=(-4.0, 2.0))
    assert len(rows) == 2 and rows[0]["objective/kl_exact"] == 0 and rows[0]["loss/value_avg"] == 0
    for a in seen:
        critic, q = a["critic"], a["query"]
        assert critic is None
        for g in range(0, 8, 4):                                          # 4 consecutive rows: one prompt
            assert all(torch.equal(q[g], q[g + i]) for i in range(4))
        assert a["gold_norm"] == (-4.0, 2.0) and a["gold"].shape == (8,)               # the gold scores, and their normaliser
    (opts,) = opts_made
    assert len(opts) == 1 and {id(p) for g in opts[0].param_groups for p in g["params"]} == \
        {id(p) for p in actor.parameters()}
    state = store.load_torch(os.path.join(tmp_path, "ppo_state.pt"))
    assert state["critic"] is None and len(state["opts"]) == 1


# ---- best-of-k and pass@k against every k-subset ----
@pytest.mark.parametrize("n", [1, 5, 8])
def test_expected_best_of_k_is_the_mean_over_every_k_subset(n):
    g = torch.Generator().manual_seed(n)
    scores = (torch.randint(-4, 5, (n,), generator=g) * 0.5).tolist()                 # steps of 0.5: ties
    for k in range(1, n + 1):
        subsets = list(itertools.combinations(scores, k))                             # without replacement
        assert expected_best(scores, k) == pytest.approx(sum(map(max, subsets)) / len(subsets), abs=1e-12)


@pytest.mark.parametrize("n", [1, 6, 8])
def test_pass_at_k_is_the_fraction_of_k_subsets_with_a_pass(n):
    for c in range(n + 1):
        passed = [True] * c + [False] * (n - c)
        for k in range(1, n + 1):
            subsets = list(itertools.combinations(passed, k))
            assert pass_at_k(n, c, k) == pytest.approx(sum(map(any, subsets)) / len(subsets), abs=1e-12)
    assert pass_at_k(16, 4, 1) == 0.25 and pass_at_k(16, 0, 16) == 0 and pass_at_k(16, 1, 16) == 1
    assert math.isclose(pass_at_k(4, 2, 2), 1 - 1 / 6)


class Writer:
    """A stand-in policy for best_of_k: to each prompt it writes the next of the responses chosen
    for that prompt, as generate returns them: (B, R) ids, end-of-text after the text, and a text
    without one fills all R."""

    def __init__(self, enc, responses):
        self.enc = enc
        self.left = {p: list(rs) for p, rs in responses.items()}

    def eval(self):
        return self

    def generate(self, idx, max_new_tokens, temperature, eos, mask):
        rows = []
        for q, m in zip(idx, mask):
            # encode_prompts puts end-of-text before each prompt, so it is left out here.
            prompt = self.enc.decode(q[m].tolist()[1:])
            ids = self.enc.encode(self.left[prompt].pop(0), allowed_special="all")
            assert len(ids) == max_new_tokens or (len(ids) < max_new_tokens and ids[-1] == eos)
            rows.append(ids + [eos] * (max_new_tokens - len(ids)))
        return torch.tensor(rows), torch.zeros(len(rows), max_new_tokens)


def test_best_of_k_passes_only_well_formed_responses_above_the_bar():
    """best_of_k through sample_texts and data.judge, on a policy whose responses are known:
    ill-formed ones with a high gold score (an ungrammatical sentence, an off-domain aspect, no
    end-of-text), well-formed ones at exactly pass_gold. pass@k and the expected best gold of k
    against every k-subset of each prompt's responses."""
    # A byte-level tokenizer: any text is a token sequence, and end-of-text is id 256.
    enc = make_encoding({bytes([i]): i for i in range(256)})
    R, E, bar = 100, data.EOT, 1.5
    good = "the pasta was extremely delicious. the waiter was very friendly."
    sharp = "the camera was extremely sharp. the display was very crisp."
    responses = {
        "review: the pasta place on 5th street\n": [
            good + E, good + " pasta the was." + E, good + " the camera was very sharp." + E,
            (good + " the soup was truly fresh.").ljust(R), "the pasta was bland." + E],
        "review: the zeta x2 phone\n": [
            sharp + " blah." + E, sharp.ljust(R), "the camera was good." + E,
            "the pasta was extremely delicious. the camera was very sharp." + E,
            "the design was good." + E],
        "review: the grand hotel on main street\n": [
            "the room was very spotless. the staff was extremely helpful." + E,
            "the bed was cozy." + E,
            "the room was extremely spotless. the pasta was very delicious." + E,
            "i would definitely recommend this hotel." + E,
            ("the staff was extremely welcoming. the room was very cozy. the bathroom was truly "
             "spacious.").ljust(R)]}
    writer = Writer(enc, responses)
    run = SimpleNamespace(response_length=R, temperature=1.0, device="cpu")
    # The harder threshold: a pass needs gold above 2.5, judged on the same samples.
    hard = 2.5
    got = best_of_k(writer, enc, list(responses), run, 5, bar, 15, ks=(1, 2, 3, 5, 8), pass_gold_hard=hard)
    # Every response was written, once.
    assert all(not left for left in writer.left.values())
    verdicts = [[data.judge(p, r) for r in rs] for p, rs in responses.items()]
    wellformed = [[v["wellformed"] for v in vs] for vs in verdicts]
    scores = [[v["score"] for v in vs] for vs in verdicts]
    # The premise: 8 ill-formed responses above the bar, 2 well-formed ones at it, 3 passes.
    assert sum(not w and s > bar for ws, ss in zip(wellformed, scores) for w, s in zip(ws, ss)) == 8
    assert sum(w and s == bar for ws, ss in zip(wellformed, scores) for w, s in zip(ws, ss)) == 2
    assert sum(w and s > bar for ws, ss in zip(wellformed, scores) for w, s in zip(ws, ss)) == 3
    assert got["k"] == [1, 2, 3, 5] and got["prompts"] == 3 and got["n"] == 5
    for i, k in enumerate(got["k"]):
        pass_at, best = [], []
        for ws, ss in zip(wellformed, scores):
            subsets = list(itertools.combinations(range(5), k))
            passed = [any(ws[j] and ss[j] > bar for j in s) for s in subsets]
            pass_at.append(sum(passed) / len(subsets))
            best.append(sum(max(ss[j] for j in s) for s in subsets) / len(subsets))
        assert got["pass_at"][i] == pytest.approx(statistics.mean(pass_at), abs=1e-12)
        assert got["best"][i] == pytest.approx(statistics.mean(best), abs=1e-12)
        hard_at = [sum(any(ws[j] and ss[j] > hard for j in s) for s in itertools.combinations(range(5), k))
                   / math.comb(5, k) for ws, ss in zip(wellformed, scores)]
        assert got["pass_at_hard"][i] == pytest.approx(statistics.mean(hard_at), abs=1e-12)
    # The harder bar passes fewer, and not none: the two curves differ.
    assert got["pass_gold_hard"] == hard and 0 < got["pass_at_hard"][0] < got["pass_at"][0]
