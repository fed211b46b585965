"""The stages of RLHF, from an empty folder to a report, and the table that says what each reads and writes.

    python train.py                      # runs them: train.py is the driver (flags, checks, which stages to run)
    python train.py --stage=pretrain     # one stage
Each stage is a function `stage_NAME(cfg, stamp)` that reads its inputs from out_dir and writes its outputs there:
world, pretrain, reference, preferences, reward, ppo (`run_ppo`, used by ablate.py too; the loop is ppo.train_ppo),
report, and the read-only sample and inspect (inspect_page.py). The stage table is STAGES, at the bottom: each
stage's input and output files and the config fields that shape its outputs; `stamp` is what a stage's outputs are
made from, which train.py records in stages.json and compares on the next run.
Lines marked `# torchrun` are the only ones a single process skips past (dist.py).
Left out: resuming the preferences and reward stages half way.
"""
import ast, copy, dataclasses, importlib.util, math, os, random, shutil, time
from collections import namedtuple
import numpy as np
import torch

import data, dist, store, tokenizer
from config import WorldConfig, PretrainConfig, check_world, fields
from errors import RunError
from evaluate import (best_of_k, evaluate_policy, judge_texts, plot_bestofk, plot_metrics, sample_texts, step0_kl,
                      write_report)
from inspect_page import stage_inspect
from kl import KLConfig
from model import (GPT, GPTConfig, Optimizers, StepGuard, adamw, hidden_matrices, load_checkpoint, rng_states,
                   save_checkpoint, set_rng_states)
from ppo import PPOConfig, say, train_ppo
import ref as refs
from ref import Reference, RefConfig
from reward import (RewardConfig, gold_normaliser, load_scalar_model, make_preferences, save_scalar_model,
                    train_reward_model)


def seed_everything(seed):
    random.seed(seed); np.random.seed(seed); torch.manual_seed(seed)


def path(cfg, name):
    return os.path.join(cfg.run.out_dir, name)


def load_timings(cfg, notes=None):
    """timings.json, {stage: seconds}; {} when it is missing, or damaged (a line in `notes` says so)."""
    p = path(cfg, "timings.json")
    if not os.path.exists(p):
        return {}
    try:
        timings = store.load_json(p)
    except RunError:
        timings = None
    ok = isinstance(timings, dict) and all(isinstance(v, (int, float)) for v in timings.values())
    if not ok and notes is not None:
        notes.append(f"{p} is damaged: the stage times start anew")
    return timings if ok else {}


# ---- stage: world ----
ASIDE = "world.new"         # the world is built in this folder of out_dir, checked, then moved into place


def build_world_aside(cfg):
    """The world, built in out_dir/world.new/ and checked there (config.check_world: every prompt and both splits
    fit --block_size). A world that does not fit stops the run before anything in out_dir is touched, so
    train.py calls this before it removes any output."""
    w, aside = cfg.world, path(cfg, ASIDE)
    shutil.rmtree(aside, ignore_errors=True)
    s = data.build_world(aside, seed=cfg.run.seed, n_reviews=w.n_reviews, vocab_size=w.vocab_size,
                         tokenizer=w.tokenizer)
    try:
        world_ok(cfg, folder=aside)
    except RunError:
        shutil.rmtree(aside, ignore_errors=True)
        raise
    print(f"world: {s['n_reviews']} reviews, {s['chars'] / 1e6:.2f} MB, vocab {s['vocab_size']}, "
          f"{s['tokens']['train']} train tokens, {s['n_heldout_subjects']} held-out subjects")


def stage_world(cfg, stamp):
    """The world built aside (build_world_aside; built now if it is not there) moved into out_dir."""
    aside = path(cfg, ASIDE)
    if not os.path.isdir(aside):
        build_world_aside(cfg)
    for n in files(cfg, WORLD):
        os.replace(os.path.join(aside, n), path(cfg, n))
    shutil.rmtree(aside)


# ---- stage: pretrain ----
# What pretrain_ckpt.pt holds besides its stamp.
PRETRAIN_STATE = ["iter", "model", "opt", "gen", "rng", "log", "seconds", "skipped"]


