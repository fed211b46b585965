"""The token-by-token page: which tokens the reference pulls back.

    # out/inspect.html, the main run's RLHF actor
    python -m lab.inspect_page
    # -> that folder's page
    python -m lab.inspect_page --inspect_actor=out/ablate/no_kl/seed1337/actor.pt
    python -m lab.inspect_page --inspect_actor=out/dpo_actor.pt    # -> out/inspect_dpo.html
    python -m lab.inspect_page --help    # its two flags; every other flag is train.py's

For a few held-out prompts, the pretrained model and the RLHF actor each answer (same sampling
noise). Every response token is coloured by its KL to the frozen reference, twice:
k1 = log π_θ(y_t) - log π_ref(y_t) of the sampled token (red above 0, blue below) and the exact
per-position KL over the vocabulary (kl.kl_full). Hovering a token shows both numbers and the
actor's and the reference's top-5 next tokens with their probabilities; a table under each response
lists the same. Gold (the simulated human) and proxy (the reward model) scores head each response.
One self-contained file: inline CSS, no scripts, no fonts, no images.
Named inspect_page.py, not inspect.py: run as a script, an inspect.py would shadow Python's own
`inspect` module.
When the actor's folder holds the critic and ppo.json that PPO wrote beside it, each of the actor's
tokens also shows its advantage: ppo.make_experience run on that one response with the final critic
and the final β under the run's own KL and PPO settings (GAE before whitening; the penalty to the
frozen reference, also for a moving one).
An actor trained from another pretrain.pt, ref.pt or reward.pt than out_dir's holds (its PPO record
says which: stages.json, or the ppo.json beside it) is refused: its page would set it against
models it never saw.
A DPO actor (dpo_actor.pt, from --stage=dpo) has no critic: its page has no advantages, and
its record is stages.json's dpo record or the dpo.json beside it.
A critic-free run (--advantage=grpo or rloo) leaves no critic.pt: its page has an empty advantage
column (a group advantage would need the prompt's other samples, which the page does not draw).
Left out: advantages for the pretrained model's tokens (the critic judges the actor's policy),
interactive plots.
"""
# Ctrl-C while the imports below load torch (seconds) is one line and exit 130.
if __name__ == "__main__":
    from machinery.errors import ctrl_c_while_starting
    ctrl_c_while_starting()
from dataclasses import dataclass, replace
import html, os, sys, time
import torch

import data, tokenizer, train
from kl import kl_full
from model import response_logits, token_logprobs
from ppo import make_experience
from ref import load_reference
from reward import gold_scores, load_scalar_model, score as reward_score
from sequences import encode_prompts, join_tokens, response_mask
from machinery import progress, records, store
from machinery.config import arg, check_once, parse_args, print_help
from machinery.errors import RunError, die, run_main
from machinery.precision import cast_once
from ref import load_checkpoint


@dataclass
class InspectConfig:
    inspect_actor: str = arg("", help="the actor.pt to show (default: out_dir's actor.pt)")
    inspect_n: int = arg(6, ">0", "held-out prompts on the page")


# The nats at which a token's colour is full.
SCALE = 1.0


