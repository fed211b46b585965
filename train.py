"""tether's driver: every stage of RLHF, from an empty folder to a report.

    python train.py                      # every stage; each is skipped when its output exists in --out_dir
    python train.py --stage=pretrain     # one stage: world, pretrain, reference, preferences, reward, ppo, report, sample
    python train.py --preset=smoke       # everything tiny, seconds (the tests use it)
    python train.py --help               # every config field, overridable as --name=value

Stages write into out_dir: the world (text, tokenizer, token files, prompts), pretrain.pt + pretrain.json,
prefs.jsonl, reward.pt, actor.pt + metrics.jsonl (+ ppo.png), report.md + report.json.
Left out: distributed training, mixed precision, resuming a stage half way.
"""
import copy, dataclasses, json, math, os, random, sys, time
from dataclasses import dataclass
import numpy as np
import torch

import data
from model import GPT, GPTConfig, save_checkpoint, load_checkpoint, pad_left, response_logits, token_logprobs
from ref import Reference
from kl import KLConfig, kl_full, make_kl_controller
from reward import RewardConfig, train_reward_model, save_scalar_model, load_scalar_model, score as reward_score
from ppo import PPOConfig, make_experience, ppo_update


@dataclass
class RunConfig:
    out_dir: str = "out"
    stage: str = "all"          # all, or one stage name (see STAGES)
    fresh: bool = False         # redo every stage even when its output exists
    preset: str = "default"     # default or smoke
    seed: int = 1337
    device: str = "cpu"         # cpu or cuda
    threads: int = 0            # torch CPU threads; 0 = torch's default
    temperature: float = 1.0    # one temperature everywhere: sampling, old, reference and training log-probs
    response_length: int = 64   # most response tokens sampled
    prompt: str = ""            # sample stage: a prompt of your own, e.g. "review: the nova pro phone\\n"


@dataclass
class WorldConfig:
    n_reviews: int = 40000      # about 4.8 MB of text
    vocab_size: int = 1024      # BPE vocabulary, end-of-text included
    tokenizer: str = "bpe"      # bpe (ours, trained on the world) or gpt2 (tiktoken's, if cached locally)


@dataclass
class PretrainConfig:
    max_iters: int = 900
    batch_size: int = 32
    lr: float = 4e-3
    min_lr: float = 4e-4
    warmup_iters: int = 50
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    eval_interval: int = 100
    eval_iters: int = 10
    n_samples: int = 200        # samples for the well-formed rate and gold score


PRESETS = {"default": {},
           "smoke": dict(n_reviews=3000, vocab_size=300, n_layer=2, n_embd=64, n_head=2, block_size=96,
                         max_iters=150, batch_size=32, warmup_iters=10, eval_interval=50, eval_iters=2, n_samples=16,
                         response_length=40, n_pairs=600, rm_epochs=2, rm_val_frac=0.25, ppo_iters=3,
                         rollout_batch=16, minibatch_size=8, ppo_epochs=2, n_eval=16, kl_horizon=100)}
SKIP_FIELDS = {"vocab_size@GPTConfig"}      # the model's vocabulary comes from the tokenizer
POSITIVE = {"temperature", "response_length", "n_reviews", "vocab_size", "block_size", "n_layer", "n_head", "n_embd",
            "max_iters", "batch_size", "lr", "eval_interval", "eval_iters", "n_samples", "n_pairs", "rm_epochs", "rm_lr",
            "rm_batch_size", "kl_target", "kl_horizon", "ppo_iters", "rollout_batch", "minibatch_size", "ppo_epochs",
            "ppo_lr", "vf_lr", "n_eval"}                    # must be > 0; every other number but the seed >= 0
UNIT = {"dropout", "rm_val_frac", "gamma", "lam"}           # in [0, 1]
CHOICES = {"device": ["cpu", "cuda"], "tokenizer": ["bpe", "gpt2"], "kl_ctl": ["fixed", "adaptive", "band", "linear"],
           "kl_estimator": ["k1", "k2", "k3", "full"], "kl_in": ["reward", "loss"], "kl_ref": ["frozen", "rolling"]}


