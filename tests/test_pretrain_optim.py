"""Pretraining's --optimizer=muon: which parameters Muon trains (the blocks' Linear weights, found by walking the
modules, against what optim.pretrain_optimizer gives it), the warmup + cosine schedule on every group, a smoke
pretraining that learns (and, at this budget, faster than AdamW), a kill and resume that ends bit for bit as the
uninterrupted run, the flag's bad values and stale stages refused; and bench.py --bar, whose rows are those runs.
The runs go through train.main on one smoke world (--stage=world, then --stage=pretrain), 60 iterations."""
import dataclasses, math, os, shutil
import pytest
import torch
import torch.nn as nn

import train
from machinery import optim, store
from pipeline import stages
from machinery.config import override
from pipeline import pretrain as pretrain_loop
from pipeline.pretrain import PretrainConfig
from model import GPT, GPTConfig
from machinery.optim import Optimizers

SMOKE = ["--preset=smoke", "--max_iters=60", "--eval_interval=15", "--warmup_iters=8", "--muon_lr=0.03",
         "--muon_momentum=0.9", "--plots=false"]
MUON = SMOKE + ["--optimizer=muon"]
WORLD = stages.WORLD + ["stages.json"]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("world"))
    train.main(SMOKE + [f"--out_dir={out}", "--stage=world"])
    return out


def world_copy(world, out):
    os.makedirs(out)
    for n in WORLD:
        shutil.copy(os.path.join(world, n), os.path.join(out, n))
    return str(out)


def recording(lrs):
    """optim.pretrain_optimizer, with each step's learning rates (one per group) appended to lrs first."""
    make = optim.pretrain_optimizer

    def made(model, pt, dtype="fp32"):
        opt = make(model, pt, dtype)
        step = opt.step
        opt.step = lambda: (lrs.append([g["lr"] for g in opt.param_groups]), step())
        return opt
    return made


def pretrain(world, out, argv, lrs=None):
    """--stage=pretrain on a copy of the world; returns (pretrain.json, the model's weights)."""
    out = world_copy(world, out)
    with pytest.MonkeyPatch.context() as mp:
        if lrs is not None:
            mp.setattr(optim, "pretrain_optimizer", recording(lrs))
        train.main(argv + [f"--out_dir={out}", "--stage=pretrain"])
    return store.load_json(os.path.join(out, "pretrain.json")), torch.load(os.path.join(out, "pretrain.pt"),
                                                                           weights_only=True)["model"]


@pytest.fixture(scope="module")
def muon(world, tmp_path_factory):
    lrs = []
    summary, weights = pretrain(world, tmp_path_factory.mktemp("muon") / "run", MUON, lrs)
    return dict(summary=summary, weights=weights, lrs=lrs)


@pytest.mark.parametrize("bias", [True, False])
def test_muon_trains_exactly_the_blocks_linear_weights_and_adamw_the_rest(bias):
    model = GPT(GPTConfig(block_size=16, vocab_size=40, n_layer=3, n_head=2, n_embd=16, bias=bias))
    pt = PretrainConfig(optimizer="muon", lr=3e-3, muon_lr=0.05)
    opt = optim.pretrain_optimizer(model, pt)
    assert isinstance(opt, Optimizers) and [type(o) for o in opt.opts] == [optim.Muon, torch.optim.AdamW]
    held = [[p for g in o.param_groups for p in g["params"]] for o in opt.opts]
    linear = {id(m.weight) for b in model.blocks for m in b.modules() if isinstance(m, nn.Linear)}
    assert len(linear) == 4 * 3                                         # qkv, projection, MLP in and out; x3
    everything = {id(p) for p in model.parameters()}
    assert {id(p) for p in held[0]} == linear and len(held[0]) == len(linear)
    assert {id(p) for p in held[1]} == everything - linear and len(held[1]) == len(everything - linear)
    assert model.lm_head.weight is model.wte.weight and any(p is model.wte.weight for p in held[1])   # tied: AdamW
    assert any(p is model.wpe.weight for p in held[1])
    assert [(g["peak_lr"], g["min_lr"]) for g in opt.param_groups] == [(0.05, 0.05 * pt.min_lr / 3e-3),
                                                                         (3e-3, pt.min_lr)]
    plain = optim.pretrain_optimizer(model, dataclasses.replace(pt, optimizer="adamw"))
    assert isinstance(plain, torch.optim.AdamW) and {id(p) for g in plain.param_groups for p in g["params"]} \
        == everything


