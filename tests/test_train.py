"""End to end at --preset=smoke: every stage runs, the numbers are finite, the reference never moves,
β follows its controller, the reward model beats chance, and the same seed gives the same numbers."""
import json, math, os, subprocess, sys
import pytest
import torch
import train

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def read(out, name):
    with open(os.path.join(out, name)) as f:
        return [json.loads(line) for line in f] if name.endswith("jsonl") else json.load(f)


def test_every_stage_wrote_its_output(run):
    for f in ["world.json", "tokenizer.bpe", "train.bin", "val.bin", "prompts.json", "pretrain.pt", "pretrain.json",
              "ref.pt", "prefs.jsonl", "reward.pt", "reward.json", "actor.pt", "metrics.jsonl", "ppo.json",
              "report.md", "report.json", "timings.json"]:
        assert os.path.exists(os.path.join(run, f)), f


def test_pretraining_lowers_validation_loss(run):
    vocab = read(run, "world.json")["vocab_size"]
    assert read(run, "pretrain.json")["val_loss"] < 0.7 * math.log(vocab)     # uniform guessing is log(V)


def test_metrics_are_finite_and_start_at_zero_kl(run):
    rows = read(run, "metrics.jsonl")
    assert len(rows) == train.parse_args(["--preset=smoke"])["PPOConfig"].ppo_iters
    for r in rows:
        assert all(math.isfinite(v) for v in r.values()), r
    assert rows[0]["objective/kl"] == 0.0                  # actor = reference before the first update
    rep = read(run, "report.json")
    for side in ("pretrained", "rlhf"):
        for k in train.REPORT_COLUMNS:
            assert math.isfinite(rep[side][k]), (side, k)
    assert rep["pretrained"]["kl_ref"] == 0.0


def test_reference_is_bit_identical_after_ppo(run):
    assert read(run, "ppo.json")["reference_unchanged"] is True
    pre = torch.load(os.path.join(run, "pretrain.pt"), weights_only=True)["model"]
    ref = torch.load(os.path.join(run, "ref.pt"), weights_only=True)["model"]
    act = torch.load(os.path.join(run, "actor.pt"), weights_only=True)["model"]
    assert all(torch.equal(pre[k], ref[k]) for k in pre)
    assert any(not torch.equal(pre[k], act[k]) for k in pre)          # while the actor did move


def test_beta_moves_as_the_adaptive_controller_says(run):
    C = train.parse_args(["--preset=smoke"])
    K, P = C["KLConfig"], C["PPOConfig"]
    rows = read(run, "metrics.jsonl")
    beta = K.init_kl_coef
    for r in rows:
        assert r["objective/kl_coef"] == pytest.approx(beta, rel=1e-9)
        e = min(max(r["objective/kl_penalized"] / K.kl_target - 1, -0.2), 0.2)
        beta *= 1 + e * P.rollout_batch / K.kl_horizon
    assert read(run, "ppo.json")["kl_coef_final"] == pytest.approx(beta, rel=1e-9)
    assert beta != K.init_kl_coef


def test_reward_model_beats_chance(run):
    s = read(run, "reward.json")
    assert s["acc_gold"] > 0.6 and s["n_val"] >= 100


def test_same_seed_same_numbers(run, tmp_path):
    C = train.parse_args(["--preset=smoke", f"--out_dir={run}"])
    train.seed_everything(C["RunConfig"].seed)
    again = train.run_ppo(C, run, str(tmp_path), log=lambda s: None)
    strip = lambda rows: [{k: v for k, v in r.items() if not k.startswith("time/")} for r in rows]
    assert strip(read(str(tmp_path), "metrics.jsonl")) == strip(read(run, "metrics.jsonl"))
    assert again["final"] == read(run, "ppo.json")["final"]


def test_sample_stage_needs_no_reference(run, capsys, tmp_path):
    import shutil
    for f in ["actor.pt", "tokenizer.bpe", "prompts.json"]:               # the actor alone, no ref.pt, no reward.pt
        shutil.copy(os.path.join(run, f), tmp_path / f)
    train.main(["--preset=smoke", f"--out_dir={tmp_path}", "--stage=sample"])
    assert capsys.readouterr().out.count("[gold") == 8


@pytest.mark.parametrize("args, message", [(["--nope=1"], "unknown flag"), (["--max_iters=abc"], "bad value"),
                                           (["--fresh=maybe"], "bad value"), (["--stage=bogus"], "unknown stage"),
                                           (["--preset=huge"], "unknown preset"), (["max_iters=3"], "unknown flag"),
                                           (["--kl_estimator=k9"], "bad value"), (["--device=tpu"], "bad value")])
def test_bad_flags_exit_2_with_one_line(args, message, tmp_path):
    p = subprocess.run([sys.executable, "train.py", f"--out_dir={tmp_path}"] + args, cwd=ROOT,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and message in p.stderr and len(p.stderr.strip().splitlines()) == 1
    assert not os.listdir(tmp_path)                                          # nothing started, nothing lost


def test_help_lists_every_flag():
    p = subprocess.run([sys.executable, "train.py", "--help"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0
    for name in ["--max_iters=", "--kl_ctl=", "--n_pairs=", "--ppo_iters=", "--out_dir=", "--n_embd="]:
        assert name in p.stdout