def config_classes():
    return [RunConfig, WorldConfig, GPTConfig, PretrainConfig, RewardConfig, KLConfig, PPOConfig]


def _fields(classes):
    return [(c, f) for c in classes for f in dataclasses.fields(c) if f"{f.name}@{c.__name__}" not in SKIP_FIELDS]


def _convert(field, text):
    if field.type in (bool, "bool"):
        if text.lower() in ("1", "true", "yes", ""):
            return True
        if text.lower() in ("0", "false", "no"):
            return False
        raise ValueError
    return {"int": int, "float": float, "str": str}.get(field.type, field.type)(text)


def parse_args(argv, classes=None, presets=PRESETS):
    """--name=value flags -> {class name: instance}. Bad input: one line on stderr and exit code 2."""
    classes = classes or config_classes()
    fields = {f.name: f for _, f in _fields(classes)}
    if "--help" in argv or "-h" in argv:
        print(__doc__)
        for c in classes:
            print(f"{c.__name__}:")
            for f in dataclasses.fields(c):
                if f"{f.name}@{c.__name__}" not in SKIP_FIELDS:
                    print(f"  --{f.name}={f.default}")
        sys.exit(0)
    values = {}
    for a in argv:
        name, _, text = a[2:].partition("=")
        if not a.startswith("--") or name not in fields:
            die(f"unknown flag {a!r} (python train.py --help lists them)")
        try:
            values[name] = _convert(fields[name], text)
        except ValueError:
            die(f"bad value for --{name}: {text!r} is not a {getattr(fields[name].type, '__name__', fields[name].type)}")
    preset = values.get("preset", "default")
    if preset not in presets:
        die(f"unknown preset {preset!r} (choose {', '.join(presets)})")
    values = {**presets[preset], **values}
    C = {c.__name__: c(**{f.name: values[f.name] for f in dataclasses.fields(c) if f.name in values
                           and f"{f.name}@{c.__name__}" not in SKIP_FIELDS}) for c in classes}
    check_values(C)
    return C


def check_values(C):
    """Values that parse but cannot work: one line and exit 2, before any stage starts."""
    values = {f.name: getattr(obj, f.name) for obj in C.values() for f in dataclasses.fields(obj)}
    for name, allowed in CHOICES.items():
        if name in values and values[name] not in allowed:
            die(f"bad value for --{name}: {values[name]!r} (choose {', '.join(allowed)})")
    for name, v in values.items():
        if isinstance(v, bool) or not isinstance(v, (int, float)) or name == "seed":
            continue
        if v < 0 or (name in POSITIVE and v == 0) or (name in UNIT and v > 1):
            rule = "> 0" if name in POSITIVE else "in [0, 1]" if name in UNIT else ">= 0"
            die(f"bad value for --{name}: {v} (must be {rule})")
    W, G = C.get("WorldConfig"), C.get("GPTConfig")
    if W and W.vocab_size < 257:
        die(f"bad value for --vocab_size: {W.vocab_size} (a byte-level BPE needs 256 bytes + end-of-text: >= 257)")
    if G and G.n_embd % G.n_head:
        die(f"--n_embd={G.n_embd} is not divisible by --n_head={G.n_head}")
    if values.get("device") == "cuda" and not torch.cuda.is_available():
        die("--device=cuda but torch sees no CUDA device here (use --device=cpu)")


def die(msg):
    print(f"error: {msg}", file=sys.stderr)
    sys.exit(2)


def fmt_time(s):
    return f"{int(s // 60)}m{int(s % 60):02d}s"


# ---- sampling helpers shared by the stages ----
def encode_prompts(enc, prompts):
    """Prompts -> left-padded ids (B, Tp) and mask. Each starts with end-of-text, as every document after the
    first does in the pretraining stream."""
    return pad_left([[enc.eot_token] + enc.encode_ordinary(p) for p in prompts], enc.eot_token)


def response_mask(toks, eos):
    """(B, R) True up to and including the first end-of-text; all True for a truncated row."""
    after = torch.cumsum((toks == eos).long(), 1) - (toks == eos).long()        # eos seen strictly before t
    return after == 0