def stage_pretrain(cfg, stamp):
    run, pt = cfg.run, cfg.pretrain
    enc = tokenizer.load_tokenizer(run.out_dir, cfg.world.tokenizer)
    gcfg = dataclasses.replace(cfg.gpt, vocab_size=enc.n_vocab)
    splits = {k: np.memmap(path(cfg, f"{k}.bin"), dtype=np.uint16, mode="r") for k in ("train", "val")}
    gen = torch.Generator().manual_seed(run.seed + 1000003 * dist.rank())     # torchrun: each rank its own windows
    batch_size = pt.batch_size // dist.world()                                 # torchrun: each rank its share

    def get_batch(split):                                   # random windows of block_size + 1 tokens
        return data.windows(splits[split], batch_size, gcfg.block_size, gen, run.device)   # (B, T), (B, T)

    @torch.no_grad()
    def val_loss():
        model.eval()
        loss = float(np.mean([model(*get_batch("val"))[1].item() for _ in range(pt.eval_iters)]))
        model.train()
        return dist.all_reduce(loss, "mean")                # torchrun: over every rank's batches

    model = GPT(gcfg).to(run.device)                        # the same on every rank: one seed
    dist.seed_rank(run.seed)                                # torchrun: then each rank its own dropout
    fwd = torch.compile(model) if pt.compile else model     # fixed shapes: compiled once
    opt = pretrain_optimizer(model, pt)
    guard, start, log, seconds = StepGuard("pretraining"), 0, [], 0.0
    ckpt_path = path(cfg, "pretrain_ckpt.pt")
    # Same config and inputs: go on where it stopped (on the CPU: RNG states must stay there).
    s, why = store.load_resumable(ckpt_path, stamp, PRETRAIN_STATE)
    if s is not None:
        model.load_state_dict(s["model"])
        opt.load_state_dict(s["opt"])
        gen.set_state(dist.mine(s["gen"], ckpt_path))
        set_rng_states(dist.mine(s["rng"], ckpt_path))
        start, log, seconds, guard.skipped = s["iter"], s["log"], s["seconds"], s["skipped"]
        print(f"pretrain: resuming from {ckpt_path} after iteration {start}")
    elif why != "missing":
        print(f"pretrain: {ckpt_path} is {why}; starting over")
    print(f"pretrain: {model.num_params() / 1e6:.2f}M parameters, {pt.max_iters} iters of "
          f"{pt.batch_size}x{gcfg.block_size} tokens")
    model.train()
    t0 = time.time() - seconds
    for it in range(start, pt.max_iters):
        lr = scheduled_lr(it, pt, pt.lr, pt.min_lr)            # AdamW's (the one logged)
        for g in opt.param_groups:                          # every group on the same schedule, from its own peak
            g["lr"] = scheduled_lr(it, pt, g["peak_lr"], g["min_lr"])
        _, loss = fwd(*get_batch("train"))
        guard.step(loss, opt, list(model.parameters()), pt.grad_clip)
        if (it + 1) % pt.eval_interval == 0 or it + 1 == pt.max_iters:
            log.append(dict(iter=it + 1, loss=dist.all_reduce(loss.item(), "mean"), val_loss=val_loss(), lr=lr))
            dt = time.time() - t0
            print(f"iter {it + 1}/{pt.max_iters} | loss {log[-1]['loss']:.3f} | val {log[-1]['val_loss']:.3f} | "
                  f"lr {lr:.1e} | {(it + 1 - start) * pt.batch_size * gcfg.block_size / (dt - seconds) / 1e3:.1f}k "
                  f"tok/s | eta {fmt_time((dt - seconds) / (it + 1 - start) * (pt.max_iters - it - 1))}", flush=True)
            states = dist.gather_objects((gen.get_state(), rng_states()))    # torchrun: every rank's streams
            if dist.is_main():
                store.save_torch(dict(stamp=stamp, iter=it + 1, model=model.state_dict(), opt=opt.state_dict(),
                                      gen=dist.unzip(states, 0), rng=dist.unzip(states, 1), log=log, seconds=dt,
                                      skipped=guard.skipped), ckpt_path)
    seconds = time.time() - t0
    if not dist.is_main():                                  # torchrun: rank 0 saves, samples and reports
        return
    model.eval()
    save_checkpoint(model, path(cfg, "pretrain.pt"))        # saved before anything samples from it
    seed_everything(run.seed + 1)
    heldout = data.load_prompts(run.out_dir)["heldout"]
    prompts = [heldout[i % len(heldout)] for i in range(pt.n_samples)]
    texts = sample_texts(model, enc, prompts, run)
    stats, _ = judge_texts(prompts, texts)
    out = dict(val_loss=log[-1]["val_loss"], **stats, seconds=seconds, skipped_updates=guard.skipped,
               tokens_per_second=pt.max_iters * pt.batch_size * gcfg.block_size / seconds, log=log)
    store.save_json(path(cfg, "pretrain.json"), out)
    for p, r in list(zip(prompts, texts))[:3]:
        print(f"  [{data.gold_score(p, r):+.2f}] {p.strip()} | {r}")
    print(f"pretrain: val loss {out['val_loss']:.3f}, well-formed {out['wellformed_rate']:.0%} of {pt.n_samples}, "
          f"gold {out['gold_mean']:+.2f} ± {out['gold_std']:.2f}, {fmt_time(seconds)}")


