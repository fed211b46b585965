"""Online DPO and TRL's IPO convention through the code `python train.py --stage=dpo` runs: each
round's pairs ordered as the judge (the reward model, or the simulated human) scores each answer
alone, at temperature 0.7; the prompts drawn as PPO draws them; a tie left out; the answers
sampled by the policy as it is after the last step, never the reference; at the first step the
reward of every answer 0 and the loss ln 2; the reference bit for bit what it was; killed with
kill -9 and run again, the files of an uninterrupted run; bad flags one line before any work;
--dpo_logps=mean's IPO loss against the formula written out over each response's tokens; the
implicit reward's held-out accuracy during the run the one its actor gives."""
import math, os, signal, subprocess, sys, time
import numpy as np
import pytest
import torch

import data, dpo, tokenizer, train
from options import online
from reward import gold_normaliser, labelled_pairs, load_scalar_model, split_pairs
from ref import load_checkpoint
from machinery import records, store
from pipeline import stages
from test_state import SMOKE, copy_run, hashes, refused
from test_dpo import T, by_hand, contents, dpo_run, smoke_pairs

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ONLINE = ["--dpo_pairs=online", "--online_rounds=4", "--online_prompts=8", "--dpo_lr=1e-3",
          "--dpo_save_every=1", "--n_eval=8"]


def judged_alone(enc, rm, prompt, tokens, judge, norm, penalty):
    """The judge's score of one answer, its row scored alone (no padding): the reward model's value
    at the last token, or the gold score in the reward model's units; less the penalty without
    end-of-text."""
    head = [enc.eot_token] + enc.encode_ordinary(prompt)
    assert tokens[:len(head)] == head
    answer = tokens[len(head):]
    ended = enc.eot_token in answer
    # An answer stops at its first end-of-text.
    assert not ended or answer.index(enc.eot_token) == len(answer) - 1
    if judge == "gold":
        s = (data.gold_score(prompt, enc.decode(answer)) - norm[0]) / norm[1]
    else:
        with torch.no_grad():
            s = rm(torch.tensor([tokens]))[0, -1].item()
    return s - penalty * (not ended)


@pytest.mark.parametrize("judge", ["reward", "gold"])
def test_each_pair_is_ordered_by_the_judge_scoring_each_answer_alone(run, judge):
    cfg = train.parse(SMOKE + [f"--out_dir={run}", "--stage=dpo", "--dpo_pairs=online",
                               f"--dpo_judge={judge}", "--online_prompts=24", f"--temperature={T}",
                               "--missing_eos_penalty=0.7"])
    enc = tokenizer.load_tokenizer(run, "bpe")
    actor, _ = load_checkpoint(os.path.join(run, "pretrain.pt"))
    rm, _ = load_scalar_model(os.path.join(run, "reward.pt"))
    norm = gold_normaliser(store.load_json(os.path.join(run, "prefs.jsonl"), lines=True))
    prompts = data.load_prompts(run)["train"]
    torch.manual_seed(3)
    pairs, info = online.round_pairs(actor, rm, enc, prompts, cfg, torch.Generator().manual_seed(5),
                                     norm)
    # The prompts PPO's draw_prompts would draw from a generator of the same seed, in order.
    drawn = torch.randint(len(prompts), (24,), generator=torch.Generator().manual_seed(5)).tolist()
    assert in_order([p["prompt"] for p in pairs], [prompts[i] for i in drawn])
    assert info["pairs/n"] == len(pairs) and info["pairs/n"] + info["pairs/ties"] == 24
    # The gold scores are coarse: a gold judge ties some answers (a third of them here).
    assert len(pairs) >= (20 if judge == "reward" else 10)
    agree = 0
    for p in pairs:
        chosen = judged_alone(enc, rm, p["prompt"], p["chosen"], judge, norm, 0.7)
        rejected = judged_alone(enc, rm, p["prompt"], p["rejected"], judge, norm, 0.7)
        assert chosen > rejected - 1e-5
        head = len(enc.encode_ordinary(p["prompt"])) + 1
        for half in ("chosen", "rejected"):
            gold = data.gold_score(p["prompt"], enc.decode(p[half][head:]))
            assert p[f"gold_{half}"] == pytest.approx(gold, abs=1e-9)
        agree += p["gold_chosen"] > p["gold_rejected"]
    assert info["pairs/judge_agrees_with_gold"] == pytest.approx(agree / len(pairs))


def in_order(kept, drawn):
    """True when `kept` is `drawn` with some items left out, the rest in their order."""
    rest = iter(drawn)
    return all(any(x == y for y in rest) for x in kept)


def test_a_tie_is_no_pair(run, monkeypatch):
    cfg = train.parse(SMOKE + [f"--out_dir={run}", "--stage=dpo", "--dpo_pairs=online",
                               "--online_prompts=6"])
    enc = tokenizer.load_tokenizer(run, "bpe")
    actor, _ = load_checkpoint(os.path.join(run, "pretrain.pt"))

    rm, _ = load_scalar_model(os.path.join(run, "reward.pt"))

    def even(judge, proxy, gold, penalty, norm):
        return torch.zeros(len(proxy))
    monkeypatch.setattr(online, "judge_scores", even)
    pairs, info = online.round_pairs(actor, rm, enc, data.load_prompts(run)["train"], cfg,
                                     torch.Generator().manual_seed(1), (0.0, 1.0))
    assert pairs == [] and info["pairs/ties"] == 6 and info["pairs/n"] == 0
    assert "pairs/judge_agrees_with_gold" not in info


