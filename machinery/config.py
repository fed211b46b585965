"""Flags: every config field is a `--name=value` flag, checked before any stage starts.

    python train.py --help           # every field with its default, its rule and what it does
    python train.py --preset=smoke   # a preset sets many fields at once; flags after it still win
    python train.py --config=out/config.json --out_dir=again   # a run again, from its own record

Each config dataclass lives beside the code it configures (GPTConfig in model.py, RewardConfig in
reward.py, KLConfig in kl.py, PPOConfig in ppo.py, PretrainConfig and EvalConfig in machinery/,
RefConfig, AnchorConfig and RollbackConfig in options/, InspectConfig in lab/inspect_page.py); the
run and world ones live here. A field is declared with
`arg(default, rule, help, choices)`, so its range sits next to it. Bad input is one line on stderr
and exit code 2, before anything is written (`die`); failures found later are `RunError`s, printed
the same way by train.py (both in errors.py). Checks that need another file (dist, cheap_ref,
anchors, rollback, kl, grpo, tokenizer) run in train.py's `parse`, which also resolves
--dtype=auto (precision.auto_dtype).
Left out: config files of other formats than a run's config.json, environment variables, nested or
list-valued flags.
"""
import dataclasses, difflib, json, math, os, sys
from dataclasses import dataclass
from types import SimpleNamespace

from machinery.errors import RunError, die

RULES = {">0": lambda v: v > 0, ">=0": lambda v: v >= 0, "[0,1]": lambda v: 0 <= v <= 1,
         "[0,1)": lambda v: 0 <= v < 1, "(0,1)": lambda v: 0 < v < 1,
         "(0,1]": lambda v: 0 < v <= 1, "[0,2^31)": lambda v: 0 <= v < 2 ** 31,
         # The temperature's rule: in fp32, logits/T errs by |logit|/T·6e-8, under 1e-3 nats here.
         ">=0.01": lambda v: v >= 0.01,
         # Evaluation sizes: the samples' texts and verdicts are held in memory (about 1 kB each),
         # so 100,000 is about 100 MB; far more would die of MemoryError after the training they
         # evaluate.
         "[1,100000]": lambda v: 1 <= v <= 100000}


def arg(default, rule=None, help="", choices=None):
    """A config field with its rule (a key of RULES), one line of help and, for strings, its
    choices."""
    return dataclasses.field(default=default, metadata=dict(rule=rule, help=help, choices=choices))


@dataclass
class RunConfig:
    out_dir: str = arg("out", help="folder for every stage's outputs")
    stage: str = arg("all", help="every stage not done yet, or one stage (stages.STAGES)",
                     choices=["all", "world", "pretrain", "reference", "preferences", "reward",
                              "ppo", "report", "dpo"])
    fresh: bool = arg(False, help="delete every output in out_dir and redo every stage")
    redo_from: str = arg("", help="redo this stage and every later one, the report included (a "
                         "finished run with a flag changed, in one command); the earlier ones are "
                         "kept as usual",
                         choices=["", "world", "pretrain", "reference", "preferences", "reward",
                                  "ppo", "report"])
    preset: str = arg("default", help="default, smoke (seconds; the tests use it), gpu (one GPU, "
                      "about 10 minutes)", choices=["default", "smoke", "gpu"])
    seed: int = arg(1337, "[0,2^31)", "numpy takes seeds in [0, 2^32); the stages add small "
                    "offsets (+1, +2, lab/ablate.py's seed + k)")
    device: str = arg("auto", help="auto (cuda when available), cpu, cuda or mps (Apple's GPU; "
                      "untested)", choices=["auto", "cpu", "cuda", "mps"])
    threads: int = arg(0, ">=0", "torch CPU threads; 0 = torch's default")
    deterministic: bool = arg(False, help="PyTorch's deterministic algorithms "
                              "(torch.use_deterministic_algorithms; on CUDA also cuDNN's and "
                              "cuBLAS's): one seed, one set of numbers on a GPU too, at some cost "
                              "in speed; the CPU's kernels are deterministic already")
    dtype: str = arg("fp32", help="precision of every forward: fp32, bf16 autocast (fp32 weights "
                     "and optimizer, each weight cast once per step; TF32 for what stays fp32 on "
                     "CUDA), or auto: bf16 where the device multiplies bf16 natively, else fp32 "
                     "(precision.auto_dtype, applied in train.parse)",
                     choices=["fp32", "bf16", "auto"])
    temperature: float = arg(1.0, ">=0.01", "one temperature everywhere: sampling, old, "
                             "reference, training log-probs; below 0.01 sampling is greedy "
                             "anyway and fp32 log-probs lose precision")
    response_length: int = arg(64, ">0", "most response tokens sampled; prompt + response must "
                               "fit block_size")
    log_to: str = arg("none", help="tensorboard: every row of each stage's JSONL log also as "
                      "TensorBoard scalars, as it is written, under out_dir/tb/STAGE/ "
                      "(machinery/tblog.py; tensorboard --logdir out/tb); changes no number, so "
                      "no stage is redone for it", choices=["none", "tensorboard"])
    plots: bool = arg(True, help="each stage's figure (pretrain.png, reward.png, ppo.png, "
                      "dpo.png, bestofk.png); false: none drawn (sweeps, headless machines). "
                      "Changes no number, so no stage is redone for it; a kept stage is not "
                      "redrawn (python -m lab.plot OUT_DIR draws any run's curves)")