def scheduled_lr(it, pt, peak, floor):
    """Iteration it's learning rate: linear warmup to `peak`, then a cosine down to `floor` at max_iters."""
    if it < pt.warmup_iters:
        return peak * (it + 1) / pt.warmup_iters
    return floor + 0.5 * (peak - floor) * (1 + math.cos(math.pi * (it - pt.warmup_iters) /
                                                        max(1, pt.max_iters - pt.warmup_iters)))


def pretrain_optimizer(model, pt):
    """--optimizer=adamw: AdamW on every parameter. muon: Muon on the blocks' 2-D matrices (model.hidden_matrices,
    as Muon's authors prescribe) and AdamW, as with adamw, on the rest (embeddings, the tied output layer, LayerNorm
    gains, biases). Muon's own lr (--muon_lr, Keller Jordan's 0.02 with torch's "original" per-shape scaling
    sqrt(max(1, rows/cols))), so the AdamW part keeps the lr tuned for it. Each group carries its peak and floor lr
    (peak_lr, min_lr) for the schedule: Muon's floor is in the same ratio to its peak as AdamW's."""
    if pt.optimizer == "adamw":
        opt = adamw(model.parameters(), pt.lr, betas=(0.9, 0.95), weight_decay=pt.weight_decay)
        peaks = [(pt.lr, pt.min_lr)]
    else:
        hidden = hidden_matrices(model)
        mine = {id(p) for p in hidden}
        rest = [p for p in model.parameters() if id(p) not in mine]    # parameters(): the tied matrix once
        opt = Optimizers(torch.optim.Muon(hidden, lr=pt.muon_lr, momentum=pt.muon_momentum, nesterov=True,
                                          weight_decay=pt.muon_weight_decay, adjust_lr_fn="original"),
                         adamw(rest, pt.lr, betas=(0.9, 0.95), weight_decay=pt.weight_decay))
        peaks = [(pt.muon_lr, pt.muon_lr * pt.min_lr / pt.lr), (pt.lr, pt.min_lr)]
    for g, (peak, floor) in zip(opt.param_groups, peaks, strict=True):
        g["peak_lr"], g["min_lr"] = peak, floor
    return opt


def fmt_time(s):
    return f"{int(s // 60)}m{int(s % 60):02d}s"


# ---- stage: reference ----
def stage_reference(cfg, stamp):
    """π_ref is the pretrained model, frozen: saved once, loaded by every PPO run, compared bit for bit after."""
    model, _ = load_checkpoint(path(cfg, "pretrain.pt"))
    save_checkpoint(model, path(cfg, "ref.pt"))
    print(f"reference: frozen copy of the pretrained model ({model.num_params() / 1e6:.2f}M parameters) -> ref.pt")