def decode_responses(enc, toks):
    m = response_mask(toks, enc.eot_token)
    return [enc.decode(t[mk].tolist()) for t, mk in zip(toks, m)]


@torch.no_grad()
def sample_texts(model, enc, prompts, cfg, batch=100):
    """Responses (text, EOT marks end-of-text) to a list of prompts; the rng is torch's global one."""
    out = []
    for i in range(0, len(prompts), batch):
        idx, mask = encode_prompts(enc, prompts[i:i + batch])
        toks, _ = model.generate(idx.to(cfg.device), cfg.response_length, cfg.temperature, eos=enc.eot_token,
                                 mask=mask.to(cfg.device))
        out += decode_responses(enc, toks.cpu())
    return out


def seed_everything(seed):
    random.seed(seed); np.random.seed(seed); torch.manual_seed(seed)


# ---- stage: world ----
def stage_world(C):
    s = data.build_world(C["RunConfig"].out_dir, seed=C["RunConfig"].seed, n_reviews=C["WorldConfig"].n_reviews,
                         vocab_size=C["WorldConfig"].vocab_size, tokenizer=C["WorldConfig"].tokenizer)
    print(f"world: {s['n_reviews']} reviews, {s['chars'] / 1e6:.2f} MB, vocab {s['vocab_size']}, "
          f"{s['tokens']['train']} train tokens, {s['n_heldout_subjects']} held-out subjects")


# ---- stage: pretrain ----
def evaluate_samples(model, enc, prompts, cfg, n):
    prompts = [prompts[i % len(prompts)] for i in range(n)]
    resp = sample_texts(model, enc, prompts, cfg)
    verdicts = [data.judge(p, r) for p, r in zip(prompts, resp)]
    gold = np.array([v["score"] for v in verdicts])
    return dict(wellformed_rate=float(np.mean([v["wellformed"] for v in verdicts])), gold_mean=float(gold.mean()),
                gold_std=float(gold.std())), prompts, resp


def stage_pretrain(C):
    R, P = C["RunConfig"], C["PretrainConfig"]
    enc = data.load_tokenizer(R.out_dir, C["WorldConfig"].tokenizer)
    gcfg = dataclasses.replace(C["GPTConfig"], vocab_size=enc.n_vocab)
    splits = {k: np.memmap(os.path.join(R.out_dir, f"{k}.bin"), dtype=np.uint16, mode="r") for k in ("train", "val")}
    gen = torch.Generator().manual_seed(R.seed)

    def get_batch(split):                                   # random windows of block_size + 1 tokens
        d = splits[split]
        ix = torch.randint(len(d) - gcfg.block_size - 1, (P.batch_size,), generator=gen).tolist()
        xy = torch.from_numpy(np.stack([d[i:i + gcfg.block_size + 1].astype(np.int64) for i in ix]))
        return xy[:, :-1].to(R.device), xy[:, 1:].to(R.device)       # (B, T), (B, T)

    @torch.no_grad()
    def val_loss():
        model.eval()
        loss = float(np.mean([model(*get_batch("val"))[1].item() for _ in range(P.eval_iters)]))
        model.train()
        return loss

    model = GPT(gcfg).to(R.device)
    print(f"pretrain: {model.num_params() / 1e6:.2f}M parameters, {P.max_iters} iters of "
          f"{P.batch_size}x{gcfg.block_size} tokens")
    opt = torch.optim.AdamW(model.parameters(), lr=P.lr, betas=(0.9, 0.95), weight_decay=P.weight_decay)
    t0 = time.time()
    for it in range(P.max_iters):
        lr = P.lr * (it + 1) / P.warmup_iters if it < P.warmup_iters else P.min_lr + 0.5 * (P.lr - P.min_lr) * (
            1 + math.cos(math.pi * (it - P.warmup_iters) / max(1, P.max_iters - P.warmup_iters)))   # warmup + cosine
        for g in opt.param_groups:
            g["lr"] = lr
        _, loss = model(*get_batch("train"))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), P.grad_clip)
        opt.step()
        if (it + 1) % P.eval_interval == 0 or it + 1 == P.max_iters:
            dt = time.time() - t0
            tps = (it + 1) * P.batch_size * gcfg.block_size / dt
            print(f"iter {it + 1}/{P.max_iters} | loss {loss.item():.3f} | val {val_loss():.3f} | lr {lr:.1e} | "
                  f"{tps / 1e3:.1f}k tok/s | eta {fmt_time(dt / (it + 1) * (P.max_iters - it - 1))}", flush=True)
    seconds = time.time() - t0
    model.eval()
    stats, prompts, resp = evaluate_samples(model, enc, data.load_prompts(R.out_dir)["heldout"], R, P.n_samples)
    out = dict(val_loss=val_loss(), **stats, seconds=seconds,
               tokens_per_second=P.max_iters * P.batch_size * gcfg.block_size / seconds)
    save_checkpoint(model, os.path.join(R.out_dir, "pretrain.pt"))
    with open(os.path.join(R.out_dir, "pretrain.json"), "w") as f:
        json.dump(out, f, indent=1)
    for p, r in list(zip(prompts, resp))[:3]:
        print(f"  [{data.gold_score(p, r):+.2f}] {p.strip()} | {r}")
    print(f"pretrain: val loss {out['val_loss']:.3f}, well-formed {out['wellformed_rate']:.0%} of {P.n_samples}, "
          f"gold {out['gold_mean']:+.2f} ± {out['gold_std']:.2f}, {fmt_time(seconds)}")