@torch.no_grad()
def token_rows(model, ref, enc, prompt, response, temperature, critic=None):
    """Per response token (up to end-of-text): its id and text, k1 and exact KL to the reference,
    and the top-5 next tokens (text, probability) of the model and of the reference at that
    position. critic: None, or (critic, rm, β, kl config, ppo config, gold normaliser) to add each
    token's advantage as PPO computes it."""
    q, qm = encode_prompts(enc, [prompt])                                      # (1, Tp)
    resp = torch.tensor([response])                                            # (1, R)
    mask = response_mask(resp, enc.eot_token)[0]                               # (R,)
    logits = response_logits(model, q, qm, resp, temperature)                  # (1, R, V)
    ref_logits = ref.logits(q, qm, resp, temperature)                          # (1, R, V)
    k1 = (token_logprobs(logits, resp) - token_logprobs(ref_logits, resp))[0]  # (R,)
    exact = kl_full(logits, ref_logits)[0]                                     # (R,)

    # The top 5 of lg, the logits (V,) at one position.
    def top5(lg):
        p, i = lg.softmax(-1).topk(5)
        return [(enc.decode([j]), q) for q, j in zip(p.tolist(), i.tolist())]
    adv = torch.full_like(k1, float("nan"))  # (R,) nan: not shown
    if critic is not None:
        value_model, rm, beta, kl_cfg, ppo_cfg, gold_norm = critic
        gold = gold_scores(enc, [prompt], resp)
        _, info = make_experience(model, value_model, ref, ref, rm, q, qm, resp, enc.eot_token,
                                  beta, kl_cfg, ppo_cfg, temperature, gold, gold_norm)
        adv = info["advantages"][0]
    return [dict(id=response[t], text=enc.decode([response[t]]), k1=k1[t].item(),
                 kl=exact[t].item(), adv=adv[t].item(), actor_top=top5(logits[0, t]),
                 ref_top=top5(ref_logits[0, t]))
            for t in range(int(mask.sum()))]


def shown(text):
    return html.escape(text.replace(data.EOT, "⏎eot").replace("\n", "↵"))


def colour(v, signed):
    a = min(1.0, abs(v) / SCALE)
    return f"rgba(40,90,220,{a:.3f})" if signed and v < 0 else f"rgba(220,40,40,{a:.3f})"


def token_span(r, key):
    def tops(xs):
        return ", ".join(f"{shown(s)!s} {p:.3f}" for s, p in xs)
    # A nan advantage (it differs from itself) means no critic.
    adv = "" if r["adv"] != r["adv"] else f" | advantage {r['adv']:+.4f}"
    title = (f"k1 {r['k1']:+.4f} | exact {r['kl']:.4f}{adv}&#10;actor: {tops(r['actor_top'])}&#10;"
             f"reference: {tops(r['ref_top'])}")
    return (f'<span class="t" style="background:{colour(r[key], key == "k1")}" '
            f'data-tok="{r["id"]}" data-k1="{r["k1"]:.6f}" data-kl="{r["kl"]:.6f}" '
            f'data-adv="{r["adv"]:.6f}" title="{title}">{shown(r["text"])}</span>')


def response_block(name, model_path, prompt, rows, gold, proxy):
    def tops(xs):
        return "<br>".join(f"{shown(s)} {p:.3f}" for s, p in xs)

    def adv(r):
        return "" if r["adv"] != r["adv"] else f"{r['adv']:+.3f}"
    table = "".join(f"<tr><td>{t}</td><td>{shown(r['text'])}</td><td>{r['k1']:+.4f}</td>"
                    f"<td>{r['kl']:.4f}</td><td>{adv(r)}</td><td>{tops(r['actor_top'])}</td>"
                    f"<td>{tops(r['ref_top'])}</td></tr>"
                    for t, r in enumerate(rows))
    kl_sum = sum(r["kl"] for r in rows)
    k1_sum = sum(r["k1"] for r in rows)
    return (f'<div class="resp" data-model="{html.escape(model_path)}" '
            f'data-prompt="{html.escape(prompt)}">'
            f'<h3>{html.escape(name)}: gold {gold:+.2f}, proxy {proxy:+.2f}, '
            f'KL {kl_sum:.2f} nats (k1 sum {k1_sum:+.2f})</h3>'
            f'<p class="line"><b>exact</b> {"".join(token_span(r, "kl") for r in rows)}</p>'
            f'<p class="line"><b>k1</b> {"".join(token_span(r, "k1") for r in rows)}</p>'
            f'<details><summary>per token</summary><table><tr><th>t</th><th>token</th>'
            f'<th>k1</th><th>exact KL</th><th>advantage</th><th>actor top-5</th>'
            f'<th>reference top-5</th></tr>{table}</table></details></div>')


CSS = ("body{font-family:sans-serif;max-width:70em;margin:2em auto;line-height:1.6}"
       ".t{font-family:monospace;white-space:pre;padding:1px 0}"
       ".line b{display:inline-block;width:4em}"
       ".resp{border-left:3px solid #ccc;padding-left:1em;margin:1em 0}"
       "table{border-collapse:collapse;font-size:80%}"
       "td,th{border:1px solid #ddd;padding:2px 6px;vertical-align:top;font-family:monospace}")