# ---- stage: preferences ----
def stage_preferences(cfg, stamp):
    run = cfg.run
    enc = tokenizer.load_tokenizer(run.out_dir, cfg.world.tokenizer)
    model, _ = load_checkpoint(path(cfg, "pretrain.pt"), run.device)
    rows = make_preferences(model, enc, data.load_prompts(run.out_dir)["train"], cfg.reward.n_pairs, run)
    store.save_json(path(cfg, "prefs.jsonl"), rows, lines=True)
    decided = [r for r in rows if r["gold_a"] != r["gold_b"]]
    agree = np.mean([(r["label"] == 0) == (r["gold_a"] > r["gold_b"]) for r in decided]) if decided else float("nan")
    print(f"preferences: {len(rows)} pairs; the annotator agrees with the gold order on {agree:.1%} of "
          f"{len(decided)} pairs with distinct gold scores")


# ---- stage: reward ----
def stage_reward(cfg, stamp):
    run = cfg.run
    enc = tokenizer.load_tokenizer(run.out_dir, cfg.world.tokenizer)
    lm, _ = load_checkpoint(path(cfg, "pretrain.pt"), run.device)
    rows = store.load_json(path(cfg, "prefs.jsonl"), lines=True)        # stages.json vouches for its n_pairs
    pairs = [dict(chosen=r["tokens_a"], rejected=r["tokens_b"], gold_chosen=r["gold_a"], gold_rejected=r["gold_b"])
             if r["label"] == 0 else dict(chosen=r["tokens_b"], rejected=r["tokens_a"], gold_chosen=r["gold_b"],
                                          gold_rejected=r["gold_a"]) for r in rows]
    rm, stats = train_reward_model(lm, pairs, cfg.reward, enc.eot_token, seed=run.seed)
    if not dist.is_main():                                              # torchrun: rank 0 writes
        return
    save_scalar_model(rm, path(cfg, "reward.pt"))
    store.save_json(path(cfg, "reward.json"), stats)
    print(f"reward model: held-out accuracy {stats['acc_noisy']:.1%} against the noisy labels, "
          f"{stats['acc_gold']:.1%} against the gold order ({stats['n_val']} pairs; the annotator itself agrees "
          f"with gold on {stats['annotator_agreement']:.1%})")


# ---- stage: ppo (the loop is ppo.train_ppo) ----
def load_models(base, device):
    """The pretrained actor, the frozen reference and the reward model (no gradients) of a run folder."""
    models = ("pretrain.pt", "ref.pt", "reward.pt")
    missing = [n for n in models if not os.path.isfile(os.path.join(base, n))]
    if missing:
        raise RunError(f"{base} has no {', '.join(missing)}: run train.py --out_dir={base} first")
    actor, _ = load_checkpoint(os.path.join(base, "pretrain.pt"), device)
    ref, _ = load_checkpoint(os.path.join(base, "ref.pt"), device)
    rm, _ = load_scalar_model(os.path.join(base, "reward.pt"), device)
    return actor, Reference(ref), rm.requires_grad_(False)


