"""Where a default PPO iteration's time goes: each phase, and each phase by operator class.

    python -m lab.profile_ppo                  # on out/'s finished run: a table, nothing written
    python -m lab.profile_ppo --iters=8 --ppo_epochs=2   # any train.py flag passes through

It runs ppo.train_ppo itself (the code train.py runs, with the run's models, prompts and flags)
for --iters iterations (default 6) in a temporary folder, twice: once timed by the clock, phase by
phase (rollout, experience, update, and one during-PPO evaluation of --eval_n samples after the
last iteration), and once the same under torch.profiler, whose operator self-times are summed by
class: matrix multiplication (mm, addmm, bmm, linear), attention (scaled_dot_product_*),
optimizer (the fused AdamW step, zero_grad, the gradient clip's norms), sampling (multinomial and
its exponential_, topk), element-wise and other kernels (the rest). "Python and dispatch" is what
is left of the phase's profiled time: the interpreter, the autograd engine, the dispatcher and the
profiler's own cost, so it is an upper bound. The first iteration is a warm-up and not counted.
Both runs do the same work (the same seed): the clock's seconds are without the profiler.
Left out: memory, CUDA kernels, torch.compile (answers/tokens-flops-trl.md measures it separately).
"""
# Ctrl-C while the imports below load torch (seconds) is one line and exit 130.
if __name__ == "__main__":
    from machinery.errors import ctrl_c_while_starting
    ctrl_c_while_starting()
import contextlib, copy, sys, tempfile, time
import torch
from torch.profiler import ProfilerActivity, profile, record_function

import data, ppo, tokenizer, train
from reward import gold_normaliser
from machinery import provenance, store
from options import evaluate
from pipeline import stages
from machinery.errors import RunError, die, run_main
from options import cheap_ref

PHASES = ("rollout", "experience", "update", "evaluation")
CLASSES = ("matmul", "attention", "optimizer", "sampling", "element-wise and other",
           "Python and dispatch")
MATMUL = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul",
          "aten::linear", "aten::addmv")
SAMPLING = ("aten::multinomial", "aten::exponential_", "aten::topk")


def op_class(name, inside_optimizer):
    """The class of one operator by its name (and whether an optimizer range holds it)."""
    if inside_optimizer:
        return "optimizer"
    if name in MATMUL:
        return "matmul"
    if "scaled_dot_product" in name or "flash_attention" in name:
        return "attention"
    if name in SAMPLING:
        return "sampling"
    return "element-wise and other"


@contextlib.contextmanager
def phases_timed(seconds, profiled):
    """ppo's rollout, make_experience and ppo_update, and the optimizer's step and clip, wrapped:
    each call's clock seconds added to seconds[phase]; under the profiler each call is a named
    range. The originals are put back on leaving."""
    originals = dict(rollout=ppo.rollout, experience=ppo.make_experience,
                     update=ppo.ppo_update, clip=torch.nn.utils.clip_grad_norm_)
    names = dict(rollout="rollout", experience="make_experience", update="ppo_update")

    def wrap(phase, fn):
        def timed(*a, **kw):
            t = time.perf_counter()
            with record_function(f"phase:{phase}") if profiled else contextlib.nullcontext():
                out = fn(*a, **kw)
            seconds[phase].append(time.perf_counter() - t)
            return out
        return timed

    def clip(*a, **kw):
        with record_function("Optimizer.clip_grad_norm"):
            return originals["clip"](*a, **kw)
    for phase, attr in names.items():
        setattr(ppo, attr, wrap(phase, originals[phase]))
    torch.nn.utils.clip_grad_norm_ = clip
    try:
        yield
    finally:
        for phase, attr in names.items():
            setattr(ppo, attr, originals[phase])
        torch.nn.utils.clip_grad_norm_ = originals["clip"]


def one_pass(cfg, profiled):
    """--iters PPO iterations and one evaluation on the run's models: {phase: [seconds per call]},
    and the profiler (None when not profiled)."""
    base, run = cfg.run.out_dir, cfg.run
    enc = tokenizer.load_tokenizer(base, cfg.world.tokenizer)
    prompts = data.load_prompts(base)
    actor, ref, rm = stages.load_models(base, run.device)
    # As stages.run_ppo sets them up: --ref's reference, the critic, the gold normaliser.
    actor, ref = cheap_ref.make_reference(actor, ref, cfg.ref)
    critic = copy.deepcopy(rm).requires_grad_(True) if cfg.ppo.advantage == "gae" else None
    gold_norm = gold_normaliser(store.load_json(f"{base}/prefs.jsonl", lines=True))
    stages.seed_everything(run.seed)
    seconds = {p: [] for p in PHASES}
    prof = profile(activities=[ProfilerActivity.CPU]) if profiled else contextlib.nullcontext()
    with tempfile.TemporaryDirectory() as tmp, phases_timed(seconds, profiled), prof:
        ppo.train_ppo(actor, critic, ref, rm, enc, prompts["train"], cfg, tmp, stamp={},
                      log=lambda line: None, gold_norm=gold_norm, heldout=prompts["heldout"])
        t = time.perf_counter()
        with record_function("phase:evaluation") if profiled else contextlib.nullcontext():
            evaluate.during_ppo(actor, enc, prompts["heldout"], run, ref, rm, cfg.eval)
        seconds["evaluation"].append(time.perf_counter() - t)
    return seconds, prof if profiled else None


