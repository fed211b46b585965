"""End to end at --preset=smoke, through the code `python train.py` runs: every stage, the PPO loop's behaviour
(KL 0 and ratio 1 at the start, the penalty lowers the KL, the rolling reference, β), determinism, and resume."""
import copy, json, math, os, shutil, signal, statistics, subprocess, sys, time
import pytest
import torch
import train
from machinery import records, store
from pipeline import stages
from conftest import recording_controller

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def read(out, name):
    return store.load_json(os.path.join(out, name), lines=name.endswith("jsonl"))


def ppo_run(run, out, *flags, log=lambda s: None):
    """The PPO stage's own code (stages.run_ppo -> ppo.train_ppo) on the smoke run's models, into `out`."""
    cfg = train.parse(["--preset=smoke", f"--out_dir={run}", *flags])
    stages.seed_everything(cfg.run.seed)
    stamp = stages.stamp(cfg, stages.BY_NAME["ppo"])
    # No ppo.png: the smoke run draws it, and test_plots.py checks it.
    return stages.run_ppo(cfg, run, str(out), stamp, log=log, plot=False), read(str(out), "metrics.jsonl")


def no_time(rows):
    return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in rows]


def test_every_stage_wrote_its_output_and_its_record(run):
    recs = read(run, "stages.json")
    for st in stages.STAGES:
        # An optional stage (dpo) is not part of python train.py.
        assert records.outputs_intact(run, recs[st.name]) if not st.optional else st.name not in recs, st.name
    assert read(run, "config.json")["gpt"]["n_layer"] == 2 and not os.path.exists(os.path.join(run, "ppo_state.pt"))


def test_pretraining_lowers_validation_loss(run):
    vocab = read(run, "world.json")["vocab_size"]
    assert read(run, "pretrain.json")["val_loss"] < 0.7 * math.log(vocab)     # uniform guessing is log(V)


def test_metrics_are_finite_kl_starts_at_zero_and_ratio_at_one(run):
    rows = read(run, "metrics.jsonl")
    assert len(rows) == train.parse(["--preset=smoke"]).ppo.ppo_iters
    for r in rows:
        assert all(math.isfinite(v) for v in r.values()), r
        assert r["policy/ratio_dev_first"] < 1e-5           # old log-probs come from the policy that sampled
    assert rows[0]["objective/kl_exact"] == 0.0                   # actor = reference before the first update
    assert all(r["objective/kl_exact"] > 0 for r in rows[1:])     # ... and not after
    rep = read(run, "report.json")
    assert rep["pretrained"]["kl"] == 0.0 and rep["rlhf"]["kl"] > 0


def test_logged_penalty_is_the_one_applied(run, tmp_path):
    for r in read(run, "metrics.jsonl"):                    # k1 in the reward: -β · Σ_t k1_t
        assert r["objective/non_score_reward"] == pytest.approx(-r["objective/kl_coef"] * r["objective/kl"])
        assert r["objective/rlhf_reward"] == pytest.approx(r["objective/scores"] + r["objective/non_score_reward"])
    _, rows = ppo_run(run, tmp_path, "--kl_in=loss", "--kl_estimator=full", "--ppo_iters=2")
    assert all(r["objective/non_score_reward"] == 0 and r["loss/kl_avg"] >= 0 for r in rows)


def test_the_penalty_lowers_the_kl(run, tmp_path):
    """Same seed, same first rollout; a strong penalty must end nearer the reference than none at all."""
    flags = ["--kl_ctl=fixed", "--ppo_iters=6", "--ppo_lr=3e-4"]
    _, free = ppo_run(run, tmp_path / "free", *flags, "--init_kl_coef=0")
    _, held = ppo_run(run, tmp_path / "held", *flags, "--init_kl_coef=3")
    assert free[0]["objective/kl_exact"] == held[0]["objective/kl_exact"] == 0
    assert held[-1]["objective/kl_exact"] < 0.5 * free[-1]["objective/kl_exact"]


def test_rolling_reference_is_the_previous_policy(run, tmp_path):
    _, rows = ppo_run(run, tmp_path, "--ref_update=rolling", "--ppo_iters=3")
    assert rows[0]["objective/kl_penalized"] == 0                                   # iteration 1: the frozen one
    assert rows[1]["objective/kl_penalized"] == pytest.approx(rows[1]["objective/kl_exact"], rel=1e-6)  # still the start
    assert 0 < rows[2]["objective/kl_penalized"] < rows[2]["objective/kl_exact"]          # then the last iteration's