def run_ppo(cfg, base, run_dir, stamp, log=say):
    """PPO from base's pretrained model, reference and reward model; writes into run_dir actor.pt, metrics.jsonl,
    ppo.json (final evaluation, with the stamp it was made under) and ppo.png. Used by ablate.py too."""
    run = cfg.run
    os.makedirs(run_dir, exist_ok=True)
    enc = tokenizer.load_tokenizer(base, cfg.world.tokenizer)
    prompts = data.load_prompts(base)
    actor, ref, rm = load_models(base, run.device)
    actor, ref = refs.make_reference(actor, ref.model, cfg.ref)      # --ref=full: the same two models
    memory = refs.memory_bytes(actor, ref)
    critic = copy.deepcopy(rm).requires_grad_(True) if cfg.ppo.advantage == "gae" else None   # starts as the rm
    gold_norm = gold_normaliser(store.load_json(os.path.join(base, "prefs.jsonl"), lines=True))   # pretrained samples
    metrics, beta = train_ppo(actor, critic, ref, rm, enc, prompts["train"], cfg, run_dir, stamp, log, gold_norm)
    if not dist.is_main():                                           # torchrun: rank 0 evaluates and writes
        return None
    save_checkpoint(refs.plain_actor(actor), os.path.join(run_dir, "actor.pt"))    # lora: adapters merged
    store.remove(os.path.join(run_dir, "critic.pt"))                 # grpo, rloo: none (and no stale one)
    if critic is not None:
        save_scalar_model(critic, os.path.join(run_dir, "critic.pt"))    # the inspect page's per-token advantages
    full_ref = Reference(load_checkpoint(os.path.join(base, "ref.pt"), run.device)[0])
    unchanged = refs.unchanged(ref, full_ref.model, cfg.ref)
    seed_everything(run.seed + 1)
    final, _ = evaluate_policy(actor, enc, prompts["heldout"], run, full_ref, rm, cfg.ppo.n_eval)  # KL to full ref
    summary = dict(final=final, reference_unchanged=unchanged, kl_coef_final=beta, stamp=stamp,
                   skipped_updates=metrics[-1]["policy/skipped_updates"], seconds=metrics[-1]["time/elapsed"])
    seed_everything(run.seed + 2)                                   # n samples per held-out prompt
    summary.update(bestofk=best_of_k(actor, enc, prompts["heldout"], run, cfg.ppo.bestofk_n, cfg.ppo.pass_gold,
                                     cfg.ppo.n_eval),
                   gold_norm=dict(mean=gold_norm[0], std=gold_norm[1]),
                   entropy=float(np.mean([r["objective/entropy"] for r in metrics[-10:]])),    # the last 10 iters
                   critic_bytes=0 if critic is None else 16 * sum(p.numel() for p in critic.parameters()))
    own, step0 = final["kl"], 0.0                                   # full: the same model; exact: 0 at step 0,
    if cfg.ref.ref != "full":                                        # checked at the first rollout
        seed_everything(run.seed + 1)                               # the same samples, scored by the run's ref
        own = evaluate_policy(actor, enc, prompts["heldout"], run, ref, rm, cfg.ppo.n_eval)[0]["kl"]
    if not ref.exact:
        seed_everything(run.seed + 1)
        step0 = step0_kl(load_checkpoint(os.path.join(base, "pretrain.pt"), run.device)[0], ref, enc,
                              prompts["heldout"], run, rm, cfg.ppo.n_eval)
    summary["ref"] = dict(kind=cfg.ref.ref, bytes=memory["ref"], actor_bytes=memory["actor"],
                          trainable_bytes=memory["trainable"], kl_step0=step0, kl_own_ref=own,
                          seconds_per_iter=metrics[-1]["time/elapsed"] / len(metrics),
                          rollbacks=metrics[-1]["policy/rollbacks"])
    store.save_json(os.path.join(run_dir, "ppo.json"), summary)
    plot_metrics(metrics, os.path.join(run_dir, "ppo.png"))
    store.remove(os.path.join(run_dir, "ppo_state.pt"))             # finished: ppo.json is the record
    return summary


def stage_ppo(cfg, stamp):
    s = run_ppo(cfg, cfg.run.out_dir, cfg.run.out_dir, stamp)
    if s is None:                                                     # torchrun: a rank other than 0
        return
    f = s["final"]
    print(f"ppo: held-out gold {f['gold_mean']:+.2f}, proxy {f['proxy_mean']:+.2f}, KL to reference "
          f"{f['kl']:.2f} nats, well-formed {f['wellformed_rate']:.0%}; reference unchanged: "
          f"{s['reference_unchanged']}")