def test_rounds_that_all_tie_take_no_step_and_the_run_ends(run, tmp_path, monkeypatch):
    """Every answer judged alike: each round has no pair, so no step; the run still ends, its actor
    the pretrained model and its rows without a loss."""
    def even(judge, proxy, gold, penalty, norm):
        return torch.zeros(len(proxy))
    monkeypatch.setattr(online, "judge_scores", even)
    summary, rows = dpo_run(run, tmp_path, *ONLINE, "--dpo_eval_every=2", "--eval_n=8")
    assert [r["pairs/n"] for r in rows] == [0, 0, 0, 0] and not any("loss" in r for r in rows)
    actor, _ = load_checkpoint(os.path.join(tmp_path, "dpo_actor.pt"))
    pretrained, _ = load_checkpoint(os.path.join(run, "pretrain.pt"))
    assert all(torch.equal(a, b) for a, b in zip(actor.parameters(), pretrained.parameters()))
    assert summary["final"]["kl"] == 0


def test_online_dpo_samples_with_the_policy_as_trained_and_starts_at_reward_0(run, tmp_path, monkeypatch):
    """The answers of round k come from the actor after k - 1 steps (never the reference, never the
    pretrained model again); at the first step the policy is the reference, so every implicit
    reward is 0 and the loss ln 2; ref.pt and the rest of the folder are untouched."""
    before = hashes(run)
    seen = []
    real = online.round_pairs

    def watched(actor, *a, **kw):
        seen.append(torch.cat([p.detach().flatten() for p in actor.parameters()]).clone())
        return real(actor, *a, **kw)
    monkeypatch.setattr(online, "round_pairs", watched)
    summary, rows = dpo_run(run, tmp_path, *ONLINE, "--dpo_eval_every=2", "--eval_n=8")
    assert hashes(run) == before
    pretrained, _ = load_checkpoint(os.path.join(run, "pretrain.pt"))
    assert torch.equal(seen[0], torch.cat([p.flatten() for p in pretrained.parameters()]))
    assert all(not torch.equal(a, b) for a, b in zip(seen, seen[1:]))       # a step between rounds
    first = rows[0]
    assert first["rewards/chosen"] == 0 and first["rewards/rejected"] == 0
    assert first["loss"] == pytest.approx(math.log(2), abs=1e-6)
    assert [r["step"] for r in rows] == [1, 2, 3, 4] and all("epoch" not in r for r in rows)
    for r in rows:
        assert r["pairs/n"] + r["pairs/ties"] == 8 and 0 <= r["pairs/judge_agrees_with_gold"] <= 1
        assert r["val/response_length"] > 0
    evals = [r for r in rows if "eval/kl" in r]
    assert [r["step"] for r in evals] == [2, 4]
    assert all(0 <= r["eval/implicit_acc_noisy"] <= 1 for r in evals)
    assert summary["steps"] == 4 and summary["final"]["kl"] > 0


def test_without_the_reference_the_first_reward_is_the_policy_s_log_prob(run, tmp_path):
    _, rows = dpo_run(run, tmp_path, *ONLINE, "--dpo_reference=none", "--dpo_beta=0.3")
    first = rows[0]
    assert first["rewards/chosen"] == pytest.approx(0.3 * first["logps/chosen"], rel=1e-6)
    assert first["rewards/chosen"] < 0


