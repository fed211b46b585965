"""The stages of RLHF, from an empty folder to a report, and the table that says what each reads
and writes.

    python train.py                   # runs them: train.py is the driver (flags, checks, which
                                      # stages to run)
    python train.py --stage=pretrain  # one stage
Each stage is a function `stage_NAME(cfg, stamp)` that reads its inputs from out_dir and writes its
outputs there: world, pretrain, reference, preferences, reward, ppo (`run_ppo`, used by
lab/ablate.py too; the loop is ppo.train_ppo), report. Sampling a finished run is sample.py's.
The stage table is STAGES, at the bottom: each stage's input and output files and the config fields
that shape its outputs; `stamp` is what a stage's outputs are made from, which train.py records in
stages.json and compares on the next run.
Lines under a `# torchrun` comment are the only ones a single process skips past (dist.py).
Left out: resuming the preferences and reward stages half way.
"""
import copy, importlib.util, os, random, shutil
from collections import namedtuple
import numpy as np
import torch

import data, tokenizer
from dpo import DPOConfig, implicit_accuracy, train_dpo
from kl import KLConfig
from model import GPTConfig
from ppo import PPOConfig, say, train_ppo
from ref import check_unchanged, load_checkpoint, load_reference, save_checkpoint, save_reference
from reward import (RewardConfig, gold_normaliser, labelled_pairs, load_scalar_model,
                    make_preferences, save_scalar_model, train_reward_model)
from machinery import dist, provenance, records, store, tblog
from machinery.config import WorldConfig, check_world, fields
from machinery.errors import RunError
from machinery.precision import autocast, deterministic
from options import cheap_ref
from options.anchors import AnchorConfig
from options.cheap_ref import RefConfig
from options.evaluate import (EvalConfig, best_of_k, evaluate_policy, judge_texts, sample_texts,
                              step0_kl)
from options.rollback import RollbackConfig
from pipeline.pretrain import PretrainConfig, fmt_time, train_gpt
from pipeline.report import (plot_bestofk, plot_curves, plot_dpo, plot_metrics, plot_reward,
                             write_report)


def seed_everything(seed):
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def path(cfg, name):
    return os.path.join(cfg.run.out_dir, name)


def load_timings(cfg, notes=None):
    """timings.json, {stage: seconds}; {} when it is missing, or damaged (a line in `notes` says
    so)."""
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
# The world is built in this folder of out_dir, checked, then moved into place.
ASIDE = "world.new"


def build_world_aside(cfg):
    """The world, built in out_dir/world.new/ and checked there (config.check_world: every prompt
    and both splits fit --block_size). A world that does not fit stops the run before anything in
    out_dir is touched, so train.py calls this before it removes any output."""
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
    """The world built aside (build_world_aside; built now if it is not there) moved into
    out_dir."""
    aside = path(cfg, ASIDE)
    if not os.path.isdir(aside):
        build_world_aside(cfg)
    for n in files(cfg, WORLD):
        os.replace(os.path.join(aside, n), path(cfg, n))
    shutil.rmtree(aside)