# ---- stage: report ----
def stage_report(cfg, stamp):
    run = cfg.run
    enc = tokenizer.load_tokenizer(run.out_dir, cfg.world.tokenizer)
    pre, ref, rm = load_models(run.out_dir, run.device)
    rlhf, _ = load_checkpoint(path(cfg, "actor.pt"), run.device)
    heldout = data.load_prompts(run.out_dir)["heldout"]
    res, samples = {}, {}
    for name, model in (("pretrained", pre), ("rlhf", rlhf)):
        seed_everything(run.seed + 1)                                 # same prompts, same sampling noise
        res[name], samples[name] = evaluate_policy(model, enc, heldout, run, ref, rm, cfg.ppo.n_eval)
        seed_everything(run.seed + 2)
        res[name]["bestofk"] = best_of_k(model, enc, heldout, run, cfg.ppo.bestofk_n, cfg.ppo.pass_gold,
                                         cfg.ppo.n_eval)
    plot_bestofk({name: r["bestofk"] for name, r in res.items()}, path(cfg, "bestofk.png"))
    timings = load_timings(cfg)
    print(write_report(path(cfg, "report.md"), res, samples, cfg.ppo.n_eval, run.temperature, timings))
    store.save_json(path(cfg, "report.json"), dict(res, seconds=timings))


# ---- stage: sample (the actor alone, no reference needed) ----
def stage_sample(cfg, stamp):
    run = cfg.run
    enc = tokenizer.load_tokenizer(run.out_dir, cfg.world.tokenizer)
    actor, _ = load_checkpoint(path(cfg, "actor.pt"), run.device)
    prompts = [run.prompt] if run.prompt else data.load_prompts(run.out_dir)["heldout"][:8]
    for p, r in zip(prompts, sample_texts(actor, enc, prompts, run)):
        print(f"[gold {data.gold_score(p, r):+.2f}] {p.strip()} | {r}")


# ---- the stage table: what each stage reads, writes, and which config fields shape its outputs ----
Stage = namedtuple("Stage", "name fn inputs outputs fields partial code")
_names = lambda *groups: [f.name for g in groups for _, f in fields({"g": g})]
_SAMPLING = ["seed", "temperature", "response_length", "dtype"]
WORLD = ["world.json", "train.txt", "val.txt", "train.bin", "val.bin", "tokenizer.bpe", "prompts.json"]
TOK = ["tokenizer.bpe", "prompts.json"]
# The code each stage runs: project files, and functions of this file ("stages.py:NAME"). A stage is redone when
# one of them changes (comments, docstrings and layout aside); config.py and store.py only check and store.
_EVAL = ["evaluate.py", "kl.py", "ref.py", "reward.py", "model.py", "data.py", "tokenizer.py"]
STAGES = [
    Stage("world", stage_world, [], WORLD, ["seed"] + _names(WorldConfig), None,
          ["data.py", "tokenizer.py", "stages.py:build_world_aside", "stages.py:stage_world"]),
    Stage("pretrain", stage_pretrain, ["train.bin", "val.bin"] + TOK, ["pretrain.pt", "pretrain.json"],
          _SAMPLING + ["dtype"] + _names(GPTConfig, PretrainConfig), "pretrain_ckpt.pt",
          ["model.py", "data.py", "tokenizer.py", "evaluate.py", "dist.py", "stages.py:stage_pretrain",
           "stages.py:scheduled_lr", "stages.py:pretrain_optimizer"]),
    Stage("reference", stage_reference, ["pretrain.pt"], ["ref.pt"], [], None,
          ["model.py", "stages.py:stage_reference"]),
    Stage("preferences", stage_preferences, ["pretrain.pt"] + TOK, ["prefs.jsonl"], _SAMPLING + ["n_pairs"], None,
          ["model.py", "reward.py", "data.py", "tokenizer.py", "stages.py:stage_preferences"]),
    Stage("reward", stage_reward, ["pretrain.pt", "prefs.jsonl"], ["reward.pt", "reward.json"],
          ["seed", "dtype"] + _names(RewardConfig), None,
          ["model.py", "reward.py", "dist.py", "stages.py:stage_reward"]),
    Stage("ppo", stage_ppo, ["pretrain.pt", "ref.pt", "reward.pt", "train.bin", "prefs.jsonl"] + TOK,  # ptx, gold
          ["actor.pt", "critic.pt", "metrics.jsonl", "ppo.json", "ppo.png"],                  # critic.pt: gae only
          _SAMPLING + [n for n in _names(KLConfig, PPOConfig, RefConfig) if n != "save_interval"], "ppo_state.pt",
          _EVAL + ["ppo.py", "grpo.py", "dist.py", "stages.py:load_models", "stages.py:run_ppo",
                   "stages.py:stage_ppo"]),
    Stage("report", stage_report, ["pretrain.pt", "actor.pt", "ref.pt", "reward.pt"] + TOK,
          ["report.md", "report.json", "bestofk.png"], _SAMPLING + ["n_eval", "bestofk_n", "pass_gold"], None,
          _EVAL + ["stages.py:load_models", "stages.py:stage_report"]),
]
SAMPLE = Stage("sample", stage_sample, ["actor.pt"] + TOK, [], [], None, [])
INSPECT = Stage("inspect", stage_inspect, ["pretrain.pt", "ref.pt", "reward.pt"] + TOK, [], [], None, [])
BY_NAME = {s.name: s for s in STAGES + [SAMPLE, INSPECT]}


