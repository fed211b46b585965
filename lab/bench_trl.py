"""tether's PPO iteration beside TRL's PPOTrainer, alternately in one process: s/iteration.

It runs ONLY in a scratch virtual environment outside the project. tether never imports this file,
and transformers and trl are never dependencies of tether (its design card forbids them; this file
measures another library). The installed trl picks the trainer: 0.11.4 (with transformers 4.46.3)
its classic PPOTrainer; 1.12 the newer trl.experimental.ppo.PPOTrainer; any other is refused.
    # reuses the system's torch 2.13.0, numpy, tiktoken
    python -m venv --system-site-packages /work/trl_venv
    # pip must never fetch another torch (a CUDA one: GBs)
    echo torch==2.13.0 > /tmp/trl_constraints.txt
    /work/trl_venv/bin/pip install -c /tmp/trl_constraints.txt trl==0.11.4 transformers==4.46.3 rich
    # from the repository root
    /work/trl_venv/bin/python -m lab.bench_trl --threads=2 --repeats=5
    # trl 1.12.0 (transformers 5.24.0, accelerate 1.15.0, datasets) in a venv of its own
    python -m venv --system-site-packages /work/trl12_venv
    /work/trl12_venv/bin/pip install --find-links /opt/wheels -c /tmp/trl_constraints.txt \\
        torch==2.13.0 trl==1.12.0
    /work/trl12_venv/bin/python -m lab.bench_trl --threads=2 --repeats=5
(rich: trl 0.11.4 imports it without declaring it.) --threads sets torch's thread count for both
sides (0: torch's default); --repeats the timed iterations of each side after one warm-up iteration
of each.
Both sides run the anchor of bench.py (ppo_anchor): GPT-2 architecture, 4 layers, 4 heads, 128
channels, vocabulary 1024, 64 positions; 64 prompts of 16 random tokens; exactly 32 tokens sampled
per prompt (temperature 1, no top-k, no top-p, no early stop); 4 epochs x 4 minibatches of 16; a
frozen reference; a fixed β = 0.05 with the k1 estimator in the reward; a random reward model of the
anchor's size scored inside the iteration; tether's gamma, lam, clip ranges and actor lr.
TRL 0.11.4: the repeats alternate the order (tether first, then TRL first) so that drift in the
machine hits both; each phase's median is printed, and the iteration's is the median of the
per-iteration sums (so the phases need not add up to it exactly).
TRL 1.12 runs its whole loop inside train(): it is called once, for 1 + repeats iterations
(total_episodes = 64 x that), and a callback at the end of each of its iterations (on_step_end)
runs one tether iteration, so the two strictly alternate. A TRL iteration is timed from the end of
the tether iteration before it (or train()'s start) to its on_step_end: tether's time is never in
it, and TRL's clean-up after on_step_end (freeing the rollout, gc) falls into its next iteration.
The first iteration of each is the warm-up. Its phases are cut by timestamps taken in wrappers that
this file puts around functions train() calls (they compute nothing else): generate is its
batch_generation; experience runs from there to the first forward with gradients (old log-probs
from generate's scores, the ref, value and reward forwards, rewards, GAE, whitening; the three
forwards are also summed on their own); update from there to the first gather of the iteration's
statistics (16 minibatch steps); other is the rest (statistics, log, next batch, gc). Each column
is the median over the repeats; the iteration's is the median of the whole iterations.
What differs from TRL 0.11.4, and what it costs each side:
  - TRL's value head shares the actor's trunk: one forward and one backward per minibatch train
    policy and value (loss = pg + vf_coef·vf, one Adam). tether trains a separate critic of the
    actor's size with its own AdamW and its own gradient clip: a second forward/backward per
    minibatch, and a critic forward in the experience. tether does more work per iteration.
  - Sampling: tether's own loop with a KV cache (ids drawn with torch.multinomial); TRL calls
    transformers' generate (DynamicCache, logits processors; min_new_tokens forbids end-of-text,
    where tether may sample that id and masks the rest of the response in the experience). Both
    sample the 64 prompts as one batch (TRL's generate is given batch_size=64; its default, 4,
    would make 16 calls).
  - The experience: tether scores the whole batch in one forward per model; TRL's step runs its
    forwards in chunks of mini_batch_size (16). tether's also computes, for its logs, the exact KL
    over the vocabulary twice (to the frozen and to the penalty's reference); TRL's step pads and
    collates lists of tensors and gathers statistics.
  - Optimizers: TRL's default Adam (not fused); tether's fused AdamW. Dropout is 0 on both sides.
    TRL 0.11.4 clips the gradient by a `filter` iterator that the first clip exhausts, so it clips
    only once; tether clips every step.
  - Attention: transformers' GPT-2 (sdpa) with GELU set to the exact erf form as in tether's model.
What differs from TRL 1.12 (read in trl/experimental/ppo/ppo_trainer.py), and what it costs:
  - The value model is separate, as tether's critic: a GPT2ForSequenceClassification with one
    label, of the actor's size (4 blocks). But one optimizer trains both (PolicyAndValueWrapper):
    loss = pg + vf_coef·vf with vf_coef 0.1, one backward, one step, one lr (tether's actor lr)
    for both; tether has two AdamWs (the critic with its own lr) and a backward and a step each.
    The same forwards and backwards per minibatch on both sides: a policy and a value trunk.
  - Gradient clipping: TRL 1.12's loop never clips (max_grad_norm is passed but unused); tether
    clips the actor's and the critic's gradients separately at every step.
  - Optimizer: transformers' default, adamw_torch_fused (eps set to tether's 1e-5, no weight
    decay, a constant lr), one fused step over both models; tether's two fused AdamWs.
  - Sampling: transformers' generate (DynamicCache; logits processors: the temperature 1 + 1e-7,
    suppress_tokens for the last id) with output_scores: the 32 processed logit tensors
    (64, 1024) are kept and stacked. stop_token is None (no stop, no truncation), and the last id
    (end-of-text and padding) is suppressed, since TRL's masks would take it for padding: always
    32 tokens (asserted). tether may sample that id and masks the rest of the response in the
    experience.
  - The experience: TRL's old log-probs come from generate's processed scores (the last id
    excluded), with no policy forward; tether forwards the actor again. TRL's ref forward runs the
    LM head at all 48 positions and keeps every hidden state (so do its value and reward forwards);
    tether's runs 47 positions and its LM head only at the 32 response ones. TRL's log-probs take a
    logsumexp per sequence in a Python loop (selective_log_softmax).
    local_rollout_forward_batch_size = 64 (its default): one generate call and one forward per model
    for the whole batch, as tether. tether's also computes, for its logs, the exact KL over the
    vocabulary twice; TRL calls gc.collect() twice per iteration (a full collection of the process,
    tether's objects too; its time is printed).
  - Both subtract tether's missing-EOS penalty (1.0, passed to TRL) from a score without
    end-of-text: every response here in TRL, almost every one in tether. Both whiten the
    advantages (TRL's with a Bessel-corrected variance); neither whitens the rewards.
  - The update: both recompute the logits (TRL divides them by 1 + 1e-7, over 48 positions) and an
    entropy over the vocabulary for the statistics; TRL's minibatches come from
    np.random.permutation, tether's from torch.randperm.
  - Dropout: 0 in the configs on both sides; TRL also sets every Dropout's p to 0. The reference:
    a frozen deep copy of the policy on both sides (TRL's create_reference_model).
  - Logging: TRL gathers its statistics each iteration (14 of them, an .item() each) and calls its
    callbacks (the printing one removed here; no reporting, saving or evaluation).
  - Attention: transformers' GPT-2 (sdpa) with GELU set to the exact erf form as in tether's model.
Left out: cuda (TRL is kept on the CPU here), the GPU memory profile.
"""
# Ctrl-C while the imports below load torch (seconds) is one line and exit 130.
if __name__ == "__main__":
    from machinery.errors import ctrl_c_while_starting
    ctrl_c_while_starting()
