"""The kept runs read back without training: which run kept in lab/runs stands for a run of a
suite's command on a machine that lacks its inputs (another CPU rebuilds another pretrained model),
and the kept evaluations of the pretrained model. The suites' --tables_only rebuild their tables
and figures from these alone:

    python -m lab.dpo_suite --subdir=dpo_epochs --arms=frontier --dpo_epochs=4 \\
        --dpo_eval_every=26 --models= --tables_only

A kept run stands for a run of the command when its record's config is the one the command gives
that run (its flags, seed, threads and processes; stages.stamp_config) and its files are as the run
wrote them. Its inputs cannot be checked without the base, so the table takes one base for all its
runs: the pretrained model and reward model (their hashes in each record) that every run of the
table was kept on, or the one --base names (a prefix of the pretrained model's hash) when the
archive holds runs of several. A run made by other code is read all the same; the tables say what
made each run (machine, commit, date). What the archive lacks is named, and nothing is written.
Left out: the weights (never kept), so nothing that samples from a trained actor (examples.md).
"""
import glob, hashlib, json, os
from machinery import provenance, records, store
from machinery.errors import RunError
from pipeline import stages

# A run's record, written last (as ablate.RECORD).
RECORD = "run.json"
# The kept evaluations of a base's pretrained model, per suite folder.
PRETRAINED = "pretrained.json"


def base_of(rec):
    """The base a kept run was made on: (its pretrained model's hash, its reward model's)."""
    return rec["inputs"].get("pretrain.pt"), rec["inputs"].get("reward.pt")


def candidates(seed_dir, cfg, st, names):
    """[(folder, record)]: the runs kept under seed_dir (its inputs_HASH folders) whose record's
    config is the one cfg gives stage st and whose kept files (`names`) are intact."""
    values, defaults = stages.stamp_config(cfg, st)
    out = []
    for d in sorted(glob.glob(os.path.join(seed_dir, "inputs_*"))):
        path = os.path.join(d, RECORD)
        if not os.path.exists(path):
            continue
        try:
            rec = store.load_json(path)
        except RunError:
            continue
        if records.damaged_record(rec) or machine(rec) is None:
            continue
        # Its own inputs stand in for the ones this machine cannot hash: config alone.
        stamp = dict(config=values, defaults=defaults, inputs=rec["inputs"])
        if records.first_difference(rec, stamp) is None and records.outputs_intact(d, rec, names):
            out.append((d, rec))
    return out


def machine(rec):
    """The machine a kept run was made on, (cpu, AVX-512, native bf16); None when its record does
    not say."""
    m = rec.get("made_on")
    try:
        return m["cpu"], m["avx512"], m["native_bf16"]
    except (KeyError, TypeError):
        return None


def choose(found, base="", on=None):
    """found: {key: [(folder, record)]}, each key a run of the table. Returns (base, {key: (folder,
    record)}, [keys the archive lacks on that base]): the base named by `base` (a prefix of the
    pretrained model's hash), else the one with the most runs among those made on the machine
    `on` (any machine when none was; ties there: the first in hash order). RunError when `base`
    matches no kept run, or several bases, or when no `base` or `on` is given and two bases hold
    as many runs."""
    bases = sorted({base_of(rec) for runs in found.values() for _, rec in runs}, key=str)
    if base:
        bases = [b for b in bases if (b[0] or "").startswith(base)]
        if not bases:
            raise RunError(f"--base={base}: no kept run's pretrained model has a hash that starts "
                           "so")
        if len({b[0] for b in bases}) > 1:
            raise RunError(f"--base={base}: {len({b[0] for b in bases})} pretrained models of the "
                           "archive match (give more of its hash)")
    if on is not None:
        there = [b for b in bases if any(base_of(rec) == b and machine(rec) == on
                                         for runs in found.values() for _, rec in runs)]
        bases = there or bases
    if not bases:
        return None, {}, list(found)
    counts = {b: sum(any(base_of(rec) == b for _, rec in runs) for runs in found.values())
              for b in bases}
    best = max(bases, key=counts.get)
    # As many runs on two pretrained models: which the table stands for is the user's to say.
    tied = [b for b in bases if counts[b] == counts[best]]
    if not base and on is None and len(tied) > 1:
        named = ", ".join(f"{(b[0] or '?')[:8]}" for b in tied)
        raise RunError(f"--tables_only: the archive holds {counts[best]} of this table's runs on "
                       f"each of {len(tied)} pretrained models ({named}): name one with "
                       "--base=HASH")
    chosen, missing = {}, []
    for key, runs in found.items():
        mine = [r for r in runs if base_of(r[1]) == best]
        if mine:
            chosen[key] = mine[-1]
        else:
            missing.append(key)
    return best, chosen, missing