@dataclass
class WorldConfig:
    n_reviews: int = arg(40000, ">0", "generated reviews, about 4.8 MB of text at 40,000")
    vocab_size: int = arg(1024, ">0", "BPE vocabulary, end-of-text included")
    tokenizer: str = arg("bpe", help="bpe (ours, trained on the world) or gpt2 (tiktoken's, if "
                         "cached locally)", choices=["bpe", "gpt2"])


# The smoke preset pretrains with AdamW: the end-to-end tests' thresholds (cheap references' logit
# error, the penalty's effect in 3 iterations, a diverging lr) were set on its model; Muon's own
# tests run Muon on the smoke world (tests/test_pretrain_optim.py). Its pretraining takes seconds: a
# log line at each evaluation (log_interval = eval_interval) is enough.
PRESETS = {"default": {},
           "smoke": dict(n_reviews=3000, vocab_size=300, n_layer=2, n_embd=64, n_head=2,
                         block_size=96, max_iters=150, batch_size=32, warmup_iters=10,
                         optimizer="adamw", log_interval=50,
                         eval_interval=50, eval_iters=2, n_samples=16, response_length=40,
                         n_pairs=600, rm_epochs=2, rm_val_frac=0.25, ppo_iters=3,
                         rollout_batch=16, minibatch_size=8, ppo_epochs=2, n_eval=16,
                         kl_horizon=100, save_interval=1),
           # One H100-class GPU, about 10 minutes for every stage (an estimate: no GPU was
           # available to measure it). 8 layers x 512 channels (25 M parameters, 27x the default)
           # in bf16 keep the matrix units busy at batch 64 x 256 tokens; block 256 holds the
           # longest prompt + 64 response tokens with room to spare. The world grows 5x (about
           # 24 MB of reviews) so 3000 iterations (49 M tokens, ~7 passes) do not just memorise
           # it; a larger model wants a smaller lr (nanoGPT's 10 M model uses 1e-3, with AdamW, as
           # here). 30,000 preference pairs and PPO rollouts of 512 (8x) give the reward model and
           # the policy gradient less noise; kl_horizon grows with the sequences seen so β can still
           # move about 20 % per horizon.
           "gpu": dict(n_reviews=200000, n_layer=8, n_head=8, n_embd=512, block_size=256,
                       dropout=0.0, max_iters=3000, batch_size=64, lr=1e-3, min_lr=1e-4,
                       optimizer="adamw", warmup_iters=100, eval_interval=250, eval_iters=20,
                       n_samples=500, dtype="bf16", compile=True, n_pairs=30000, rm_epochs=2,
                       rm_layers=0, rm_lr=3e-4, rm_batch_size=64, rollout_batch=512,
                       minibatch_size=128, ppo_iters=100, kl_horizon=10000, n_eval=1000,
                       save_interval=20)}
# The model's vocabulary comes from the tokenizer, not a flag.
SKIP = {("GPTConfig", "vocab_size")}


