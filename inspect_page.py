"""The token-by-token page: which tokens the reference pulls back.

    python train.py --stage=inspect                        # out/inspect.html, the main run's RLHF actor
    python train.py --stage=inspect --inspect_actor=out/ablate/no_kl/seed1337/actor.pt    # -> that folder's page

For a few held-out prompts, the pretrained model and the RLHF actor each answer (same sampling noise). Every
response token is coloured by its KL to the frozen reference, twice: k1 = log π_θ(y_t) - log π_ref(y_t) of the
sampled token (red above 0, blue below) and the exact per-position KL over the vocabulary (kl.kl_full). Hovering a
token shows both numbers and the actor's and the reference's top-5 next tokens with their probabilities; a
table under each response lists the same. Gold (the simulated human) and proxy (the reward model) scores head each
response. One self-contained file: inline CSS, no scripts, no fonts, no images.
Named inspect_page.py, not inspect.py: a top-level inspect.py would shadow Python's own `inspect` module.
When the actor's folder holds the critic and ppo.json that PPO wrote beside it, each of the actor's tokens also
shows its advantage: ppo.make_experience run on that one response with the final critic and the final β under the
run's own KL and PPO settings (GAE before whitening; the penalty to the frozen reference, also for a moving one).
An actor trained from another pretrain.pt, ref.pt or reward.pt than out_dir's holds (its PPO record says which:
stages.json, or the ppo.json beside it) is refused: its page would set it against models it never saw.
A critic-free run (--advantage=grpo or rloo) leaves no critic.pt: its page has an empty advantage column (a group
advantage would need the prompt's other samples, which the page does not draw).
Left out: advantages for the pretrained model's tokens (the critic judges the actor's policy), interactive plots.
"""
from dataclasses import dataclass, replace
import html, os
import torch

import data, store, tokenizer
from config import arg
from errors import RunError
from kl import kl_full
from model import response_logits, token_logprobs
from ppo import make_experience
from precision import cast_once
from ref import Reference
from reward import gold_scores, load_scalar_model, score as reward_score
from sequences import encode_prompts, join_tokens, response_mask
from state import load_checkpoint


@dataclass
class InspectConfig:
    inspect_actor: str = arg("", help="inspect stage: the actor.pt to show (default: out_dir's actor.pt)")
    inspect_n: int = arg(6, ">0", "inspect stage: held-out prompts on the page")


SCALE = 1.0                     # nats at which a token's colour is full


@torch.no_grad()
def token_rows(model, ref, enc, prompt, response, temperature, critic=None):
    """Per response token (up to end-of-text): its id and text, k1 and exact KL to the reference, and the top-5
    next tokens (text, probability) of the model and of the reference at that position. critic: None, or
    (critic, rm, β, kl config, ppo config, gold normaliser) to add each token's advantage as PPO computes it."""
    q, qm = encode_prompts(enc, [prompt])                                                    # (1, Tp)
    resp = torch.tensor([response])                                                          # (1, R)
    mask = response_mask(resp, enc.eot_token)[0]                                             # (R,)
    logits = response_logits(model, q, qm, resp, temperature)                                # (1, R, V)
    ref_logits = ref.logits(q, qm, resp, temperature)                                        # (1, R, V)
    k1 = (token_logprobs(logits, resp) - token_logprobs(ref_logits, resp))[0]                # (R,)
    exact = kl_full(logits, ref_logits)[0]                                                   # (R,)

    def top5(lg):                                                                            # lg (V,)
        p, i = lg.softmax(-1).topk(5)
        return [(enc.decode([j]), q) for q, j in zip(p.tolist(), i.tolist())]
    adv = torch.full_like(k1, float("nan"))                                                  # (R,) nan: not shown
    if critic is not None:
        value_model, rm, beta, kl_cfg, ppo_cfg, gold_norm = critic
        _, info = make_experience(model, value_model, ref, ref, rm, q, qm, resp, enc.eot_token, beta, kl_cfg,
                                  ppo_cfg, temperature, gold_scores(enc, [prompt], resp), gold_norm)
        adv = info["advantages"][0]
    return [dict(id=response[t], text=enc.decode([response[t]]), k1=k1[t].item(), kl=exact[t].item(),
                 adv=adv[t].item(), actor_top=top5(logits[0, t]), ref_top=top5(ref_logits[0, t]))
            for t in range(int(mask.sum()))]