# ---- stage: pretrain (the loop is pretrain.train_gpt) ----
def stage_pretrain(cfg, stamp):
    run, pt = cfg.run, cfg.pretrain
    enc = tokenizer.load_tokenizer(run.out_dir, cfg.world.tokenizer)
    bins = {k: path(cfg, f"{k}.bin") for k in ("train", "val")}
    model, log, seconds, skipped = train_gpt(cfg, stamp, enc.n_vocab, bins,
                                             path(cfg, "pretrain_ckpt.pt"))
    # torchrun: rank 0 saves, samples and reports.
    if not dist.is_main():
        return
    model.eval()
    # Saved before anything samples from it.
    save_checkpoint(model, path(cfg, "pretrain.pt"))
    seed_everything(run.seed + 1)
    heldout = data.load_prompts(run.out_dir)["heldout"]
    prompts = [heldout[i % len(heldout)] for i in range(pt.n_samples)]
    texts = sample_texts(model, enc, prompts, run)
    stats, _ = judge_texts(prompts, texts)
    tokens = pt.max_iters * pt.batch_size * cfg.gpt.block_size
    # pretrain.json keeps the evaluations; pretrain_metrics.jsonl and its plot every step.
    evals = [{k: r[k] for k in ("iter", "loss", "val_loss", "lr")} for r in log if "val_loss" in r]
    out = dict(val_loss=log[-1]["val_loss"], **stats, seconds=seconds, skipped_updates=skipped,
               tokens_per_second=tokens / seconds, log=evals)
    store.save_json(path(cfg, "pretrain.json"), out)
    store.save_json(path(cfg, "pretrain_metrics.jsonl"), log, lines=True)
    if run.plots:
        plot_curves(log, "loss", "val_loss", "pretraining: next-token loss",
                    path(cfg, "pretrain.png"))
    for p, r in list(zip(prompts, texts))[:3]:
        print(f"  [{data.gold_score(p, r):+.2f}] {p.strip()} | {r}")
    print(f"pretrain: val loss {out['val_loss']:.3f}, well-formed {out['wellformed_rate']:.0%} "
          f"of {pt.n_samples}, gold {out['gold_mean']:+.2f} ± {out['gold_std']:.2f}, "
          f"{fmt_time(seconds)}")


# ---- stage: reference ----
def stage_reference(cfg, stamp):
    """π_ref is the pretrained model, frozen: saved once, loaded by every PPO run, compared bit for
    bit after (ref.py)."""
    model = save_reference(path(cfg, "pretrain.pt"), path(cfg, "ref.pt"))
    print(f"reference: frozen copy of the pretrained model ({model.num_params() / 1e6:.2f}M "
          "parameters) -> ref.pt")


# ---- stage: preferences ----
def stage_preferences(cfg, stamp):
    run = cfg.run
    enc = tokenizer.load_tokenizer(run.out_dir, cfg.world.tokenizer)
    model, _ = load_checkpoint(path(cfg, "pretrain.pt"), run.device)
    prompts = data.load_prompts(run.out_dir)["train"]
    rows = make_preferences(model, enc, prompts, cfg.reward.n_pairs, run, log=say)
    store.save_json(path(cfg, "prefs.jsonl"), rows, lines=True)
    decided = [r for r in rows if r["gold_a"] != r["gold_b"]]
    agrees = [(r["label"] == 0) == (r["gold_a"] > r["gold_b"]) for r in decided]
    agree = np.mean(agrees) if decided else float("nan")
    print(f"preferences: {len(rows)} pairs; the annotator agrees with the gold order on "
          f"{agree:.1%} of {len(decided)} pairs with distinct gold scores")


# ---- stage: reward ----
def stage_reward(cfg, stamp):
    run = cfg.run
    enc = tokenizer.load_tokenizer(run.out_dir, cfg.world.tokenizer)
    lm, _ = load_checkpoint(path(cfg, "pretrain.pt"), run.device)
    # stages.json vouches for its n_pairs.
    pairs = labelled_pairs(store.load_json(path(cfg, "prefs.jsonl"), lines=True))
    # --log_to=tensorboard: every row, as it comes, in out_dir/tb/reward/ too.
    board = tblog.open_log(run.log_to, run.out_dir, "reward")
    rm, stats, rows = train_reward_model(lm, pairs, cfg.reward, enc.eot_token, seed=run.seed,
                                         log=say, board=board)
    tblog.close(board)
    # torchrun: rank 0 writes.
    if not dist.is_main():
        return
    save_scalar_model(rm, path(cfg, "reward.pt"))
    store.save_json(path(cfg, "reward.json"), stats)
    store.save_json(path(cfg, "reward_metrics.jsonl"), rows, lines=True)
    if run.plots:
        plot_reward(rows, path(cfg, "reward.png"))
    print(f"reward model: held-out accuracy {stats['acc_noisy']:.1%} against the noisy labels, "
          f"{stats['acc_gold']:.1%} against the gold order ({stats['n_val']} pairs; the annotator "
          f"itself agrees with gold on {stats['annotator_agreement']:.1%})")