def files(cfg, names):
    """A stage's files under this config: gpt2's tokenizer is tiktoken's own (no tokenizer.bpe), only PPO with a
    critic (--advantage=gae) leaves critic.pt, and plots are drawn only where matplotlib is installed."""
    plots = importlib.util.find_spec("matplotlib") is not None
    out = []
    for n in names:
        if n == "tokenizer.bpe" and cfg.world.tokenizer != "bpe":
            continue
        if n == "critic.pt" and cfg.ppo.advantage != "gae":
            continue
        if n.endswith(".png") and not plots:
            continue
        out.append(n)
    return out


ROOT = os.path.dirname(os.path.abspath(__file__))


_DIGESTS = {}       # (file, its mtime and size, function or "") -> hash: each file parsed once while unchanged


def code_of(st, root=ROOT):
    """{piece: hash} of the code stage `st` runs (its `code` list), read from the project in `root`: a file's
    parsed tree, or one function's of this file (store.code_digest: comments, docstrings and layout aside)."""
    out = {}
    for piece in st.code:
        name, _, fn = piece.partition(":")
        p = os.path.join(root, name)
        key = (p, os.stat(p).st_mtime_ns, os.stat(p).st_size, fn)
        if key not in _DIGESTS:
            with open(p) as f:
                node = ast.parse(f.read())
            if fn:
                node = next(n for n in node.body if isinstance(n, ast.FunctionDef) and n.name == fn)
            _DIGESTS[key] = store.code_digest(node)
        out[piece] = _DIGESTS[key]
    return out


def stamp(cfg, st):
    """What a stage's outputs are made from: its config fields, the hashes of its input files and of its code."""
    groups = {g: type(c) for g, c in vars(cfg).items()}            # train.GROUPS, as parsed
    values = {f.name: getattr(getattr(cfg, g), f.name) for g, f in fields(groups) if f.name in st.fields}
    defaults = {f.name: f.default for g, f in fields(groups) if f.name in st.fields}    # the code's, not a preset's
    return dict(config=values, inputs={n: store.file_hash(path(cfg, n)) for n in files(cfg, st.inputs)},
                defaults=defaults, code=code_of(st))


def world_ok(cfg, corpus=True, folder=None):
    """config.check_world with the world's tokenizer, prompts (and --prompt) and token files, in out_dir or in
    `folder` (a world built aside)."""
    folder = folder or cfg.run.out_dir
    enc = tokenizer.load_tokenizer(folder, cfg.world.tokenizer)
    prompts = sum(data.load_prompts(folder).values(), []) + ([cfg.run.prompt] if cfg.run.prompt else [])
    sizes = {}
    if corpus:
        sizes = {s: os.path.getsize(os.path.join(folder, f"{s}.bin")) // 2 for s in ("train", "val")}
    check_world(cfg, enc, prompts, sizes)