# ---- stage: reference ----
def stage_reference(C):
    """π_ref is the pretrained model, frozen: saved once, loaded by every PPO run, compared bit for bit after."""
    out = C["RunConfig"].out_dir
    model, _ = load_checkpoint(os.path.join(out, "pretrain.pt"))
    save_checkpoint(model, os.path.join(out, "ref.pt"))
    print(f"reference: frozen copy of the pretrained model ({model.num_params() / 1e6:.2f}M parameters) -> ref.pt")


def join_tokens(query, query_mask, response, mask):
    """Per row: the prompt's real tokens followed by the response's real tokens (a list of id lists)."""
    return [q[qm].tolist() + r[m].tolist() for q, qm, r, m in zip(query, query_mask, response, mask)]


# ---- stage: preferences ----
def stage_preferences(C):
    R, W = C["RunConfig"], C["RewardConfig"]
    enc = data.load_tokenizer(R.out_dir, C["WorldConfig"].tokenizer)
    model, _ = load_checkpoint(os.path.join(R.out_dir, "pretrain.pt"), R.device)
    model.eval()
    rng = random.Random(R.seed)
    train_prompts = data.load_prompts(R.out_dir)["train"]
    prompts = [rng.choice(train_prompts) for _ in range(W.n_pairs)]
    rows = []
    for i in range(0, len(prompts), 250):
        batch = [p for p in prompts[i:i + 250] for _ in range(2)]              # two samples per prompt
        q, qm = encode_prompts(enc, batch)
        resp, _ = model.generate(q.to(R.device), R.response_length, R.temperature, eos=enc.eot_token,
                                 mask=qm.to(R.device))
        resp, m = resp.cpu(), response_mask(resp.cpu(), enc.eot_token)
        toks, texts = join_tokens(q, qm, resp, m), decode_responses(enc, resp)
        for j in range(0, len(batch), 2):
            p, a, b = batch[j], texts[j], texts[j + 1]
            label = data.label_pair(p, a, b, rng)                               # 0: a preferred
            rows.append(dict(prompt=p, a=a, b=b, label=label, gold_a=data.gold_score(p, a),
                             gold_b=data.gold_score(p, b), tokens_a=toks[j], tokens_b=toks[j + 1]))
    with open(os.path.join(R.out_dir, "prefs.jsonl"), "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    decided = [r for r in rows if r["gold_a"] != r["gold_b"]]
    agree = np.mean([(r["label"] == 0) == (r["gold_a"] > r["gold_b"]) for r in decided]) if decided else float("nan")
    print(f"preferences: {len(rows)} pairs; the annotator agrees with the gold order on {agree:.1%} of "
          f"{len(decided)} pairs with distinct gold scores")


# ---- stage: reward ----
def stage_reward(C):
    R, W = C["RunConfig"], C["RewardConfig"]
    enc = data.load_tokenizer(R.out_dir, C["WorldConfig"].tokenizer)
    lm, _ = load_checkpoint(os.path.join(R.out_dir, "pretrain.pt"), R.device)
    with open(os.path.join(R.out_dir, "prefs.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    pairs = [dict(chosen=r["tokens_a"], rejected=r["tokens_b"], gold_chosen=r["gold_a"], gold_rejected=r["gold_b"])
             if r["label"] == 0 else dict(chosen=r["tokens_b"], rejected=r["tokens_a"], gold_chosen=r["gold_b"],
                                          gold_rejected=r["gold_a"]) for r in rows]
    rm, stats = train_reward_model(lm, pairs, W, enc.eot_token, seed=R.seed)
    save_scalar_model(rm, os.path.join(R.out_dir, "reward.pt"))
    with open(os.path.join(R.out_dir, "reward.json"), "w") as f:
        json.dump(stats, f, indent=1)
    print(f"reward model: held-out accuracy {stats['acc_noisy']:.1%} against the noisy labels, "
          f"{stats['acc_gold']:.1%} against the gold order ({stats['n_val']} pairs; the annotator itself agrees "
          f"with gold on {stats['annotator_agreement']:.1%})")


# ---- evaluation shared by ppo, report and ablate.py ----
@torch.no_grad()
def evaluate_policy(model, enc, prompts, R, ref, rm, n, batch=100):
    """Samples on held-out prompts and what they cost and earn: gold and proxy score, exact KL to the reference,
    fluency (well-formed, perplexity under the reference), diversity (distinct-n, repetition), end-of-text rate."""
    model.eval()
    prompts = [prompts[i % len(prompts)] for i in range(n)]
    kl, nll, ntok, proxy, texts, eos = [], 0.0, 0, [], [], []
    for i in range(0, n, batch):
        q, qm = encode_prompts(enc, prompts[i:i + batch])
        q, qm = q.to(R.device), qm.to(R.device)
        resp, _ = model.generate(q, R.response_length, R.temperature, eos=enc.eot_token, mask=qm)
        m = response_mask(resp, enc.eot_token)
        logits, ref_logits = response_logits(model, q, qm, resp, R.temperature), ref.logits(q, qm, resp, R.temperature)
        kl += (kl_full(logits, ref_logits) * m).sum(1).tolist()                                  # per sequence
        ref_logp = token_logprobs(ref_logits, resp)                                             # (B, R)
        nll, ntok = nll - (ref_logp * m).sum().item(), ntok + m.sum().item()
        proxy += reward_score(rm, join_tokens(q, qm, resp, m), enc.eot_token).tolist()
        texts += decode_responses(enc, resp.cpu())
        eos += (resp == enc.eot_token).any(1).tolist()
    verdicts = [data.judge(p, r) for p, r in zip(prompts, texts)]
    bodies = [r.split(data.EOT)[0] for r in texts]
    gold = np.array([v["score"] for v in verdicts])
    return dict(gold_mean=float(gold.mean()), gold_std=float(gold.std()), proxy_mean=float(np.mean(proxy)),
                kl_ref=float(np.mean(kl)), wellformed_rate=float(np.mean([v["wellformed"] for v in verdicts])),
                distinct_1=data.distinct_n(bodies, 1), distinct_2=data.distinct_n(bodies, 2),
                repetition_rate=float(np.mean([v["repetition"] for v in verdicts])), ref_ppl=math.exp(nll / ntok),
                eos_rate=float(np.mean(eos)), response_length=ntok / n), list(zip(prompts, texts, gold.tolist(), proxy))


# ---- stage: ppo ----
def load_models(out_dir, device):
    actor, _ = load_checkpoint(os.path.join(out_dir, "pretrain.pt"), device)
    ref_model, _ = load_checkpoint(os.path.join(out_dir, "ref.pt"), device)
    rm, _ = load_scalar_model(os.path.join(out_dir, "reward.pt"), device)
    return actor, Reference(ref_model), rm.requires_grad_(False)


def run_ppo(C, base_dir, run_dir, log=print):
    """PPO from the pretrained actor, with the reference and reward model in base_dir; writes into run_dir
    actor.pt, metrics.jsonl (one line per iteration) and ppo.json (final evaluation). Returns ppo.json."""
    R, K, P = C["RunConfig"], C["KLConfig"], C["PPOConfig"]
    os.makedirs(run_dir, exist_ok=True)
    enc = data.load_tokenizer(base_dir, C["WorldConfig"].tokenizer)
    eos = enc.eot_token
    actor, ref, rm = load_models(base_dir, R.device)
    critic = copy.deepcopy(rm).requires_grad_(True)                  # critic starts as the reward model
    actor.eval(); critic.eval()                                      # dropout off during RL; grads still flow
    opt = torch.optim.AdamW([{"params": actor.parameters(), "lr": P.ppo_lr},
                             {"params": critic.parameters(), "lr": P.vf_lr}], eps=1e-5, weight_decay=0.0)
    kl_ctl = make_kl_controller(K, P.ppo_iters * P.rollout_batch)
    kl_ref = ref                                                     # rolling: replaced every iteration
    prompts, rng = data.load_prompts(base_dir)["train"], random.Random(R.seed)
    metrics_path, t0 = os.path.join(run_dir, "metrics.jsonl"), time.time()
    open(metrics_path, "w").close()
    # ---- ppo loop ----
    for it in range(P.ppo_iters):
        t_it = time.time()
        snapshot = Reference(actor) if K.kl_ref == "rolling" else None
        batch_prompts = [rng.choice(prompts) for _ in range(P.rollout_batch)]
        q, qm = encode_prompts(enc, batch_prompts)
        q, qm = q.to(R.device), qm.to(R.device)
        with torch.no_grad():                                        # ---- rollout ----
            resp, _ = actor.generate(q, R.response_length, R.temperature, eos=eos, mask=qm)       # (B, R)
            mask = response_mask(resp, eos)                                                      # (B, R)
            scores = reward_score(rm, join_tokens(q, qm, resp, mask), eos)                       # (B,)
        beta = kl_ctl.value
        batch, info = make_experience(actor, critic, ref, kl_ref, q, qm, resp, mask, scores, beta, K, P,
                                      R.temperature)
        kl, kl_exact, kl_pen_exact = info["kl"], info["kl_ref"], info["kl_pen"]
        stats = ppo_update(actor, critic, opt, batch, P, R.temperature, beta, K.kl_in)  # ---- update ----
        kl_ctl.update(kl_pen_exact.mean().item(), P.rollout_batch)
        if snapshot is not None:
            kl_ref = snapshot                                        # next iteration: KL to this iteration's policy
        texts = decode_responses(enc, resp.cpu())
        gold = [data.gold_score(p, r) for p, r in zip(batch_prompts, texts)]
        non_score = (-beta * kl * mask).sum(1)
        n_tok, dt = mask.sum().item(), time.time() - t_it
        row = {"iter": it + 1, "objective/kl": kl_exact.mean().item(), "objective/kl_penalized": kl_pen_exact.mean().item(),
               "objective/kl_estimate": (kl * mask).sum(1).mean().item(), "objective/kl_coef": beta,
               "objective/scores": scores.mean().item(), "objective/gold": float(np.mean(gold)),
               "objective/non_score_reward": non_score.mean().item(),
               "objective/rlhf_reward": (scores + non_score).mean().item(), "objective/entropy": stats["entropy"],
               "policy/clipfrac_avg": stats["clipfrac"], "policy/approxkl_avg": stats["approxkl"],
               "loss/policy_avg": stats["pg_loss"], "loss/value_avg": stats["vf_loss"], "loss/kl_avg": stats["kl_loss"],
               "val/clipfrac_avg": stats["vf_clipfrac"], "val/ratio": stats["ratio"],
               "val/num_eos_tokens": (resp == eos).any(1).float().sum().item(), "val/response_length": n_tok / len(resp),
               "time/tokens_per_second": n_tok / dt, "time/elapsed": time.time() - t0}
        with open(metrics_path, "a") as f:
            f.write(json.dumps(row) + "\n")
        eta = (time.time() - t0) / (it + 1) * (P.ppo_iters - it - 1)
        log(f"iter {it + 1}/{P.ppo_iters} | rm {row['objective/scores']:+.2f} | gold {row['objective/gold']:+.2f} | "
            f"kl {row['objective/kl']:.2f} | β {beta:.4f} | ent {stats['entropy']:.2f} | clip {stats['clipfrac']:.3f} | "
            f"approxkl {stats['approxkl']:.4f} | vf {stats['vf_loss']:.3f} | len {row['val/response_length']:.1f} | "
            f"{row['time/tokens_per_second']:.0f} tok/s | eta {fmt_time(eta)}")
    save_checkpoint(actor, os.path.join(run_dir, "actor.pt"))
    ref_ckpt = torch.load(os.path.join(base_dir, "ref.pt"), map_location="cpu", weights_only=True)["model"]
    unchanged = all(torch.equal(v.cpu(), ref_ckpt[k]) for k, v in ref.model.state_dict().items())
    seed_everything(R.seed + 1)
    final, _ = evaluate_policy(actor, enc, data.load_prompts(base_dir)["heldout"], R, ref, rm, P.n_eval)
    summary = dict(final=final, reference_unchanged=unchanged, kl_coef_final=kl_ctl.value, seconds=time.time() - t0)
    with open(os.path.join(run_dir, "ppo.json"), "w") as f:
        json.dump(summary, f, indent=1)
    plot_metrics(metrics_path, os.path.join(run_dir, "ppo.png"))
    return summary


def plot_metrics(metrics_path, png):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    with open(metrics_path) as f:
        rows = [json.loads(line) for line in f]
    it = [r["iter"] for r in rows]
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.5))
    a.plot(it, [r["objective/scores"] for r in rows], label="proxy (reward model)")
    a.plot(it, [r["objective/gold"] for r in rows], label="gold (simulated human)")
    a.set_xlabel("PPO iteration"); a.set_ylabel("score"); a.legend()
    b.plot(it, [r["objective/kl"] for r in rows], color="C3")
    b.set_xlabel("PPO iteration"); b.set_ylabel("KL(actor ‖ reference), nats/sequence")
    fig.tight_layout(); fig.savefig(png, dpi=100); plt.close(fig)


