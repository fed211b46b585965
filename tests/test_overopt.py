"""Overoptimization's pieces against slow references: best-of-n's expected gold and proxy against every subset of a
small pool, the pool's best-of-n KL against every n-tuple drawn with replacement (ties broken at random), the
log n - (n - 1)/n formula as its no-tie limit and an upper bound with ties, the fits recovering known α and β and
their peaks against a grid; and, through the PPO stage's own code on the smoke run, --eval_every (the training
numbers of a run without it, bit for bit) and --stop_kl (the run ends with the actor that made the last rollout
under the limit, also after a kill)."""
import itertools, math, os, shutil
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


def traj(kl, gold, iters=None):
    """A trajectory as overopt.trajectory gives it, from the pretrained model (KL 0, gain 0)."""
    iters = iters or list(range(1, len(kl) + 1))
    return dict(kl=[0.0] + kl, gold=[0.0] + gold, proxy=[0.0] * (len(kl) + 1), iters=[0] + iters)


def empty():
    return dict(free={}, stops={}, steps={}, pairs={}, fits={}, bon={})


def row_of(lines, name):
    return next(line for line in lines if line.startswith(f"| {name} |")).split(" | ")


def test_a_frontier_cell_is_each_seeds_best_evaluation_and_one_read_far_under_its_budget_is_marked():
    trajs = {"free": {1: traj([0.8, 1.9, 3.5, 9.5, 11.0], [0.2, 0.5, -1.0, -2.0, -3.0]),
                      2: traj([0.9, 2.5, 9.8, 10.5], [0.1, 0.7, -1.0, -2.0])}}
    res = empty()
    cells = row_of(tables.free_section(trajs, ["free"], res), "free")
    # At 1 nat: 0.2 and 0.1, both read within a nat of the budget.
    assert res["free"]["free"]["best_under"] == {1: [0.2, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5],
                                                 2: [0.1, 0.1, 0.7, 0.7, 0.7, 0.7, 0.7]}
    assert cells[3].startswith("+0.15 [") and "†" not in cells[3]
    # At 2 nats seed 2's best is at 0.9 nats, more than a nat under: marked. At 10 both are near.
    assert cells[4].endswith("†") and "†" not in cells[9] and cells[2] == "4–5"
    assert res["free"]["free"]["resolved"] == [True, False, False, False, False, False, True]


def test_a_run_that_never_passes_ten_nats_says_so():
    trajs = {"slow": {1: traj([0.5, 1.0], [0.1, 0.2]), 2: traj([0.5, 12.0], [0.1, -1.0])}}
    cells = row_of(tables.free_section(trajs, ["slow"], empty()), "slow")
    assert cells[2] == "2–2 (1 of 2)" and cells[-1].endswith("† |")


def test_each_penalty_is_paired_by_seed_with_its_own_unpenalised_run_at_its_final_kl():
    free = {1: traj([1.0, 2.0, 3.0], [0.4, 0.9, 0.6]), 2: traj([1.5, 2.5, 4.0], [0.3, 0.2, 1.0])}
    # Seed 1 overshoots to 2.8 nats and comes back: its final KL is read, not its largest.
    pen = {1: traj([2.8, 2.5], [1.0, 1.5], [4, 8]), 2: traj([3.0, 3.9], [1.2, 2.0], [4, 8])}
    res = empty()
    tables.pair_section({"free": free, "long": pen}, [("long", "free")], res)
    got = res["pairs"]["long - free"]
    # Seed 1 ends at 2.5 nats: the best β = 0 evaluation at or under it is 0.9 (at 2.0); its first
    # pass through 2.5 is halfway from 0.9 to 0.6. Seed 2 ends at 3.9: best 0.3 (at 1.5).
    assert got["frontier"] == {1: 0.9, 2: 0.3}
    assert got["d_frontier"] == pytest.approx([1.5 - 0.9, 2.0 - 0.3])
    assert got["d_first"] == pytest.approx([1.5 - 0.75, 2.0 - (0.2 + 0.8 * 14 / 15)])
    # Seed 2's best under 3.9 nats is read at 1.5 (its next evaluation, 2.5, is lower): no
    # evaluation within a nat under 3.9, so the frontier there is not resolved.
    assert got["resolved"] is False


