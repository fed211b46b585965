"""tether's driver: every stage of RLHF, from an empty folder to a report.

    python train.py                   # every stage not done yet (world, pretrain, ..., ppo, report)
    python train.py --stage=pretrain  # redo one stage, removing what later stages made from it
    python train.py --preset=smoke    # everything tiny, seconds (the tests use it)
    python train.py --config=out/config.json --out_dir=again   # a run again, from its record
    python train.py --help            # every config field, overridable as --name=value
    python sample.py                  # then: the RLHF actor answers held-out prompts

Each stage writes into out_dir and records in stages.json the config fields and input files it was
made from; a later run that differs stops with one line (or, with --stage=NAME, redoes that stage).
Pretraining and PPO save resumable checkpoints: the same command after a kill goes on where it
stopped and ends with the same numbers.
This file is the driver: GROUPS (the config), `parse` with the checks across fields and files, and
`run_stages`, which plans from stages.json and runs what is missing. The stages and their table
(STAGES) are in pipeline/stages.py; the PPO loop itself is in ppo.py. The token-by-token page
reads a finished run: python -m lab.inspect_page.
Under `torchrun --standalone --nproc_per_node=N train.py ...` pretraining, the reward model and PPO
train on N processes (each its share of every batch, gradients averaged: machinery/dist.py); rank 0
alone plans, writes and prints, and runs the other stages while the rest wait. Lines under a `#
torchrun` comment are the only ones a single process skips past.
Left out: resuming the preferences and reward stages half way.
"""
# Ctrl-C while the imports below load torch (seconds) is one line and exit 130.
if __name__ == "__main__":
    from machinery.errors import ctrl_c_while_starting
    ctrl_c_while_starting()
import dataclasses, hashlib, json, os, sys, time
import torch

import dpo, kl, tokenizer
from dpo import DPOConfig
from kl import KLConfig
from model import GPTConfig
from ppo import PPOConfig
from ref import check_copy
from reward import RewardConfig
from machinery import dist, store
from machinery.config import RunConfig, WorldConfig, check, die, parse_args
from machinery.errors import RunError, run_main
from machinery.precision import auto_dtype
from machinery.records import load_records, make_record, own_fields, plan, records_path
from options import anchors, cheap_ref, grpo, rollback
from options.anchors import AnchorConfig
from options.cheap_ref import RefConfig
from options.evaluate import EvalConfig
from options.rollback import RollbackConfig
from pipeline.pretrain import PretrainConfig
from pipeline.stages import (BY_NAME, STAGES, build_world_aside, files, load_timings, path,
                             run_stage, stamp, world_ok)

GROUPS = dict(run=RunConfig, world=WorldConfig, gpt=GPTConfig, pretrain=PretrainConfig,
              reward=RewardConfig, kl=KLConfig, ppo=PPOConfig, ref=RefConfig, anchor=AnchorConfig,
              rollback=RollbackConfig, eval=EvalConfig, dpo=DPOConfig)


def parse(argv):
    """The flags, checked: alone (config.check), then what needs another file: batch sizes the
    torchrun processes must share equally (dist), the --ref kinds the model's depth allows
    (cheap_ref), the reference's updates (anchors), the rollback factor (rollback), where an
    estimator may go (kl), the group sizes a rollout can hold (grpo) and, for --tokenizer=gpt2,
    tiktoken's files in its cache (tokenizer). Bad input: one line, exit 2. Then --dtype=auto
    becomes what this device multiplies natively (precision.auto_dtype)."""
    cfg = parse_args(argv, GROUPS, __doc__)
    check(cfg)
    r, p = cfg.reward, cfg.ppo
    sizes = dict(batch_size=cfg.pretrain.batch_size, rm_batch_size=r.rm_batch_size,
                 rollout_batch=p.rollout_batch, minibatch_size=p.minibatch_size)
    why = (dist.check_divisible(sizes) or cheap_ref.check(cfg) or anchors.check(cfg)
           or rollback.check(cfg) or kl.check(cfg) or grpo.check(cfg) or dpo.check(cfg)
           or (cfg.world.tokenizer == "gpt2" and tokenizer.gpt2_missing())
           or (cfg.eval.pass_gold_hard <= cfg.eval.pass_gold
               and f"--pass_gold_hard={cfg.eval.pass_gold_hard} must be above --pass_gold="
                   f"{cfg.eval.pass_gold}: it is the harder of the two thresholds"))
    if why:
        die(why)
    # --dtype=auto: what this device multiplies natively (the stamps hold what runs).
    if cfg.run.dtype == "auto":
        cfg.run.dtype = auto_dtype(cfg.run.device)[0]
    return cfg