def test_every_group_follows_the_warmup_and_cosine_from_its_own_peak(muon):
    lrs, pt = muon["lrs"], train.parse(MUON).pretrain
    assert len(lrs) == pt.max_iters and all(len(r) == 2 for r in lrs)
    m, a = [r[0] for r in lrs], [r[1] for r in lrs]                     # Muon's group, AdamW's
    assert all(math.isclose(x / pt.muon_lr, y / pt.lr, rel_tol=1e-12) for x, y in zip(m, a))   # one shape, two peaks
    w = pt.warmup_iters
    assert all(a[i] < a[i + 1] for i in range(w - 1)) and a[w - 1] == pt.lr              # up to the peak ...
    assert all(a[i] >= a[i + 1] for i in range(w - 1, len(a) - 1))                        # ... then down ...
    assert pt.min_lr < a[-1] < pt.min_lr + 0.01 * (pt.lr - pt.min_lr)                      # ... to the floor


def test_a_muon_pretraining_learns_and_beats_adamw_at_this_budget(muon, world, tmp_path):
    log = muon["summary"]["log"]
    vals = [r["val_loss"] for r in log]
    assert [r["iter"] for r in log] == [15, 30, 45, 60]
    assert all(x > y for x, y in zip(vals, vals[1:])), vals           # every estimate lower than the one before
    adamw, _ = pretrain(world, tmp_path / "adamw", SMOKE + ["--optimizer=adamw"])
    assert vals[-1] < adamw["val_loss"] - 0.1, (vals[-1], adamw["val_loss"])


def test_a_muon_pretraining_killed_and_resumed_ends_bit_for_bit_as_never_interrupted(muon, world, tmp_path):
    """Ctrl-C just before the checkpoint at iteration 45 (the one at 30 is kept), then the same command: both
    optimizers' states come back from pretrain_ckpt.pt, Muon's momentum buffers included."""
    out = world_copy(world, tmp_path / "cut")

    def print_then_stop(*args, **kw):
        print(*args, **kw)
        if args and str(args[0]).startswith("iter 45/"):
            raise KeyboardInterrupt                                     # what Ctrl-C raises
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(pretrain_loop, "print", print_then_stop, raising=False)
        with pytest.raises(SystemExit) as e:
            train.main(MUON + [f"--out_dir={out}", "--stage=pretrain"])
    assert e.value.code == 130 and not os.path.exists(os.path.join(out, "pretrain.json"))
    state = torch.load(os.path.join(out, "pretrain_ckpt.pt"), weights_only=True)
    assert state["iter"] == 30 and len(state["opt"]) == 2 and state["opt"][0]["state"]   # Muon's momentum saved
    # The same command again.
    train.main(MUON + [f"--out_dir={out}", "--stage=pretrain"])
    strip = lambda d: {k: v for k, v in d.items() if k not in ("seconds", "tokens_per_second")}
    assert strip(store.load_json(os.path.join(out, "pretrain.json"))) == strip(muon["summary"])
    weights = torch.load(os.path.join(out, "pretrain.pt"), weights_only=True)["model"]
    assert weights.keys() == muon["weights"].keys()
    assert all(torch.equal(weights[k], muon["weights"][k]) for k in weights)
    # The next stage takes a Muon-pretrained model as it takes an AdamW one (the smoke preset's).
    train.main(MUON + [f"--out_dir={out}", "--stage=reference"])
    assert store.load_json(os.path.join(out, "stages.json"))["reference"]["inputs"]["pretrain.pt"] == \
        store.file_hash(os.path.join(out, "pretrain.pt"))