def test_the_same_kl_is_read_at_each_runs_first_pass_and_paired_by_seed():
    """At 2 nats: the β = 0 run passes it halfway between its evaluations at 1 and 3 nats, the penalty
    between 1.5 and 2.5 (then comes back under it, which a first pass ignores); a seed whose penalty
    never reaches 4 nats is left out there, and with one pair left the row is not written. 'final' reads
    the penalty's last evaluation and the β = 0 run's first pass through its KL."""
    def run(kl, proxy, gold, length, wf):
        return dict(kl=[0.0] + kl, proxy=[0.0] + proxy, gold=[0.0] + gold, length=[18.0] + length,
                    wellformed=[0.9] + wf, iters=list(range(len(kl) + 1)))
    free = {1: run([1.0, 3.0, 5.0], [0.2, 0.6, 1.0], [0.4, 0.2, 0.0], [20.0, 30.0, 32.0], [0.9, 0.7, 0.5]),
            2: run([1.0, 3.0, 5.0], [0.1, 0.5, 0.9], [0.3, 0.3, 0.1], [22.0, 26.0, 30.0], [0.9, 0.8, 0.6])}
    pen = {1: run([1.5, 2.5, 1.9], [1.0, 2.0, 2.2], [1.2, 2.2, 2.4], [16.0, 12.0, 11.0], [0.95] * 3),
           2: run([1.5, 2.5, 4.5], [1.0, 1.6, 2.0], [1.0, 1.8, 2.1], [17.0, 13.0, 12.0], [0.95] * 3)}
    res = empty()
    lines = tables.bought_section({"free": free, "long": pen}, [("long", "free")], res)
    got = res["bought"]["long - free @ 2"]
    assert got["seeds"] == [1, 2]
    assert got["d_proxy"] == pytest.approx([1.5 - 0.4, 1.3 - 0.3])
    assert got["d_gold"] == pytest.approx([1.7 - 0.3, 1.4 - 0.3])
    assert got["read"][0][0]["length"] == pytest.approx(14.0) and got["read"][0][1]["length"] == pytest.approx(25.0)
    assert "long - free @ 4" not in res["bought"]
    row = row_of(lines, "long")
    assert row[2] == "2" and row[7] == "14.5 / 24.5" and row[8].startswith("0.95 / 0.8")
    # Final: the penalty's last evaluation (seed 1 back at 1.9 nats) beside the β = 0 run's first pass there.
    final = res["bought"]["long - free @ final"]
    assert final["d_gold"] == pytest.approx([2.4 - (0.4 - 0.2 * 0.45), 2.1 - (0.3 - 0.2 * 0.75)])
    assert final["read"][0][0]["length"] == 11.0


def test_the_change_over_the_last_iterations_reads_only_them():
    iters = [0, 4, 8, 12, 16, 20, 24, 28, 32]
    # A jump before the window, then a rise of 0.05 per iteration inside it.
    gold = [0.0, 5.0, 5.0, 5.0, 5.0, 0.4, 0.6, 0.8, 1.0]
    assert overopt.change_over_last(iters, gold, span=12) == pytest.approx(0.6)
    assert overopt.change_over_last(iters[:3], gold[:3], span=4) is None
    assert overopt.at_iters(iters, gold, [4, 5, 32]) == [5.0, None, 1.0]


def test_a_stopped_run_is_counted_as_the_unpenalised_runs_prefix_only_when_it_is_one():
    free = {1: traj([1.0, 2.0, 3.0], [0.4, 0.9, 0.6]), 2: traj([1.5, 2.5], [0.3, 0.2])}
    stop = {1: traj([1.0, 2.0], [0.4, 0.9]), 2: traj([1.5], [0.31])}
    # Each seed's gain is over the pretrained model on its own stream.
    rows = [dict(condition="pretrained", seed=1, gold_mean=0.5),
            dict(condition="pretrained", seed=2, gold_mean=0.6)]
    rows += [dict(condition="stop_2", seed=s, gold_mean=g, kl=k) for s, g, k in ((1, 1.0, 1.9),
                                                                                 (2, 0.7, 1.4))]
    res = empty()
    cells = row_of(tables.stop_section({"free": free, "stop_2": stop}, rows, {"stop_2": 2},
                                       "free", res), "2 nats")
    assert res["stops"]["stop_2"]["same"] == 1 and cells[-1] == "1 of 2 |"
    assert res["stops"]["stop_2"]["gain"] == pytest.approx([0.5, 0.1])