def idle_flag(argv, cfg):
    """Why a flag on the command line would do nothing, in one line: DPO's own flags (DPOConfig's)
    without --stage=dpo; None when each does something. A --config file's values are not flags.
    (PPO's flags under --stage=dpo must match what the folder's PPO was made with: records.plan.)"""
    given = {a[2:].partition("=")[0] for a in argv if a.startswith("--")}
    for f in dataclasses.fields(DPOConfig):
        if f.name in given and cfg.run.stage != "dpo":
            return (f"--{f.name} is DPO's flag: only --stage=dpo reads it (add --stage=dpo to make "
                    "DPO with it)")
    return None


# torchrun: every rank runs these; rank 0 runs the others alone.
TRAINING = {"pretrain", "reward", "ppo"}


def follow_stages(cfg):
    """torchrun, ranks other than 0: rank 0's plan, taking part in its training stages, in step
    with it."""
    try:
        plan = dist.broadcast_object(None)
    except RuntimeError:
        # Rank 0 stopped before it had a plan; its line says why.
        sys.exit(1)
    for name in plan:
        st = BY_NAME[name]
        if name in TRAINING:
            run_stage(cfg, st, stamp(cfg, st))
        # Wait until rank 0 has written this stage's outputs and records.
        dist.barrier()
    return {}


def check_finished(cfg, what, inputs):
    """A command that reads a finished run with train.py's flags (lab/inspect_page.py) needs its
    input files, and a world made with this --tokenizer. RunError otherwise, before anything is made
    (not even the folder). what: the command, for the message."""
    out = cfg.run.out_dir
    missing = [n for n in files(cfg, inputs) if not os.path.exists(path(cfg, n))]
    if missing:
        raise RunError(f"{what} needs {', '.join(missing)} in {out}: run the stages before it "
                       "first")
    world = load_records(out).get("world", {})
    made = world.get("config", {}).get("tokenizer", cfg.world.tokenizer)
    # Its other flags only say how to sample.
    if made != cfg.world.tokenizer:
        raise RunError(f"the world in {out} was made with --tokenizer={made}, now --tokenizer="
                       f"{cfg.world.tokenizer}: {what} reads that world's tokens")


def open_folder(cfg, reads=None):
    """out_dir checked before any work: a folder (made here unless `reads`) whose name is valid
    UTF-8, writable; reads: (what, inputs) of a command that reads a finished run
    (check_finished). Bad input: one line, exit 2. Returns the run lock (store.Lock), to hold: a
    folder made here that the command leaves empty (refused before any stage wrote) is removed
    when the lock is released, so a refused command leaves no new folder behind."""
    out = cfg.run.out_dir
    if store.not_a_folder(out):
        die(f"--out_dir={out} {store.not_a_folder(out)}")
    # A command that reads a finished run makes nothing in a folder without one, not even it.
    if reads:
        check_finished(cfg, *reads)
    # The outermost folder this command makes on the way to out_dir, if any.
    made = None
    up = os.path.abspath(out)
    while not os.path.exists(up):
        made, up = up, os.path.dirname(up)
    try:
        os.makedirs(out, exist_ok=True)
    except OSError as e:
        die(f"--out_dir={out} cannot be made ({e.strerror})")
    if store.unwritable(out):
        die(f"--out_dir={out} is not writable ({store.unwritable(out)}): use a folder this "
            "process may write, or another --out_dir")
    return store.Lock(out, made)


# The stage under way: its name, stamp digest, start and the seconds of its earlier pieces.
PIECE = "running.json"


def begin_piece(cfg, st, now):
    """The seconds an interrupted run of stage `st` already spent on what it resumes from (from
    its start to the last save of its resumable state, st.partial: later work is done again);
    0.0 when it starts over. Records this piece's start in out_dir/running.json."""
    digest = hashlib.sha256(json.dumps(stamp(cfg, st), sort_keys=True).encode()).hexdigest()[:16]
    before = 0.0
    p = path(cfg, PIECE)
    if st.partial and os.path.exists(p) and os.path.exists(path(cfg, st.partial)):
        try:
            last = store.load_json(p)
            if last["stage"] == st.name and last["stamp"] == digest:
                saved = os.path.getmtime(path(cfg, st.partial))
                before = last["before"] + max(0.0, saved - last["started"])
        except (RunError, KeyError, TypeError):
            before = 0.0
    store.save_json(p, dict(stage=st.name, stamp=digest, started=now, before=before))
    return before