def test_a_bad_optimizer_is_one_line_exit_2_and_writes_nothing(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        train.main(SMOKE + [f"--out_dir={tmp_path}", "--optimizer=bogus"])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and err == "error: bad value for --optimizer: 'bogus' (choose adamw, muon)"
    assert not os.listdir(tmp_path)


@pytest.mark.parametrize("flag", ["--optimizer=adamw", "--muon_lr=0.01"])
def test_a_pretrain_stage_made_under_other_optimizer_flags_is_refused(world, tmp_path, capsys, flag):
    out = world_copy(world, tmp_path / "run")
    short = override(MUON, [f"--out_dir={out}", "--max_iters=2", "--n_samples=1"])
    train.main(short + ["--stage=pretrain"])
    before = {n: store.file_hash(os.path.join(out, n)) for n in os.listdir(out) if n != ".lock"}
    with pytest.raises(SystemExit) as e:
        train.main(override(short, ["--stage=reference", flag]))
    err = capsys.readouterr().err.strip()
    name, _, new = flag[2:].partition("=")
    assert e.value.code == 2 and len(err.splitlines()) == 1 and "stage pretrain" in err and f"now --{name}={new}" in err
    assert {n: store.file_hash(os.path.join(out, n)) for n in os.listdir(out) if n != ".lock"} == before


def test_bench_bar_runs_the_pretrain_stage_of_train_py_for_each_run_of_the_grid(world, tmp_path, monkeypatch, capsys):
    """Each row is what `train.py --stage=pretrain` with that optimizer, lr and max_iters writes, on a copy of the
    world; the bar judges each at its end; a second call reuses the finished runs."""
    from lab import bench
    base = world_copy(world, tmp_path / "main")
    flags = ["--preset=smoke", "--n_samples=2", "--eval_iters=1", "--warmup_iters=1", f"--out_dir={base}"]
    res = bench.main(["--bar=adamw:3e-3:3;muon:0.05:2,3"] + flags)
    assert [(r["optimizer"], r["lr"], r["max_iters"], r["tokens"]) for r in res["runs"]] == \
        [("adamw", 3e-3, 3, 3 * 32 * 96), ("muon", 0.05, 2, 2 * 32 * 96), ("muon", 0.05, 3, 3 * 32 * 96)]
    by_hand, _ = pretrain(world, tmp_path / "by_hand", flags[:-1] + ["--optimizer=muon", "--muon_lr=0.05",
                                                                     "--max_iters=3"])
    row = res["runs"][2]
    assert (row["val_loss"], row["wellformed_rate"], row["gold_mean"]) == \
        (by_hand["val_loss"], by_hand["wellformed_rate"], by_hand["gold_mean"])
    assert store.load_json(os.path.join(base, "bench_bar.json"))["runs"] == res["runs"]
    assert not any(r["meets_bar"] for r in res["runs"]) and res["fewest_tokens"] == dict(adamw=None, muon=None)
    line = min(r["val_loss"] for r in res["runs"][1:])                       # the better muon run's loss
    monkeypatch.setattr(bench, "BAR", dict(val_loss=line, wellformed_rate=0.0))
    capsys.readouterr()
    again = bench.main(["--bar=adamw:3e-3:3;muon:0.05:2,3"] + flags)
    assert "---- stage pretrain ----" not in capsys.readouterr().out                      # nothing run again
    assert [r["val_loss"] for r in again["runs"]] == [r["val_loss"] for r in res["runs"]]
    best = min(res["runs"][1:], key=lambda r: r["val_loss"])
    assert again["fewest_tokens"] == dict(adamw=None if res["runs"][0]["val_loss"] > line else 3 * 32 * 96,
                                          muon=best["tokens"])
