"""Where the time goes, measured in one process on this machine: a table, and out/bench.json.

    # 1 to 4 minutes on 2 cores (bf16 is slow where the CPU emulates it)
    python -m lab.bench
    # any thread count; --device=cuda where there is one
    python -m lab.bench --threads=1
It measures: the machine's fp32 and bf16 matmul throughput (the ceiling), pretraining tokens/s on
the default model, rollout tokens/s with and without the KV cache, and one PPO iteration at a fixed
anchor config (4 layers, 4 heads, 128 channels, vocabulary 1024; 64 prompts of 16 tokens, 32 new
tokens, sampling never stops early; 4 epochs x 4 minibatches; a random reward model) split into
generate / experience / update, through the code train.py runs.
Pretraining and the PPO iteration run in fp32 and in bf16 (train.py's --dtype=bf16 path: its
`autocast`, each weight cast once per step), one after the other; the table says what --dtype=auto
picks here, and why.
(The last id stands for end-of-text in the experience, so a response that happens to sample it is
masked there.)
The update's FLOPs are counted (forward 2 per multiply-add, backward twice the forward) and divided
by its time and by the measured matmul rate. Every timing is the median of a few repeats after a
warm-up. The same update on responses of lengths uniform over 4..32 (seed 0) with
--minibatch_order=shuffle and length: time, padded positions.
    # every --ref kind: bytes held and the KL to the full ref at step 0
    python -m lab.bench --refs --out_dir=out
--refs measures the reference options (ref.py) on a finished run's models instead (any train.py flag
passes through, checked by train.parse): the table is printed, nothing is written.
    # --bar alone: that grid
    python -m lab.bench --bar='adamw:4e-3:600,700,900;muon:0.02:400,500,600' [train.py flags]
--bar answers "how many pretraining tokens does each optimizer need to reach the quality bar" (BAR:
validation loss <= 1.235 and >= 90 % of the pretrain stage's samples well-formed). The grid is
`;`-separated items OPT:LRS:ITERS, each a comma list, every lr x every max_iters: OPT is a
--optimizer, the lr is --lr for adamw and --muon_lr for muon (whose AdamW part keeps --lr). Each run
is the real pretrain stage (train.run_stages up to pretrain, flags through train.parse) in its own
folder out/bench_bar/OPT_lrLR_itersN, with the world copied from --out_dir (never regenerated): a
shorter max_iters shortens the cosine too, and a run is judged at its end. One row per run
(tokens = max_iters x batch_size x block_size; seconds: its pretraining time), and
out/bench_bar.json. A finished run is reused (its seconds are from when it ran) and a killed one
resumes; --fresh redoes every run of the grid.
Left out: memory profiles, torch.compile timings,
multi-GPU.
"""
# Ctrl-C while the imports below load torch (seconds) is one line and exit 130.
if __name__ == "__main__":
    from machinery.errors import ctrl_c_while_starting
    ctrl_c_while_starting()
import dataclasses, math, os, shutil, statistics, sys, time
import torch

import data, tokenizer, train
from kl import KLConfig
from model import GPT, GPTConfig
from ppo import PPOConfig, make_experience, minibatches, ppo_update
from ref import Reference
from reward import ScalarModel
from machinery import provenance, records, store
from pipeline import stages
from machinery.config import check_once, override
from machinery.errors import RunError, die, run_main
from options.evaluate import step0_kl
from machinery.optim import StepGuard, adamw, make_optimizers
from machinery.precision import auto_dtype, autocast, cast_once
from ref import load_checkpoint
from options.cheap_ref import KINDS, make_reference, memory_bytes

ANCHOR = GPTConfig(block_size=64, vocab_size=1024, n_layer=4, n_head=4, n_embd=128)
B, TP, R, EPOCHS, MINIBATCH = 64, 16, 32, 4, 16


def sync(device):
    """Wait until the device has done what was queued: CUDA runs kernels after the call returns,
    so a clock read before this reads the launch, not the work. Nothing on the CPU."""
    if str(device).startswith("cuda"):
        torch.cuda.synchronize(device)


