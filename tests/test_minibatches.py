"""--minibatch_order=length against shuffle, through ppo_update and train_ppo: equal lengths give the same update bit
for bit; every epoch holds every response once, in minibatches of the configured size, each forwarded at its longest
response and as homogeneous in length as sorting can make them (a brute-force cut of the sorted lengths), in an order
that varies; the PPO stage at smoke size runs, and a kill and resume ends as the uninterrupted run."""
import os
import pytest
import torch
import ppo
from machinery import store
from kl import KLConfig
from test_anchors import ppo_run, stopped_at_3_and_resumed
from test_ppo import EOS, tiny, update

R = 12


def rollout_of_lengths(lengths, seed=0):
    """make_experience on responses of the given lengths (end-of-text included; R: truncated), tiny()'s models and
    its 4 left-padded prompts of different lengths, repeated."""
    actor, ref, critic, rm, prompts, q, qm, _ = tiny(seed)
    B = len(lengths)
    q, qm = q.repeat(B // 4 + 1, 1)[:B], qm.repeat(B // 4 + 1, 1)[:B]
    g = torch.Generator().manual_seed(seed)
    resp = torch.randint(4, 50, (B, R), generator=g)                      # ids >= 4: no end-of-text by chance
    for b, n in enumerate(lengths):
        if n < R:
            resp[b, n - 1:] = EOS
    k = KLConfig(kl_in="loss", kl_estimator="k3")                          # the loss form too: ref_logprobs travel
    batch, _ = ppo.make_experience(actor, critic, ref, ref, rm, q, qm, resp, EOS, 0.3, k, ppo.PPOConfig(), 0.7)
    assert batch["mask"].sum(1).tolist() == list(lengths)
    return actor, critic, batch, k


@pytest.mark.parametrize("size", [2, 3])                                 # 3: a last minibatch of 2 (8 = 3 + 3 + 2)
def test_equal_lengths_make_the_length_update_the_shuffle_update_bit_for_bit(size):
    actor, critic, batch, k = rollout_of_lengths([7] * 8)
    runs = []
    for order in ("shuffle", "length"):
        cfg = ppo.PPOConfig(ppo_epochs=3, minibatch_size=size, minibatch_order=order, ent_coef=0.01)
        runs.append(update(actor, critic, batch, cfg, beta=0.2, kl_cfg=k))
    (a1, c1, s1), (a2, c2, s2) = runs
    assert s1 == s2
    for x, y in zip([*a1.parameters(), *c1.parameters()], [*a2.parameters(), *c2.parameters()], strict=True):
        assert torch.equal(x, y)
    assert any(not torch.equal(x, y) for x, y in zip(a1.parameters(), actor.parameters()))      # it did train


MIXED = [12, 3, 7, 3, 9, 1, 12, 5, 3, 10, 7, 2, 12, 6, 3, 8, 4, 11]     # 18 responses, ties, 3 truncated (12 = R)


def plan_of(batch, cfg, actor, critic, k):
    """What ppo_update did, epoch by epoch: the minibatches it drew (index tensors, from ppo.minibatches as it called
    it) and the response width each was forwarded at (ppo.response_logits as it called it)."""
    pieces, widths = [], []
    draw, logits = ppo.minibatches, ppo.response_logits
    ppo.minibatches = lambda *a: pieces.append(draw(*a)) or pieces[-1]
    ppo.response_logits = lambda m, q, qm, resp, t: widths.append(resp.size(1)) or logits(m, q, qm, resp, t)
    try:
        update(actor, critic, batch, cfg, beta=0.2, kl_cfg=k, seed=5)
    finally:
        ppo.minibatches, ppo.response_logits = draw, logits
    assert len(pieces) == cfg.ppo_epochs and len(widths) == sum(map(len, pieces))
    return pieces, widths


def test_each_epoch_holds_every_response_once_in_minibatches_of_similar_lengths():
    actor, critic, batch, k = rollout_of_lengths(MIXED)
    L, B, size = torch.tensor(MIXED), len(MIXED), 4
    padded, spread = {}, {}
    for order in ("shuffle", "length"):
        cfg = ppo.PPOConfig(ppo_epochs=4, minibatch_size=size, minibatch_order=order)
        pieces, widths = plan_of(batch, cfg, actor, critic, k)
        width = iter(widths)
        for epoch in pieces:
            assert sorted(torch.cat(epoch).tolist()) == list(range(B))                  # each response once
            assert [len(p) for p in epoch] == [4, 4, 4, 4, 2]                           # the configured size
            for p in epoch:
                assert next(width) == L[p].max()                                        # cut to its longest
            if order == "length":                  # the best any grouping can do: the sorted lengths, cut in runs
                assert sum(sorted(sorted(L[p].tolist()) for p in epoch), []) == sorted(MIXED)
        forwarded = sum(size_ * w for size_, w in zip((len(p) for e in pieces for p in e), widths))
        padded[order] = 1 - cfg.ppo_epochs * sum(MIXED) / forwarded
        spread[order] = sum(int(L[p].max() - L[p].min()) for e in pieces for p in e)
    assert spread["length"] < spread["shuffle"] / 3 and padded["length"] < padded["shuffle"] / 2


def test_length_groups_are_the_sorted_lengths_cut_and_come_in_an_order_that_varies():
    """Straight on ppo.minibatches, many epochs: the groups are consecutive runs of the sorted lengths (slot sizes
    as shuffle's), ties are broken afresh each epoch (who shares a group changes), and every group is first about
    as often as every other (the order is random)."""
    L = torch.tensor(MIXED[:16])                                            # 16 = 4 x 4: no smaller last minibatch
    torch.manual_seed(0)
    first, members = torch.zeros(4), set()
    for _ in range(2000):
        epoch = ppo.minibatches(L, 4, "length")
        assert sorted(torch.cat(epoch).tolist()) == list(range(16))
        by_mean = sorted(epoch, key=lambda p: L[p].double().mean().item())
        assert sum((sorted(L[p].tolist()) for p in by_mean), []) == sorted(L.tolist())
        first[[p is epoch[0] for p in by_mean].index(True)] += 1             # the rank of the group trained first
        members.add(tuple(sorted(by_mean[0].tolist())))                        # who the shortest group holds
    assert len(members) > 1                                                 # 3 of 5 length-3 rows: ties vary
    assert (first / 2000 - 0.25).abs().max() < 0.05, first                  # uniform: 500 ± 19 each


def test_the_ppo_stage_with_length_order_runs_and_resumes_as_if_never_interrupted(run, tmp_path):
    flags = ["--minibatch_order=length", "--ppo_iters=3"]
    whole, rows = ppo_run(run, tmp_path / "whole", *flags)
    _, shuffled = ppo_run(run, tmp_path / "shuffle", "--ppo_iters=3")
    assert rows[0]["objective/kl_exact"] == 0.0 and rows[0]["policy/ratio_dev_first"] < 1e-5
    assert rows[-1]["objective/kl_exact"] > 0 and all(r["policy/skipped_updates"] == 0 for r in rows)
    assert rows[0]["loss/policy_avg"] != shuffled[0]["loss/policy_avg"]     # the flag reaches the update

    again, resumed = stopped_at_3_and_resumed(run, tmp_path / "cut", *flags)
    assert resumed == rows and again["final"] == whole["final"]
    assert store.load_json(os.path.join(tmp_path / "cut", "ppo.json"))["stamp"]["config"]["minibatch_order"] == "length"