def test_reference_is_bit_identical_after_ppo(run):
    assert read(run, "ppo.json")["reference_unchanged"] is True
    pre = torch.load(os.path.join(run, "pretrain.pt"), weights_only=True)["model"]
    ref = torch.load(os.path.join(run, "ref.pt"), weights_only=True)["model"]
    act = torch.load(os.path.join(run, "actor.pt"), weights_only=True)["model"]
    assert all(torch.equal(pre[k], ref[k]) for k in pre)
    assert any(not torch.equal(pre[k], act[k]) for k in pre)          # while the actor did move


def test_beta_moves_as_the_adaptive_controller_says(run):
    cfg = train.parse(["--preset=smoke"])
    K, P = cfg.kl, cfg.ppo
    beta = K.init_kl_coef
    for r in read(run, "metrics.jsonl"):
        assert r["objective/kl_coef"] == pytest.approx(beta, rel=1e-9)
        e = min(max(r["objective/kl_penalized"] / K.kl_target - 1, -0.2), 0.2)
        beta *= 1 + e * P.rollout_batch / K.kl_horizon
    assert read(run, "ppo.json")["kl_coef_final"] == pytest.approx(beta, rel=1e-9)
    assert beta != K.init_kl_coef


def test_the_controller_is_fed_the_exact_kl(run, tmp_path, monkeypatch):
    """Not the estimator (k1 can be negative): the batch mean of the exact per-sequence KL that β controls."""
    import ppo
    fed = []
    monkeypatch.setattr(ppo, "make_kl_controller", recording_controller(ppo.make_kl_controller, fed))
    _, rows = ppo_run(run, tmp_path, "--ppo_iters=3")
    assert fed == pytest.approx([r["objective/kl_penalized"] for r in rows], rel=1e-6)
    assert fed != pytest.approx([r["objective/kl"] for r in rows], rel=1e-3)


def test_bf16_trains_in_bf16_and_ppo_still_starts_at_kl_zero(run, tmp_path):
    """--dtype=bf16 must reach the training passes (other numbers than fp32, still learning) and leave PPO exact.
    Pretraining is cut to 8 steps for both, the pairs to 160 for one reward epoch, PPO to 2 iterations, no
    figures: where the CPU emulates bf16 (no AVX512-BF16), a bf16 step costs about 15 fp32 ones."""
    short = ["--preset=smoke", "--max_iters=8", "--eval_interval=4", "--n_pairs=160", "--rm_epochs=1",
             "--ppo_iters=2", "--plots=false"]
    ref32, out = str(tmp_path / "fp32"), str(tmp_path / "bf16")
    for o in (ref32, out):
        shutil.copytree(run, o)                                  # the smoke run's world
    train.main(short + [f"--out_dir={ref32}", "--stage=pretrain"])
    train.main(short + [f"--out_dir={out}", "--dtype=bf16", "--stage=pretrain"])
    train.main(short + [f"--out_dir={out}", "--dtype=bf16"])
    fp32, bf16 = read(ref32, "pretrain.json"), read(out, "pretrain.json")
    assert bf16["val_loss"] != fp32["val_loss"] and bf16["val_loss"] < 1.05 * fp32["val_loss"]
    assert bf16["log"][-1]["val_loss"] < bf16["log"][0]["val_loss"]                    # it learns
    assert read(out, "reward.json")["acc_noisy"] != read(run, "reward.json")["acc_noisy"] or \
        read(out, "reward.json")["val_loss"] != read(run, "reward.json")["val_loss"]
    rows = read(out, "metrics.jsonl")
    assert rows[0]["objective/kl_exact"] == 0.0 and all(r["policy/ratio_dev_first"] < 1e-5 for r in rows)


def test_reward_model_beats_chance(run):
    s = read(run, "reward.json")
    assert s["acc_gold"] > 0.6 and s["n_val"] >= 100


def test_the_reward_model_scores_the_pretrained_samples_with_mean_0_and_std_1(run):
    """reward.py's gain and bias: every sample of prefs.jsonl, both of each pair (the pretrained
    policy's, training and held-out pairs alike), scored by reward.pt without padding, has mean 0
    and sample standard deviation 1 (n - 1, as gold_normaliser's)."""
    import reward
    rm, _ = reward.load_scalar_model(os.path.join(run, "reward.pt"))
    rows = read(run, "prefs.jsonl")
    samples = [tokens for r in rows for tokens in (r["tokens_a"], r["tokens_b"])]
    scores = []
    # One forward per length: the samples of that length stacked, so none is padded.
    with torch.no_grad():
        for n in sorted({len(x) for x in samples}):
            same = torch.tensor([x for x in samples if len(x) == n])
            scores += rm(same)[:, -1].tolist()
    assert len(scores) == 2 * len(rows) == 1200
    assert statistics.mean(scores) == pytest.approx(0.0, abs=1e-4)
    assert statistics.stdev(scores) == pytest.approx(1.0, abs=1e-4)