def timed(fn, repeats, device="cpu"):
    """Median seconds of fn() over `repeats` calls, after one warm-up call; the device is synced
    before each clock is read."""
    fn()
    times = []
    for _ in range(repeats):
        sync(device)
        t = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def matmul_flops(dtype, device, n=1024, repeats=5):
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    return 2 * n ** 3 / timed(lambda: a @ b, repeats, device)


def forward_flops_per_token(cfg, context, lm_head=True):
    """Multiply-adds x 2 for one token through the model: the blocks' matrices, attention over
    `context` tokens, and (for the actor) the output layer."""
    d = cfg.n_embd
    # Per block: qkv, proj and mlp (12 d²), then QKᵀ and AV over the context.
    blocks = cfg.n_layer * (2 * 12 * d * d + 2 * 2 * context * d)
    return blocks + (2 * d * cfg.vocab_size if lm_head else 2 * d)


def anchor_models(device):
    torch.manual_seed(0)
    actor = GPT(ANCHOR).to(device).eval()
    critic, rm = ScalarModel(GPT(ANCHOR)).to(device), ScalarModel(GPT(ANCHOR)).to(device)
    # The reward model gives random scores.
    torch.nn.init.normal_(rm.head.weight, 0, 0.5)
    return actor, Reference(actor), critic.eval(), rm.eval()


def ppo_anchor(device, dtype="fp32"):
    """One PPO iteration at the anchor config as its three phases, through ppo.make_experience and
    ppo.ppo_update, in fp32 or bf16: {name: function of no arguments}, to call in order (generate,
    experience, update). bench_trl.py runs them too."""
    actor, ref, critic, rm = anchor_models(device)
    q = torch.randint(0, ANCHOR.vocab_size - 1, (B, TP), device=device)
    qm = torch.ones(B, TP, dtype=torch.bool, device=device)
    # The last id stands for end-of-text; generation ignores it: always R tokens.
    eos = ANCHOR.vocab_size - 1
    cfg, kc = PPOConfig(ppo_epochs=EPOCHS, minibatch_size=MINIBATCH), KLConfig()
    opts = make_optimizers(actor, critic, cfg)
    guards = (StepGuard("actor"), StepGuard("critic"))
    state = {}

    def generate():
        # As train.py holds it around a stage, and as ppo.rollout casts each weight once.
        with autocast(device, dtype), cast_once(actor):
            state["resp"] = actor.generate(q, R, 1.0, eos=None, mask=qm)[0]

    def experience():
        with autocast(device, dtype):
            state["batch"] = make_experience(actor, critic, ref, ref, rm, q, qm, state["resp"],
                                             eos, 0.05, kc, cfg, 1.0)[0]

    def update():
        with autocast(device, dtype):
            ppo_update(actor, critic, opts, guards, state["batch"], cfg, 1.0, 0.05, kc)
    return dict(generate=generate, experience=experience, update=update)


def bench_ppo(device, repeats, dtype="fp32"):
    """The anchor's PPO iteration, each phase timed on its own (ppo_anchor), and the update's
    FLOPs."""
    t = {name: timed(fn, repeats, device) for name, fn in ppo_anchor(device, dtype).items()}
    # One forward over prompt + response.
    tokens = B * (TP + R - 1)
    # The mean attention span.
    ctx = (TP + R) / 2
    actor_flops = forward_flops_per_token(ANCHOR, ctx)
    critic_flops = forward_flops_per_token(ANCHOR, ctx, lm_head=False)
    # Per token, the actor and the critic, forward + backward (twice the forward).
    per_token = 3 * (actor_flops + critic_flops)
    t["update_flops"] = EPOCHS * tokens * per_token
    return t