def stage_ppo(C):
    s = run_ppo(C, C["RunConfig"].out_dir, C["RunConfig"].out_dir)
    f = s["final"]
    print(f"ppo: held-out gold {f['gold_mean']:+.2f}, proxy {f['proxy_mean']:+.2f}, KL to reference "
          f"{f['kl_ref']:.2f} nats, well-formed {f['wellformed_rate']:.0%}; reference unchanged: "
          f"{s['reference_unchanged']}")


# ---- stage: report ----
REPORT_COLUMNS = ["gold_mean", "gold_std", "proxy_mean", "kl_ref", "wellformed_rate", "distinct_2",
                  "repetition_rate", "ref_ppl", "eos_rate", "response_length"]


def stage_report(C):
    R, P = C["RunConfig"], C["PPOConfig"]
    enc = data.load_tokenizer(R.out_dir, C["WorldConfig"].tokenizer)
    pre, ref, rm = load_models(R.out_dir, R.device)
    rlhf, _ = load_checkpoint(os.path.join(R.out_dir, "actor.pt"), R.device)
    prompts = data.load_prompts(R.out_dir)["heldout"]
    res, samples = {}, {}
    for name, model in (("pretrained", pre), ("rlhf", rlhf)):
        seed_everything(R.seed + 1)                                  # same prompts, same sampling noise
        res[name], samples[name] = evaluate_policy(model, enc, prompts, R, ref, rm, P.n_eval)
    timings_path = os.path.join(R.out_dir, "timings.json")
    res["seconds"] = json.load(open(timings_path)) if os.path.exists(timings_path) else {}
    lines = [f"# tether report ({P.n_eval} samples on held-out prompts, temperature {R.temperature})", "",
             "| metric | pretrained | rlhf |", "|---|---|---|"]
    lines += [f"| {k} | {res['pretrained'][k]:.3f} | {res['rlhf'][k]:.3f} |" for k in REPORT_COLUMNS]
    lines += ["", "Examples (gold, proxy):", ""]
    for i in range(4):
        for name in ("pretrained", "rlhf"):
            p, t, g, s = samples[name][i]
            lines.append(f"- {name:10s} [{g:+.2f}, {s:+.2f}] {p.strip()} | {t.replace(chr(10), ' / ')}")
    lines += ["", "Seconds per stage (this run): " + ", ".join(f"{k} {v}" for k, v in res["seconds"].items())]
    text = "\n".join(lines) + "\n"
    with open(os.path.join(R.out_dir, "report.md"), "w") as f:
        f.write(text)
    with open(os.path.join(R.out_dir, "report.json"), "w") as f:
        json.dump(res, f, indent=1)
    print(text)


