"""Evaluation: what a policy writes for held-out prompts, what it earns, what it costs. The option
--eval_every enters the PPO loop through `due` and `during_ppo`; every stage's final evaluation,
and the report's (pipeline/report.py writes it), use the same functions.

    python train.py --stage=report      # pretrained model vs RLHF actor, side by side
                                        # -> out/report.md, report.json
The ppo and report stages and lab/ablate.py all score through `evaluate_policy`, so every row of
every table is measured the same way: same prompts, same sampling seed, same metrics; the pretrain
stage and lab/ablate.py's examples use `sample_texts` and `judge_texts`.
Best-of-k, the pass@k of this world (`best_of_k`): n = --bestofk_n samples for each of n_eval / n
held-out prompts (spread over the subjects; the same sample budget as the evaluation), and for
k = 1, 2, 4, 8, 16 the expected best gold score among k of them and pass@k, a pass being a
well-formed response with gold above --pass_gold (default 1.25: the pretrained model passes
about 26 % of the time and its pass@16 is 1.0), and again, from the same samples, above
--pass_gold_hard (default 2.0: the pretrained model's pass@16 is 0.67, so a policy that narrows
can show it). Both are the unbiased estimators over the n samples (Chen et al. 2021): every
k-subset of the n counted.
--eval_every=N evaluates the actor during PPO (`during_ppo`), every N iterations, on --eval_n
held-out samples: the trajectory of gold, proxy and KL that lab/ablate.py --suite=overopt fits.
Left out: confidence intervals, per-token views.
"""
from dataclasses import dataclass
import math, os, time
import numpy as np
import torch

import data
from kl import kl_full
from model import response_logits, token_logprobs
from reward import score as reward_score
from sequences import encode_prompts, join_tokens, response_mask
from machinery import progress, state, store
from machinery.config import arg
from machinery.precision import cast_once


@dataclass
class EvalConfig:
    n_eval: int = arg(200, "[1,100000]", "held-out samples in the final evaluation")
    bestofk_n: int = arg(16, "[1,100000]", "best-of-k, pass@k: samples per held-out prompt "
                         "(n_eval in all, at least one prompt's)")
    pass_gold: float = arg(1.25, help="pass@k: a pass is a well-formed response with gold above "
                           "this")
    pass_gold_hard: float = arg(2.0, help="pass@k again, from the same samples, at this harder "
                                "threshold (the default model's pass@16: 0.67)")
    eval_every: int = arg(0, ">=0", "PPO: evaluate the actor on held-out prompts every this many "
                          "iterations (eval/ columns of metrics.jsonl; 0 = off)")
    eval_n: int = arg(96, "[1,100000]", "--eval_every: samples per evaluation (held-out prompts "
                      "cycled, the same sampling noise each time)")


REPORT_COLUMNS = ["gold_mean", "gold_std", "proxy_mean", "kl", "wellformed_rate", "distinct_2",
                  "repetition_rate", "ref_ppl", "eos_rate", "response_length"]


def decode_responses(enc, response):
    """Texts of the responses (B, R) up to and including end-of-text (which decodes as data.EOT)."""
    m = response_mask(response, enc.eot_token)
    return [enc.decode(r[mk].tolist()) for r, mk in zip(response.cpu(), m.cpu())]


@torch.no_grad()
def sample_texts(model, enc, prompts, run, batch=100, label=""):
    """Responses (text) to a list of prompts; the randomness is torch's global generator. With a
    label, a terminal shows `label: done/total samples` while it samples (progress.counter)."""
    model.eval()
    out = []
    t0 = time.time()
    for i in range(0, len(prompts), batch):
        if label:
            progress.counter(label, i, len(prompts), "samples", t0)
        q, qm = (x.to(run.device) for x in encode_prompts(enc, prompts[i:i + batch]))
        # bf16: each weight cast once for the whole sampling, not once per token.
        with cast_once(model):
            resp, _ = model.generate(q, run.response_length, run.temperature, eos=enc.eot_token,
                                     mask=qm)
        out += decode_responses(enc, resp)
    if label:
        progress.counter(label, len(prompts), len(prompts), "samples", t0)
    return out


def judge_texts(prompts, texts):
    """Gold verdicts: well-formed rate, gold mean and std."""
    verdicts = [data.judge(p, r) for p, r in zip(prompts, texts)]
    gold = np.array([v["score"] for v in verdicts])
    stats = dict(wellformed_rate=float(np.mean([v["wellformed"] for v in verdicts])),
                 gold_mean=float(gold.mean()), gold_std=float(gold.std()))
    return stats, verdicts