def bench_minibatch_order(device, repeats):
    """ppo_update at the anchor config on responses whose end-of-text falls at a length uniform over
    4..R (seed 0), with --minibatch_order=shuffle and length: seconds, and the fraction of the
    response positions the update forwards (each minibatch cut to its longest response) that are
    padding, over EPOCHS epochs (seed 0)."""
    actor, ref, critic, rm = anchor_models(device)
    g, eos = torch.Generator().manual_seed(0), ANCHOR.vocab_size - 1
    # Ids below eos: no eos in the prompts or the responses yet.
    q = torch.randint(0, eos, (B, TP), generator=g)
    resp = torch.randint(0, eos, (B, R), generator=g)
    lengths = torch.randint(4, R + 1, (B,), generator=g)  # (B,)
    # End-of-text at lengths - 1 and on.
    resp[torch.arange(R) >= lengths[:, None] - 1] = eos
    q, resp, qm = q.to(device), resp.to(device), torch.ones(B, TP, dtype=torch.bool, device=device)
    batch = make_experience(actor, critic, ref, ref, rm, q, qm, resp, eos, 0.05, KLConfig(),
                            PPOConfig(), 1.0)[0]
    out = {}
    for order in ("shuffle", "length"):
        cfg = PPOConfig(ppo_epochs=EPOCHS, minibatch_size=MINIBATCH, minibatch_order=order)
        opts = make_optimizers(actor, critic, cfg)
        guards = (StepGuard("actor"), StepGuard("critic"))

        def update():
            return ppo_update(actor, critic, opts, guards, batch, cfg, 1.0, 0.05, KLConfig())
        out[f"update_{order}_s"] = timed(update, repeats, device)
        torch.manual_seed(0)
        pieces = [p for _ in range(EPOCHS) for p in minibatches(lengths, MINIBATCH, order)]
        # The real response positions, over EPOCHS epochs, and the positions the update forwards.
        real = EPOCHS * lengths.sum().item()
        forwarded = sum(len(p) * lengths[p].max().item() for p in pieces)
        out[f"padded_{order}"] = 1 - real / forwarded
    return out


def bench_pretrain(device, repeats, dtype="fp32", batch=32):
    """Training tokens/s of the default model, fp32 or with bf16 autocast (train.py's --dtype)."""
    cfg = GPTConfig()
    torch.manual_seed(0)
    model = GPT(cfg).to(device).train()
    opt = adamw(model.parameters(), 1e-4)
    x = torch.randint(0, cfg.vocab_size, (batch, cfg.block_size), device=device)

    def step():
        with autocast(device, dtype):
            _, loss = model(x, x)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return batch * cfg.block_size / timed(step, repeats, device)


def bench_rollout(device, repeats):
    """Tokens/s sampling B x R tokens after TP-token prompts, with the KV cache and with a full
    forward per token."""
    actor, _, _, _ = anchor_models(device)
    q = torch.randint(0, ANCHOR.vocab_size, (B, TP), device=device)

    @torch.no_grad()
    def no_cache():
        idx = q
        for _ in range(R):
            logits = actor(idx)[0][:, -1]
            idx = torch.cat([idx, torch.multinomial(torch.softmax(logits, -1), 1)], 1)
    cached = timed(lambda: actor.generate(q, R, 1.0), repeats, device)
    return B * R / cached, B * R / timed(no_cache, repeats, device)


def bench_refs(argv):
    """The KL-at-init table: for every --ref kind, the bytes the reference holds, the trainable
    actor state, and the exact KL from the full reference at step 0, on the finished run in
    --out_dir (train.py's flags)."""
    cfg = train.parse(argv)
    base, run = cfg.run.out_dir, cfg.run
    n_layer = stages.load_models(base, run.device)[1].model.config.n_layer
    enc = tokenizer.load_tokenizer(base, cfg.world.tokenizer)
    heldout = data.load_prompts(base)["heldout"]
    print("| ref | bytes held for the reference | trainable actor state, bytes "
          "| KL to full ref at step 0 |")
    print("|---|---|---|---|")
    for kind in KINDS[:-1] + [f"shared_{n}" for n in range(1, n_layer)]:
        pre, _, rm = stages.load_models(base, run.device)
        ref_model, _ = load_checkpoint(os.path.join(base, "ref.pt"), run.device)
        actor, ref = make_reference(pre, ref_model, dataclasses.replace(cfg.ref, ref=kind))
        mem = memory_bytes(actor, ref)
        stages.seed_everything(run.seed + 1)
        pretrained = load_checkpoint(os.path.join(base, "pretrain.pt"), run.device)[0]
        kl = step0_kl(pretrained, ref, enc, heldout, run, rm, cfg.eval.n_eval)
        print(f"| {kind} | {mem['ref']:,} | {mem['trainable']:,} | {kl:.4f} |", flush=True)


