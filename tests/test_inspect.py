"""python -m lab.inspect_page: the page is written, is well-formed self-contained HTML, and every number on it
is what kl.py gives for the same tokens (recomputed here from the models through the real functions)."""
import json, math, os, shutil
from html.parser import HTMLParser
import torch
import tokenizer, train
from lab import inspect_page
from machinery import store
from kl import kl_full
from model import response_logits, token_logprobs
from sequences import encode_prompts, join_tokens, response_mask
from ref import load_checkpoint
from reward import load_scalar_model, response_values, score

VOID = {"meta", "br"}


class Page(HTMLParser):
    """Checks that every tag closes in order; collects each response block's tokens from its `exact` line."""

    def __init__(self):
        super().__init__()
        self.stack, self.blocks = [], []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag not in VOID:
            self.stack.append(tag)
        if tag == "div" and a.get("class") == "resp":
            self.blocks.append(dict(model=a["data-model"], prompt=a["data-prompt"], lines=[]))
        if tag == "p" and a.get("class") == "line":
            self.blocks[-1]["lines"].append([])
        if tag == "span" and "data-tok" in a:
            self.blocks[-1]["lines"][-1].append((int(a["data-tok"]), float(a["data-k1"]), float(a["data-kl"]),
                                                 float(a["data-adv"])))

    def handle_endtag(self, tag):
        assert self.stack and self.stack.pop() == tag, f"</{tag}> closes nothing open"


def test_inspect_page_is_valid_and_its_numbers_are_kl_py_s(run):
    inspect_page.main(["--preset=smoke", f"--out_dir={run}", "--inspect_n=2"])
    text = open(os.path.join(run, "inspect.html"), encoding="utf-8").read()
    for external in ("<script", "http://", "https://", "@font-face", "src=", "@import"):
        assert external not in text                                       # one self-contained file
    page = Page()
    page.feed(text)
    page.close()
    assert page.stack == [] and len(page.blocks) == 4                     # 2 prompts x (pretrained, RLHF)
    enc = tokenizer.load_tokenizer(run, "bpe")
    ref, _ = load_checkpoint(os.path.join(run, "ref.pt"))
    cfg = train.parse(["--preset=smoke"])
    moved = 0
    for b in page.blocks:
        exact_line, k1_line = b["lines"]
        assert [x[:3] for x in exact_line] == [x[:3] for x in k1_line] and exact_line   # the same tokens
        advs = [a for *_, a in exact_line]
        model, _ = load_checkpoint(b["model"])
        q, qm = encode_prompts(enc, [b["prompt"]])
        resp = torch.tensor([[t for t, *_ in exact_line]])                # (1, R)
        with torch.no_grad():
            logits = response_logits(model, q, qm, resp, cfg.run.temperature)       # (1, R, V)
            ref_logits = response_logits(ref, q, qm, resp, cfg.run.temperature)
            kl = kl_full(logits, ref_logits)[0]
            k1 = (token_logprobs(logits, resp) - token_logprobs(ref_logits, resp))[0]
        torch.testing.assert_close(torch.tensor([v for _, _, v, _ in exact_line]), kl, atol=2e-6, rtol=0)
        torch.testing.assert_close(torch.tensor([v for _, v, _, _ in exact_line]), k1, atol=2e-6, rtol=0)
        if b["model"].endswith("pretrain.pt"):
            assert kl.abs().max() == 0                                    # the reference is the pretrained model
            assert all(math.isnan(a) for a in advs)                       # the critic judges the actor only
        else:
            moved += kl.sum().item() > 0
            assert all(math.isfinite(a) for a in advs)                    # PPO left critic.pt beside actor.pt
    assert moved == 2                                                     # the RLHF actor is not the reference


def test_inspect_advantages_are_gae_under_the_runs_own_settings(run, tmp_path):
    """Each of the actor's tokens shows sum_l (γλ)^l δ_(t+l), δ_t = r_t + γ V_(t+1) - V_t, with r_t = -β k1_t and
    the reward model's score added at the last token, computed here by brute force. The settings are the ones the
    run recorded in ppo.json, not this command's: a copy of the run with γ 0.9, λ 0.8, β 0.3 written there."""
    for n in ("actor.pt", "critic.pt"):
        shutil.copy(os.path.join(run, n), tmp_path / n)
    rec = store.load_json(os.path.join(run, "ppo.json"))
    rec["stamp"]["config"].update(gamma=0.9, lam=0.8)
    rec["kl_coef_final"] = 0.3
    (tmp_path / "ppo.json").write_text(json.dumps(rec))
    inspect_page.main(["--preset=smoke", f"--out_dir={run}", "--inspect_n=2",
                f"--inspect_actor={tmp_path / 'actor.pt'}"])
    page = Page()
    page.feed((tmp_path / "inspect.html").read_text(encoding="utf-8"))
    enc = tokenizer.load_tokenizer(run, "bpe")
    ref, _ = load_checkpoint(os.path.join(run, "ref.pt"))
    rm, _ = load_scalar_model(os.path.join(run, "reward.pt"))
    critic, _ = load_scalar_model(os.path.join(run, "critic.pt"))
    actor, _ = load_checkpoint(os.path.join(run, "actor.pt"))
    temperature, eot = train.parse(["--preset=smoke"]).run.temperature, enc.eot_token
    gamma, lam, beta, seen = 0.9, 0.8, 0.3, 0
    for b in page.blocks:
        if b["model"].endswith("pretrain.pt"):
            continue
        line = b["lines"][0]
        q, qm = encode_prompts(enc, [b["prompt"]])
        resp = torch.tensor([[t for t, *_ in line]])                      # (1, L)
        L = resp.size(1)
        with torch.no_grad():
            k1 = (token_logprobs(response_logits(actor, q, qm, resp, temperature), resp)
                  - token_logprobs(response_logits(ref, q, qm, resp, temperature), resp))[0]          # (L,)
            values = response_values(critic, q, qm, resp)[0]                                         # (L,)
            s = score(rm, join_tokens(q, qm, resp, response_mask(resp, eot)), eot)[0]
        s = s - 1.0 * (resp[0, -1] != eot)                                # missing_eos_penalty (smoke default)
        r = [-beta * k1[t] + (s if t == L - 1 else 0.0) for t in range(L)]
        delta = [r[t] + (gamma * values[t + 1] if t + 1 < L else 0.0) - values[t] for t in range(L)]
        want = [sum((gamma * lam) ** l * delta[t + l] for l in range(L - t)) for t in range(L)]
        torch.testing.assert_close(torch.tensor([a for *_, a in line]), torch.stack(want).float(), atol=1e-4,
                                   rtol=0)
        seen += 1
    assert seen == 2