def test_the_stop_table_says_how_far_apart_the_pretrained_models_two_streams_are():
    # Seed 2's streams are the farther apart (0.6 on the final evaluation's, 0.25 on the others').
    free = {1: dict(traj([1.0], [0.4]), start_gold=0.45),
            2: dict(traj([1.5], [0.3]), start_gold=0.25)}
    rows = [dict(condition="pretrained", seed=1, gold_mean=0.5),
            dict(condition="pretrained", seed=2, gold_mean=0.6),
            dict(condition="stop_2", seed=1, gold_mean=1.0, kl=1.9)]
    lines = tables.stop_section({"free": free}, rows, {"stop_2": 2}, "free", empty())
    assert ("streams differ by up to 0.35 gold, 0.60 on the final evaluation's and 0.25 on the "
            "evaluations' for seed 2" in "".join(lines))
    # A trajectory read from a run's metrics carries its start's gold.
    start = {"eval/gold_mean": 0.7, "eval/proxy_mean": 0.1, "eval/kl": 0.0,
             "eval/response_length": 9.0, "eval/wellformed_rate": 1.0}
    assert overopt.trajectory([], start)["start_gold"] == 0.7


def test_over_pretrained_models_the_unit_is_each_models_mean():
    res = dict(pairs={"a - f": dict(d_frontier=[1.0, 2.0, 3.0]),
                      "b - g": dict(d_frontier=[0.0, 1.0])})
    lines = tables.models_section(res, {"main": "a - f", "model2": "b - g"})
    m = res["models"]
    assert m["means"] == [2.0, 0.5] and m["between_sd"] == pytest.approx(math.sqrt(1.125))
    assert m["within_sd"] == pytest.approx((1.0 + math.sqrt(0.5)) / 2) and m["ci"][3] == 2
    # What seeds alone give a model's mean: 1/√3 and √0.5/√2 = 0.5, averaged.
    assert m["within_se"] == pytest.approx((1 / math.sqrt(3) + 0.5) / 2)
    # Two models: t with 1 degree of freedom, 12.706 standard errors each side.
    assert m["ci"][1] == pytest.approx(1.25 - 12.706 * 0.75, abs=1e-3) and "n 2 models" in lines[1]


def test_each_proxy_s_gap_is_its_own_seeds_and_its_difference_from_the_main_proxy_s_is_unpaired():
    res = dict(pairs={"a - f": dict(d_frontier=[1.0, 2.0, 3.0]), "b - g": dict(d_frontier=[0.0, 1.0, 5.0, 2.0]),
                      "c - h": dict(d_frontier=[1.0])})
    about = dict(acc_noisy=0.6, acc_gold=0.7, n_val=300, about="--rm_layers=4")
    lines = tables.proxies_section(res, {"main": dict(about, pair="a - f"), "rm4": dict(about, pair="b - g"),
                                         "rm1": dict(about, pair="c - h"), "pairs9": dict(about, pair="x - y")})
    p = res["proxies"]
    assert set(p) == {"main", "rm1", "rm4"} and p["main"]["minus_main"] is None     # a pair not run: no row
    # Welch by hand: variances of the means 1/3 and (14/3)/4, df = (va + vb)^2 / (va^2/2 + vb^2/3) = 4.42.
    va, vb = 1.0 / 3, (14.0 / 3) / 4
    df = (va + vb) ** 2 / (va ** 2 / 2 + vb ** 2 / 3)
    half = tables.t_quantile(0.975, math.floor(df * 100) / 100) * math.sqrt(va + vb)
    assert p["rm4"]["minus_main"] == pytest.approx((0.0, -half, half))
    assert df == pytest.approx(4.42, abs=0.01) and 2.571 < half / math.sqrt(va + vb) < 2.776   # t(5) < . < t(4)
    rm4 = row_of(lines, "rm4")
    assert rm4[2:5] == ["300", "0.600", "0.700"] and "undecided (n 4 and 3)" in rm4[-1]
    assert row_of(lines, "rm1")[-1] == "- |"                                      # one seed: no interval
    assert tables.proxies_section(res, {"rm4": dict(about, pair="b - g")}) == []   # no main proxy: nothing


def test_the_forms_are_fitted_per_seed_to_frontiers_and_recover_their_parameters():
    d = np.linspace(0.2, 3.0, 12)
    kl = list(d ** 2)
    trajs = {"free": {s: traj(kl, list(d * (a - 0.3 * np.log(d)))) for s, a in ((1, 0.8), (2, 1.0))}}
    res = empty()
    cells = row_of(tables.fits_section(trajs, ["free"], [], {}, res), "free")
    assert [f["alpha"] for f in res["fits"]["free"]] == pytest.approx([0.8, 1.0])
    assert cells[2] == "0.900 (0.800 to 1.000)" and cells[3] == "0.300 (0.300 to 0.300)"