import contextlib, io, os, statistics, sys, tempfile, time, types, warnings

from machinery.errors import die, run_main

# The help is the docstring: printed before the imports below, which fail without trl.
if __name__ == "__main__" and ("--help" in sys.argv or "-h" in sys.argv):
    print(__doc__)
    sys.exit(0)

# trl.experimental warns on import that its APIs may change: known here.
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
# Outside the scratch venv, a one-line error, not a traceback.
try:
    import torch
    import trl, transformers
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import (GPT2Config, GPT2ForSequenceClassification, GPT2LMHeadModel,
                              PreTrainedTokenizerFast)
    if trl.__version__ == "0.11.4":
        from trl import AutoModelForCausalLMWithValueHead, PPOConfig as TRLConfig, PPOTrainer
    if trl.__version__.startswith("1.12."):
        import datasets
        from transformers import TrainerCallback
        from transformers.trainer_callback import PrinterCallback
        from trl.experimental.ppo import PPOConfig as TRL12Config, PPOTrainer as TRL12Trainer
        from trl.experimental.ppo import ppo_trainer as trl12
except ImportError as e:
    die(f"bench_trl.py runs only in a scratch venv with trl 0.11.4 (transformers 4.46.3) or trl "
        f"1.12 ({e}); its docstring has the commands")

