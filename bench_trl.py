"""tether's PPO iteration beside TRL's classic PPOTrainer, alternately in one process: s/iteration.

It runs ONLY in a scratch virtual environment outside the project. tether never imports this file,
and transformers and trl are never dependencies of tether (its design card forbids them; this file
measures another library):
    # reuses the system's torch 2.13.0, numpy, tiktoken
    python -m venv --system-site-packages /work/trl_venv
    # pip must never fetch another torch (a CUDA one: GBs)
    echo torch==2.13.0 > /tmp/trl_constraints.txt
    /work/trl_venv/bin/pip install -c /tmp/trl_constraints.txt trl==0.11.4 transformers==4.46.3 rich
    /work/trl_venv/bin/python bench_trl.py --threads=2 --repeats=5     # from the repository root
(rich: trl 0.11.4 imports it without declaring it.) --threads sets torch's thread count for both
sides (0: torch's default); --repeats the timed iterations of each side after one warm-up iteration
of each.
Both sides run the anchor of bench.py (ppo_anchor): GPT-2 architecture, 4 layers, 4 heads, 128
channels, vocabulary 1024, 64 positions; 64 prompts of 16 random tokens; exactly 32 tokens sampled
per prompt (temperature 1, no top-k, no top-p, no early stop); 4 epochs x 4 minibatches of 16; a
frozen reference; a fixed β = 0.05 with the k1 estimator in the reward; a random reward model of the
anchor's size scored inside the iteration. The repeats alternate the order (tether first, then TRL
first) so that drift in the machine hits both; each phase's median is printed, and the iteration's
is the median of the per-iteration sums (so the phases need not add up to it exactly).
What differs, and what it costs each side:
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
Left out: cuda (TRL is kept on the CPU here), the GPU memory profile, TRL's newer trainers (PPOv2 /
PPOTrainer >= 0.12).
"""
import statistics, sys, time, warnings

from errors import die

# The help is the docstring: printed before the imports below, which fail without trl.
if __name__ == "__main__" and ("--help" in sys.argv or "-h" in sys.argv):
    print(__doc__)
    sys.exit(0)

# Outside the scratch venv, a one-line error, not a traceback.
try:
    import torch
    import trl, transformers
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import (GPT2Config, GPT2ForSequenceClassification, GPT2LMHeadModel,
                              PreTrainedTokenizerFast)
    from trl import AutoModelForCausalLMWithValueHead, PPOConfig as TRLConfig, PPOTrainer
except ImportError as e:
    die(f"bench_trl.py runs only in a scratch venv with trl 0.11.4 and transformers 4.46.3 "
        f"({e}); its docstring has the commands")

import bench
from model import GPT
from ppo import PPOConfig

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
    if (trl.__version__, transformers.__version__) != ("0.11.4", "4.46.3"):
        die(f"bench_trl.py is written for trl 0.11.4 and transformers 4.46.3, this venv has "
            f"{trl.__version__} and {transformers.__version__}")
    return opts


def main(argv):
    opts = parse(argv)
    if opts["threads"]:
        torch.set_num_threads(opts["threads"])
    # Silence PPOTrainer's deprecation and no-dataset notes.
    warnings.filterwarnings("ignore", module="trl")
    transformers.logging.set_verbosity_error()
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


if __name__ == "__main__":
    main(sys.argv[1:])