# ---- stage: ppo (the loop is ppo.train_ppo) ----
def load_models(base, device):
    """The pretrained actor, the frozen reference and the reward model (no gradients) of a run
    folder."""
    models = ("pretrain.pt", "ref.pt", "reward.pt")
    missing = [n for n in models if not os.path.isfile(os.path.join(base, n))]
    if missing:
        raise RunError(f"{base} has no {', '.join(missing)}: run train.py --out_dir={base} first")
    actor, _ = load_checkpoint(os.path.join(base, "pretrain.pt"), device)
    ref = load_reference(os.path.join(base, "ref.pt"), device)
    rm, _ = load_scalar_model(os.path.join(base, "reward.pt"), device)
    return actor, ref, rm.requires_grad_(False)


def run_ppo(cfg, base, run_dir, stamp, log=say, plot=True):
    """PPO from base's pretrained model, reference and reward model; writes into run_dir actor.pt,
    metrics.jsonl, ppo.json (final evaluation, with the stamp it was made under) and ppo.png. Used
    by lab/ablate.py too, with plot=False: a suite's runs are drawn by its own figures (and any
    run's curves by python -m lab.plot RUN_DIR), not one ppo.png each."""
    run = cfg.run
    os.makedirs(run_dir, exist_ok=True)
    enc = tokenizer.load_tokenizer(base, cfg.world.tokenizer)
    prompts = data.load_prompts(base)
    actor, ref, rm = load_models(base, run.device)
    # --ref: how the reference is held; with full, both as loaded.
    actor, ref = cheap_ref.make_reference(actor, ref, cfg.ref)
    memory = cheap_ref.memory_bytes(actor, ref)
    # The critic starts as the reward model.
    critic = copy.deepcopy(rm).requires_grad_(True) if cfg.ppo.advantage == "gae" else None
    # The gold scores' normaliser, from the pretrained model's samples.
    gold_norm = gold_normaliser(store.load_json(os.path.join(base, "prefs.jsonl"), lines=True))
    metrics, beta = train_ppo(actor, critic, ref, rm, enc, prompts["train"], cfg, run_dir, stamp,
                              log, gold_norm, prompts["heldout"])
    full_ref = load_reference(os.path.join(base, "ref.pt"), run.device)
    # The KL was paid to π_ref only if the reference left PPO as ref.pt made it: else the run
    # stops, and its state goes, so that the same command redoes PPO (ref.py).
    try:
        check_unchanged(ref, cheap_ref.as_built(full_ref, cfg.ref))
    except RunError:
        store.remove(os.path.join(run_dir, "ppo_state.pt"))
        raise
    # torchrun: rank 0 evaluates and writes.
    if not dist.is_main():
        return None
    # With --ref=lora the adapters are merged.
    save_checkpoint(cheap_ref.plain_actor(actor), os.path.join(run_dir, "actor.pt"))
    # grpo and rloo have no critic (and leave no stale one).
    store.remove(os.path.join(run_dir, "critic.pt"))
    if critic is not None:
        # The inspect page's per-token advantages.
        save_scalar_model(critic, os.path.join(run_dir, "critic.pt"))
    seed_everything(run.seed + 1)
    # The KL is to the full reference.
    final, _ = evaluate_policy(actor, enc, prompts["heldout"], run, full_ref, rm, cfg.eval.n_eval)
    summary = dict(final=final, reference_unchanged=True, kl_coef_final=beta, stamp=stamp,
                   skipped_updates=metrics[-1]["policy/skipped_updates"],
                   stopped_after=len(metrics) if len(metrics) < cfg.ppo.ppo_iters else None,
                   seconds=metrics[-1]["time/elapsed"])
    # n samples per held-out prompt.
    seed_everything(run.seed + 2)
    summary.update(
        bestofk=best_of_k(actor, enc, prompts["heldout"], run, cfg.eval.bestofk_n,
                          cfg.eval.pass_gold, cfg.eval.n_eval,
                          pass_gold_hard=cfg.eval.pass_gold_hard),
        gold_norm=dict(mean=gold_norm[0], std=gold_norm[1]),
        # The entropy over the last 10 iterations.
        entropy=float(np.mean([r["policy/entropy_avg"] for r in metrics[-10:]])),
        critic_bytes=0 if critic is None else 16 * sum(p.numel() for p in critic.parameters()))
    # With --ref=full the run's own reference is the full one, so its KL is final's; an exact
    # reference's KL at step 0 is 0, checked at the first rollout.
    own, step0 = final["kl"], 0.0
    if cfg.ref.ref != "full":
        # The same samples, scored by the run's ref.
        seed_everything(run.seed + 1)
        own = evaluate_policy(actor, enc, prompts["heldout"], run, ref, rm,
                              cfg.eval.n_eval)[0]["kl"]
    if not ref.exact:
        seed_everything(run.seed + 1)
        step0 = step0_kl(load_checkpoint(os.path.join(base, "pretrain.pt"), run.device)[0], ref,
                         enc, prompts["heldout"], run, rm, cfg.eval.n_eval)
    summary["ref"] = dict(kind=cfg.ref.ref, bytes=memory["ref"], actor_bytes=memory["actor"],
                          trainable_bytes=memory["trainable"], kl_step0=step0, kl_own_ref=own,
                          seconds_per_iter=metrics[-1]["time/elapsed"] / len(metrics),
                          rollbacks=metrics[-1]["policy/rollbacks"])
    store.save_json(os.path.join(run_dir, "ppo.json"), summary)
    if plot:
        plot_metrics(metrics, os.path.join(run_dir, "ppo.png"), critic=critic is not None)
    # Finished: ppo.json is the record.
    store.remove(os.path.join(run_dir, "ppo_state.pt"))
    return summary