def write_page(path, title, blocks, note):
    page = (f"<!DOCTYPE html><html><head><meta charset=\"utf-8\">"
            f"<title>{html.escape(title)}</title><style>{CSS}</style></head>"
            f"<body><h1>{html.escape(title)}</h1><p>{note}</p>{''.join(blocks)}"
            f"</body></html>\n")
    store.write_text(path, page)
    return page


def ppo_critic(cfg, folder, rm):
    """(critic, rm, final β, KL config, PPO config, gold (mean, std)) of the PPO run that wrote
    folder's actor.pt, from the critic.pt and ppo.json beside it (the settings as that run recorded
    them, not this command's flags); None without them."""
    files = [os.path.join(folder, n) for n in ("critic.pt", "ppo.json")]
    if not all(map(os.path.exists, files)):
        return None
    record = store.load_json(files[1])

    # The config group with the settings that run recorded.
    def ran(group):
        config = record["stamp"]["config"]
        return replace(group, **{k: v for k, v in config.items() if hasattr(group, k)})
    critic, _ = load_scalar_model(files[0], cfg.run.device)
    # The units of --reward=gold.
    norm = record.get("gold_norm", dict(mean=0.0, std=1.0))
    gold_norm = (norm["mean"], norm["std"])
    return critic, rm, record["kl_coef_final"], ran(cfg.kl), ran(cfg.ppo), gold_norm


def made_from(out, actor_path):
    """{file: hash} of out_dir's models the actor was trained from, as its run recorded them:
    stages.json's ppo record for out_dir's own actor.pt (dpo's for dpo_actor.pt), which also
    vouches for the actor itself, else the ppo.json (dpo.json) written beside it (ablate.py's
    runs); None when neither says."""
    name = os.path.basename(actor_path)
    stage = "dpo" if name == "dpo_actor.pt" else "ppo"
    record = records.load_records(out).get(stage)
    if os.path.abspath(actor_path) == os.path.abspath(os.path.join(out, name)) and record:
        if record["outputs"].get(name) != store.file_hash(actor_path):
            raise RunError(f"{actor_path} is not the actor the {stage} stage made: "
                           f"redo it with --stage={stage}")
        return record["inputs"]
    beside = os.path.join(os.path.dirname(actor_path), f"{stage}.json")
    return store.load_json(beside)["stamp"]["inputs"] if os.path.exists(beside) else None