def test_the_plan_pairs_each_penalty_with_the_unpenalised_run_of_its_base_lambda_and_advantage():
    from lab import ablate
    plan = ablate.overopt_plan(ablate.SUITES["overopt"])
    own = plan["own_free"]
    assert own["long_0.3"] == "free" and own["long_seq_0.1_lam1"] == "free_lam1"
    assert own["long_0.1_lam1"] == "free_lam1" and own["long_rloo_0.1"] == "free_rloo"
    assert own["long_adaptive_rm4"] == "free_rm4" and own["long_adaptive_model2"] == "free_model2"
    assert set(own) == set(plan["penalised"]) and plan["stops"]["stop_6"] == 6
    assert plan["also"] == [("long_adaptive", "free_lr_x0.25"), ("long_adaptive", "free_lr_x0.0625")]
    for pen, free in own.items():
        flags = set(ablate.CONDITIONS[pen])
        rest = set(ablate.CONDITIONS[free]) - set(ablate.NO_KL)
        # Only β and the controller differ between the two (and the placement, a β's own).
        assert {f for f in rest if "lam" in f or "advantage" in f} <= flags, pen
        assert ablate.BASES.get(pen, (None,))[0] == ablate.BASES.get(free, (None,))[0], pen


# ---- through the PPO stage, on the smoke run ----
FLAGS = ["--ppo_iters=4", "--ppo_lr=6e-4", "--kl_ctl=fixed", "--init_kl_coef=0", "--save_interval=1",
         "--plots=false"]


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


def test_the_overopt_suite_on_some_of_its_conditions_writes_its_tables_from_each_runs_evaluations(
        run, tmp_path, capsys):
    """Through ablate.py on the smoke run: the β = 0 run evaluated after every iteration, the stop and
    the penalised run beside it, and overopt.md / overopt.json read from their metrics; the key pair on a
    1-block reward model too, beside its reward model's accuracy as its own reward stage measured it. Then the
    same tables from the kept runs and kept evaluations alone, in a folder without any base; and what the
    archive lacks named."""
    from lab import ablate
    argv = ["--preset=smoke", "--suite=overopt", "--quick", "--ppo_iters=3", "--eval_every=1", "--eval_n=8",
            "--n_eval=8", "--jobs=1", "--subdir=overopt_t", f"--kept={tmp_path / 'kept'}",
            "--conditions=free,stop_1,long_adaptive,long_adaptive_rm1,free_rm1"]
    ablate.main(argv + [f"--out_dir={run}"])
    adir = os.path.join(run, "overopt_t")
    res = store.load_json(os.path.join(adir, "overopt.json"))
    free = next(iter(res["trajectories"]["free"].values()))
    metrics = store.load_json(os.path.join(adir, "free", "seed1337", "metrics.jsonl"), lines=True)
    assert set(res["trajectories"]) == {"free", "stop_1", "long_adaptive", "long_adaptive_rm1", "free_rm1"}
    assert free["iters"] == [0, 1, 2, 3] and free["kl"][1:] == [r["eval/kl"] for r in metrics]
    assert res["pairs"]["long_adaptive - free"]["kl"]
    md = open(os.path.join(adir, "overopt.md")).read()
    assert "## The unpenalised frontier, measured" in md and "| long_adaptive | free |" in md
    assert free["length"][1:] == [r["eval/response_length"] for r in metrics]
    assert free["wellformed"][1:] == [r["eval/wellformed_rate"] for r in metrics]
    assert "## What the same KL buys, with and without the penalty" in md
    assert "best-of-n (main)" in md and md.startswith("# ablate.py")
    rm1 = store.load_json(os.path.join(adir, "bases", "rm_layers1", "reward.json"))
    proxies = res["proxies"]
    assert list(proxies) == ["main", "rm1"] and proxies["rm1"]["acc_gold"] == rm1["acc_gold"]
    assert proxies["rm1"]["about"] == "--rm_layers=1" and proxies["rm1"]["n_val"] == rm1["n_val"]
    assert proxies["rm1"]["d_frontier"] == res["pairs"]["long_adaptive_rm1 - free_rm1"]["d_frontier"]
    assert "## The key pair on proxies of other quality" in md and "| rm1 | --rm_layers=1 |" in md
    bare = tmp_path / "bare"
    bare.mkdir()
    ablate.main(argv + [f"--out_dir={bare}", "--tables_only"])
    again = open(bare / "overopt_t" / "overopt.md").read()
    assert again.split("\nMade by")[0] == md.split("\nMade by")[0]
    res2 = store.load_json(str(bare / "overopt_t" / "overopt.json"))
    assert {k: v for k, v in res2.items() if k != "made_by"} == {k: v for k, v in res.items() if k != "made_by"}
    # The 1-block reward model's kept evaluations gone: named, nothing written.
    os.remove(bare / "overopt_t" / "overopt.md")
    pre = tmp_path / "kept" / "overopt_t" / "pretrained"
    for d in os.listdir(pre):
        if '"group": "rm_layers1"' in open(pre / d / "pretrained.json").read():
            shutil.rmtree(pre / d)
    with pytest.raises(SystemExit) as e:
        ablate.main(argv + [f"--out_dir={bare}", "--tables_only"])
    err = capsys.readouterr().err
    assert e.value.code != 0 and len(err.strip().splitlines()) == 1
    assert "lacks rm_layers1 (the pretrained model's evaluations for the overopt tables)" in err
    assert not (bare / "overopt_t" / "overopt.md").exists()