def run_stages(cfg, upto=None):
    """Check the state of out_dir, then run what is missing or asked for (upto: the stages up to
    that one only). Returns {stage: seconds}.
    Every check comes before anything is removed: the flags, the records, and the world's lengths (a
    world to be made is built aside and checked first)."""
    # torchrun: the other ranks follow rank 0's plan.
    if not dist.is_main():
        return follow_stages(cfg)
    out = cfg.run.out_dir
    # A damaged record is a missing one: its stage is redone, and a line says so.
    notes = []
    records = {} if cfg.run.fresh else load_records(out, notes)
    timings = {} if cfg.run.fresh else load_timings(cfg, notes)
    for line in notes:
        print(line)
    stages = STAGES[:[s.name for s in STAGES].index(upto) + 1] if upto else STAGES
    todo, kept, dropped = plan(stages, cfg.run.stage, out, records, lambda st: stamp(cfg, st),
                               lambda st, rec: files(cfg, st.outputs, rec["config"],
                                                     rec["outputs"]),
                               redo=cfg.run.redo_from)
    for name in kept:
        print(f"---- stage {name}: done with this config, kept ----")
    if todo and todo[0].name == "world":
        build_world_aside(cfg)
    else:
        world_ok(cfg)
    # A stage that reads ref.pt needs the frozen copy of pretrain.pt, checked before anything goes.
    reads_ref = [st for st in todo if "ref.pt" in st.inputs]
    if reads_ref and "reference" not in [st.name for st in todo]:
        check_copy(path(cfg, "pretrain.pt"), path(cfg, "ref.pt"))
    if cfg.run.fresh:
        made = [n for st in STAGES for n in st.outputs + [st.partial] if n]
        for n in made + ["stages.json", "timings.json", PIECE]:
            store.remove(path(cfg, n))
    # The config the recorded stages were made with (--config reads it back). A command that runs
    # the stages up to one (lab/ablate.py's bases) leaves the later ones, and config.json, alone.
    if upto is None:
        resolved = {g: dataclasses.asdict(c) for g, c in vars(cfg).items()}
        # A finished optional stage this command leaves alone keeps its own flags' values there.
        for st in STAGES:
            if st.optional and st.name in records and st not in todo + dropped:
                made = records[st.name]["config"]
                for group in resolved.values():
                    group.update({k: made[k] for k in own_fields(st, STAGES) if k in group})
        store.save_json(path(cfg, "config.json"), resolved)
    for st in dropped:
        records.pop(st.name, None)
        for n in st.outputs:
            store.remove(path(cfg, n))
        store.save_json(records_path(out), records)
    # torchrun: the plan, to the other ranks.
    dist.broadcast_object([st.name for st in todo])
    for st in todo:
        # What this stage and every later one made is out of date now (an optional stage's own
        # outputs only: nothing is made from them).
        if st.outputs:
            stale = [st] if st.optional else STAGES[STAGES.index(st):]
            for later in stale:
                records.pop(later.name, None)
                for n in later.outputs:
                    store.remove(path(cfg, n))
            store.save_json(records_path(out), records)
        # The dtype is the one that runs: with --dtype=auto, what it chose.
        print(f"---- stage {st.name} ---- ({cfg.run.dtype})", flush=True)
        t = time.time()
        before = begin_piece(cfg, st, t)
        run_stage(cfg, st, stamp(cfg, st))
        if st.outputs:
            s = stamp(cfg, st)
            records[st.name] = make_record(out, s["config"], files(cfg, st.inputs),
                                                 files(cfg, st.outputs), s["defaults"], s["code"])
            store.save_json(records_path(out), records)
            # A resumed stage's time is its pieces' summed.
            timings[st.name] = round(before + time.time() - t, 1)
            store.save_json(path(cfg, "timings.json"), timings)
            if st.partial:
                store.remove(path(cfg, st.partial))
            store.remove(path(cfg, PIECE))
        # torchrun: the other ranks wait for this stage.
        dist.barrier()
    return timings


def main(argv):
    cfg = parse(argv)
    if idle_flag(argv, cfg):
        die(idle_flag(argv, cfg))
    # torchrun: join the group; in one process the device is unchanged.
    cfg.run.device = dist.init(cfg.run.device)
    # What autocast leaves in fp32 may use TF32 on CUDA.
    if cfg.run.dtype == "bf16":
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True

    assert set(RunConfig.__dataclass_fields__["stage"].metadata["choices"]) == {"all", *BY_NAME}
    if cfg.run.threads:
        torch.set_num_threads(cfg.run.threads)
    try:
        # torchrun: rank 0 checks the folder and holds the lock.
        if not dist.is_main():
            return run_stages(cfg)
        with open_folder(cfg):
            return run_stages(cfg)
    except RunError as e:
        # torchrun: one line, from rank 0 (errors.die).
        die(str(e), e.code)
    except FloatingPointError as e:
        # model.generate met logits that are not finite: the run itself failed.
        die(str(e), 1)
    except KeyboardInterrupt:
        die("interrupted; what was saved is kept, and the same command goes on from there", 130)
    finally:
        dist.close()


if __name__ == "__main__":
    run_main(main, sys.argv[1:])