def fields(groups):
    """(group name, field) for every flag; groups is {name: dataclass}."""
    return [(g, f) for g, c in groups.items() for f in dataclasses.fields(c)
            if (c.__name__, f.name) not in SKIP]


def boolean(text):
    """A boolean flag's value: alone (--fresh, text "") it is true; with a value it takes true/false
    or 1/0, nothing else (ValueError). lab/claims.py's --exact takes the same."""
    if text.lower() in ("1", "true", ""):
        return True
    if text.lower() in ("0", "false"):
        return False
    raise ValueError


def no_value(name, argv, i):
    """The line for --name given without '=' (argv[i]): the way to write it, with the next word
    as its value when there is one."""
    after = argv[i + 1] if i + 1 < len(argv) and not argv[i + 1].startswith("--") else None
    example = f"--{name}={after}" if after is not None else f"--{name}=VALUE"
    return (f"--{name} has no value: write {example} (the flag and its value are one word, joined "
            "by '=')")


def _convert(f, text):
    if f.type in (bool, "bool"):
        return boolean(text)
    value = {"int": int, "float": float, "str": str}.get(f.type, f.type)(text)
    if isinstance(value, float) and not math.isfinite(value):
        # NaN and inf parse as floats, and no field wants them.
        raise ValueError
    return value


def print_help(doc, groups):
    print(doc)
    print("  --config=FILE  a run's config.json: every field it holds, a preset and the other "
          "flags winning over it (its out_dir too, the run's own folder, unless --out_dir is "
          "given: a line says so)")
    for g, c in groups.items():
        print(f"{c.__name__}:")
        for _, f in fields({g: c}):
            m = f.metadata
            rule = ""
            if m.get("rule"):
                rule = f" ({m['rule']})"
            elif m.get("choices"):
                rule = f" ({'|'.join(m['choices'])})"
            print(f"  --{f.name}={f.default}{rule}  {m.get('help', '')}".rstrip())


# How a command runs, not what a run is: a --config file never sets them.
NOT_FROM_FILE = ("stage", "fresh", "redo_from")


def _from_file(f, v, where):
    """A config file's value for field f, checked against the field's type; one line naming the
    file and the field, exit 2, when it is not of it."""
    kind = {"int": int, "float": float, "str": str, "bool": bool}.get(f.type, f.type)
    ok = isinstance(v, kind) and not (kind is int and isinstance(v, bool))
    # JSON writes a whole float as an integer.
    if kind is float and isinstance(v, int) and not isinstance(v, bool):
        v, ok = float(v), True
    if not ok or (kind is float and not math.isfinite(v)):
        die(f"{where}: {f.name} is {v!r}, not a finite {kind.__name__}")
    return v


# A run's config.json is a few kB; a file over this is not one (and /dev/zero never ends).
CONFIG_BYTES = 1 << 20


def config_file(path, groups):
    """{field: value} of a run's config.json (the resolved config train.py writes beside its
    stages), every field but NOT_FROM_FILE and the ones no flag sets. Bad input (an unreadable
    file, one over CONFIG_BYTES, a field this code has no flag for, a value of the wrong type): one
    line, exit 2. At most CONFIG_BYTES + 1 bytes are read, so an endless file is refused at once."""
    try:
        with open(path, "rb") as f:
            raw = f.read(CONFIG_BYTES + 1)
    except OSError as e:
        die(f"--config={path}: cannot read it ({e.strerror})")
    if len(raw) > CONFIG_BYTES:
        die(f"--config={path}: over {CONFIG_BYTES >> 20} MB, not a run's config.json (a few kB)")
    try:
        data = json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError):
        die(f"--config={path}: not a JSON config (a run's config.json)")
    if not isinstance(data, dict) or not all(isinstance(v, dict) for v in data.values()):
        die(f"--config={path}: not a config (a run's config.json: {{group: {{field: value}}}})")
    by_name = {f.name: f for _, f in fields(groups)}
    values = {}
    for group, given in data.items():
        for name, v in given.items():
            skipped = group in groups and (groups[group].__name__, name) in SKIP
            if name in NOT_FROM_FILE or skipped:
                continue
            if name not in by_name:
                die(f"--config={path}: {group}.{name} is no flag of this code (renamed or removed "
                    "since the run?)")
            values[name] = _from_file(by_name[name], v, f"--config={path}")
    return values


