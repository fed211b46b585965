"""What users of nanoGPT, CleanRL and TRL take for granted, through the code the pipeline runs: a run rerun from
its own config.json (with PyTorch's deterministic algorithms on: the same checkpoints on the CPU); a flag written
with a space or misspelt gets its fix; pretraining and the reward model leave a metrics file per step and a plot,
and the preferences stage prints its progress; bench syncs CUDA before reading a clock; --device=mps is taken where
torch sees it."""
import json, os, time
import pytest
import torch

import train
from machinery import records, store
from test_state import SMOKE, hashes, refused


def test_a_run_rerun_from_its_config_json_makes_the_same_run(tiny_run, tmp_path, capsys):
    """--config=out/config.json into a new folder: every stage's record holds the config the first run's holds,
    and every checkpoint is the same file (here with --deterministic too: the CPU's kernels are deterministic
    already, so the switch changes no number). On the run's own folder the same command keeps every stage."""
    out = str(tmp_path / "again")
    try:
        train.main([f"--config={tiny_run}/config.json", f"--out_dir={out}", "--deterministic"])
    finally:
        torch.use_deterministic_algorithms(False)
    first, again = (records.load_records(d) for d in (tiny_run, out))
    for name, rec in first.items():
        other = {k: v for k, v in rec["config"].items() if k != "deterministic"}
        assert {k: v for k, v in again[name]["config"].items() if k != "deterministic"} == other, name
    assert again["pretrain"]["config"]["deterministic"] is True
    for n in ("pretrain.pt", "ref.pt", "prefs.jsonl", "reward.pt", "actor.pt", "critic.pt"):
        assert store.file_hash(os.path.join(out, n)) == store.file_hash(os.path.join(tiny_run, n)), n
    capsys.readouterr()
    before = hashes(tiny_run)
    train.main([f"--config={tiny_run}/config.json"])
    assert capsys.readouterr().out.count("done with this config, kept") == 7
    assert {k: v for k, v in hashes(tiny_run).items() if not k.endswith(("config.json", "timings.json"))} == \
        {k: v for k, v in before.items() if not k.endswith(("config.json", "timings.json"))}


@pytest.mark.parametrize("content, why", [
    ('{"ppo": {"ppo_iters": "three"}}', "ppo_iters is 'three', not a finite int"),
    ('{"ppo": {"no_such_field": 1}}', "ppo.no_such_field is no flag of this code"),
    ('{"ppo": {"ppo_lr": NaN}}', "not a finite float"),
    ('[1, 2]', "not a config"),
    ("not json", "not a JSON config"),
])
def test_a_bad_config_file_is_one_line(tmp_path, capsys, content, why):
    path = tmp_path / "config.json"
    path.write_text(content)
    assert why in refused(SMOKE + [f"--config={path}", f"--out_dir={tmp_path / 'out'}"], capsys)
    assert not (tmp_path / "out").exists()


def test_later_flags_win_over_the_config_file(run):
    cfg = train.parse([f"--config={run}/config.json", "--ppo_iters=7"])
    assert cfg.ppo.ppo_iters == 7 and cfg.gpt.n_layer == 2 and cfg.run.preset == "smoke"
    assert train.parse([f"--config={run}/config.json", "--preset=default"]).gpt.n_layer == 2


@pytest.mark.parametrize("argv, hint", [
    (["--ppo_iters", "10"], "write --ppo_iters=10"),
    (["--ppo_lr"], "write --ppo_lr=VALUE"),
    (["--ppo_iter=10"], "did you mean --ppo_iters?"),
    (["--kl_estimater=k3"], "did you mean --kl_estimator?"),
    (["ppo_iters=10"], "did you mean --ppo_iters?"),
])
def test_a_space_separated_or_misspelt_flag_gets_its_fix(tmp_path, capsys, argv, hint):
    assert hint in refused(SMOKE + [f"--out_dir={tmp_path}"] + argv, capsys)


def test_pretraining_and_the_reward_model_leave_a_curve(run, capsys):
    cfg = train.parse(["--preset=smoke"])
    rows = store.load_json(os.path.join(run, "pretrain_metrics.jsonl"), lines=True)
    assert [r["iter"] for r in rows] == list(range(1, cfg.pretrain.max_iters + 1))
    assert all(r["loss"] > 0 and r["lr"] > 0 for r in rows)
    evals = [{k: r[k] for k in ("iter", "loss", "val_loss", "lr")} for r in rows if "val_loss" in r]
    assert evals == store.load_json(os.path.join(run, "pretrain.json"))["log"]
    assert [r["iter"] for r in evals][-1] == cfg.pretrain.max_iters
    steps = store.load_json(os.path.join(run, "reward_metrics.jsonl"), lines=True)
    rm = store.load_json(os.path.join(run, "reward.json"))
    assert [r["step"] for r in steps] == list(range(1, len(steps) + 1))
    assert len([r for r in steps if "val_loss" in r]) == cfg.reward.rm_epochs
    assert {k: steps[-1][k] for k in ("val_loss", "acc_noisy", "acc_gold")} == \
        {k: rm[k] for k in ("val_loss", "acc_noisy", "acc_gold")}
    assert all(0 <= r["accuracy"] <= 1 for r in steps)
    pytest.importorskip("matplotlib")
    assert os.path.getsize(os.path.join(run, "pretrain.png")) > 0 and os.path.getsize(os.path.join(run, "reward.png"))


def test_the_preferences_stage_prints_its_progress(run, tmp_path, capsys):
    import shutil
    out = tmp_path / "run"
    shutil.copytree(run, out)
    train.main(SMOKE + [f"--out_dir={out}", "--stage=preferences"])
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("preferences: ") and
             "pairs |" in line]
    n = train.parse(SMOKE).reward.n_pairs
    assert lines and lines[-1].startswith(f"preferences: {n}/{n} pairs |") and " eta 0m00s" in lines[-1]


def test_bench_syncs_cuda_before_each_clock(monkeypatch):
    """On CUDA a kernel runs after its launch returns: each clock read must follow a synchronize. The device calls
    are mocked (no GPU here): the order of syncs, clock reads and the timed work is what is checked."""
    from lab import bench
    events = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: events.append("sync"))
    clock = time.perf_counter
    monkeypatch.setattr(bench.time, "perf_counter", lambda: (events.append("clock"), clock())[1])
    bench.timed(lambda: events.append("work"), 2, device="cuda")
    assert events == ["work"] + ["sync", "clock", "work", "sync", "clock"] * 2
    events.clear()
    bench.timed(lambda: events.append("work"), 1, device="cpu")
    assert events == ["work", "clock", "work", "clock"]


def test_device_mps_is_taken_where_torch_sees_it(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    cfg = train.parse(SMOKE + ["--device=mps", f"--out_dir={tmp_path}"])
    assert cfg.run.device == "mps" and cfg.run.dtype == "fp32"
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    assert "no MPS device" in refused(SMOKE + ["--device=mps", f"--out_dir={tmp_path}"], capsys)