def choose_groups(found, group_of, base=""):
    """choose for each group of runs (group_of(key): "main" or another base's name), the main
    group first: `base` names its base; every other group takes the base made on the machine
    that made the main group's runs, where it has one. Returns ({key: (folder, record)}, [keys
    lacking], {group: base})."""
    groups = sorted({group_of(k) for k in found}, key=lambda g: g != "main")
    chosen, missing, bases, on = {}, [], {}, None
    for g in groups:
        mine = {k: v for k, v in found.items() if group_of(k) == g}
        bases[g], picked, lacks = choose(mine, base if g == "main" else "", on)
        chosen.update(picked)
        missing += lacks
        if g == "main" and picked:
            on = machine(next(iter(picked.values()))[1])
    return chosen, missing, bases


def lacking(folder, lacks, runs):
    """The one-line error of a table the archive cannot rebuild: what folder lacks, the first 8."""
    more = f" and {len(lacks) - 8} more" if len(lacks) > 8 else ""
    return RunError(f"--tables_only: {folder} lacks {', '.join(lacks[:8])}{more} (of {runs} "
                    "runs and the pretrained model's evaluations) for this command")


def made_on(rec):
    """What made a kept run, as ablate.kept_run says it: "CPU (...), commit X, date"."""
    m = rec["made_on"]
    yes = {True: "yes", False: "no"}
    notes = {True: " with uncommitted changes", False: "", None: " (working tree not read)"}
    return (f"{m['cpu']} (AVX-512 {yes[m['avx512']]}, native bf16 {yes[m['native_bf16']]}), "
            f"commit {m['commit']}{notes[m.get('uncommitted')]}, {m['date']}")


def pretrained_config(cfg, seeds, extra):
    """What the pretrained model's kept evaluations depend on besides the base: the sampling
    settings, the evaluation's sizes, the seeds and the suite's own (`extra`)."""
    run = cfg.run
    return dict(temperature=run.temperature, response_length=run.response_length,
                dtype=run.dtype, deterministic=run.deterministic, eval_n=cfg.eval.eval_n,
                n_eval=cfg.eval.n_eval, seeds=list(seeds), **extra)


def inputs_folder(folder, inputs):
    """folder/inputs_HASH, HASH a digest of the input hashes: where what was made from them is
    kept. A CPU that rounds differently builds other base models, so its runs are kept beside
    another CPU's, never over them."""
    text = json.dumps(inputs, sort_keys=True)
    return os.path.join(folder, "inputs_" + hashlib.sha256(text.encode()).hexdigest()[:12])


def keep_pretrained(folder, config, inputs, values, seconds, device):
    """The pretrained model's evaluations (`values`, a dict) kept in folder/inputs_HASH, HASH a
    digest of the base's input hashes and the config, so evaluations under another config (other
    seeds, sizes) are kept beside them; left as they are when the same values are kept there."""
    kept = inputs_folder(folder, dict(inputs=inputs, config=config))
    path = os.path.join(kept, PRETRAINED)
    old = kept_pretrained(folder, config, inputs=inputs)
    # Compared as JSON text: a NaN (a pretrained row's entropy) equals itself there.
    same = json.dumps(values, sort_keys=True)
    if old is not None and json.dumps(old.get("values"), sort_keys=True) == same:
        return
    os.makedirs(kept, exist_ok=True)
    # Made in this process: its own threads.
    store.save_json(path, dict(config=config, inputs=inputs, values=values,
                               made_on=provenance.stamp(seconds, None, device)))


def kept_pretrained(folder, config, inputs=None, base=None):
    """The kept evaluations made under `config`, on the base whose input hashes are `inputs` (a
    machine that has the base) or whose (pretrained, reward) hashes are `base` (one that does
    not); None when none is kept."""
    for path in sorted(glob.glob(os.path.join(folder, "inputs_*", PRETRAINED))):
        try:
            kept = store.load_json(path)
        except RunError:
            continue
        if not isinstance(kept, dict) or kept.get("config") != config:
            continue
        if inputs is not None and kept.get("inputs") != inputs:
            continue
        if base is not None and base_of(kept) != base:
            continue
        return kept
    return None