# The quality bar (the default run: 1.227 and 94.5 %).
BAR = dict(val_loss=1.235, wellformed_rate=0.90)
GRID = "adamw:4e-3:600,700,900;muon:0.02:400,500,600"
LR_FLAG = dict(adamw="lr", muon="muon_lr")


def parse_grid(text):
    """'OPT:LRS:ITERS;...' -> [(optimizer, lr, max_iters)], every lr x every max_iters of each
    item."""
    cells = []
    for item in text.split(";"):
        opt, _, rest = item.partition(":")
        lrs, _, iters = rest.partition(":")
        try:
            lrs, iters = [float(x) for x in lrs.split(",")], [int(x) for x in iters.split(",")]
        except ValueError:
            lrs = iters = []
        good_lrs = all(x > 0 and math.isfinite(x) for x in lrs)
        good_iters = all(n > 0 for n in iters)
        if opt not in LR_FLAG or not good_lrs or not good_iters or not lrs or not iters:
            die(f"bad grid item {item!r} for --bar (OPT:LRS:ITERS, e.g. muon:0.02:400,500; "
                "OPT adamw or muon)")
        cells += [(opt, lr, n) for lr in lrs for n in iters]
    return cells


def bench_bar(grid, argv):
    """The pretrain stage for each (optimizer, lr, max_iters) of the grid, each in its own folder
    with --out_dir's world; a table of tokens against quality, and --out_dir/bench_bar.json."""
    cfg = train.parse(argv)
    if any(a.split("=")[0] in ("--optimizer", "--max_iters", "--stage") for a in argv):
        die("bench.py --bar sets --optimizer, --max_iters and the lr of each run from the grid; "
            "--stage is pretrain")
    base, fresh = cfg.run.out_dir, cfg.run.fresh
    runs = []
    # Every run's flags are checked before any work.
    for opt, lr, n in parse_grid(grid):
        d = os.path.join(base, "bench_bar", f"{opt}_lr{lr:g}_iters{n}")
        if any(c.run.out_dir == d for *_, c in runs):
            die(f"--bar: two grid points would share {d} (the same point, or lrs that print alike)")
        c = train.parse(override(argv, [f"--optimizer={opt}", f"--{LR_FLAG[opt]}={lr}",
                                        f"--max_iters={n}", f"--out_dir={d}"]))
        # With --fresh, the runs are redone, never the world.
        c.run.fresh = False
        runs.append((opt, lr, n, c))
    world = records.load_records(base).get("world")
    world_stamp = stages.stamp(cfg, stages.BY_NAME["world"])
    diff = world and (records.first_difference(world, world_stamp)
                      or records.code_difference(world, world_stamp))
    if not world:
        why = "has none"
    elif diff:
        why = f"was made with {diff}"
    elif records.outputs_intact(base, world):
        why = None
    else:
        why = "has changed since it was made"
    if why:
        die(f"bench.py --bar copies the world from --out_dir={base}, which {why}: run "
            "python train.py --stage=world with these flags first")
    if cfg.run.threads:
        torch.set_num_threads(cfg.run.threads)
    rows = []
    for opt, lr, n, c in runs:
        d = c.run.out_dir
        os.makedirs(d, exist_ok=True)
        try:
            with store.Lock(d):
                # The folder is new, or holds another world since.
                if records.load_records(d).get("world") != world:
                    for name in stages.files(cfg, stages.WORLD):
                        shutil.copy(os.path.join(base, name), os.path.join(d, name))
                    store.save_json(records.records_path(d), dict(world=world))
                done = records.load_records(d).get("pretrain")
                made = stages.stamp(c, stages.BY_NAME["pretrain"])
                if fresh or not done or not records.outputs_intact(d, done) or \
                        records.first_difference(done, made) or records.code_difference(done, made):
                    # The stage is (re)done; a killed run resumes its pretrain_ckpt.pt.
                    c.run.stage = "pretrain"
                    if fresh:
                        store.remove(os.path.join(d, "pretrain_ckpt.pt"))
                train.run_stages(c, upto="pretrain")
        except KeyboardInterrupt:
            die("interrupted; finished runs are kept, and the same command goes on from there", 130)
        s = store.load_json(os.path.join(d, "pretrain.json"))
        tokens = n * c.pretrain.batch_size * c.gpt.block_size
        meets_bar = (s["val_loss"] <= BAR["val_loss"]
                     and s["wellformed_rate"] >= BAR["wellformed_rate"])
        rows.append(dict(optimizer=opt, lr=lr, max_iters=n, tokens=tokens,
                         val_loss=s["val_loss"], wellformed_rate=s["wellformed_rate"],
                         gold_mean=s["gold_mean"], seconds=s["seconds"], out_dir=d,
                         meets_bar=meets_bar))
    # Per optimizer, the fewest tokens (then seconds, then lr) of a run that meets the bar.
    fewest = {}
    for o in dict.fromkeys(r["optimizer"] for r in rows):
        met = [r for r in rows if r["optimizer"] == o and r["meets_bar"]]
        fewest[o] = min(([r["tokens"], r["seconds"], r["lr"]] for r in met), default=None)
    print(f"\nthe bar: validation loss <= {BAR['val_loss']} and well-formed >= "
          f"{BAR['wellformed_rate']:.0%} of {cfg.pretrain.n_samples} samples\n")
    print("| optimizer | lr | max_iters | tokens | val loss | well-formed | gold | seconds "
          "| meets bar |\n|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['optimizer']} | {r['lr']:g} | {r['max_iters']} | {r['tokens']:,} | "
              f"{r['val_loss']:.3f} | {r['wellformed_rate']:.1%} | {r['gold_mean']:+.2f} | "
              f"{r['seconds']:.0f} | {'yes' if r['meets_bar'] else 'no'} |")
    for o, f in fewest.items():
        best = f"{f[0]:,} tokens at lr {f[2]:g} ({f[1]:.0f} s)" if f else "no run meets the bar"
        print(f"{o}: " + best)
    fewest_tokens = {o: f and f[0] for o, f in fewest.items()}
    # The runs' seconds summed: runs reused from an earlier command count their own time.
    made = provenance.stamp(sum(r["seconds"] for r in rows), device=cfg.run.device)
    print(provenance.line(made, "the runs' seconds summed"))
    res = dict(bar=BAR, grid=grid, flags=argv, runs=rows, fewest_tokens=fewest_tokens,
               made_by=made)
    store.save_json(os.path.join(base, "bench_bar.json"), res)
    return res