def test_same_seed_same_numbers(run, tmp_path):
    again, rows = ppo_run(run, tmp_path)
    assert no_time(rows) == no_time(read(run, "metrics.jsonl"))
    assert again["final"] == read(run, "ppo.json")["final"]


def test_ppo_interrupted_and_resumed_ends_as_if_never_interrupted(run, tmp_path):
    def stop_at_2(line):
        if line.startswith("iter 2/"):
            raise KeyboardInterrupt
    with pytest.raises(KeyboardInterrupt):
        ppo_run(run, tmp_path, log=stop_at_2)
    assert len(read(str(tmp_path), "metrics.jsonl")) == 2 and os.path.exists(tmp_path / "ppo_state.pt")
    lines = []
    again, rows = ppo_run(run, tmp_path, log=lines.append)
    assert lines[0].startswith("ppo: resuming") and not any(line.startswith("iter 1/") for line in lines)
    assert no_time(rows) == no_time(read(run, "metrics.jsonl"))      # the resumed KL is to the pretrained model
    assert again["final"] == read(run, "ppo.json")["final"]


def test_sampling_needs_no_reference(run, capsys, tmp_path):
    import sample
    for f in ["actor.pt", "tokenizer.bpe", "prompts.json"]:               # the actor alone, no ref.pt, no reward.pt
        shutil.copy(os.path.join(run, f), tmp_path / f)
    sample.main([f"--out_dir={tmp_path}"])
    assert capsys.readouterr().out.count("[gold") == 8
    sample.main([f"--out_dir={tmp_path}", r"--prompt=review: the nova pro phone\n"])
    assert "] review: the nova pro phone | " in capsys.readouterr().out         # \n became a newline


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device here")
def test_smoke_pipeline_on_cuda(tmp_path):
    train.main(["--preset=smoke", f"--out_dir={tmp_path}", "--device=cuda"])
    assert read(str(tmp_path), "metrics.jsonl")[0]["objective/kl_exact"] == 0.0
    assert read(str(tmp_path), "config.json")["run"]["device"] == "cuda"


# ---- the last edges: refused before any work (one line, exit 2, nothing written) ----
def refused_here(main, argv, capsys):
    """main(argv) must stop with exit 2 and one line on stderr; returns that line."""
    with pytest.raises(SystemExit) as e:
        main(argv)
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and len(err.splitlines()) == 1 and err.startswith("error: "), err
    return err


@pytest.mark.parametrize("flag, message", [
    ("--seed=-1", "[0,2^31)"), ("--seed=4294967296", "[0,2^31)"), ("--seed=2147483648", "[0,2^31)"),
    ("--temperature=1e-300", ">=0.01"), ("--temperature=0.0099", ">=0.01"),
    ("--pass_gold_hard=1.25", "above --pass_gold=1.25")])
def test_a_seed_numpy_refuses_and_a_temperature_that_overflows_are_refused(flag, message, tmp_path, capsys):
    out = tmp_path / "out"
    err = refused_here(train.main, ["--preset=smoke", f"--out_dir={out}", flag], capsys)
    assert flag.split("=")[0] in err and message in err
    assert not out.exists()
    train.parse(["--preset=smoke", "--seed=0", "--temperature=0.01"])           # the edges themselves pass
    train.parse(["--preset=smoke", f"--seed={2 ** 31 - 1}"])


def test_at_the_temperature_floor_sampling_and_log_probs_stay_finite_and_agree():
    """Logits of ±100 (beyond what the smoke model reaches) at T = 0.01 in fp32: the sampled tokens' log-probs are
    finite and the training path (response_logits) gives the ones generate sampled with, to 1e-3 nats."""
    from model import GPT, GPTConfig, response_logits, token_logprobs
    from sequences import pad_left
    T = 0.01
    train.parse(["--preset=smoke", f"--temperature={T}"])
    torch.manual_seed(0)
    m = GPT(GPTConfig(block_size=32, vocab_size=40, n_layer=2, n_head=2, n_embd=32)).eval()
    with torch.no_grad():
        m.lm_head.weight.mul_(100 / m(torch.tensor([[1, 2, 3]]))[0].abs().max())     # logits of about ±100
    q, qm = pad_left([[1, 2, 3, 4], [5, 6]], 0)
    with torch.no_grad():
        resp, logps = m.generate(q, 12, temperature=T, mask=qm)
        assert m(q)[0].abs().max() > 50
        again = token_logprobs(response_logits(m, q, qm, resp, T), resp)
    assert torch.isfinite(logps).all() and (logps <= 0).all()
    torch.testing.assert_close(again, logps, atol=1e-3, rtol=0)