# The lines say_once has printed in this process.
_SAID = set()


def say_once(line):
    """One line on stdout, once per process (lab/ablate.py parses the same flags many times) and
    from rank 0 alone under torchrun (RANK set)."""
    if line in _SAID or int(os.environ.get("RANK", 0)):
        return
    _SAID.add(line)
    print(line, flush=True)


def parse_args(argv, groups, doc=""):
    """--name=value flags -> SimpleNamespace(run=RunConfig(...), ...). --config=FILE (a run's
    config.json) sets every field it holds first; a preset, then the other flags, win over it.

    Bad input: one line, exit 2: a flag written with a space before its value gets the way to
    write it, an unknown flag the closest known name."""
    by_name = {}
    for g, f in fields(groups):
        assert f.name not in by_name, f"two config fields named {f.name}"
        by_name[f.name] = f
    if "--help" in argv or "-h" in argv:
        print_help(doc, groups)
        sys.exit(0)
    check_once(argv)
    values, from_file = {}, {}
    for i, a in enumerate(argv):
        name, eq, text = a[2:].partition("=")
        if a.startswith("--") and name == "config":
            if not eq:
                die(no_value(name, argv, i))
            from_file, config_path = config_file(text, groups), text
            continue
        if not a.startswith("--") or name not in by_name:
            close = difflib.get_close_matches(name if a.startswith("--") else a, list(by_name),
                                              n=1)
            hint = f"did you mean --{close[0]}? " if close else ""
            die(f"unknown flag {a!r} ({hint}--help lists them)")
        kind = getattr(by_name[name].type, "__name__", by_name[name].type)
        if not eq and kind not in (bool, "bool"):
            die(no_value(name, argv, i))
        try:
            values[name] = _convert(by_name[name], text)
        except ValueError:
            if kind in (bool, "bool"):
                die(f"bad value for --{name}: {text!r} (a boolean flag takes true, false, 1 or 0)")
            die(f"bad value for --{name}: {text!r} is not a finite {kind}")
    # Without --out_dir, a run again from its config.json goes on in that run's own folder: said.
    if "out_dir" in from_file and "out_dir" not in values:
        say_once(f"note: --out_dir={from_file['out_dir']}, from --config={config_path}: the run's "
                 "own folder (add --out_dir=DIR to run in another)")
    preset = values.get("preset", from_file.get("preset", "default"))
    if preset not in PRESETS:
        die(f"bad value for --preset: {preset!r} (choose {', '.join(PRESETS)})")
    # A preset given as a flag wins over the file; the other flags win over both.
    base = {**PRESETS[preset], **from_file}
    if "preset" in values:
        base = {**from_file, **PRESETS[preset]}
    values = {**base, **values}
    if "prompt" in values:
        # A shell passes \n as two characters.
        values["prompt"] = values["prompt"].replace("\\n", "\n")
    made = {}
    for g, c in groups.items():
        given = {f.name: values[f.name] for _, f in fields({g: c}) if f.name in values}
        made[g] = c(**given)
    cfg = SimpleNamespace(**made)
    for g, f in fields(groups):
        v, m = getattr(getattr(cfg, g), f.name), f.metadata
        if m.get("choices") and v not in m["choices"]:
            die(f"bad value for --{f.name}: {v!r} (choose {', '.join(m['choices'])})")
        if m.get("rule") and not RULES[m["rule"]](v):
            die(f"bad value for --{f.name}: {v} (must be {m['rule']})")
    return cfg


def flat(cfg):
    """{field name: value} over every group."""
    return {k: v for group in vars(cfg).values() for k, v in dataclasses.asdict(group).items()}