@torch.no_grad()
def evaluate_policy(model, enc, prompts, run, ref, rm, n, batch=100):
    """n samples on the given prompts (cycled) and what they cost and earn: gold and proxy score,
    exact KL to the reference (nats per sequence), fluency (well-formed, perplexity under the
    reference), diversity (distinct-n, repetition), end-of-text rate. Returns (metrics,
    [(prompt, text, gold, proxy)]). A terminal shows `evaluating: done/n samples` meanwhile."""
    model.eval()
    prompts = [prompts[i % len(prompts)] for i in range(n)]
    kl, nll, ntok, proxy, texts, eos = [], 0.0, 0, [], [], []
    t0 = time.time()
    for i in range(0, n, batch):
        progress.counter("evaluating", i, n, "samples", t0)
        q, qm = (x.to(run.device) for x in encode_prompts(enc, prompts[i:i + batch]))  # (b, Tp)
        with cast_once(model):
            resp, _ = model.generate(q, run.response_length, run.temperature,
                                     eos=enc.eot_token, mask=qm)  # (b, R)
        m = response_mask(resp, enc.eot_token)  # (b, R)
        logits = response_logits(model, q, qm, resp, run.temperature)  # (b, R, V)
        ref_logits = ref.logits(q, qm, resp, run.temperature)  # (b, R, V)
        # The KL of each sequence, summed over its real tokens.
        kl += (kl_full(logits, ref_logits) * m).sum(1).tolist()
        nll, ntok = nll - (token_logprobs(ref_logits, resp) * m).sum().item(), ntok + m.sum().item()
        proxy += reward_score(rm, join_tokens(q, qm, resp, m), enc.eot_token).tolist()
        texts += decode_responses(enc, resp)
        eos += (resp == enc.eot_token).any(1).tolist()
    progress.counter("evaluating", n, n, "samples", t0)
    stats, verdicts = judge_texts(prompts, texts)
    bodies = [t.split(data.EOT)[0] for t in texts]
    metrics = dict(**stats, proxy_mean=float(np.mean(proxy)), kl=float(np.mean(kl)),
                   distinct_1=data.distinct_n(bodies, 1), distinct_2=data.distinct_n(bodies, 2),
                   repetition_rate=float(np.mean([v["repetition"] for v in verdicts])),
                   ref_ppl=math.exp(nll / ntok), eos_rate=float(np.mean(eos)),
                   response_length=ntok / n)
    examples = [(p, t, v["score"], s) for p, t, v, s in zip(prompts, texts, verdicts, proxy)]
    return metrics, examples


def due(cfg, it):
    """True when --eval_every asks for an evaluation after PPO iteration `it` (0-based)."""
    return cfg.eval_every > 0 and (it + 1) % cfg.eval_every == 0


@torch.no_grad()
def during_ppo(actor, enc, prompts, run, ref, rm, cfg):
    """--eval_every: `evaluate_policy` on cfg.eval_n samples of the held-out prompts, drawn from a
    random stream of its own (seeded by --seed, the same at every evaluation, so two evaluations
    differ only by the policy) and every other stream put back as it was, so a run with evaluation
    trains exactly as one without. The KL is to `ref`, the run's frozen reference. Returns the
    eval/ columns of a metrics row."""
    saved = state.rng_states()
    torch.manual_seed(run.seed + 20221019)
    m, _ = evaluate_policy(actor, enc, prompts, run, ref, rm, cfg.eval_n)
    state.set_rng_states(saved)
    names = ("gold_mean", "proxy_mean", "kl", "wellformed_rate", "distinct_2", "response_length",
             "eos_rate")
    return {f"eval/{k}": m[k] for k in names}


@torch.no_grad()
def step0_kl(pretrained, ref, enc, prompts, run, rm, n):
    """Exact KL (nats/sequence) from the pretrained model, i.e. the full fp32 reference, to `ref`,
    on n samples of the pretrained model on `prompts`: the error a cheap reference adds before any
    training."""
    return evaluate_policy(pretrained, enc, prompts, run, ref, rm, n)[0]["kl"]


def expected_best(scores, k):
    """E[max of k scores drawn without replacement from the n given]: the i-th smallest is the
    largest of a k-subset in C(i-1, k-1) of the C(n, k) subsets, so
    Σ_i C(i-1, k-1) / C(n, k) · x_(i) over the sorted scores."""
    x, n = sorted(scores), len(scores)
    return sum(math.comb(i - 1, k - 1) * x[i - 1] for i in range(k, n + 1)) / math.comb(n, k)


def pass_at_k(n, c, k):
    """P(at least one pass among k drawn without replacement from n samples of which c pass):
    1 - C(n-c, k)/C(n, k)."""
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


@torch.no_grad()
def best_of_k(model, enc, prompts, run, n, pass_gold, budget, ks=(1, 2, 4, 8, 16),
              pass_gold_hard=None):
    """n samples for each of budget // n prompts (at least 1, at most all, spread over the list);
    for each k <= n the mean over prompts of the expected best gold score of k samples and of
    pass@k (pass: well-formed with gold > pass_gold), and, with pass_gold_hard, pass@k of the same
    samples at that threshold (pass_at_hard). Randomness: torch's global generator. A terminal
    shows `best-of-k: done/total samples` meanwhile."""
    m = min(len(prompts), max(1, budget // n))
    prompts = [prompts[i * len(prompts) // m] for i in range(m)]
    # Each prompt n times in a row.
    rows = [p for p in prompts for _ in range(n)]
    texts = sample_texts(model, enc, rows, run, batch=256, label="best-of-k")
    verdicts = [data.judge(p, t) for p, t in zip(rows, texts)]
    groups = [verdicts[i:i + n] for i in range(0, len(verdicts), n)]
    ks = [k for k in ks if k <= n]
    best = [float(np.mean([expected_best([v["score"] for v in g], k) for g in groups])) for k in ks]

    def pass_curve(threshold):
        passes = [sum(v["wellformed"] and v["score"] > threshold for v in g) for g in groups]
        return [float(np.mean([pass_at_k(n, c, k) for c in passes])) for k in ks]
    out = dict(n=n, prompts=len(prompts), pass_gold=pass_gold, k=ks, best=best,
               pass_at=pass_curve(pass_gold))
    if pass_gold_hard is not None:
        out.update(pass_gold_hard=pass_gold_hard, pass_at_hard=pass_curve(pass_gold_hard))
    return out
