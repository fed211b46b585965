"""DPO and IPO through the code `python train.py --stage=dpo` runs, against slow references: each response scored
alone (one full forward of its own row, no padding) and summed by hand over exactly its tokens and its end-of-text,
at temperature 0.7, with left-padded prompts, truncated responses and chosen and rejected of other lengths; at the
start (actor = reference, dropout off) every DPO loss is ln 2 and every margin 0, IPO's is (1/(2τ))²; the cached
reference log-probs are the live ones; the loss is finite at a margin of -1,000; the reference is bit for bit what
it was; same seed, same numbers; killed and resumed, the numbers of an uninterrupted run; bad flags are one line and
exit 2, before any work."""
import copy, math, os, shutil
import pytest
import torch
from torch.nn import functional as F

import dpo, tokenizer, train
from reward import labelled_pairs, split_pairs
from ref import load_reference
from machinery import state, store
from pipeline import stages
from ref import load_checkpoint, save_checkpoint
from test_state import SMOKE, copy_run, hashes, refused
from conftest import TINY

T = 0.7


def smoke_pairs(run, n=12):
    """n pairs of the smoke run's prefs.jsonl, chosen to hold truncated responses and halves of other lengths."""
    pairs = labelled_pairs(store.load_json(os.path.join(run, "prefs.jsonl"), lines=True))
    enc = tokenizer.load_tokenizer(run, "bpe")
    eot = enc.eot_token
    ended = [p for p in pairs if p["chosen"][-1] == eot and p["rejected"][-1] == eot
             and len(p["chosen"]) != len(p["rejected"])]
    truncated = [p for p in pairs if p["chosen"][-1] != eot or p["rejected"][-1] != eot]
    assert ended and truncated
    return enc, (ended[:n // 2] + truncated[:n - n // 2])


def by_hand(model, enc, pair, half):
    """log π(response | prompt) of one half of a pair: its own row alone, one full forward, the log-softmax at
    temperature T of each response token (its end-of-text included where it ended) summed."""
    prompt = [enc.eot_token] + enc.encode_ordinary(pair["prompt"])
    seq = pair[half]
    assert seq[:len(prompt)] == prompt
    response = seq[len(prompt):]
    with torch.no_grad():
        logits = model(torch.tensor([seq]))[0][0, len(prompt) - 1:-1] / T       # (R, V)
    return F.log_softmax(logits, -1).gather(1, torch.tensor(response)[:, None]).sum().item()


@pytest.fixture(scope="module")
def models(run):
    actor, _ = load_checkpoint(os.path.join(run, "pretrain.pt"))
    with torch.no_grad():
        for p in actor.parameters():
            p.add_(0.02 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
    return actor.eval(), load_reference(os.path.join(run, "ref.pt"), "cpu")


@pytest.mark.parametrize("loss, beta, tau", [("dpo", 0.3, 0.1), ("ipo", 0.1, 0.25)])
def test_the_loss_against_a_loop_over_pairs_scored_one_by_one(run, models, loss, beta, tau):
    actor, ref = models
    enc, pairs = smoke_pairs(run)
    cfg = dpo.DPOConfig(dpo_loss=loss, dpo_beta=beta, ipo_tau=tau)
    q, qm, resp, mask = dpo.pair_tensors(enc, pairs)
    assert not qm.all()                                                    # the prompts are left-padded
    lp = dpo.sequence_logprobs(actor, q, qm, resp, mask, T)
    policy = torch.stack([lp[:len(pairs)], lp[len(pairs):]], 1)
    reference = dpo.reference_logprobs(ref, enc, pairs, T)
    losses = dpo.dpo_losses(dpo.margins(policy, reference, cfg), cfg)
    for i, p in enumerate(pairs):
        hc, hr = (by_hand(actor, enc, p, h) - by_hand(ref.model, enc, p, h) for h in ("chosen", "rejected"))
        h = hc - hr
        expect = (h - 1 / (2 * tau)) ** 2 if loss == "ipo" else -math.log(1 / (1 + math.exp(-beta * h)))
        assert policy[i, 0].item() == pytest.approx(by_hand(actor, enc, p, "chosen"), abs=2e-3)
        assert policy[i, 1].item() == pytest.approx(by_hand(actor, enc, p, "rejected"), abs=2e-3)
        assert losses[i].item() == pytest.approx(expect, rel=1e-3, abs=1e-4)


def test_each_half_scores_exactly_its_response_and_its_end_of_text(run, models):
    """The mask of each half holds its own response's tokens (end-of-text included where it ended) and nothing of
    the other half's length; what stands in the padding after it changes nothing."""
    actor, _ = models
    enc, pairs = smoke_pairs(run)
    q, qm, resp, mask = dpo.pair_tensors(enc, pairs)
    halves = [p["chosen"] for p in pairs] + [p["rejected"] for p in pairs]
    lengths = [len(s) - n for s, n in zip(halves, qm.sum(1).tolist())]
    assert mask.sum(1).tolist() == lengths
    lp = dpo.sequence_logprobs(actor, q, qm, resp, mask, T)
    noise = torch.where(mask, resp, torch.randint_like(resp, 5, 50))
    assert torch.equal(dpo.sequence_logprobs(actor, q, qm, noise, mask, T), lp)


def test_at_the_start_every_loss_is_ln_2_and_every_margin_0(run, models):
    _, ref = models
    enc, pairs = smoke_pairs(run)
    actor = copy.deepcopy(ref.model)
    q, qm, resp, mask = dpo.pair_tensors(enc, pairs)
    lp = dpo.sequence_logprobs(actor, q, qm, resp, mask, T)
    policy = torch.stack([lp[:len(pairs)], lp[len(pairs):]], 1)
    h = dpo.margins(policy, dpo.reference_logprobs(ref, enc, pairs, T), dpo.DPOConfig())
    assert torch.equal(h, torch.zeros_like(h))
    assert torch.allclose(dpo.dpo_losses(h, dpo.DPOConfig(dpo_beta=0.7)), torch.full_like(h, math.log(2)))
    ipo = dpo.DPOConfig(dpo_loss="ipo", ipo_tau=0.2)
    assert torch.allclose(dpo.dpo_losses(h, ipo), torch.full_like(h, (1 / (2 * 0.2)) ** 2))


def test_the_cached_reference_log_probs_are_the_live_ones(run, models):
    _, ref = models
    enc, pairs = smoke_pairs(run)
    cached = dpo.reference_logprobs(ref, enc, pairs, T)
    q, qm, resp, mask = dpo.pair_tensors(enc, pairs[:5])
    live = dpo.sequence_logprobs(ref.model, q, qm, resp, mask, T)
    assert torch.allclose(cached[:5], torch.stack([live[:5], live[5:]], 1), atol=1e-5)


def test_the_loss_is_finite_at_a_margin_of_minus_1000():
    h = torch.tensor([-1000.0, 0.0, 1000.0], requires_grad=True)
    loss = dpo.dpo_losses(h, dpo.DPOConfig(dpo_beta=5.0)).sum()
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(h.grad).all() and h.grad[0] < 0


def test_no_reference_puts_zeros_in_its_place():
    policy, reference = torch.tensor([[-3.0, -5.0]]), torch.tensor([[-4.0, -1.0]])
    assert dpo.margins(policy, reference, dpo.DPOConfig()).item() == pytest.approx(1.0 - (-4.0))
    assert dpo.margins(policy, reference, dpo.DPOConfig(dpo_reference="none")).item() == pytest.approx(2.0)


def dpo_run(run, out, *flags):
    """The dpo stage's own code (stages.run_stage -> stages.stage_dpo) on a copy of the smoke run's models."""
    cfg = train.parse(SMOKE + [f"--out_dir={run}", "--stage=dpo", *flags])
    st = stages.BY_NAME["dpo"]
    stages.run_stage(cfg, st, stages.stamp(cfg, st), base=run, run_dir=str(out), log=lambda line: None)
    return store.load_json(os.path.join(out, "dpo.json")), [
        {k: v for k, v in r.items() if not k.startswith("time/")}
        for r in store.load_json(os.path.join(out, "dpo_metrics.jsonl"), lines=True)]


FLAGS = ["--dpo_lr=1e-3", "--dpo_epochs=0.5", "--dpo_save_every=2", "--dpo_eval_every=3", "--eval_n=8",
         "--n_eval=8"]


def test_dpo_learns_logs_trl_s_names_and_leaves_the_reference_as_it_was(run, tmp_path):
    before = hashes(run)
    summary, rows = dpo_run(run, tmp_path, *FLAGS)
    assert hashes(run) == before                                         # ref.pt and the rest untouched
    first, last = rows[0], rows[-1]
    assert first["loss"] == pytest.approx(math.log(2), abs=1e-3)       # actor = reference at the first step
    assert last["rewards/margins"] > first["rewards/margins"] and last["loss"] < first["loss"]
    for r in rows:
        assert r["rewards/margins"] == pytest.approx(r["rewards/chosen"] - r["rewards/rejected"], abs=1e-6)
        assert 0 <= r["rewards/accuracies"] <= 1 and r["logps/chosen"] < 0 and r["logps/rejected"] < 0
    steps = len(rows)
    assert steps == math.ceil(0.5 * math.ceil(summary["n_train"] / 32))   # half an epoch of batches of 32
    assert [r["step"] for r in rows if "eval/kl" in r] == sorted({3, 6, steps})  # every 3 steps and the last
    assert all(r["eval/response_length"] > 0 and 0 <= r["eval/eos_rate"] <= 1 for r in rows if "eval/kl" in r)
    assert summary["final"]["kl"] > 0 and 0 <= summary["implicit"]["acc_noisy"] <= 1
    assert summary["bestofk"]["k"] and os.path.exists(tmp_path / "dpo_actor.pt")
    assert not os.path.exists(tmp_path / "dpo_state.pt")


def test_dropout_is_off_in_the_policy_s_and_the_reference_s_log_probs(run, tmp_path, monkeypatch):
    """Models made with dropout 0.5 and the actor left in training mode: the first step's loss is still ln 2
    (actor = reference), because DPO scores with dropout off on both sides."""
    load = stages.load_models

    def with_dropout(base, device):
        actor, ref, rm = load(base, device)
        for m in list(actor.modules()) + list(ref.model.modules()):
            if isinstance(m, torch.nn.Dropout):
                m.p = 0.5
            if hasattr(m, "dropout") and isinstance(m.dropout, float):
                m.dropout = 0.5
        return actor.train(), ref, rm
    monkeypatch.setattr(stages, "load_models", with_dropout)
    _, rows = dpo_run(run, tmp_path, "--dpo_epochs=0.1", "--dpo_lr=1e-3")
    assert rows[0]["loss"] == pytest.approx(math.log(2), abs=1e-5)
    assert rows[0]["rewards/margins"] == pytest.approx(0.0, abs=1e-5)


class Killed(BaseException):
    """Stands for kill -9: nothing of the run's own code handles it."""


def test_same_seed_same_numbers_and_killed_and_resumed_the_same(run, tmp_path, monkeypatch):
    whole, rows = dpo_run(run, tmp_path / "a", *FLAGS)
    again, rows_again = dpo_run(run, tmp_path / "b", *FLAGS)
    assert rows_again == rows and again["final"] == whole["final"]
    save = state.save_dpo_state

    def killed_after_step_4(path, stamp, step, *a):
        save(path, stamp, step, *a)
        if step == 4:
            raise Killed
    monkeypatch.setattr(state, "save_dpo_state", killed_after_step_4)
    with pytest.raises(Killed):
        dpo_run(run, tmp_path / "c", *FLAGS)
    monkeypatch.setattr(state, "save_dpo_state", save)
    resumed, rows_resumed = dpo_run(run, tmp_path / "c", *FLAGS)
    assert rows_resumed == rows and resumed["final"] == whole["final"]


def test_the_stage_runs_from_train_py_beside_the_pipeline(run, tmp_path, capsys):
    """--stage=dpo on a finished run: nothing else is redone or removed; `python train.py` afterwards keeps every
    stage and leaves DPO's outputs as they are."""
    out = copy_run(run, tmp_path)
    train.main(SMOKE + [f"--out_dir={out}", "--stage=dpo", "--dpo_epochs=0.2"])
    assert "dpo: held-out gold" in capsys.readouterr().out
    made = hashes(out)
    train.main(SMOKE + [f"--out_dir={out}"])
    said = capsys.readouterr().out
    assert said.count("done with this config, kept") == 7 and "stage dpo" not in said
    assert all(made[k] == v for k, v in hashes(out).items() if "dpo" in k)
    # Sampled and inspected like PPO's actor: its own page, no PPO critic's advantages on it.
    import sample
    from lab import inspect_page
    assert len(sample.load_run(str(out), "dpo").sample("review: the apex max phone\n", num_samples=2)) == 2
    inspect_page.main(SMOKE + [f"--out_dir={out}", "--inspect_n=2", f"--inspect_actor={out}/dpo_actor.pt"])
    page = open(os.path.join(out, "inspect_dpo.html")).read()
    assert "dpo_actor.pt" in page and "No PPO critic" in page and not os.path.exists(os.path.join(out, "inspect.html"))


@pytest.mark.parametrize("flag, why", [("--dpo_beta=0", ">0"), ("--ipo_tau=-1", ">0"), ("--dpo_epochs=0", ">0"),
                                       ("--dpo_batch_size=100000", "training pairs"),
                                       ("--dpo_lr=nan", "finite"), ("--dpo_loss=kto", "choose dpo, ipo"),
                                       ("--dpo_beta=1e308", "fp32"), ("--ipo_tau=1e-300", "fp32")])
def test_bad_flags_are_one_line_and_nothing_is_lost(run, tmp_path, capsys, flag, why):
    out = copy_run(run, tmp_path)
    before = hashes(out)
    assert why in refused(SMOKE + [f"--out_dir={out}", "--stage=dpo", flag], capsys)
    assert hashes(out) == before


def test_torchrun_is_refused_for_the_dpo_stage(run, tmp_path, capsys, monkeypatch):
    out = copy_run(run, tmp_path)
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert "one process" in refused(SMOKE + [f"--out_dir={out}", "--stage=dpo"], capsys)


def test_a_fraction_of_an_epoch_is_allowed_and_the_split_is_the_reward_model_s(run):
    cfg = train.parse(SMOKE + ["--dpo_epochs=0.25"])
    assert cfg.dpo.dpo_epochs == 0.25
    import numpy as np
    pairs = labelled_pairs(store.load_json(os.path.join(run, "prefs.jsonl"), lines=True))
    val, train_split = split_pairs(pairs, cfg.reward.rm_val_frac, np.random.default_rng(cfg.run.seed))
    assert len(val) == store.load_json(os.path.join(run, "reward.json"))["n_val"]
    assert len(train_split) == store.load_json(os.path.join(run, "reward.json"))["n_train"]


def test_the_suite_draws_each_arm_s_curve_from_the_start_and_reuses_finished_runs(tiny_run, tmp_path, monkeypatch,
                                                                                   capsys):
    """lab.dpo_suite on a copy of the smoke run: a DPO, a no-reference and a PPO arm over 2 seeds, each
    trajectory starting at the pretrained model (KL 0) and ending at the run's last evaluation; the tables name
    every arm with a Student-t interval; --models runs them on a reseeded pretrained model too, read with the model
    as the unit; the same command again reuses every run; with the run folders gone, it restores every run from
    where they were kept (--kept) and writes the same tables."""
    from lab import dpo_suite
    out = copy_run(tiny_run, tmp_path)
    kept = tmp_path / "kept"
    # 0.6 epochs of the tiny run's 150 training pairs: 3 steps of 32, as 0.2 of the smoke run's 450 give.
    argv = TINY + [f"--out_dir={out}", "--arms=dpo_0.1,noref_0.1,ppo_adaptive,ppo_no_kl,ppo_beta_1,online_gold_0.1", "--seeds=2",
                   "--jobs=1", "--dpo_epochs=0.6", "--ppo_iters=2", "--dpo_eval_every=2", "--eval_every=1", "--eval_n=8",
                   "--n_eval=8", "--bon=2x4", "--models=model2", f"--kept={kept}", "--online_rounds=2",
                   "--online_prompts=4", "--subdir=dpo_s"]
    dpo_suite.main(argv)
    adir = os.path.join(out, "dpo_s")
    # The online arm: its own rounds (the offline flags do not reach it), evaluated every 6 rounds and at the last.
    online = store.load_json(os.path.join(adir, "online_gold_0.1", "seed1337", "dpo_metrics.jsonl"), lines=True)
    assert [r["step"] for r in online] == [1, 2] and "eval/kl" in online[-1] and "pairs/ties" in online[0]
    result = store.load_json(os.path.join(adir, "dpo.json"))
    for arm in ("dpo_0.1", "noref_0.1", "ppo_adaptive"):
        for seed in ("1337", "1338"):
            t = result["trajectories"][arm][seed]
            name = "dpo_metrics.jsonl" if arm != "ppo_adaptive" else "metrics.jsonl"
            rows = [r for r in store.load_json(os.path.join(adir, arm, f"seed{seed}", name), lines=True)
                    if "eval/kl" in r]
            assert t["kl"][0] == pytest.approx(0.0, abs=1e-4) and t["kl"][1:] == [r["eval/kl"] for r in rows]
            assert t["gold"][0] == result["starts"][seed]["eval/gold_mean"]
    md = open(os.path.join(adir, "dpo.md")).read()
    assert "Student-t 95 % interval, n = 2" in md
    assert all(f"| {arm} | 2 |" in md for arm in ("dpo_0.1", "noref_0.1", "ppo_adaptive"))
    # On model2: its own base (world and pretraining reseeded), its runs named after it, and the models tables.
    on2 = store.load_json(os.path.join(adir, "model2", "dpo_0.1", "seed1338", "run.json"))["inputs"]
    main = store.load_json(os.path.join(adir, "dpo_0.1", "seed1338", "run.json"))["inputs"]
    assert on2["pretrain.pt"] != main["pretrain.pt"] and on2["prefs.jsonl"] != main["prefs.jsonl"]
    names = {r["condition"] for r in store.load_json(os.path.join(adir, "results.jsonl"), lines=True)}
    assert names == {f"{a}{m}" for a in ("dpo_0.1", "noref_0.1", "ppo_adaptive") for m in ("", "_model2")} | \
        {"ppo_no_kl", "ppo_beta_1", "online_gold_0.1"}
    assert not os.path.exists(os.path.join(adir, "model2", "ppo_no_kl"))      # MODEL_ARMS alone on the other models
    # Every arm but PPO's fixed βs read against their frontier, and the figure of every endpoint.
    equal = md.split("Gold at equal KL against PPO's frontier")[1].split("\n\n")[1]
    assert [line.split(" | ")[0][2:] for line in equal.splitlines()[2:]] == [
        "dpo_0.1", "noref_0.1", "ppo_adaptive", "online_gold_0.1"]
    assert os.path.getsize(os.path.join(adir, "frontier.png")) > 0
    assert "| dpo_0.1 |" in md.split("2 pretrained models (main, model2;")[1]
    assert md.count("2 pretrained models (main, model2;") == 2          # against PPO; without against with
    assert "Δ gold against ppo_adaptive" in md and "Δ gold against dpo_0.1" in md
    record = os.path.join(adir, "dpo_0.1", "seed1337", "run.json")
    made = os.path.getmtime(record)
    dpo_suite.main(argv)
    assert os.path.getmtime(record) == made
    assert open(os.path.join(adir, "dpo.md")).read().split("\nMade by")[0] == md.split("\nMade by")[0]
    assert os.path.exists(kept / "dpo_s" / "model2" / "dpo_0.1" / "seed1338")
    for d in ("dpo_0.1", "noref_0.1", "ppo_adaptive", "ppo_no_kl", "ppo_beta_1", "online_gold_0.1", "model2"):
        shutil.rmtree(os.path.join(adir, d))
    dpo_suite.main(argv)
    again = open(os.path.join(adir, "dpo.md")).read()
    assert again.split("\nMade by")[0] == md.split("\nMade by")[0]
    assert "18 of the 18 runs were made by earlier commands and kept (" in again
    assert not os.path.exists(os.path.join(adir, "dpo_0.1", "seed1337", "dpo_actor.pt"))   # nothing ran
    assert "(a kept run: its weights were not kept)" in open(os.path.join(adir, "examples.md")).read()
    # From the kept runs alone, into a folder without any base (as on a CPU that builds another): the same tables,
    # the figure also where the documents show it; with one kept run gone, it is named and nothing is written.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.setattr(dpo_suite, "FIGURES", str(tmp_path / "figures"))
    only = [a for a in argv if not a.startswith("--out_dir=")] + [f"--out_dir={elsewhere}", "--tables_only"]
    # A few of the suite's arms: the figure is not published over the suite's.
    dpo_suite.main(only)
    assert not (tmp_path / "figures").exists()
    # The suite's own arms (here FRONTIER stands for them): it is.
    arms = next(a for a in argv if a.startswith("--arms="))[len("--arms="):]
    monkeypatch.setattr(dpo_suite, "FRONTIER", tuple(arms.split(",")))
    dpo_suite.main(only)
    rebuilt = open(elsewhere / "dpo_s" / "dpo.md").read()
    assert rebuilt.split("\nMade by")[0] == md.split("\nMade by")[0]
    assert (tmp_path / "figures" / "dpo_s_frontier.png").stat().st_size > 0
    assert sorted(os.listdir(elsewhere)) == ["dpo_s"]                  # nothing trained, no base made
    # Its pretrained evaluations gone: --make_pretrained on the machine with the base makes and keeps them again.
    shutil.rmtree(kept / "dpo_s" / "pretrained")
    home = [a for a in only if not a.startswith("--out_dir=")] + [next(a for a in argv if a.startswith("--out_dir="))]
    dpo_suite.main(home + ["--make_pretrained"])
    assert open(os.path.join(adir, "dpo.md")).read().split("\nMade by")[0] == md.split("\nMade by")[0]
    shutil.rmtree(kept / "dpo_s" / "noref_0.1" / "seed1338")
    os.remove(elsewhere / "dpo_s" / "dpo.md")
    with pytest.raises(SystemExit) as e:
        dpo_suite.main(only)
    assert e.value.code != 0 and "lacks noref_0.1/seed1338 (of 18 runs" in capsys.readouterr().err
    assert not os.path.exists(elsewhere / "dpo_s" / "dpo.md")


@pytest.mark.parametrize("flag, why", [("--arms=dpo_7", "unknown arm"), ("--arms=dpo_0.1,dpo_0.1", "twice"),
                                       ("--dpo_eval_every=0", "must be > 0"), ("--seeds=0", ">= 1"),
                                       ("--models=model9", "unknown model"), ("--models=model2,model2", "twice"),
                                       ("--stage=ppo", "leave out --stage"), ("--subdir=a/b", "--subdir"),
                                       ("--dpo_logps=mean", "set by each arm"), ("--dpo_pairs=online", "each arm")])
def test_the_suite_refuses_bad_flags_before_any_work(tmp_path, capsys, flag, why):
    from lab import dpo_suite
    with pytest.raises(SystemExit) as e:
        dpo_suite.main(SMOKE + [f"--out_dir={tmp_path}", "--eval_every=1", flag])
    assert e.value.code == 2 and why in capsys.readouterr().err
    assert os.listdir(tmp_path) == []


# ---- kill anywhere, resume to the same files ----
DPO = SMOKE + ["--stage=dpo", "--dpo_epochs=0.2", "--n_eval=8"]
# What holds the wall clock: every other byte of a resumed run is the uninterrupted run's.
TIMES = ("time/elapsed", "seconds")


def contents(out):
    """Every file of a run folder as a comparable value: JSON without its wall-clock fields, the
    records without the hashes of the files that hold them, every other file by its hash."""
    got = {}
    for name in sorted(os.listdir(out)):
        p = os.path.join(out, name)
        # Other tests' folders inside the shared run are not this run's files.
        if name in (".lock", "timings.json") or os.path.isdir(p):
            continue
        if name.endswith(".jsonl"):
            got[name] = [{k: v for k, v in r.items() if k not in TIMES}
                         for r in store.load_json(p, lines=True)]
        elif name == "stages.json":
            recs = store.load_json(p)
            for rec in recs.values():
                for n in ("dpo.json", "dpo_metrics.jsonl"):
                    rec["outputs"].pop(n, None)
            got[name] = recs
        elif name == "config.json":
            got[name] = store.load_json(p)
            got[name]["run"].pop("out_dir")
        elif name.endswith(".json"):
            got[name] = {k: v for k, v in store.load_json(p).items() if k not in TIMES}
        else:
            got[name] = store.file_hash(p)
    return got


@pytest.fixture(scope="module")
def dpo_whole(run, tmp_path_factory):
    """--stage=dpo on a copy of the smoke run, uninterrupted: its folder's contents."""
    out = copy_run(run, tmp_path_factory.mktemp("dpo_whole"))
    train.main(DPO + [f"--out_dir={out}"])
    return contents(out)


def kill_at_the_last_step(monkeypatch):
    save = state.save_dpo_state

    def killed(path, stamp, step, *a):
        save(path, stamp, step, *a)
        raise Killed
    monkeypatch.setattr(state, "save_dpo_state", killed)


def kill_in_the_final_evaluation(monkeypatch):
    def killed(*a, **kw):
        raise Killed
    monkeypatch.setattr(stages, "evaluate_policy", killed)


def kill_in_the_actor_s_write(monkeypatch):
    """kill -9 half way through dpo_actor.pt: store's temporary file holds a torn write."""
    def killed(model, path, **kw):
        with open(f"{path}.tmp{os.getpid()}", "wb") as f:
            f.write(b"PK\x03\x04 torn")
        raise Killed
    monkeypatch.setattr(stages, "save_checkpoint", killed)


@pytest.mark.parametrize("kill", [kill_at_the_last_step, kill_in_the_final_evaluation,
                                  kill_in_the_actor_s_write])
def test_killed_anywhere_the_same_command_ends_with_the_uninterrupted_files(run, dpo_whole, tmp_path,
                                                                             monkeypatch, capsys, kill):
    """kill -9 at DPO's last step (its state saved, no step left to run), in its final evaluation (dpo_actor.pt
    written), or inside the write of dpo_actor.pt: the same command resumes from dpo_state.pt and leaves every
    file as the uninterrupted run does (the wall-clock fields aside), no state and no torn file behind."""
    out = copy_run(run, tmp_path)
    with monkeypatch.context() as m:
        kill(m)
        with pytest.raises(Killed):
            train.main(DPO + [f"--out_dir={out}"])
    assert os.path.exists(os.path.join(out, "dpo_state.pt"))
    capsys.readouterr()
    train.main(DPO + [f"--out_dir={out}"])
    assert "dpo: resuming" in capsys.readouterr().out
    assert contents(out) == dpo_whole
    assert not any(".tmp" in n for n in os.listdir(out)) and not os.path.exists(os.path.join(out, "dpo_state.pt"))


# ---- a finished DPO in a folder is never described wrongly ----
def test_a_dpo_flag_without_the_dpo_stage_is_refused_before_any_work(run, tmp_path, capsys):
    """--dpo_beta=0.5 on a folder whose DPO was made at 0.1: refused (it would do nothing, and config.json would
    say 0.5), nothing written."""
    out = copy_run(run, tmp_path)
    train.main(DPO + [f"--out_dir={out}"])
    before = hashes(out)
    err = refused(SMOKE + [f"--out_dir={out}", "--dpo_beta=0.5"], capsys)
    assert "--dpo_beta" in err and "--stage=dpo" in err
    assert hashes(out) == before


def test_config_json_keeps_the_flags_the_folder_s_dpo_was_made_with(run, tmp_path, capsys):
    """After --stage=dpo --dpo_epochs=0.2 --n_eval=8, a plain run (--n_eval=16) keeps DPO, and config.json still
    says 0.2 epochs: --config on it gives back the same DPO."""
    out = copy_run(run, tmp_path)
    train.main(DPO + [f"--out_dir={out}"])
    capsys.readouterr()
    train.main(SMOKE + [f"--out_dir={out}"])
    assert "stage dpo" not in capsys.readouterr().out
    assert store.load_json(os.path.join(out, "config.json"))["dpo"]["dpo_epochs"] == 0.2
    assert os.path.exists(os.path.join(out, "dpo.json"))


def test_ppo_s_flags_under_the_dpo_stage_must_be_the_folder_s(run, tmp_path, capsys):
    """--stage=dpo with a PPO flag: the folder's own value is accepted; another is refused before any work (it would
    do nothing, and config.json would describe a PPO the folder does not hold)."""
    out = copy_run(run, tmp_path)
    before = hashes(out)
    err = refused(DPO + [f"--out_dir={out}", "--advantage=rloo"], capsys)
    assert "stage ppo" in err and "--advantage=rloo" in err and "leave that flag out" in err
    assert hashes(out) == before
    train.main(DPO + [f"--out_dir={out}", "--advantage=gae"])
    assert os.path.exists(os.path.join(out, "dpo.json"))


def test_a_dpo_made_by_other_code_goes_under_a_plain_run_with_one_line(run, tmp_path, capsys, monkeypatch):
    """DPO's code edited since it was made: a plain run (which never runs DPO) removes DPO's outputs and record with
    one line naming the change, instead of keeping them silently."""
    out = copy_run(run, tmp_path)
    train.main(DPO + [f"--out_dir={out}"])
    real = stages.code_of

    def edited(st, *a):
        code = real(st, *a)
        return dict(code, **{"dpo.py:dpo_losses": "edited"}) if st.name == "dpo" else code
    monkeypatch.setattr(stages, "code_of", edited)
    capsys.readouterr()
    train.main(SMOKE + [f"--out_dir={out}"])
    said = capsys.readouterr().out
    assert "stage dpo: its code changed since it was made (dpo.py:dpo_losses)" in said
    assert not any(n.startswith("dpo") for n in os.listdir(out))
    assert "dpo" not in store.load_json(os.path.join(out, "stages.json"))


def test_an_edited_ref_pt_is_refused_before_anything_is_removed(run, tmp_path, capsys):
    """ref.pt changed and its hash forged in stages.json: --stage=ppo and --stage=dpo refuse it (it is not the
    frozen copy of pretrain.pt) before the old actor, metrics and report are removed."""
    out = copy_run(run, tmp_path)
    model, _ = load_checkpoint(os.path.join(out, "ref.pt"))
    with torch.no_grad():
        model.lm_head.weight.mul_(1.01)
    save_checkpoint(model, os.path.join(out, "ref.pt"))
    recs = store.load_json(os.path.join(out, "stages.json"))
    forged = store.file_hash(os.path.join(out, "ref.pt"))
    for rec in recs.values():
        for part in ("inputs", "outputs"):
            if "ref.pt" in rec[part]:
                rec[part]["ref.pt"] = forged
    store.save_json(os.path.join(out, "stages.json"), recs)
    before = hashes(out)
    for stage in ("ppo", "dpo"):
        err = refused(SMOKE + [f"--out_dir={out}", f"--stage={stage}"], capsys)
        assert "not the frozen copy" in err and "weight holds other values" in err
        assert hashes(out) == before


def test_a_reference_changed_during_dpo_says_dpo_and_leaves_no_log(run, tmp_path, capsys, monkeypatch):
    out = copy_run(run, tmp_path)
    real = dpo.reference_logprobs

    def tampering(ref, *a):
        with torch.no_grad():
            ref.model.lm_head.weight.add_(1e-3)
        return real(ref, *a)
    monkeypatch.setattr(dpo, "reference_logprobs", tampering)
    err = refused(DPO + [f"--out_dir={out}"], capsys, code=1)
    assert "the reference changed during DPO" in err and "weight holds other values" in err
    assert not any(n.startswith("dpo") for n in os.listdir(out))


def test_the_suite_s_run_killed_in_its_final_evaluation_resumes_whole(run, tmp_path, monkeypatch):
    """lab.dpo_suite's DPO run killed once dpo_actor.pt is written: the same job resumes from its state and its
    run.json lists every output, dpo_metrics.jsonl with them."""
    from lab import dpo_suite
    job = ("dpo_0.1", 1337, SMOKE + ["--dpo_epochs=0.2", "--n_eval=8", "--dpo_eval_every=2"], run,
           str(tmp_path / "dpo_0.1"), 0, "")
    with monkeypatch.context() as m:
        kill_in_the_final_evaluation(m)
        with pytest.raises(Killed):
            dpo_suite.dpo_run(job)
    row = dpo_suite.dpo_run(job)
    rec = store.load_json(str(tmp_path / "dpo_0.1" / "run.json"))
    assert {"dpo_actor.pt", "dpo_metrics.jsonl", "dpo.json"} <= set(rec["outputs"]) and row["steps"] == 3


def test_the_epoch_table_reads_each_run_at_the_end_of_each_pass():
    """dpo_suite.by_epoch on two runs of 2 epochs, evaluated twice an epoch: the cells are the evaluations at
    epochs 1 and 2 exactly (not the ones half way), Δ gold their difference per run; no table for one epoch."""
    from lab import dpo_suite
    from lab.tables import t_cell

    def run(gold):
        return dict(epoch=[0.0, 0.5, 1.0, 1.5, 2.0], gold=gold, kl=[0, 1, 2, 3, 4],
                    acc_noisy=[None, 0.5, 0.6, 0.7, 0.8])
    trajs = {"dpo_0.1": {1337: run([0, 9, 1.0, 9, 0.5]), 1338: run([0, 9, 2.0, 9, 1.0])}}
    md = dpo_suite.by_epoch(trajs, ["dpo_0.1"])
    row = next(line for line in md.splitlines() if line.startswith("| dpo_0.1 |")).split(" | ")
    assert row[1] == " / ".join([t_cell([1.0, 2.0]), t_cell([2, 2], "{:.1f}"), t_cell([0.6, 0.6], "{:.2f}")])
    assert row[3].rstrip(" |") == t_cell([-0.5, -1.0])
    # Epoch 2 against epoch 1, seed by seed: -0.5 and -1.0 in gold, +2 nats in each.
    from lab.tables import family_cells, paired_stats
    step = next(line for line in md.splitlines() if line.startswith("| dpo_0.1 | 1 → 2 |"))
    assert step == f"| dpo_0.1 | 1 → 2 | {family_cells([paired_stats([-0.5, -1.0])], [0.25], '{:+.2f}')[0]} | " \
        f"{t_cell([2, 2], '{:+.1f}')} |"
    one = {"dpo_0.1": {1337: dict(epoch=[0.0, 0.5, 1.0], gold=[0, 1, 2], kl=[0, 1, 2], acc_noisy=[None, 1, 1])}}
    assert dpo_suite.by_epoch(one, ["dpo_0.1"]) == ""


def test_endpoints_are_each_epoch_s_end_offline_and_the_last_evaluation_otherwise():
    """dpo_suite.endpoints: an offline run of 2 epochs gives its evaluations at epochs 1 and 2 exactly (not the ones
    half way); a PPO run and a run of less than one epoch give their last evaluation."""
    from lab import dpo_suite
    offline = dict(epoch=[0.0, 0.5, 1.0, 1.5, 2.0], kl=[0, 1, 2, 3, 4], gold=[0, 9, 1.0, 9, 0.5])
    short = dict(epoch=[0.0, 0.3, 0.6], kl=[0, 1, 2.5], gold=[0, 1, 1.5])
    ppo = dict(kl=[0, 3, 7], gold=[0, 1, 2])
    ends = dpo_suite.endpoints({"dpo_0.1": {7: offline}, "ipo_1": {7: short}, "ppo_no_kl": {7: ppo}},
                               ["dpo_0.1", "ipo_1", "ppo_no_kl"])
    assert ends == {"dpo_0.1, epoch 1": {7: (2, 1.0)}, "dpo_0.1, epoch 2": {7: (4, 0.5)}, "ipo_1": {7: (2.5, 1.5)},
                    "ppo_no_kl": {7: (7, 2)}}


def test_equal_kl_reads_each_run_against_ppo_s_frontier_of_the_same_seed_at_its_own_kl():
    """dpo_suite.at_equal_kl against the reading written out: each seed's PPO frontier (its fixed-β endpoints,
    linear between neighbours) at each run's own KL, Welch's Δ over the seeds inside PPO's range, the verdicts Holm
    over the arms compared (an arm outside PPO's range is not one of them), best-of-n at the arm's mean KL."""
    from lab import dpo_suite
    from lab.tables import three_verdicts, welch_ci, welch_stats
    ppo = {"ppo_beta_1": {1: (1.0, 0.0), 2: (2.0, 0.2), 3: (1.5, 0.1)},
           "ppo_no_kl": {1: (5.0, 1.0), 2: (6.0, 1.4), 3: (4.5, 1.3)}}
    arms = {"far, epoch 1": {1: (3.0, 2.0), 2: (4.0, 2.3), 3: (2.0, 2.1)},
            "close": {1: (2.0, 0.26), 2: (3.0, 0.52), 3: (3.5, 0.88)},
            "outside": {1: (9.0, 1.0), 2: (0.5, 1.0), 3: (9.0, 1.0)}}
    bon = dict(kl_pool=[0.0, 1.0, 3.0], gold=[0.0, 0.4, 0.8])
    md, words = dpo_suite.at_equal_kl({**ppo, **arms}, list(ppo), -0.5, bon, 0.25)

    def frontier(seed, kl):
        (k0, g0), (k1, g1) = ppo["ppo_beta_1"][seed], ppo["ppo_no_kl"][seed]
        return g0 + (g1 - g0) * (kl - k0) / (k1 - k0)
    stats = []
    for label in ("far, epoch 1", "close"):
        mine = [g for _, g in arms[label].values()]
        theirs = [frontier(s, k) for s, (k, _) in arms[label].items()]
        stats.append(welch_stats(mine, theirs))
        d, lo, hi = welch_ci(mine, theirs)
        row = next(line for line in md.splitlines() if line.startswith(f"| {label} |")).split(" | ")
        assert row[5] == f"{d:+.2f} [{lo:+.2f}, {hi:+.2f}]"
    assert [w for w, _, _ in three_verdicts(stats, 0.25)] == [words["far, epoch 1"], words["close"]]
    assert words["far, epoch 1"] == "different" and "outside" not in words
    assert "| outside | 3 |" in md and "under 2 runs inside PPO's range" in md and "one family of 2 (Holm)" in md
    # Best-of-n at the mean KL (3.0 for "far": its curve's end, 0.8 above the start's -0.5).
    far = next(line for line in md.splitlines() if line.startswith("| far, epoch 1 |"))
    assert far.endswith("| +0.30 |")


def test_the_online_table_averages_each_run_s_rounds_then_the_seeds():
    """dpo_suite.online_table: per run the mean over its rounds (rounds without the column left out), then the
    Student-t cell over seeds; offline arms have no row."""
    from lab import dpo_suite
    from lab.tables import t_cell
    metrics = {"online_0.1": {1: [{"pairs/n": 4, "pairs/ties": 0, "pairs/judge_agrees_with_gold": 1.0},
                                  {"pairs/n": 2, "pairs/ties": 2}],
                              2: [{"pairs/n": 3, "pairs/ties": 1, "pairs/judge_agrees_with_gold": 0.5}]},
               "dpo_0.1": {1: [{"loss": 0.7}]}}
    md = dpo_suite.online_table(metrics, ["dpo_0.1", "online_0.1"])
    row = next(line for line in md.splitlines() if line.startswith("| online_0.1 |"))
    assert row == ("| online_0.1 | " + t_cell([3.0, 3.0], "{:.1f}") + " | " + t_cell([1.0, 1.0], "{:.1f}") + " | "
                   + t_cell([1.0, 0.5], "{:.3f}") + " |")
    assert "| dpo_0.1 |" not in md and dpo_suite.online_table(metrics, ["dpo_0.1"]) == ""


def test_the_frontier_arms_are_every_source_and_ppo_s_fixed_betas():
    """--arms=frontier names the over-epochs suite's arms: DPO, IPO, DPO without the reference, every online arm and
    every fixed β of PPO (β = 0 included), each a known arm."""
    from lab import dpo_suite
    arms = dpo_suite.parse(["--arms=frontier", "--models="])[0]["arms"].split(",")
    assert arms == list(dpo_suite.FRONTIER) and set(dpo_suite.PPO_FIXED) < set(arms)
    assert {a for a in dpo_suite.ARMS if a.startswith("online_")} < set(arms)