def stage_ppo(cfg, stamp, base=None, run_dir=None, log=say, plot=True):
    """PPO from base's models (out_dir's) into run_dir (out_dir; lab/ablate.py: a run's own folder),
    each line to `log`."""
    s = run_ppo(cfg, base or cfg.run.out_dir, run_dir or cfg.run.out_dir, stamp, log,
                plot and cfg.run.plots)
    # torchrun: a rank other than 0.
    if s is None:
        return
    f = s["final"]
    log(f"ppo: held-out gold {f['gold_mean']:+.2f}, proxy {f['proxy_mean']:+.2f}, KL to "
        f"reference {f['kl']:.2f} nats, well-formed {f['wellformed_rate']:.0%}; reference "
        f"unchanged: {s['reference_unchanged']}")


# ---- stage: dpo (optional; the loop is dpo.train_dpo) ----
def run_dpo(cfg, base, run_dir, stamp, log=say, plot=True):
    """DPO (or IPO) from base's pretrained model against its frozen reference, on base's
    prefs.jsonl; writes into run_dir dpo_actor.pt, dpo_metrics.jsonl, dpo.json (the report's
    evaluation of the actor, best-of-k, the implicit reward's held-out accuracy, with the stamp)
    and dpo.png (plot=False: none, as lab/dpo_suite.py's runs). Used by lab/dpo_suite.py too."""
    run = cfg.run
    os.makedirs(run_dir, exist_ok=True)
    enc = tokenizer.load_tokenizer(base, cfg.world.tokenizer)
    prompts = data.load_prompts(base)
    actor, ref, rm = load_models(base, run.device)
    rows = store.load_json(os.path.join(base, "prefs.jsonl"), lines=True)
    pairs = labelled_pairs(rows)
    # The reward model's split, also when --seed (the batches', the evaluations') is another.
    made = records.load_records(base).get("reward", {}).get("config", {})
    # Online: the gold judge's units, as PPO's --reward=gold.
    gold_norm = gold_normaliser(rows)
    metrics, val = train_dpo(actor, ref, rm, enc, pairs, cfg, run_dir, stamp, log, prompts,
                             made.get("seed", run.seed), gold_norm)
    # The loss held the actor to π_ref only if π_ref stayed as ref.pt made it (ref.py): else the
    # run stops, and its state and log go, so that the same command redoes DPO.
    try:
        check_unchanged(ref, load_reference(os.path.join(base, "ref.pt"), run.device).state(),
                        during="DPO")
    except RunError:
        store.remove(os.path.join(run_dir, "dpo_state.pt"))
        store.remove(os.path.join(run_dir, "dpo_metrics.jsonl"))
        raise
    save_checkpoint(actor, os.path.join(run_dir, "dpo_actor.pt"))
    seed_everything(run.seed + 1)
    final, _ = evaluate_policy(actor, enc, prompts["heldout"], run, ref, rm, cfg.eval.n_eval)
    seed_everything(run.seed + 2)
    bestofk = best_of_k(actor, enc, prompts["heldout"], run, cfg.eval.bestofk_n,
                        cfg.eval.pass_gold, cfg.eval.n_eval,
                        pass_gold_hard=cfg.eval.pass_gold_hard)
    summary = dict(final=final, bestofk=bestofk, stamp=stamp, steps=len(metrics),
                   n_train=len(pairs) - len(val), n_val=len(val),
                   implicit=implicit_accuracy(actor, ref, enc, val, cfg.dpo, run.temperature),
                   skipped_updates=metrics[-1]["skipped_updates"],
                   seconds=metrics[-1]["time/elapsed"])
    store.save_json(os.path.join(run_dir, "dpo.json"), summary)
    if plot:
        plot_dpo(metrics, os.path.join(run_dir, "dpo.png"))
    store.remove(os.path.join(run_dir, "dpo_state.pt"))
    return summary