def test_gpt2_without_tiktoken_s_cache_is_refused_before_the_world_is_made(tmp_path):
    """An empty tiktoken cache: refused at once (nothing downloaded, no world written), one line, exit 2."""
    out = tmp_path / "out"
    env = dict(os.environ, TIKTOKEN_CACHE_DIR=str(tmp_path / "empty_cache"))
    p = subprocess.run([sys.executable, "train.py", "--preset=smoke", f"--out_dir={out}", "--tokenizer=gpt2"],
                       cwd=ROOT, capture_output=True, text=True, timeout=120, env=env)
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "--tokenizer=gpt2" in p.stderr, p.stderr
    assert not out.exists() and not (tmp_path / "empty_cache").exists()


def test_ablate_and_bench_refuse_an_out_dir_that_is_a_file(tmp_path, capsys):
    from lab import ablate, bench
    f = tmp_path / "f"
    f.write_text("x")
    assert "is a file" in refused_here(ablate.main, ["--preset=smoke", "--seeds=1", f"--out_dir={f}"], capsys)
    assert "cannot be made" in refused_here(ablate.main, ["--preset=smoke", f"--out_dir={f / 'sub'}"], capsys)
    assert "is a file" in refused_here(bench.main, [f"--out_dir={f}", "--repeats=1"], capsys)
    assert "cannot be made" in refused_here(bench.main, [f"--out_dir={f / 'sub'}", "--repeats=1"], capsys)
    assert f.read_text() == "x" and os.listdir(tmp_path) == ["f"]


def test_an_fp16_reference_under_bf16_autocast_runs_ppo(run, tmp_path):
    """--ref=fp16 --dtype=bf16: the PPO stage as train.py runs it (inside bf16 autocast). The fp16 copy computes in
    fp16 (no mixed-dtype LayerNorm); its step-0 KL is small but not 0, and the final KL (to the full ref.pt weights,
    run under the same bf16 autocast as the actor) is finite."""
    from machinery.precision import autocast
    cfg = train.parse(["--preset=smoke", f"--out_dir={run}", "--dtype=bf16", "--ref=fp16", "--ppo_iters=1"])
    stages.seed_everything(cfg.run.seed)
    with autocast(cfg.run.device, cfg.run.dtype):
        s = stages.run_ppo(cfg, run, str(tmp_path), stages.stamp(cfg, stages.BY_NAME["ppo"]), log=lambda s: None)
    assert 0 < s["ref"]["kl_step0"] < 0.1 and math.isfinite(s["final"]["kl"]) and s["reference_unchanged"]


def test_a_half_precision_reference_computes_in_its_own_precision_under_bf16_autocast():
    """Reference.logits (what PPO, the evaluation and the inspect page call) of an fp16 or bf16 copy inside bf16
    autocast (--dtype=bf16) gives the numbers the same copy gives outside it (--dtype=fp32), bit for bit."""
    from model import GPT, GPTConfig
    from machinery.precision import autocast
    from sequences import pad_left
    from options.cheap_ref import make_reference, RefConfig
    from ref import Reference
    torch.manual_seed(0)
    m = GPT(GPTConfig(block_size=24, vocab_size=50, n_layer=2, n_head=2, n_embd=32)).eval()
    q, qm = pad_left([[1, 2, 3], [4]], 0)                                 # left-padded, different lengths
    resp = torch.tensor([[5, 6, 7], [8, 9, 0]])
    for kind in ("fp16", "bf16"):
        _, ref = make_reference(m, Reference(m), RefConfig(ref=kind))
        plain = ref.logits(q, qm, resp, 0.7)                              # (2, 3, 50)
        with autocast("cpu", "bf16"):
            inside = ref.logits(q, qm, resp, 0.7)
        assert torch.equal(inside, plain) and inside.dtype == torch.float32, kind