# ---- stage: sample (no reference needed) ----
def stage_sample(C):
    R = C["RunConfig"]
    enc = data.load_tokenizer(R.out_dir, C["WorldConfig"].tokenizer)
    actor, _ = load_checkpoint(os.path.join(R.out_dir, "actor.pt"), R.device)
    actor.eval()
    prompts = [R.prompt] if R.prompt else data.load_prompts(R.out_dir)["heldout"][:8]
    for p, r in zip(prompts, sample_texts(actor, enc, prompts, R)):
        print(f"[gold {data.gold_score(p, r):+.2f}] {p.strip()} | {r}")


# ---- running the stages ----
STAGES = [("world", "world.json", stage_world), ("pretrain", "pretrain.json", stage_pretrain),
          ("reference", "ref.pt", stage_reference), ("preferences", "prefs.jsonl", stage_preferences),
          ("reward", "reward.json", stage_reward), ("ppo", "ppo.json", stage_ppo), ("report", "report.json", stage_report),
          ("sample", None, stage_sample)]
NEEDS = {"pretrain": ["train.bin", "val.bin", "prompts.json"], "reference": ["pretrain.pt"],
         "preferences": ["pretrain.pt", "prompts.json"], "reward": ["pretrain.pt", "prefs.jsonl"],
         "ppo": ["pretrain.pt", "ref.pt", "reward.pt"], "report": ["actor.pt", "ref.pt", "reward.pt"],
         "sample": ["actor.pt", "prompts.json"]}