def stage_dpo(cfg, stamp, base=None, run_dir=None, log=say, plot=True):
    s = run_dpo(cfg, base or cfg.run.out_dir, run_dir or cfg.run.out_dir, stamp, log,
                plot and cfg.run.plots)
    f = s["final"]
    log(f"dpo: held-out gold {f['gold_mean']:+.2f}, proxy {f['proxy_mean']:+.2f}, KL to "
        f"reference {f['kl']:.2f} nats, well-formed {f['wellformed_rate']:.0%}, length "
        f"{f['response_length']:.1f}; implicit reward's held-out accuracy "
        f"{s['implicit']['acc_noisy']:.1%} (gold order {s['implicit']['acc_gold']:.1%})")


# ---- stage: report ----
def stage_report(cfg, stamp):
    run = cfg.run
    enc = tokenizer.load_tokenizer(run.out_dir, cfg.world.tokenizer)
    pre, ref, rm = load_models(run.out_dir, run.device)
    rlhf, _ = load_checkpoint(path(cfg, "actor.pt"), run.device)
    heldout = data.load_prompts(run.out_dir)["heldout"]
    res, samples = {}, {}
    for name, model in (("pretrained", pre), ("rlhf", rlhf)):
        # The same prompts, the same sampling noise.
        seed_everything(run.seed + 1)
        res[name], samples[name] = evaluate_policy(model, enc, heldout, run, ref, rm,
                                                   cfg.eval.n_eval)
        seed_everything(run.seed + 2)
        res[name]["bestofk"] = best_of_k(model, enc, heldout, run, cfg.eval.bestofk_n,
                                         cfg.eval.pass_gold, cfg.eval.n_eval,
                                         pass_gold_hard=cfg.eval.pass_gold_hard)
    if run.plots:
        plot_bestofk({name: r["bestofk"] for name, r in res.items()}, path(cfg, "bestofk.png"))
    timings = load_timings(cfg)
    # The machine, commit and command; the wall time is the stages' seconds summed.
    made = provenance.stamp(sum(timings.values()), device=run.device)
    print(write_report(path(cfg, "report.md"), res, samples, cfg.eval.n_eval, run.temperature,
                       timings, provenance.line(made, "the stages' seconds summed")))
    store.save_json(path(cfg, "report.json"), dict(res, seconds=timings, made_by=made))


