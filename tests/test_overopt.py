"""Overoptimization's pieces against slow references: best-of-n's expected gold and proxy against every subset of a
small pool, the pool's best-of-n KL against every n-tuple drawn with replacement (ties broken at random), the
log n - (n - 1)/n formula as its no-tie limit and an upper bound with ties, the fits recovering known α and β and
their peaks against a grid; and, through the PPO stage's own code on the smoke run, --eval_every (the training
numbers of a run without it, bit for bit) and --stop_kl (the run ends with the actor that made the last rollout
under the limit, also after a kill)."""
import itertools, math, os
import numpy as np
import pytest
import torch

from lab import overopt, tables
from machinery import store
from tests.test_ref import state_after
from tests.test_train import no_time, ppo_run

# Ties on purpose: proxies 0.5 (three samples, two of them the same text) and 2.0 (two different texts).
TEXTS = ["a", "b", "c", "c", "d", "e", "f"]
PROXY = [0.5, 2.0, 0.5, 0.5, -1.0, 2.0, 1.0]
GOLD = [0.3, -0.7, 1.1, 1.1, 0.0, 2.5, -0.2]


@pytest.mark.parametrize("n", [1, 2, 3, 5, 7])
def test_best_of_n_is_the_mean_over_every_subset_with_ties_broken_at_random(n):
    golds, proxies = [], []
    for subset in itertools.combinations(range(len(PROXY)), n):
        top = max(PROXY[i] for i in subset)
        tied = [i for i in subset if PROXY[i] == top]
        golds.append(sum(GOLD[i] for i in tied) / len(tied))
        proxies.append(top)
    got_gold, got_proxy = overopt.best_of_n(PROXY, GOLD, [n])
    assert got_gold[0] == pytest.approx(np.mean(golds), abs=1e-12)
    assert got_proxy[0] == pytest.approx(np.mean(proxies), abs=1e-12)


def brute_kl(proxy, outcome, n):
    """KL(best-of-n ‖ π) over every n-tuple of pool indices (each (1/N)^n), the best by proxy, ties among the
    tuple's best split evenly; π(outcome) = its share of the pool."""
    big_n = len(proxy)
    bon = {}
    for tup in itertools.product(range(big_n), repeat=n):
        top = max(proxy[i] for i in tup)
        tied = [i for i in tup if proxy[i] == top]
        for i in tied:
            bon[outcome[i]] = bon.get(outcome[i], 0.0) + big_n ** -n / len(tied)
    pi = {o: outcome.count(o) / big_n for o in set(outcome)}
    return sum(p * math.log(p / pi[o]) for o, p in bon.items() if p > 0)


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_the_pools_best_of_n_kl_is_the_one_of_every_tuple(n):
    assert overopt.kl_bon_pool(PROXY, n) == pytest.approx(brute_kl(PROXY, TEXTS, n), abs=1e-12)
    # Without ties: every sample its own outcome, equal proxies ordered by position.
    distinct = [p + 1e-9 * i for i, p in enumerate(PROXY)]
    assert overopt.kl_bon_pool(PROXY, n, ties=False) == pytest.approx(
        brute_kl(distinct, list(range(len(PROXY))), n), abs=1e-7)


def test_the_formula_is_the_no_tie_limit_and_an_upper_bound_with_ties():
    rng = np.random.default_rng(0)
    pool = rng.normal(size=5000)
    for n in (2, 4, 16):
        assert overopt.kl_bon_pool(pool, n, ties=False) == pytest.approx(overopt.kl_bon_formula(n), abs=0.01)
        # Many repeats: the true KL is well below the formula.
        rounded = np.round(pool)
        assert overopt.kl_bon_pool(rounded, n) < 0.95 * overopt.kl_bon_formula(n)
    assert overopt.kl_bon_formula(1) == 0.0 and overopt.distinct_ties(TEXTS) == 1