def shown(text):
    return html.escape(text.replace(data.EOT, "⏎eot").replace("\n", "↵"))


def colour(v, signed):
    a = min(1.0, abs(v) / SCALE)
    return f"rgba(40,90,220,{a:.3f})" if signed and v < 0 else f"rgba(220,40,40,{a:.3f})"


def token_span(r, key):
    tops = lambda xs: ", ".join(f"{shown(s)!s} {p:.3f}" for s, p in xs)
    adv = "" if r["adv"] != r["adv"] else f" | advantage {r['adv']:+.4f}"                     # nan: no critic
    title = (f"k1 {r['k1']:+.4f} | exact {r['kl']:.4f}{adv}&#10;actor: {tops(r['actor_top'])}&#10;"
             f"reference: {tops(r['ref_top'])}")
    return (f'<span class="t" style="background:{colour(r[key], key == "k1")}" data-tok="{r["id"]}" '
            f'data-k1="{r["k1"]:.6f}" data-kl="{r["kl"]:.6f}" data-adv="{r["adv"]:.6f}" title="{title}">'
            f'{shown(r["text"])}</span>')


def response_block(name, model_path, prompt, rows, gold, proxy):
    tops = lambda xs: "<br>".join(f"{shown(s)} {p:.3f}" for s, p in xs)
    adv = lambda r: "" if r["adv"] != r["adv"] else f"{r['adv']:+.3f}"
    table = "".join(f"<tr><td>{t}</td><td>{shown(r['text'])}</td><td>{r['k1']:+.4f}</td><td>{r['kl']:.4f}</td>"
                    f"<td>{adv(r)}</td><td>{tops(r['actor_top'])}</td><td>{tops(r['ref_top'])}</td></tr>"
                    for t, r in enumerate(rows))
    return (f'<div class="resp" data-model="{html.escape(model_path)}" data-prompt="{html.escape(prompt)}">'
            f'<h3>{html.escape(name)}: gold {gold:+.2f}, proxy {proxy:+.2f}, '
            f'KL {sum(r["kl"] for r in rows):.2f} nats (k1 sum {sum(r["k1"] for r in rows):+.2f})</h3>'
            f'<p class="line"><b>exact</b> {"".join(token_span(r, "kl") for r in rows)}</p>'
            f'<p class="line"><b>k1</b> {"".join(token_span(r, "k1") for r in rows)}</p>'
            f'<details><summary>per token</summary><table><tr><th>t</th><th>token</th><th>k1</th><th>exact KL</th>'
            f'<th>advantage</th><th>actor top-5</th><th>reference top-5</th></tr>{table}</table></details></div>')


CSS = ("body{font-family:sans-serif;max-width:70em;margin:2em auto;line-height:1.6}"
       ".t{font-family:monospace;white-space:pre;padding:1px 0}.line b{display:inline-block;width:4em}"
       ".resp{border-left:3px solid #ccc;padding-left:1em;margin:1em 0}table{border-collapse:collapse;"
       "font-size:80%}td,th{border:1px solid #ddd;padding:2px 6px;vertical-align:top;font-family:monospace}")


def write_page(path, title, blocks, note):
    page = (f"<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>{html.escape(title)}</title>"
            f"<style>{CSS}</style></head><body><h1>{html.escape(title)}</h1><p>{note}</p>{''.join(blocks)}"
            f"</body></html>\n")
    store.write_text(path, page)
    return page


def ppo_critic(cfg, folder, rm):
    """(critic, rm, final β, KL config, PPO config, gold (mean, std)) of the PPO run that wrote folder's actor.pt,
    from the critic.pt and ppo.json beside it (the settings as that run recorded them, not this command's flags);
    None without them."""
    files = [os.path.join(folder, n) for n in ("critic.pt", "ppo.json")]
    if not all(map(os.path.exists, files)):
        return None
    record = store.load_json(files[1])
    ran = lambda group: replace(group, **{k: v for k, v in record["stamp"]["config"].items() if hasattr(group, k)})
    critic, _ = load_scalar_model(files[0], cfg.run.device)
    norm = record.get("gold_norm", dict(mean=0.0, std=1.0))                # --reward=gold: its units
    return critic, rm, record["kl_coef_final"], ran(cfg.kl), ran(cfg.ppo), (norm["mean"], norm["std"])