# ---- the stage table: what each stage reads, writes, and which config fields shape its outputs
# optional: run only when asked for (--stage=NAME), never by `python train.py` alone.
Stage = namedtuple("Stage", "name fn inputs outputs fields partial optional", defaults=(False,))


def _names(*groups):
    return [f.name for g in groups for _, f in fields({"g": g})]


_SAMPLING = ["seed", "temperature", "response_length", "dtype", "deterministic"]
WORLD = ["world.json", "train.txt", "val.txt", "train.bin", "val.bin", "tokenizer.bpe",
         "prompts.json"]
TOK = ["tokenizer.bpe", "prompts.json"]
_PPO_FIELDS = _names(KLConfig, PPOConfig, RefConfig, AnchorConfig, RollbackConfig, EvalConfig)
STAGES = [
    Stage("world", stage_world, [], WORLD, ["seed"] + _names(WorldConfig), None),
    # How often a loop prints (log_interval, rm_log_every, dpo_log_every) or saves its state
    # (save_interval, dpo_save_every) shapes none of its outputs: not among the stage's fields.
    Stage("pretrain", stage_pretrain, ["train.bin", "val.bin"] + TOK,
          ["pretrain.pt", "pretrain.json", "pretrain_metrics.jsonl", "pretrain.png"],
          _SAMPLING + [n for n in _names(GPTConfig, PretrainConfig) if n != "log_interval"],
          "pretrain_ckpt.pt"),
    Stage("reference", stage_reference, ["pretrain.pt"], ["ref.pt"], [], None),
    Stage("preferences", stage_preferences, ["pretrain.pt"] + TOK, ["prefs.jsonl"],
          _SAMPLING + ["n_pairs"], None),
    Stage("reward", stage_reward, ["pretrain.pt", "prefs.jsonl"],
          ["reward.pt", "reward.json", "reward_metrics.jsonl", "reward.png"],
          ["seed", "dtype"] + [n for n in _names(RewardConfig) if n != "rm_log_every"], None),
    # DPO: the reference inside the loss, from the pretrained model; reward.pt is its evaluation's
    # proxy only.
    Stage("dpo", stage_dpo, ["pretrain.pt", "ref.pt", "reward.pt", "prefs.jsonl"] + TOK,
          ["dpo_actor.pt", "dpo_metrics.jsonl", "dpo.json", "dpo.png"],
          _SAMPLING + [n for n in _names(DPOConfig, EvalConfig)
                       if n not in ("dpo_save_every", "dpo_log_every")]
          + ["rm_val_frac", "missing_eos_penalty"], "dpo_state.pt", True),
    # train.bin: ptx's windows; prefs.jsonl: the gold scores' normaliser. critic.pt: gae only.
    Stage("ppo", stage_ppo,
          ["pretrain.pt", "ref.pt", "reward.pt", "train.bin", "prefs.jsonl"] + TOK,
          ["actor.pt", "critic.pt", "metrics.jsonl", "ppo.json", "ppo.png"],
          _SAMPLING + [n for n in _PPO_FIELDS if n != "save_interval"], "ppo_state.pt"),
    Stage("report", stage_report, ["pretrain.pt", "actor.pt", "ref.pt", "reward.pt"] + TOK,
          ["report.md", "report.json", "bestofk.png"], _SAMPLING + _names(EvalConfig), None),
]
BY_NAME = {s.name: s for s in STAGES}