def test_a_fit_keeps_alpha_and_beta_to_what_they_mean_and_a_peak_to_the_data():
    """overopt.fit: a gain that only curves up gets β = 0 (not a negative bend) and no peak; a peak past the
    largest d fitted is not reported; fit_cells gives each quantity's mean and range, never an interval past 1 for
    R², and says "no peak within N nats" where no fit turns within its data."""
    from lab import tables
    d = np.linspace(0.1, 2.0, 20)
    up = 0.5 * d + 0.3 * d * d
    f = overopt.fit(d, up, "bon")
    assert f["beta"] == 0.0 and f["alpha"] > 0 and f["d_peak"] is None
    # The true bon peak is at d = 1.3 / 0.8 = 1.625: inside [0.1, 2.0], but not inside [0.1, 1.2].
    clean = 1.3 * d - 0.4 * d * d
    assert overopt.fit(d, clean, "bon")["d_peak"] == pytest.approx(1.625)
    short = d[d <= 1.2]
    assert overopt.fit(short, 1.3 * short - 0.4 * short * short, "bon")["d_peak"] is None
    # The best feasible fit: no pair (α, β >= 0) on a grid does better than the bounded fit.
    noisy = up + np.random.default_rng(0).normal(0, 0.3, d.shape)
    g = overopt.fit(d, noisy, "rl")
    second = d * np.log(d)

    def err(a, b):
        return float(((noisy - (a * d - b * second)) ** 2).sum())
    assert g["alpha"] >= 0 and g["beta"] >= 0
    grid = min(err(a, b) for a in np.linspace(0, 3, 121) for b in np.linspace(0, 3, 121))
    assert err(g["alpha"], g["beta"]) <= grid + 1e-9
    fits = [overopt.fit(d, up, "bon"), overopt.fit(d, up * 1.1, "bon")]
    cells = tables.fit_cells(fits)
    assert cells[3] == f"no peak within {2.0 ** 2:.1f} nats" and cells[4] == "-"
    assert cells[2] == tables.range_cell([f["r2"] for f in fits], "{:.2f}") and all(f["r2"] <= 1 for f in fits)


def test_each_column_s_comparisons_are_one_family_whatever_row_they_sit_in():
    """tables.family_rows: the comparison cells of each column (paired against 0, or Welch) read by family_cells
    over that column's rows together, its n after it; fewer than two values give '-'. A third row whose
    comparison would be "different" alone is "undecided" in its column's family of three."""
    from lab import tables
    a, b, c = [0.4, 0.6, 0.5], [0.1, -0.2, 0.05], [2.0, 2.1, 1.9]
    d = [0.3, 0.6, 0.4]
    rows = [["x", tables.compared(a, 0.25), tables.compared([1.0], 0.25)],
            ["y", tables.compared(b, None), dict(stats=tables.welch_stats(c, a), margin=0.25, note=" (n 3 and 3)")],
            ["z", tables.compared(d, 0.25), "-"]]
    lines, sizes = tables.family_rows(rows, "{:+.2f}")
    first = tables.family_cells([tables.paired_stats(a), tables.paired_stats(b), tables.paired_stats(d)],
                                [0.25, None, 0.25], "{:+.2f}")
    second = tables.family_cells([tables.welch_stats(c, a)], [0.25], "{:+.2f}")
    assert sizes == [3, 1] and lines == [f"| x | {first[0]} (n 3) | - |",
                                         f"| y | {first[1]} (n 3) | {second[0]} (n 3 and 3) |",
                                         f"| z | {first[2]} (n 3) | - |"]
    assert first[2].endswith("undecided") and tables.family_cells([tables.paired_stats(d)], [0.25])[0].endswith(
        "different")