@pytest.mark.parametrize("form,alpha,beta", [("bon", 1.3, 0.4), ("rl", 0.9, 0.5)])
def test_the_fits_recover_known_alpha_and_beta_and_their_peak(form, alpha, beta):
    d = np.linspace(0.1, 4.0, 25)
    second = d * d if form == "bon" else d * np.log(d)
    clean = alpha * d - beta * second
    f = overopt.fit(d, clean, form)
    assert f["alpha"] == pytest.approx(alpha, abs=1e-9) and f["beta"] == pytest.approx(beta, abs=1e-9)
    assert f["r2"] == pytest.approx(1.0)
    grid = np.linspace(1e-3, 20, 200001)
    want = overopt.curve(f, grid, form)
    assert f["d_peak"] == pytest.approx(grid[want.argmax()], abs=1e-3)
    assert f["gain_peak"] == pytest.approx(want.max(), abs=1e-6)
    noisy = clean + np.random.default_rng(1).normal(0, 0.05, d.shape)
    g = overopt.fit(d, noisy, form)
    assert abs(g["alpha"] - alpha) < 0.1 and abs(g["beta"] - beta) < 0.1 and 0.9 < g["r2"] < 1.0


def test_at_kl_interpolates_at_the_first_pass_and_says_none_beyond():
    kl, gold = [0.0, 1.0, 3.0, 2.0, 5.0], [0.0, 1.0, 2.0, 9.0, 3.0]
    assert overopt.at_kl(kl, gold, [0.5, 2.0, 4.0, 6.0]) == [0.5, 1.5, pytest.approx(5.0), None]


def test_the_frontier_reading_keeps_the_best_evaluation_within_each_budget():
    """The same trajectory: a later evaluation back under a budget counts (KL 2 after 3), one over it never does,
    and the start (KL 0, gain 0) is always within."""
    kl, gold = [0.0, 1.0, 3.0, 2.0, 5.0], [0.0, -1.0, 2.0, 9.0, 3.0]
    assert overopt.best_under(kl, gold, [0.5, 1.0, 2.0, 2.5, 4.0, 6.0]) == [0.0, 0.0, 9.0, 9.0, 9.0, 9.0]


def test_the_tables_pair_the_frontier_reading_by_seed():
    """overopt_tables on two synthetic trajectories per condition: the frontier cells are each seed's best within the
    budget, and the paired difference is taken seed by seed."""
    trajs = {"no_kl": {1: dict(kl=[0.0, 3.0, 9.0], gold=[0.0, 0.5, -4.0], proxy=[0.0, 1.0, 2.0]),
                       2: dict(kl=[0.0, 1.0, 7.0], gold=[0.0, 0.1, -3.0], proxy=[0.0, 0.5, 2.0])},
             "beta": {1: dict(kl=[0.0, 4.0, 3.0], gold=[0.0, 1.0, 2.5], proxy=[0.0, 1.0, 1.5]),
                      2: dict(kl=[0.0, 2.0, 3.5], gold=[0.0, 0.7, 1.7], proxy=[0.0, 0.8, 1.2])}}
    md, res = tables.overopt_tables({}, trajs, [], ["no_kl", "beta"], kls=(2, 4))
    assert res["best_under"]["beta"] == {1: [0.0, 2.5], 2: [0.7, 1.7]}
    assert res["best_under"]["no_kl"] == {1: [0.0, 0.5], 2: [0.1, 0.1]}
    row = next(line for line in md.splitlines() if line.startswith("| beta | 2 |") and "Δ" not in line
               and line.count("|") == 7)
    # Differences per seed: at 2, 0.0 - 0.0 and 0.7 - 0.1; at 4, 2.5 - 0.5 and 1.7 - 0.1.
    assert row.split(" | ")[4].startswith("+0.300 [") and row.split(" | ")[5].startswith("+1.800 [")


# ---- through the PPO stage, on the smoke run ----
FLAGS = ["--ppo_iters=4", "--ppo_lr=6e-4", "--kl_ctl=fixed", "--init_kl_coef=0", "--save_interval=1"]