def test_grpo_on_the_gold_reward_runs_without_a_critic_and_resumes(run, tmp_path):
    """--reward=gold --advantage=grpo --kl_in=loss --kl_estimator=k3 (GRPO as published, on a verifiable reward):
    KL 0 at the first rollout, the score maximised is the gold one in the reward model's units, no critic.pt, no
    critic in ppo_state.pt, and a run interrupted after iteration 2 ends as if never interrupted."""
    flags = ["--reward=gold", "--advantage=grpo", "--kl_in=loss", "--kl_estimator=k3", "--group_size=4"]
    whole, rows = ppo_run(run, tmp_path / "whole", *flags)
    prefs = read(run, "prefs.jsonl")
    gold = [g for r in prefs for g in (r["gold_a"], r["gold_b"])]
    mean, std = sum(gold) / len(gold), statistics.stdev(gold)
    assert whole["gold_norm"] == pytest.approx(dict(mean=mean, std=std), rel=1e-9)
    assert rows[0]["objective/kl_exact"] == 0.0 and all(r["policy/ratio_dev_first"] < 1e-5 for r in rows)
    for r in rows:                              # the loss form puts nothing in the rewards: they are the gold score
        assert r["objective/non_score_reward"] == 0 and r["loss/value_avg"] == 0
        assert r["objective/rlhf_reward"] == pytest.approx((r["objective/gold"] - mean) / std
                                                           - r["objective/missing_eos"], abs=1e-5)
    assert not os.path.exists(tmp_path / "whole" / "critic.pt") and whole["critic_bytes"] == 0
    assert whole["bestofk"]["k"] == [1, 2, 4, 8, 16] and whole["entropy"] > 0

    def stop_at_3(line):
        if line.startswith("iter 3/"):
            raise KeyboardInterrupt
    with pytest.raises(KeyboardInterrupt):
        ppo_run(run, tmp_path / "resumed", *flags, log=stop_at_3)
    state = torch.load(tmp_path / "resumed" / "ppo_state.pt", weights_only=True)
    assert state["iter"] == 2 and state["critic"] is None and len(state["opts"]) == 1
    again, resumed = ppo_run(run, tmp_path / "resumed", *flags)
    assert no_time(resumed) == no_time(rows) and again["final"] == whole["final"]
    assert again["bestofk"] == whole["bestofk"]


def test_the_report_holds_best_of_k_for_both_policies(run):
    rep, ppo_json = read(run, "report.json"), read(run, "ppo.json")
    for name in ("pretrained", "rlhf"):
        b = rep[name]["bestofk"]
        assert b["k"] == [1, 2, 4, 8, 16] and b["best"] == sorted(b["best"]) and b["pass_at"] == sorted(b["pass_at"])
        # The harder threshold, on the same samples: never more passes.
        assert b["pass_gold_hard"] == 2.0 and len(b["pass_at_hard"]) == len(b["k"])
        assert all(h <= p for h, p in zip(b["pass_at_hard"], b["pass_at"]))
    assert ppo_json["critic_bytes"] > 0 and os.path.exists(os.path.join(run, "critic.pt"))
    text = open(os.path.join(run, "report.md")).read()
    assert "Best-of-k" in text and "| hard rlhf |" in text
    # What made it: the machine, the commit, the command, the stages' seconds.
    made = rep["made_by"]
    assert made["cores"] == os.cpu_count() and made["seconds"] == pytest.approx(sum(rep["seconds"].values()), abs=0.1)
    assert text.rstrip().splitlines()[-1].startswith("Made by `python ") and f"commit {made['commit']}" in text


def test_a_field_added_since_a_record_matches_at_its_default_only(run, tmp_path, capsys):
    """A record made before a field existed lacks it. Kept when the field is at its code default (the old code's
    behaviour), refused otherwise, and refused when the preset's value is not the code default either."""
    out = tmp_path / "out"
    shutil.copytree(run, out)
    records = read(str(out), "stages.json")
    for stage, field in (("ppo", "cliprange"), ("report", "pass_gold")):   # smoke keeps the code defaults
        del records[stage]["config"][field], records[stage]["defaults"][field]
    store.save_json(str(out / "stages.json"), records)
    before = {n: store.file_hash(str(out / n)) for n in ("actor.pt", "report.json")}
    train.main(["--preset=smoke", f"--out_dir={out}"])     # every stage kept: nothing made again
    assert {n: store.file_hash(str(out / n)) for n in before} == before
    err = refused_here(train.main, ["--preset=smoke", f"--out_dir={out}", "--cliprange=0.3"], capsys)
    assert "stage ppo" in err and "no --cliprange, now --cliprange=0.3" in err
    records = read(str(out), "stages.json")
    del records["ppo"]["config"]["ppo_epochs"], records["ppo"]["defaults"]["ppo_epochs"]   # smoke: 2, not 4
    store.save_json(str(out / "stages.json"), records)
    err = refused_here(train.main, ["--preset=smoke", f"--out_dir={out}"], capsys)
    assert "no --ppo_epochs, now --ppo_epochs=2" in err
    assert {n: store.file_hash(str(out / n)) for n in before} == before