from lab import bench
from model import GPT
from ppo import PPOConfig
from reward import ScalarModel

# The fixed β of bench.ppo_anchor (it never updates the controller).
BETA = 0.05


def hf_config(**kw):
    """transformers' GPT-2 at bench.ANCHOR's size: no dropout, exact GELU (tether's nn.GELU), tied
    embeddings."""
    a = bench.ANCHOR
    return GPT2Config(vocab_size=a.vocab_size, n_positions=a.block_size, n_embd=a.n_embd,
                      n_layer=a.n_layer, n_head=a.n_head, activation_function="gelu",
                      resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                      bos_token_id=a.vocab_size - 1, eos_token_id=a.vocab_size - 1,
                      pad_token_id=a.vocab_size - 1, **kw)


def id_tokenizer(vocab_size):
    """A fast tokenizer whose tokens are the ids themselves: PPOTrainer wants one to pad and collate
    with. The last id is end-of-text and padding, as in bench.ppo_anchor; prompts never hold it, and
    responses cannot."""
    tk = Tokenizer(models.WordLevel({f"t{i}": i for i in range(vocab_size)}, unk_token="t0"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    last = f"t{vocab_size - 1}"
    return PreTrainedTokenizerFast(tokenizer_object=tk, eos_token=last, pad_token=last)


def trl_anchor():
    """TRL's PPO iteration at the anchor: {name: function of no arguments}, to call in order
    (generate, reward, step). `split` holds step's own timing of its phases from the latest call."""
    B, TP, R = bench.B, bench.TP, bench.R
    V = bench.ANCHOR.vocab_size
    # The PPO settings are tether's, as in ppo_anchor.
    cfg = PPOConfig(ppo_epochs=bench.EPOCHS, minibatch_size=bench.MINIBATCH)
    torch.manual_seed(0)
    lm = GPT2LMHeadModel(hf_config())
    model = AutoModelForCausalLMWithValueHead.from_pretrained(lm, summary_dropout_prob=0.0)
    # The reward model's score is the one at the last (real) token.
    rm = GPT2ForSequenceClassification(hf_config(num_labels=1)).eval()
    # Random scores, as in bench.anchor_models.
    torch.nn.init.normal_(rm.score.weight, 0, 0.5)
    tcfg = TRLConfig(exp_name="bench_trl", seed=0, batch_size=B, mini_batch_size=bench.MINIBATCH,
                     gradient_accumulation_steps=1, ppo_epochs=bench.EPOCHS, early_stopping=False,
                     learning_rate=cfg.ppo_lr, adap_kl_ctrl=False, init_kl_coef=BETA,
                     kl_penalty="kl", gamma=cfg.gamma, lam=cfg.lam, cliprange=cfg.cliprange,
                     cliprange_value=cfg.cliprange_value, max_grad_norm=cfg.max_grad_norm,
                     accelerator_kwargs=dict(cpu=True))
    # With ref_model=None, the reference is a frozen deep copy.
    trainer = PPOTrainer(tcfg, model, ref_model=None, tokenizer=id_tokenizer(V))
    # B tensors of shape (TP,).
    queries = list(torch.randint(0, V - 1, (B, TP)))
    gen = dict(min_new_tokens=R, max_new_tokens=R, do_sample=True, top_k=0, top_p=1.0,
               temperature=1.0, pad_token_id=V - 1, eos_token_id=V - 1)
    state, split = {}, {}

    def generate():
        # B tensors of shape (R,).
        state["resp"] = trainer.generate(queries, batch_size=B, return_prompt=False, **gen)

    @torch.no_grad()
    def reward():
        pairs = [torch.cat([q, r]) for q, r in zip(queries, state["resp"])]
        seqs = torch.stack(pairs)  # (B, TP + R)
        # A list of B scalars.
        state["scores"] = list(rm(input_ids=seqs).logits[:, 0])

    def step():
        t = trainer.step(queries, state["resp"], state["scores"])
        split.update(forwards=t["time/ppo/forward_pass"] + t["time/ppo/compute_rewards"]
                     + t["time/ppo/compute_advantages"], optimize=t["time/ppo/optimize_step"])
    return dict(generate=generate, reward=reward, step=step), split, state, trainer


def run_once(phases):
    """Seconds of each phase of one iteration, in order."""
    out = {}
    for name, fn in phases.items():
        t = time.perf_counter()
        fn()
        out[name] = time.perf_counter() - t
    return out


def trl12_anchor(iterations, out_dir):
    """TRL 1.12's PPOTrainer at the anchor, set up for `iterations` iterations of its train()
    loop; out_dir is a scratch folder (the trainer makes its output_dir even when it saves
    nothing)."""
    B, TP, R = bench.B, bench.TP, bench.R
    V = bench.ANCHOR.vocab_size
    # The PPO settings are tether's, as in ppo_anchor.
    cfg = PPOConfig(ppo_epochs=bench.EPOCHS, minibatch_size=bench.MINIBATCH)
    torch.manual_seed(0)
    policy = GPT2LMHeadModel(hf_config())
    # The last id (end-of-text, padding) is never sampled: TRL's masks would take it for padding.
    policy.generation_config.suppress_tokens = [V - 1]
    # The critic of bench.anchor_models: a trunk of the actor's size and a scalar head.
    value = GPT2ForSequenceClassification(hf_config(num_labels=1))
    rm = GPT2ForSequenceClassification(hf_config(num_labels=1)).eval()
    # Random scores, as in bench.anchor_models.
    torch.nn.init.normal_(rm.score.weight, 0, 0.5)
    prompts = torch.randint(0, V - 1, (B, TP))
    dataset = datasets.Dataset.from_dict({"input_ids": prompts.tolist()})
    # TRL's minibatch: per_device_train_batch_size x gradient_accumulation_steps / num_mini_batches
    # = 16 prompts; its loop over micro-batches of per_device_train_batch_size then runs once per
    # minibatch: one forward, backward and step each.
    tcfg = TRL12Config(output_dir=out_dir, seed=0, total_episodes=B * iterations,
                       per_device_train_batch_size=B, gradient_accumulation_steps=1,
                       num_mini_batches=B // bench.MINIBATCH, num_ppo_epochs=bench.EPOCHS,
                       local_rollout_forward_batch_size=B, response_length=R, stop_token=None,
                       temperature=1.0, missing_eos_penalty=cfg.missing_eos_penalty,
                       kl_coef=BETA, kl_estimator="k1", whiten_rewards=False, vf_coef=0.1,
                       gamma=cfg.gamma, lam=cfg.lam, cliprange=cfg.cliprange,
                       cliprange_value=cfg.cliprange_value, max_grad_norm=cfg.max_grad_norm,
                       learning_rate=cfg.ppo_lr, lr_scheduler_type="constant", adam_epsilon=1e-5,
                       weight_decay=0.0, bf16=False, fp16=False, gradient_checkpointing=False,
                       activation_checkpointing=False, use_cpu=True, report_to="none",
                       save_strategy="no", eval_strategy="no", num_sample_generations=0,
                       disable_tqdm=True, push_to_hub=False)
    # With ref_model=None, the reference is a frozen deep copy of the policy.
    trainer = TRL12Trainer(tcfg, processing_class=id_tokenizer(V), model=policy, ref_model=None,
                           reward_model=rm, train_dataset=dataset, value_model=value)
    # No logging: the callback that prints each iteration's statistics goes.
    trainer.remove_callback(PrinterCallback)
    return trainer


def instrument12(trainer):
    """Wraps the functions TRL 1.12's train() calls by name (the module's batch_generation,
    forward, get_reward, gc.collect; the accelerator's gather_for_metrics) with timers that
    change nothing they compute. Returns the dict they fill for the running iteration:
    perf_counter times gen0, gen1 (generate), update0 (the first forward with gradients),
    update1 (the first gather of statistics); `forwards` (seconds in the experience's forwards),
    `gc` (seconds in gc.collect()) and `seqs` (the sampled prompt + response ids)."""
    marks = {"forwards": 0.0, "gc": 0.0}
    generate, forward, get_reward = trl12.batch_generation, trl12.forward, trl12.get_reward
    gather, collect = trainer.accelerator.gather_for_metrics, trl12.gc.collect

    def timed_generate(*args, **kw):
        marks["gen0"] = time.perf_counter()
        out = generate(*args, **kw)
        marks["gen1"] = time.perf_counter()
        marks["seqs"] = out[0]
        return out

    def timed_forward(*args, **kw):
        t = time.perf_counter()
        # The update's forwards are the ones with gradients; the first opens the update.
        if torch.is_grad_enabled():
            marks.setdefault("update0", t)
            return forward(*args, **kw)
        out = forward(*args, **kw)
        marks["forwards"] += time.perf_counter() - t
        return out

    def timed_get_reward(*args, **kw):
        t = time.perf_counter()
        out = get_reward(*args, **kw)
        marks["forwards"] += time.perf_counter() - t
        return out

    def timed_gather(*args, **kw):
        # The first gather of the iteration's statistics closes its update.
        marks.setdefault("update1", time.perf_counter())
        return gather(*args, **kw)

    def timed_collect(*args, **kw):
        t = time.perf_counter()
        out = collect(*args, **kw)
        marks["gc"] += time.perf_counter() - t
        return out
    trl12.batch_generation, trl12.forward = timed_generate, timed_forward
    trl12.get_reward = timed_get_reward
    trainer.accelerator.gather_for_metrics = timed_gather
    # The module's own name `gc` only: the rest of the process keeps the real one.
    trl12.gc = types.SimpleNamespace(collect=timed_collect)
    return marks


def run_trl12(trainer, ours):
    """trainer.train() once, one tether iteration (`ours`, bench.ppo_anchor's phases) run in a
    callback at the end of each TRL iteration. Returns {"tether": rows, "trl": rows}, a dict of
    seconds per iteration each, the warm-up first; and the set of (response length, whether the
    last id was sampled) over TRL's iterations."""
    marks = instrument12(trainer)
    rows, seen = {"tether": [], "trl": []}, set()
    callback = TrainerCallback()

    def on_train_begin(args, state, control, **kw):
        marks["start"] = time.perf_counter()

    def on_step_end(args, state, control, **kw):
        end = time.perf_counter()
        m = marks
        rows["trl"].append(dict(generate=m["gen1"] - m["gen0"], experience=m["update0"] - m["gen1"],
                                forwards=m["forwards"], update=m["update1"] - m["update0"],
                                gc=m["gc"], iteration=end - m["start"]))
        resp = m["seqs"][:, bench.TP:]
        seen.add((resp.size(1), bool((resp == bench.ANCHOR.vocab_size - 1).any())))
        rows["tether"].append(run_once(ours))
        marks.clear()
        marks.update(forwards=0.0, gc=0.0, start=time.perf_counter())
    # A plain callback object: the handler calls these with (args, state, control, **kw).
    callback.on_train_begin, callback.on_step_end = on_train_begin, on_step_end
    trainer.add_callback(callback)
    # train() prints a banner line; nothing else of it is wanted here.
    with contextlib.redirect_stdout(io.StringIO()):
        trainer.train()
    return rows, seen


def main_1_12(opts):
    """TRL 1.12's experimental PPOTrainer beside tether, one iteration each in turn: the table."""
    # transformers' notes on names it renames in v6 (gradient -> activation checkpointing).
    warnings.filterwarnings("ignore", category=FutureWarning, module="transformers")
    t0 = time.time()
    ours = bench.ppo_anchor("cpu")
    with tempfile.TemporaryDirectory() as scratch:
        trainer = trl12_anchor(1 + opts["repeats"], scratch)
        rows, seen = run_trl12(trainer, ours)
    assert seen == {(bench.R, False)}, f"TRL sampled (length, end-of-text) {seen}, not {bench.R}"
    # The warm-up iterations go.
    rows = {who: rs[1:] for who, rs in rows.items()}
    med = {who: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for who, rs in rows.items()}
    total = dict(tether=statistics.median(sum(r.values()) for r in rows["tether"]),
                 trl=med["trl"]["iteration"])
    ours_m, trl_m = med["tether"], med["trl"]
    trl_rest = statistics.median(r["iteration"] - r["generate"] - r["experience"] - r["update"]
                                 for r in rows["trl"])
    policy_n = sum(p.numel() for p in trainer.policy_model.parameters())
    value_n = sum(p.numel() for p in trainer.value_model.parameters())
    critic_n = sum(p.numel() for p in ScalarModel(GPT(bench.ANCHOR)).parameters())
    print(f"bench_trl.py: {torch.get_num_threads()} threads, torch {torch.__version__}, "
          f"trl {trl.__version__} (trl.experimental.ppo), transformers {transformers.__version__}; "
          f"{opts['repeats']} repeats after a warm-up ({time.time() - t0:.0f} s)")
    print(f"parameters: actor tether {GPT(bench.ANCHOR).num_params():,}, TRL {policy_n:,}; "
          f"critic tether {critic_n:,}, TRL's value model {value_n:,}\n")
    print("| s/iter, median | generate | experience (reward model, logprobs, ref, values, GAE) "
          "| update (4 epochs x 4 minibatches) | other | iteration |")
    print("|---|---|---|---|---|---|")
    print(f"| tether | {ours_m['generate']:.3f} | {ours_m['experience']:.3f} | "
          f"{ours_m['update']:.3f} (actor + critic, two AdamWs) | - | {total['tether']:.3f} |")
    print(f"| TRL {trl.__version__} PPOTrainer | {trl_m['generate']:.3f} | "
          f"{trl_m['experience']:.3f} (forwards {trl_m['forwards']:.3f}: ref, value, reward) | "
          f"{trl_m['update']:.3f} (policy + value, one AdamW) | {trl_rest:.3f} (statistics, "
          f"log, gc) | {total['trl']:.3f} |")
    print(f"| TRL / tether | {trl_m['generate'] / ours_m['generate']:.2f} | "
          f"{trl_m['experience'] / ours_m['experience']:.2f} | "
          f"{trl_m['update'] / ours_m['update']:.2f} | - | "
          f"{total['trl'] / total['tether']:.2f} |")
    print(f"\nTRL's gc.collect(): {trl_m['gc']:.3f} s per iteration (one call in the experience, "
          "one in other)")
    print(f"tether's speed / TRL {trl.__version__}'s (TRL s/iter ÷ tether s/iter): "
          f"{total['trl'] / total['tether']:.2f}x")
    return dict(tether=ours_m, trl=trl_m, total=total)


def parse(argv):
    opts = dict(threads=0, repeats=5)
    for a in argv:
        name, _, value = a[2:].partition("=")
        if not a.startswith("--") or name not in opts:
            die(f"unknown flag {a!r} (bench_trl.py takes --threads, --repeats)")
        try:
            opts[name] = int(value)
        except ValueError:
            die(f"bad value for --{name}: {value!r}")
    if opts["threads"] < 0 or opts["repeats"] < 1:
        die("--threads must be >= 0 and --repeats >= 1")
    if (trl.__version__, transformers.__version__) == ("0.11.4", "4.46.3"):
        return opts
    if trl.__version__.startswith("1.12."):
        return opts
    die(f"bench_trl.py is written for trl 0.11.4 with transformers 4.46.3, or trl 1.12; this venv "
        f"has trl {trl.__version__} and transformers {transformers.__version__}")


def main_0_11(opts):
    """TRL 0.11.4's classic PPOTrainer beside tether, iteration by iteration: the table."""
    t0 = time.time()
    ours = bench.ppo_anchor("cpu")
    theirs, split, state, trainer = trl_anchor()
    # A warm-up, one iteration each.
    run_once(ours), run_once(theirs)
    lengths = {len(r) for r in state["resp"]}
    assert lengths == {bench.R}, f"TRL sampled responses of {lengths} tokens, not {bench.R}"
    trl_params = sum(p.numel() for p in trainer.model.pretrained_model.parameters())
    n_params = (trl_params, GPT(bench.ANCHOR).num_params())
    rows = {"tether": [], "trl": []}
    for i in range(opts["repeats"]):
        order = [("tether", ours), ("trl", theirs)][::1 if i % 2 == 0 else -1]
        for who, phases in order:
            t = run_once(phases)
            if who == "trl":
                t.update(split)
            rows[who].append(t)
    med = {who: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for who, rs in rows.items()}
    # An iteration's seconds: its phases, less the parts of TRL's step timed inside it.
    total = {}
    for who, rs in rows.items():
        sums = [sum(v for k, v in r.items() if k not in ("forwards", "optimize")) for r in rs]
        total[who] = statistics.median(sums)
    ours_m, trl_m = med["tether"], med["trl"]
    trl_exp = trl_m["reward"] + trl_m["forwards"]
    trl_rest = trl_m["step"] - trl_m["forwards"] - trl_m["optimize"]
    print(f"bench_trl.py: {torch.get_num_threads()} threads, torch {torch.__version__}, "
          f"trl {trl.__version__}, transformers {transformers.__version__}; "
          f"{opts['repeats']} repeats after a warm-up ({time.time() - t0:.0f} s)")
    print(f"actor parameters: tether {n_params[1]:,}, TRL {n_params[0]:,} (+ a value head of "
          f"{bench.ANCHOR.n_embd + 1} on the shared trunk; tether's critic is a second trunk)\n")
    print("| s/iter, median | generate | experience (reward model, logprobs, ref, values, GAE) "
          "| update (4 epochs x 4 minibatches) | other | iteration |")
    print("|---|---|---|---|---|---|")
    print(f"| tether | {ours_m['generate']:.3f} | {ours_m['experience']:.3f} | "
          f"{ours_m['update']:.3f} (actor + critic) | - | {total['tether']:.3f} |")
    print(f"| TRL 0.11.4 PPOTrainer | {trl_m['generate']:.3f} | {trl_exp:.3f} "
          f"(reward {trl_m['reward']:.3f} + step's forwards {trl_m['forwards']:.3f}) | "
          f"{trl_m['optimize']:.3f} (shared trunk) | {trl_rest:.3f} (step's collation, stats) | "
          f"{total['trl']:.3f} |")
    print(f"| TRL / tether | {trl_m['generate'] / ours_m['generate']:.2f} | "
          f"{trl_exp / ours_m['experience']:.2f} | "
          f"{trl_m['optimize'] / ours_m['update']:.2f} | - | "
          f"{total['trl'] / total['tether']:.2f} |")
    return dict(tether=ours_m, trl=trl_m, total=total)


def main(argv):
    opts = parse(argv)
    if opts["threads"]:
        torch.set_num_threads(opts["threads"])
    # Silence PPOTrainer's deprecation and no-dataset notes.
    warnings.filterwarnings("ignore", module="trl")
    transformers.logging.set_verbosity_error()
    if trl.__version__ == "0.11.4":
        return main_0_11(opts)
    return main_1_12(opts)


if __name__ == "__main__":
    run_main(main, sys.argv[1:])