def write_inspect(cfg, page):
    """out_dir's inspect.html (or the page beside --inspect_actor's actor.pt)."""
    run, n = cfg.run, page.inspect_n
    out = run.out_dir
    actor_path = page.inspect_actor or os.path.join(out, "actor.pt")
    if not os.path.exists(actor_path):
        raise RunError(f"--inspect_actor={actor_path} does not exist")
    inputs = made_from(out, actor_path)
    # The page sets the actor against each of them.
    for name in ("pretrain.pt", "ref.pt", "reward.pt"):
        if inputs is not None and inputs.get(name) != store.file_hash(os.path.join(out, name)):
            raise RunError(f"{actor_path} was trained from another {name} than the one in {out} "
                           "(it has changed since): its KL and advantages would be to models it "
                           "never saw; redo its PPO run")
    if inputs is None:
        print(f"inspect: no record says what {actor_path} was trained from; "
              f"shown against {out}'s models")
    enc = tokenizer.load_tokenizer(out, cfg.world.tokenizer)
    pre, _ = load_checkpoint(os.path.join(out, "pretrain.pt"), run.device)
    ref = load_reference(os.path.join(out, "ref.pt"), run.device)
    rm, _ = load_scalar_model(os.path.join(out, "reward.pt"), run.device)
    actor, _ = load_checkpoint(actor_path, run.device)
    # A DPO actor has no critic: PPO's critic.pt beside it judged another policy.
    dpo = os.path.basename(actor_path) == "dpo_actor.pt"
    critic = None if dpo else ppo_critic(cfg, os.path.dirname(actor_path), rm)
    heldout = data.load_prompts(out)["heldout"]
    # Spread over the held-out subjects.
    prompts = heldout[::max(1, len(heldout) // n)][:n]
    blocks = []
    t0 = time.time()
    for name, model, mpath in (("pretrained", pre, os.path.join(out, "pretrain.pt")),
                               (f"RLHF actor ({actor_path})", actor, actor_path)):
        # A terminal shows the responses done so far (none of the numbers depend on it).
        progress.counter("inspect", len(blocks), 2 * len(prompts), "responses", t0)
        # The same sampling noise for both.
        torch.manual_seed(run.seed + 2)
        q, qm = (x.to(run.device) for x in encode_prompts(enc, prompts))
        with cast_once(model.eval()):
            resp, _ = model.generate(q, run.response_length, run.temperature, eos=enc.eot_token,
                                     mask=qm)
        mask = response_mask(resp, enc.eot_token)
        proxy = reward_score(rm, join_tokens(q, qm, resp, mask), enc.eot_token).tolist()
        for i, p in enumerate(prompts):
            tokens = resp[i][mask[i]].tolist()
            its_critic = critic if model is actor else None
            rows = token_rows(model, ref, enc, p, tokens, run.temperature, its_critic)
            gold = data.gold_score(p, enc.decode(tokens))
            blocks.append((i, f'<h2>{shown(p.strip())}</h2>' if name == "pretrained" else "",
                           response_block(name, mpath, p, rows, gold, proxy[i])))
            progress.counter("inspect", len(blocks), 2 * len(prompts), "responses", t0)
    # Per prompt: the pretrained model's answer, then the RLHF actor's.
    blocks = [h + b for _, h, b in sorted(blocks, key=lambda x: x[0])]
    if critic:
        advantages = ("The actor's tokens also show their advantage (GAE before whitening) under "
                      f"the final critic and β = {critic[2]:.4g}.")
    else:
        advantages = "No PPO critic for this actor: no advantages."
    note = (f"Held-out prompts, temperature {run.temperature}. Colour: KL to the frozen reference "
            f"per token, full at {SCALE} nat (red: the actor likes the token more than the "
            "reference; blue, k1 only: less). Hover a token for both numbers and the top-5 next "
            "tokens of the actor and the reference. " + advantages)
    folder = os.path.dirname(actor_path) if page.inspect_actor else out
    path = os.path.join(folder, "inspect_dpo.html" if dpo else "inspect.html")
    write_page(path, "tether: which tokens the reference pulls back", blocks, note)
    print(f"inspect: {len(prompts)} prompts, pretrained and RLHF actor -> {path}")


# The models the page reads from a finished run.
INPUTS = ["pretrain.pt", "ref.pt", "reward.pt", "tokenizer.bpe", "prompts.json"]


def parse(argv):
    """(InspectConfig, train.py's config): --inspect_actor and --inspect_n are the page's, every
    other flag is train.py's (how to sample, the folder). Bad input: one line, exit 2."""
    if "--help" in argv or "-h" in argv:
        print_help(__doc__, {"inspect": InspectConfig})
        print("Every other flag is train.py's (python train.py --help).")
        sys.exit(0)
    check_once(argv)
    names = {f"--{n}" for n in InspectConfig.__dataclass_fields__}
    mine = [a for a in argv if a.partition("=")[0] in names]
    page = parse_args(mine, {"inspect": InspectConfig}).inspect
    return page, train.parse([a for a in argv if a not in mine])


def main(argv):
    page, cfg = parse(argv)
    if cfg.run.threads:
        torch.set_num_threads(cfg.run.threads)
    try:
        with train.open_folder(cfg, reads=("the inspect page", INPUTS)):
            write_inspect(cfg, page)
    except RunError as e:
        die(str(e), e.code)
    except KeyboardInterrupt:
        die("interrupted; nothing was written", 130)


if __name__ == "__main__":
    run_main(main, sys.argv[1:])