def check(cfg):
    """Combinations of values that parse but cannot work: one line, exit 2, before anything is
    written. (Prompt lengths and corpus size need the tokenizer: train.py checks them once the world
    exists. What needs another file, batch sizes the torchrun processes share and the --ref kinds a
    depth allows, train.py's parse checks with dist.check_divisible, cheap_ref.check and the
    like.)"""
    import importlib.util
    import torch
    run, w, g, r, p = cfg.run, cfg.world, cfg.gpt, cfg.reward, cfg.ppo
    if w.tokenizer == "bpe" and w.vocab_size < 257:
        die(f"bad value for --vocab_size: {w.vocab_size} (a byte-level BPE needs 256 bytes + "
            "end-of-text: >= 257)")
    if g.n_embd % g.n_head:
        die(f"--n_embd={g.n_embd} is not divisible by --n_head={g.n_head}")
    if w.n_reviews < 100:
        die(f"bad value for --n_reviews: {w.n_reviews} (must be >= 100: 5 % are the validation "
            "split)")
    n_val = int(r.n_pairs * r.rm_val_frac)
    if n_val < 1 or r.n_pairs - n_val < r.rm_batch_size:
        die(f"--n_pairs={r.n_pairs} with --rm_val_frac={r.rm_val_frac} gives {n_val} held-out and "
            f"{r.n_pairs - n_val} training pairs: need >= 1 held-out and "
            f">= --rm_batch_size={r.rm_batch_size}")
    if run.redo_from and (run.stage != "all" or run.fresh):
        die(f"--redo_from={run.redo_from} redoes from that stage on: use it without --stage and "
            "--fresh")
    if run.fresh and run.stage != "all":
        die(f"--fresh redoes every stage: use it without --stage (--stage={run.stage} alone "
            "redoes that stage)")
    e = cfg.eval
    if e.eval_every > p.ppo_iters:
        die(f"--eval_every={e.eval_every} is more than --ppo_iters={p.ppo_iters}: it would "
            "evaluate nothing (0 turns it off)")
    if p.minibatch_size > p.rollout_batch:
        die(f"--minibatch_size={p.minibatch_size} is larger than "
            f"--rollout_batch={p.rollout_batch}")
    if run.response_length + 2 > g.block_size:
        die(f"--response_length={run.response_length} leaves no room for a prompt in "
            f"--block_size={g.block_size}")
    if run.device == "cuda" and not torch.cuda.is_available():
        die("--device=cuda but torch sees no CUDA device here (use --device=cpu or auto)")
    if run.device == "mps" and not torch.backends.mps.is_available():
        die("--device=mps but torch sees no MPS device here (use --device=cpu or auto)")
    # The writer is imported only where it writes (machinery/tblog.py): missing, it is said now.
    if run.log_to == "tensorboard" and importlib.util.find_spec("tensorboard") is None:
        die("--log_to=tensorboard needs the tensorboard package (pip install tensorboard)")
    if run.device == "auto":
        run.device = "cuda" if torch.cuda.is_available() else "cpu"


def check_world(cfg, enc, prompts, split_tokens):
    """What needs the tokenizer, once the world exists: the longest prompt (with its leading
    end-of-text) plus the response must fit block_size, and every split must hold a window of
    block_size + 1 tokens."""
    run, block = cfg.run, cfg.gpt.block_size
    n, p = max((len(enc.encode_ordinary(p)) + 1, p) for p in prompts)
    if n + run.response_length > block:
        raise RunError(f"the prompt {p!r} is {n} tokens (with its end-of-text); with "
                       f"--response_length={run.response_length} that is "
                       f"{n + run.response_length} > --block_size={block}")
    for split, tokens in split_tokens.items():
        if tokens <= block + 1:
            raise RunError(f"the {split} split has {tokens} tokens, too few for windows of "
                           f"--block_size={block} + 1: raise --n_reviews "
                           f"(now {cfg.world.n_reviews}) and redo with --fresh")


def check_once(argv):
    """A flag given twice (--name or --name=value) is refused: one line naming it, exit 2. Which of
    the two was meant is not for a parser to guess (train.py's flags, lab/ablate.py's and
    lab/bench.py's)."""
    names = [a.partition("=")[0] for a in argv]
    if len(set(names)) < len(names):
        die(f"{max(names, key=names.count)} is given twice (give each flag once)")


def override(flags, later):
    """flags, less every flag that `later` names again, then `later`: "the later flag wins" for a
    parser that takes each flag once (lab/ablate.py's and lab/bench.py's runs, through
    train.parse)."""
    names = {a.partition("=")[0] for a in later}
    return [a for a in flags if a.partition("=")[0] not in names] + later