def main(argv):
    # The docstring says every mode and flag.
    if "--help" in argv or "-h" in argv:
        print(__doc__)
        return
    check_once(argv)
    bar = [a for a in argv if a == "--bar" or a.startswith("--bar=")]
    try:
        if "--refs" in argv:
            return bench_refs([a for a in argv if a != "--refs"])
        if bar:
            return bench_bar(bar[-1].partition("=")[2] or GRID, [a for a in argv if a not in bar])
    except RunError as e:
        die(str(e), e.code)
    opts = dict(threads=0, device="cpu", repeats=3, out_dir="out")
    for a in argv:
        name, _, value = a[2:].partition("=")
        if not a.startswith("--") or name not in opts:
            die(f"unknown flag {a!r} (bench.py takes {', '.join('--' + k for k in opts)}, "
                "or --refs, --bar)")
        try:
            opts[name] = type(opts[name])(value)
        except ValueError:
            die(f"bad value for --{name}: {value!r}")
    no_cuda = opts["device"] == "cuda" and not torch.cuda.is_available()
    if opts["device"] not in ("cpu", "cuda") or no_cuda:
        die(f"bad value for --device: {opts['device']!r} (cpu, or cuda where torch sees one)")
    if opts["threads"] < 0 or opts["repeats"] < 1:
        die("--threads must be >= 0 and --repeats >= 1")
    # The run writes bench.json at the end: refuse a bad --out_dir now.
    if store.not_a_folder(opts["out_dir"]):
        die(f"--out_dir={opts['out_dir']} {store.not_a_folder(opts['out_dir'])}")
    if opts["threads"]:
        torch.set_num_threads(opts["threads"])
    dev, n = opts["device"], opts["repeats"]
    t0 = time.time()
    res = dict(device=dev, threads=torch.get_num_threads(), torch=torch.__version__,
               matmul_fp32=matmul_flops(torch.float32, dev),
               matmul_bf16=matmul_flops(torch.bfloat16, dev),
               pretrain_tokens_per_s=bench_pretrain(dev, n),
               pretrain_bf16_tokens_per_s=bench_pretrain(dev, n, "bf16"))
    kv_cache, no_cache = bench_rollout(dev, n)
    res["rollout_tokens_per_s_kv_cache"] = kv_cache
    res["rollout_tokens_per_s_no_cache"] = no_cache
    ppo, ppo_bf16 = bench_ppo(dev, n), bench_ppo(dev, n, "bf16")
    res.update({f"ppo_{k}_s": v for k, v in ppo.items() if k != "update_flops"})
    res.update({f"ppo_bf16_{k}_s": v for k, v in ppo_bf16.items() if k != "update_flops"})
    res["ppo_iteration_s"] = ppo["generate"] + ppo["experience"] + ppo["update"]
    res["ppo_bf16_iteration_s"] = ppo_bf16["generate"] + ppo_bf16["experience"] + ppo_bf16["update"]
    res["dtype_auto"], res["dtype_auto_why"] = auto_dtype(dev)
    res["ppo_update_gflop"] = ppo["update_flops"] / 1e9
    res["ppo_update_fraction_of_matmul"] = ppo["update_flops"] / ppo["update"] / res["matmul_fp32"]
    res.update({f"ppo_varlen_{k}": v for k, v in bench_minibatch_order(dev, n).items()})
    res["seconds"] = time.time() - t0
    rows = [("matmul fp32, 1024³", f"{res['matmul_fp32'] / 1e9:.0f} GFLOP/s"),
            ("matmul bf16, 1024³", f"{res['matmul_bf16'] / 1e9:.0f} GFLOP/s"),
            ("pretraining (default model, 32x128)",
             f"{res['pretrain_tokens_per_s'] / 1e3:.1f} k tokens/s"),
            ("pretraining, bf16 autocast (--dtype=bf16)",
             f"{res['pretrain_bf16_tokens_per_s'] / 1e3:.1f} k tokens/s"),
            ("rollout with KV cache (anchor)",
             f"{res['rollout_tokens_per_s_kv_cache'] / 1e3:.1f} k tokens/s"),
            ("rollout, full forward per token",
             f"{res['rollout_tokens_per_s_no_cache'] / 1e3:.1f} k tokens/s"),
            ("PPO iteration (anchor)", f"{res['ppo_iteration_s']:.3f} s"),
            ("  generate", f"{res['ppo_generate_s']:.3f} s"),
            ("  experience", f"{res['ppo_experience_s']:.3f} s"),
            ("  update", f"{res['ppo_update_s']:.3f} s ({res['ppo_update_gflop']:.0f} GFLOP, "
                         f"{res['ppo_update_fraction_of_matmul']:.0%} of fp32 matmul)"),
            ("PPO update, lengths 4..32: shuffle / length",
             f"{res['ppo_varlen_update_shuffle_s']:.3f} s / "
             f"{res['ppo_varlen_update_length_s']:.3f} s "
             f"(padding {res['ppo_varlen_padded_shuffle']:.0%} / "
             f"{res['ppo_varlen_padded_length']:.0%})"),
            ("PPO iteration, bf16 autocast (--dtype=bf16)", f"{res['ppo_bf16_iteration_s']:.3f} s"),
            *[(f"  {k}", f"{res[f'ppo_bf16_{k}_s']:.3f} s")
              for k in ("generate", "experience", "update")],
            ("--dtype=auto here", f"{res['dtype_auto']}: {res['dtype_auto_why']}")]
    print(f"bench.py on {dev}, {res['threads']} threads, torch {res['torch']} "
          f"({res['seconds']:.0f} s)\n")
    print("| what | measured |\n|---|---|\n" + "\n".join(f"| {a} | {b} |" for a, b in rows))
    res["made_by"] = provenance.stamp(res["seconds"], res["threads"], dev)
    print("\n" + provenance.line(res["made_by"]))
    os.makedirs(opts["out_dir"], exist_ok=True)
    store.save_json(os.path.join(opts["out_dir"], "bench.json"), res)
    return res


if __name__ == "__main__":
    run_main(main, sys.argv[1:])