def by_class(prof, skip):
    """{phase: {class: seconds}} from the profiler's events: each operator's self time goes to the
    phase range it lies in (the first `skip` calls of each phase are left out), by op_class;
    "Python and dispatch" is the phase's range time less its operators' self times."""
    events = prof.events()
    ranges = {p: [] for p in PHASES}
    for e in events:
        if e.name.startswith("phase:"):
            ranges[e.name[6:]].append((e.time_range.start, e.time_range.end))
    ranges = {p: sorted(r)[skip if p != "evaluation" else 0:] for p, r in ranges.items()}
    optimizer = [(e.time_range.start, e.time_range.end) for e in events
                 if e.name.startswith("Optimizer.")]
    out = {p: dict.fromkeys(CLASSES, 0.0) for p in PHASES}
    for e in events:
        if not e.name.startswith("aten::"):
            continue
        start = e.time_range.start
        phase = next((p for p, r in ranges.items() if any(a <= start < b for a, b in r)), None)
        if phase is None:
            continue
        inside = any(a <= start < b for a, b in optimizer)
        out[phase][op_class(e.name, inside)] += e.self_cpu_time_total / 1e6
    for p, r in ranges.items():
        total = sum(b - a for a, b in r) / 1e6
        out[p]["Python and dispatch"] = max(0.0, total - sum(out[p].values()))
    return out


def table(seconds, classes, n):
    """The markdown table: one row a phase (clock seconds per call, the mean over the counted
    calls; its share of an iteration), then its classes as shares of its profiled time."""
    head = "| phase | s per call | share of an iteration | " + " | ".join(CLASSES) + " |"
    lines = [head, "|---" * (len(CLASSES) + 3) + "|"]
    per_call = {p: sum(s) / len(s) for p, s in seconds.items()}
    iteration = sum(per_call[p] for p in PHASES[:3])
    for p in PHASES:
        total = sum(classes[p].values()) or 1.0
        share = f"{per_call[p] / iteration:.0%}"
        if p == "evaluation":
            share = f"{per_call[p] / iteration:.2f} iterations"
        cells = " | ".join(f"{classes[p][c] / total:.0%}" for c in CLASSES)
        lines.append(f"| {p} | {per_call[p]:.3f} | {share} | {cells} |")
    lines.append(f"| iteration (rollout + experience + update) | {iteration:.3f} | 100% | "
                 + " | ".join("" for _ in CLASSES) + " |")
    return "\n".join(lines)


def main(argv):
    # The docstring says every mode and flag.
    if "--help" in argv or "-h" in argv:
        print(__doc__)
        return
    iters = [a for a in argv if a.startswith("--iters=")]
    try:
        n = int(iters[-1].partition("=")[2]) if iters else 6
    except ValueError:
        die(f"bad value for --iters: {iters[-1].partition('=')[2]!r} (a whole number >= 2)")
    if n < 2:
        die(f"--iters={n}: at least 2 (the first is a warm-up)")
    cfg = train.parse([a for a in argv if a not in iters] + [f"--ppo_iters={n}", "--eval_every=0"])
    try:
        if cfg.run.threads:
            torch.set_num_threads(cfg.run.threads)
        t0 = time.time()
        seconds, _ = one_pass(cfg, profiled=False)
        counted = {p: (s[1:] if p != "evaluation" else s) for p, s in seconds.items()}
        _, prof = one_pass(cfg, profiled=True)
        classes = by_class(prof, skip=1)
    except RunError as e:
        die(str(e), e.code)
    took = time.time() - t0
    print(f"profile_ppo: {n - 1} iterations counted (the first a warm-up), one evaluation of "
          f"{cfg.eval.eval_n} samples, {torch.get_num_threads()} threads\n")
    print(table(counted, classes, n))
    print("\n" + provenance.line(provenance.stamp(took, torch.get_num_threads(), cfg.run.device)))


if __name__ == "__main__":
    run_main(main, sys.argv[1:])
