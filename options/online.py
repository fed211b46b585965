"""Online DPO's pairs (Guo et al. 2024, "Direct language model alignment from online AI feedback";
TRL's OnlineDPOTrainer): each round the policy as it is now answers every drawn prompt twice, and
a judge picks which answer is the chosen one; dpo.py then takes one DPO step on those pairs, with
the frozen reference in the loss as offline.

    python train.py --stage=dpo --dpo_pairs=online                   # the reward model judges
    python train.py --stage=dpo --dpo_pairs=online --dpo_judge=gold  # the simulated human judges
    python -m pytest -q tests/test_online.py

The prompts are drawn as PPO draws them (--online_prompts a round from the training prompts, a
generator of --seed), the answers sampled at the sampling temperature. The judge scores an answer
as PPO's reward does: `reward` is the reward model's score (the proxy PPO maximises), `gold` the
simulated human's in the reward model's units (PPO's --reward=gold); both take
--missing_eos_penalty off an answer without end-of-text. The higher score is the chosen answer; a
tie (or the same answer twice) says nothing about which is better, so its pair is left out of the
round. With the same
budget in sampled answers as PPO (60 rounds of 32 prompts x 2 = 60 x 64), offline and online DPO
differ in their data alone.
Left out: more than two answers a prompt (best against worst of k), a language model as the judge.
"""
import torch

from reward import gold_scores, score as reward_score
from sequences import encode_prompts, join_tokens, response_mask
from machinery.precision import cast_once


def draw(prompts, n, gen):
    """n prompts drawn from `gen` with replacement, as ppo.draw_prompts draws a rollout's."""
    drawn = torch.randint(len(prompts), (n,), generator=gen)
    return [prompts[i] for i in drawn.tolist()]


def judge_scores(judge, proxy, gold, penalty, gold_norm):
    """The judge's score (N,) of each answer: `reward` the proxy as PPO scores it (the reward
    model's score less the end-of-text penalty), `gold` the simulated human's score normalised as
    PPO's --reward=gold, less the same penalty."""
    if judge == "gold":
        return (gold.float() - gold_norm[0]) / gold_norm[1] - penalty
    return proxy


@torch.no_grad()
def round_pairs(actor, rm, enc, prompts, cfg, gen, gold_norm):
    """One round: --online_prompts prompts drawn from `gen`, each answered twice by `actor` (the
    global random stream, at the run's temperature), judged. Returns the pairs (as
    reward.labelled_pairs gives them: token lists of prompt + answer, chosen first by the judge,
    their gold scores, the prompt) and the round's numbers for its metrics row."""
    run, dc = cfg.run, cfg.dpo
    n = dc.online_prompts
    drawn = draw(prompts, n, gen)
    # Each prompt twice: the first answers in rows 0..n-1, the second in rows n..2n-1.
    texts = drawn + drawn
    q, qm = (x.to(run.device) for x in encode_prompts(enc, texts))  # (2n, Tp)
    with cast_once(actor):
        response, _ = actor.generate(q, run.response_length, run.temperature,
                                     eos=enc.eot_token, mask=qm)  # (2n, R)
    joined = join_tokens(q, qm, response, response_mask(response, enc.eot_token))
    gold = gold_scores(enc, texts, response)  # (2n,)
    # PPO's scores: the reward model's, less the penalty of an answer without end-of-text.
    truncated = ~(response == enc.eot_token).any(1)  # (2n,)
    penalty = cfg.ppo.missing_eos_penalty * truncated.float().cpu()  # (2n,)
    proxy = reward_score(rm, joined, enc.eot_token).float().cpu() - penalty  # (2n,)
    judged = judge_scores(dc.dpo_judge, proxy, gold, penalty, gold_norm)  # (2n,)
    pairs = []
    agree = 0
    for i in range(n):
        # A tie, or the same answer twice, is no preference: the pair is left out.
        if judged[i] == judged[n + i] or joined[i] == joined[n + i]:
            continue
        better, worse = (i, n + i) if judged[i] > judged[n + i] else (n + i, i)
        pairs.append(dict(chosen=joined[better], rejected=joined[worse],
                          gold_chosen=gold[better].item(), gold_rejected=gold[worse].item(),
                          prompt=texts[i]))
        agree += int(gold[better] > gold[worse])
    lengths = [len(j) - int(m.sum()) for j, m in zip(joined, qm.cpu())]
    info = {"pairs/n": len(pairs), "pairs/ties": n - len(pairs),
            "objective/scores": proxy.mean().item(), "objective/gold": gold.mean().item(),
            "val/response_length": sum(lengths) / len(lengths)}
    # A round without a pair has no agreement to report.
    if pairs:
        info["pairs/judge_agrees_with_gold"] = agree / len(pairs)
    return pairs, info