def no_eval(rows):
    return [{k: v for k, v in r.items() if not k.startswith("eval/")} for r in no_time(rows)]


def test_eval_every_evaluates_on_its_own_stream_and_changes_no_training_number(run, tmp_path):
    plain, rows = ppo_run(run, tmp_path / "plain", *FLAGS)
    with_eval, erows = ppo_run(run, tmp_path / "eval", *FLAGS, "--eval_every=2", "--eval_n=24")
    assert no_eval(erows) == no_eval(rows) and with_eval["final"] == plain["final"]
    assert [("eval/gold_mean" in r) for r in erows] == [False, True, False, True]
    assert all(r["eval/kl"] >= 0 and 0 <= r["eval/wellformed_rate"] <= 1 for r in erows[1::2])
    # The actor moved between the two evaluations, so they differ.
    assert erows[1]["eval/kl"] != erows[3]["eval/kl"]


@pytest.fixture(scope="module")
def stopped(run, tmp_path_factory):
    out = tmp_path_factory.mktemp("stop")
    _, free = ppo_run(run, out / "free", *FLAGS)
    k = [r["objective/kl_exact"] for r in free]
    assert k[0] == 0 and k[1] < k[2]
    limit = (k[1] + k[2]) / 2
    flags = [*FLAGS, f"--stop_kl={limit}"]
    lines = []
    summary, rows = ppo_run(run, out / "stopped", *flags, log=lines.append)
    good = state_after(run, out / "good", 1, *FLAGS)
    return dict(out=out, flags=flags, summary=summary, rows=rows, free=free, good=good, lines=lines)


def test_stop_kl_keeps_the_actor_that_made_the_last_rollout_under_the_limit(stopped):
    rows, good = stopped["rows"], stopped["good"]
    assert no_time(rows) == no_time(stopped["free"][:2]) and stopped["summary"]["stopped_after"] == 2
    assert any(line.startswith("ppo: stopped at iteration 3") for line in stopped["lines"])
    actor = store.load_torch(os.path.join(stopped["out"], "stopped", "actor.pt"))["model"]
    # The state after iteration 1 is the one that made iteration 2's rollout.
    assert good["actor"].keys() <= actor.keys() and all(torch.equal(actor[n], good["actor"][n]) for n in good["actor"])


@pytest.mark.parametrize("cut", ["before", "after"])
def test_a_stopped_run_killed_before_or_after_its_stop_ends_the_same(run, stopped, cut):
    out = stopped["out"] / f"cut_{cut}"
    if cut == "before":
        state_after(run, out, 1, *stopped["flags"])
    else:
        def kill(line):
            if line.startswith("ppo: stopped"):
                raise KeyboardInterrupt
        with pytest.raises(KeyboardInterrupt):
            ppo_run(run, out, *stopped["flags"], log=kill)
    again, rows = ppo_run(run, out, *stopped["flags"])
    assert no_time(rows) == no_time(stopped["rows"]) and again["final"] == stopped["summary"]["final"]
    assert again["stopped_after"] == 2


def test_a_fit_whose_peak_lies_far_beyond_the_data_says_none_instead_of_overflowing():
    d = np.linspace(0.1, 4.0, 25)
    f = overopt.fit(d, 0.4 * d - 0.0005 * d * np.log(d), "rl")
    assert f["beta"] == pytest.approx(0.0005, abs=1e-9) and f["d_peak"] is None and f["gain_peak"] is None


def test_one_text_scored_twice_is_one_outcome_in_the_pool():
    """The same response scored in two batches may differ in the last bits: bon_curve merges by text."""
    pool = {"p": [("a", 1.0, 0.5), ("a", 1.0, 0.5 + 1e-7), ("b", 0.0, 0.2), ("c", 2.0, 0.9)]}
    merged = overopt.bon_curve(pool, [1, 2])
    assert merged["kl_pool"][1] == pytest.approx(overopt.kl_bon_pool([0.5, 0.5, 0.2, 0.9], 2))
    assert merged["repeats"] == 1