def test_killed_with_kill_9_and_run_again_it_ends_with_the_uninterrupted_files(run, tmp_path, capsys):
    """A real kill -9 of `python train.py --stage=dpo --dpo_pairs=online` once two rounds are logged;
    the same command again resumes (the policy, its optimizer, the prompts' generator and the
    sampling stream) and leaves the files an uninterrupted run leaves."""
    argv = SMOKE + ["--stage=dpo"] + ONLINE
    whole = copy_run(run, tmp_path / "whole")
    train.main(argv + [f"--out_dir={whole}", f"--threads={torch.get_num_threads()}"])
    out = copy_run(run, tmp_path / "killed")
    # The same torch threads as this process's (a record holds them: other threads, another run).
    threads = f"--threads={torch.get_num_threads()}"
    p = subprocess.Popen([sys.executable, "train.py", *argv, f"--out_dir={out}", threads], cwd=ROOT,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    log = os.path.join(out, "dpo_metrics.jsonl")
    deadline = time.time() + 300
    while not (os.path.exists(log) and len(open(log).read().splitlines()) >= 2):
        assert p.poll() is None and time.time() < deadline
        time.sleep(0.01)
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    assert not os.path.exists(os.path.join(out, "dpo.json"))
    capsys.readouterr()
    train.main(argv + [f"--out_dir={out}", threads])
    assert "dpo: resuming" in capsys.readouterr().out
    assert contents(out) == contents(whole)


@pytest.mark.parametrize("flags, why", [
    (["--dpo_pairs=online", "--dpo_epochs=2"], "--dpo_epochs=2.0 has no effect with --dpo_pairs="),
    (["--dpo_pairs=online", "--dpo_batch_size=8"], "has no effect"),
    (["--dpo_judge=gold"], "--dpo_judge=gold has no effect with --dpo_pairs=offline"),
    (["--online_rounds=5"], "has no effect"),
    (["--dpo_pairs=online", "--online_rounds=0"], "--online_rounds"),
    (["--dpo_pairs=online", "--online_prompts=0"], "--online_prompts"),
    (["--dpo_pairs=both"], "choose offline, online"),
    (["--dpo_logps=avg"], "choose sum, mean")])
def test_bad_online_flags_are_one_line_before_any_work(run, tmp_path, capsys, flags, why):
    out = copy_run(run, tmp_path)
    before = hashes(out)
    assert why in refused(SMOKE + [f"--out_dir={out}", "--stage=dpo", *flags], capsys)
    assert hashes(out) == before


def test_trl_s_ipo_averages_each_response_s_log_ratio_over_its_tokens(run):
    """--dpo_logps=mean against the formula written out: for each half, the token log-probs (each
    response's own row, one full forward) averaged over its tokens and its end-of-text, the
    reference's likewise; h the difference of the chosen's and the rejected's averaged log-ratios;
    the loss (h - 1/(2τ))². The policy is not the reference here (another checkpoint), so h is not
    0."""
    enc, pairs = smoke_pairs(run)
    actor, _ = load_checkpoint(os.path.join(run, "pretrain.pt"))
    ref, _ = load_checkpoint(os.path.join(run, "pretrain.pt"))
    with torch.no_grad():
        for p in actor.parameters():
            p.add_(0.01 * torch.randn_like(p))
    actor.eval()
    ref.eval()
    cfg = train.parse(SMOKE + ["--dpo_loss=ipo", "--ipo_tau=0.25", "--dpo_logps=mean"]).dpo
    q, qm, resp, mask = dpo.pair_tensors(enc, pairs)
    with torch.no_grad():
        policy = dpo.pair_logprobs(dpo.sequence_logprobs(actor, q, qm, resp, mask, T, True))
        reference = dpo.pair_logprobs(dpo.sequence_logprobs(ref, q, qm, resp, mask, T, True))
        losses = dpo.dpo_losses(dpo.margins(policy, reference, cfg), cfg)
    for i, pair in enumerate(pairs):
        ratio = {}
        for half in ("chosen", "rejected"):
            n = len(pair[half]) - len(enc.encode_ordinary(pair["prompt"])) - 1
            ratio[half] = (by_hand(actor, enc, pair, half) - by_hand(ref, enc, pair, half)) / n
        h = ratio["chosen"] - ratio["rejected"]
        assert losses[i].item() == pytest.approx((h - 1 / (2 * 0.25)) ** 2, rel=1e-4, abs=1e-6)


def test_the_implicit_accuracy_during_the_run_is_the_one_its_actor_gives(run, tmp_path):
    """Offline, 2 epochs' worth of steps cut short, IPO both ways: the last row's eval/implicit_*
    equal dpo.implicit_accuracy of dpo_actor.pt on the first --eval_n held-out pairs; the summed
    and the averaged conventions give other numbers."""
    got = {}
    for logps in ("sum", "mean"):
        flags = ["--dpo_loss=ipo", "--dpo_epochs=0.3", "--dpo_lr=1e-3", "--dpo_eval_every=4",
                 "--eval_n=40", f"--dpo_logps={logps}"]
        summary, rows = dpo_run(run, tmp_path / logps, *flags)
        cfg = train.parse(SMOKE + [f"--out_dir={run}", "--stage=dpo", *flags])
        pairs = labelled_pairs(store.load_json(os.path.join(run, "prefs.jsonl"), lines=True))
        seed = records.load_records(run)["reward"]["config"]["seed"]
        val, _ = split_pairs(pairs, cfg.reward.rm_val_frac, np.random.default_rng(seed))
        actor, _ = load_checkpoint(os.path.join(tmp_path / logps, "dpo_actor.pt"))
        ref = stages.load_reference(os.path.join(run, "ref.pt"), "cpu")
        enc = tokenizer.load_tokenizer(run, "bpe")
        acc = dpo.implicit_accuracy(actor, ref, enc, val[:40], cfg.dpo, cfg.run.temperature)
        last = rows[-1]
        assert last["eval/implicit_acc_noisy"] == pytest.approx(acc["acc_noisy"], abs=1e-9)
        assert last["eval/implicit_acc_gold"] == pytest.approx(acc["acc_gold"], abs=1e-9)
        got[logps] = (rows[-1]["logps/chosen"], summary["final"]["kl"])
    assert got["sum"][0] < got["mean"][0] < 0       # a sum over tokens is below their mean