def made_from(out, actor_path):
    """{file: hash} of out_dir's models the actor was trained from, as its PPO run recorded them: stages.json's ppo
    record for out_dir's own actor.pt (which also vouches for the actor itself), else the ppo.json that PPO wrote
    beside it (ablate.py's runs); None when neither says."""
    record = store.load_records(out).get("ppo")
    if os.path.abspath(actor_path) == os.path.abspath(os.path.join(out, "actor.pt")) and record:
        if record["outputs"].get("actor.pt") != store.file_hash(actor_path):
            raise RunError(f"{actor_path} is not the actor the ppo stage made: redo it with --stage=ppo")
        return record["inputs"]
    beside = os.path.join(os.path.dirname(actor_path), "ppo.json")
    return store.load_json(beside)["stamp"]["inputs"] if os.path.exists(beside) else None


def stage_inspect(cfg, stamp):
    run, n = cfg.run, cfg.inspect.inspect_n
    out = run.out_dir
    actor_path = cfg.inspect.inspect_actor or os.path.join(out, "actor.pt")
    if not os.path.exists(actor_path):
        raise RunError(f"--inspect_actor={actor_path} does not exist")
    inputs = made_from(out, actor_path)
    for name in ("pretrain.pt", "ref.pt", "reward.pt"):          # the page sets the actor against each of them
        if inputs is not None and inputs.get(name) != store.file_hash(os.path.join(out, name)):
            raise RunError(f"{actor_path} was trained from another {name} than the one in {out} (it has changed "
                           "since): its KL and advantages would be to models it never saw; redo its PPO run")
    if inputs is None:
        print(f"inspect: no record says what {actor_path} was trained from; shown against {out}'s models")
    enc = tokenizer.load_tokenizer(out, cfg.world.tokenizer)
    pre, _ = load_checkpoint(os.path.join(out, "pretrain.pt"), run.device)
    ref = Reference(load_checkpoint(os.path.join(out, "ref.pt"), run.device)[0])
    rm, _ = load_scalar_model(os.path.join(out, "reward.pt"), run.device)
    actor, _ = load_checkpoint(actor_path, run.device)
    critic = ppo_critic(cfg, os.path.dirname(actor_path), rm)
    heldout = data.load_prompts(out)["heldout"]
    prompts = heldout[::max(1, len(heldout) // n)][:n]                 # spread over the held-out subjects
    blocks = []
    for name, model, mpath in (("pretrained", pre, os.path.join(out, "pretrain.pt")),
                               (f"RLHF actor ({actor_path})", actor, actor_path)):
        torch.manual_seed(run.seed + 2)                                 # the same sampling noise for both
        q, qm = (x.to(run.device) for x in encode_prompts(enc, prompts))
        with cast_once(model.eval()):
            resp, _ = model.generate(q, run.response_length, run.temperature, eos=enc.eot_token,
                                     mask=qm)
        mask = response_mask(resp, enc.eot_token)
        proxy = reward_score(rm, join_tokens(q, qm, resp, mask), enc.eot_token).tolist()
        for i, p in enumerate(prompts):
            tokens = resp[i][mask[i]].tolist()
            rows = token_rows(model, ref, enc, p, tokens, run.temperature, critic if model is actor else None)
            gold = data.gold_score(p, enc.decode(tokens))
            blocks.append((i, f'<h2>{shown(p.strip())}</h2>' if name == "pretrained" else "",
                           response_block(name, mpath, p, rows, gold, proxy[i])))
    blocks = [h + b for _, h, b in sorted(blocks, key=lambda x: x[0])]   # per prompt: pretrained, then RLHF
    note = (f"Held-out prompts, temperature {run.temperature}. Colour: KL to the frozen reference per token, full "
            f"at {SCALE} nat (red: the actor likes the token more than the reference; blue, k1 only: less). "
            "Hover a token for both numbers and the top-5 next tokens of the actor and the reference. "
            + ("The actor's tokens also show their advantage (GAE before whitening) under the final critic and "
               f"β = {critic[2]:.4g}." if critic else "No critic.pt beside the actor: no advantages."))
    path = os.path.join(os.path.dirname(actor_path) if cfg.inspect.inspect_actor else out, "inspect.html")
    write_page(path, "tether: which tokens the reference pulls back", blocks, note)
    print(f"inspect: {len(prompts)} prompts, pretrained and RLHF actor -> {path}")