def files(cfg, names, made=None, named=None):
    """A stage's files under this config, or under `made` (the {field: value} config of a record:
    what that stage made): gpt2's tokenizer is tiktoken's own (no tokenizer.bpe), only PPO with a
    critic (--advantage=gae) leaves critic.pt, and plots are drawn only with --plots where
    matplotlib is installed. named: the files a record names; a figure is then one only where it
    names it (a stage made with --plots=false is not redone to draw one)."""
    made = made or {}
    plots = cfg.run.plots and importlib.util.find_spec("matplotlib") is not None
    tokenizer_kind = made.get("tokenizer", cfg.world.tokenizer)
    advantage = made.get("advantage", cfg.ppo.advantage)
    out = []
    for n in names:
        if n == "tokenizer.bpe" and tokenizer_kind != "bpe":
            continue
        if n == "critic.pt" and advantage != "gae":
            continue
        if n.endswith(".png") and not (plots if named is None else n in named):
            continue
        out.append(n)
    return out


def run_stage(cfg, st, stamp, **kw):
    """Stage `st` as train.py and lab/ablate.py run it: --deterministic's switch, every generator
    seeded from --seed, then its function under the run's precision (a no-op under fp32; under bf16
    autocast takes every forward of the stage: precision.py). kw: run_ppo's, for lab/ablate.py's
    runs."""
    if cfg.run.deterministic:
        deterministic()
    seed_everything(cfg.run.seed)
    with autocast(cfg.run.device, cfg.run.dtype):
        return st.fn(cfg, stamp, **kw)


def code_of(st, root=records.ROOT):
    """{piece: hash} of the code stage `st` runs, from the project in `root`: what run_stage and
    the stage's function reach (records.code_of)."""
    roots = [(__name__, "run_stage"), (__name__, st.fn.__name__)]
    return records.code_of(roots, root)


def stamp_config(cfg, st):
    """A stamp's config part, (values, defaults): the stage's fields as cfg gives them and as the
    code's defaults give them; read without any input file."""
    # train.GROUPS, as parsed.
    groups = {g: type(c) for g, c in vars(cfg).items()}
    values = {f.name: getattr(getattr(cfg, g), f.name) for g, f in fields(groups)
              if f.name in st.fields}
    # The code's defaults, not a preset's.
    defaults = {f.name: f.default for g, f in fields(groups) if f.name in st.fields}
    # What changes a computing stage's numbers without being one of its fields: torch's threads
    # (how a matmul's sums are split) and torchrun's processes (each its own sampling noise). A
    # record from before they were recorded matches any.
    if st.name not in ("world", "reference"):
        numeric = dict(threads=torch.get_num_threads(), processes=dist.world())
        values.update(numeric)
        defaults.update(numeric)
    return values, defaults


def stamp(cfg, st):
    """What a stage's outputs are made from: its config fields, the hashes of its input files and of
    its code."""
    values, defaults = stamp_config(cfg, st)
    inputs = {n: store.file_hash(path(cfg, n)) for n in files(cfg, st.inputs)}
    return dict(config=values, inputs=inputs, defaults=defaults, code=code_of(st))


def world_ok(cfg, corpus=True, folder=None):
    """config.check_world with the world's tokenizer, prompts and token files, in
    out_dir or in `folder` (a world built aside)."""
    folder = folder or cfg.run.out_dir
    enc = tokenizer.load_tokenizer(folder, cfg.world.tokenizer)
    prompts = sum(data.load_prompts(folder).values(), [])
    sizes = {}
    if corpus:
        sizes = {s: os.path.getsize(os.path.join(folder, f"{s}.bin")) // 2
                 for s in ("train", "val")}
    check_world(cfg, enc, prompts, sizes)