def main(argv):
    C = parse_args(argv)
    R = C["RunConfig"]
    names = [n for n, _, _ in STAGES]
    if R.stage != "all" and R.stage not in names:
        die(f"unknown stage {R.stage!r} (choose all, {', '.join(names)})")
    if R.threads > 0:
        torch.set_num_threads(R.threads)
    os.makedirs(R.out_dir, exist_ok=True)
    timings_path = os.path.join(R.out_dir, "timings.json")
    timings = json.load(open(timings_path)) if os.path.exists(timings_path) and not R.fresh else {}
    for name, output, fn in STAGES:
        done = output is None or os.path.exists(os.path.join(R.out_dir, output))
        if R.stage == name or (R.stage == "all" and (not done or (R.fresh and output))):
            missing = [f for f in NEEDS.get(name, []) if not os.path.exists(os.path.join(R.out_dir, f))]
            if missing:
                die(f"stage {name} needs {', '.join(missing)} in {R.out_dir}: run the stages before it first")
            print(f"---- stage {name} ----", flush=True)
            seed_everything(R.seed)
            t = time.time()
            fn(C)
            if output:
                timings[name] = round(time.time() - t, 1)
                with open(timings_path, "w") as f:
                    json.dump(timings, f, indent=1)
        elif R.stage == "all" and output:
            print(f"---- stage {name}: {output} exists, skipped (--fresh redoes it) ----")
    return timings


if __name__ == "__main__":
    main(sys.argv[1:])
