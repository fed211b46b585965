"""claims.py: README's first table against a finished run. On the smoke run: a table written from its report.json,
rounded as README rounds, with intervals around it, passes both modes; in --exact a number moved past its rounding is
named and exits 1, and slack admits it; by default a number moved inside its interval (another CPU) passes, one
outside it but inside the joint band of all 12 passes with a note, and one outside the band (by any amount past its
rounding) fails; the band's coverage of a new seed is simulated; bad input is one line and exit 2. And README's own
table parses into the numbers the checker compares."""
import functools, json, os
import numpy as np
import pytest

from lab import claims

ROW = "| {name} | {own} | {own_r} | {new} | {new_r} | — |"
OWN = {"gold score (mean ± std)": ("{p[gold_mean]:.2f} ± {p[gold_std]:.2f}", "**{r[gold_mean]:.2f}** ± {r[gold_std]:.2f}"),
       "proxy score (reward model)": ("{p[proxy_mean]:+.2f}", "{r[proxy_mean]:.2f}"),
       "exact KL to reference (nats / sequence)": ("{p[kl]:.2f}", "{r[kl]:.2f}"),
       "well-formed rate": ("{p[wellformed_rate]:.3f}", "{r[wellformed_rate]:.3f}"),
       "distinct-2": ("{p[distinct_2]:.3f}", "{r[distinct_2]:.3f}"),
       "perplexity under the reference": ("{p[ref_ppl]:.2f}", "{r[ref_ppl]:.2f}")}


def interval(x, half):
    """A "mean [low, high]" cell around x, printed to 3 decimals."""
    return f"{x:.3f} [{x - half:.3f}, {x + half:.3f}]"


def smoke_table(pre, rlhf, half=0.5, centre=None):
    """README's table from a report's two policies; each interval x ± half around the run's value (or centre's)."""
    centre = centre or {}
    lines = [claims.HEADER, "|---" * claims.CELLS + "|---|"]
    for name, (own, own_r) in OWN.items():
        col = claims.ROWS[name][0]
        lines.append(ROW.format(name=name, own=own.format(p=pre), own_r=own_r.format(r=rlhf),
                                new=interval(centre.get(("pretrained", col), pre[col]), half),
                                new_r=interval(centre.get(("rlhf", col), rlhf[col]), half)))
    return "\n".join(lines) + "\n"


def smoke_readme(run, tmp_path, half=0.5, centre=None, **moved):
    with open(os.path.join(run, "report.json")) as f:
        report = json.load(f)
    rlhf = dict(report["rlhf"], **moved)
    path = tmp_path / "README.md"
    path.write_text("# smoke\n\nSome text.\n\n" + smoke_table(report["pretrained"], rlhf, half, centre)
                    + "\nOver seeds 1337-1341 (Student-t, n = 5).\n")
    return str(path), report


def test_a_table_written_from_the_run_matches_it_in_both_modes(run, tmp_path, capsys):
    path, _ = smoke_readme(run, tmp_path)
    assert claims.main([f"--out_dir={run}", f"--readme={path}", "--exact"]) == 0
    assert "14 numbers inside the run's own numbers" in capsys.readouterr().out
    assert claims.main([f"--out_dir={run}", f"--readme={path}"]) == 0
    assert "12 numbers inside a new seed's prediction intervals" in capsys.readouterr().out


def test_by_default_a_run_inside_the_intervals_passes_and_one_outside_fails(run, tmp_path, capsys):
    """Another CPU's run: every number moved, inside its interval: passes by default, fails --exact. A KL outside
    its own interval but inside the joint band (12 intervals over n = 5 seeds) passes with a note naming it; one
    outside the band, by a little (past its rounding) or by much, fails and is named."""
    with open(os.path.join(run, "report.json")) as f:
        report = json.load(f)
    moved = {k: report["rlhf"][k] + 0.3 for k in ("gold_mean", "proxy_mean", "kl", "ref_ppl")}
    path, _ = smoke_readme(run, tmp_path, **moved)
    # The table says the run moved by +0.3: the run itself is 0.3 below each centre, inside ±0.5.
    assert claims.main([f"--out_dir={run}", f"--readme={path}"]) == 0
    # No note: every number lies inside its own interval.
    assert "(+ slack 0)\n" in capsys.readouterr().out
    assert claims.main([f"--out_dir={run}", f"--readme={path}", "--exact"]) == 1
    capsys.readouterr()
    kl = report["rlhf"]["kl"]
    # The band's half: 0.5 widened for 12 intervals at once, then the printed numbers' rounding
    # (half a unit of the 3rd decimal in the mean and in the end), scaled as they are.
    f = claims.joint_factor(12, 5)
    edge = 0.5 * f + (2 * f - 1) * 0.0005
    for shift, code, note in ((0.4995, 0, False), (-0.4995, 0, False), (0.5015, 0, True), (-0.5015, 0, True),
                              (edge - 0.002, 0, True), (-edge + 0.002, 0, True), (edge + 0.002, 1, False),
                              (-edge - 0.002, 1, False), (5.0, 1, False)):
        path, _ = smoke_readme(run, tmp_path, centre={("rlhf", "kl"): kl + shift})
        assert claims.main([f"--out_dir={run}", f"--readme={path}"]) == code, shift
        out = capsys.readouterr().out.splitlines()
        assert len(out) == 1 + note + code, (shift, out)
        if note:
            assert out[0].startswith("exact KL to reference (nats / sequence), rlhf (kl): run ")
            assert "outside its own interval but inside a new seed's" in out[0]
            assert "12 numbers at once (n = 5)" in out[0]
            assert out[1].endswith("; 1 outside its own 95 % interval")
        if code:
            assert out[0].startswith("exact KL to reference (nats / sequence), rlhf (kl): run ")
            assert "outside a new seed's" in out[0] and out[1].startswith("1 of 12 numbers")
    # Slack widens the band's ends.
    assert claims.main([f"--out_dir={run}", f"--readme={path}", "--slack=4.0"]) == 0
    capsys.readouterr()


def pretrained_kl_fixed(table, kl):
    """The table with the pretrained model's KL interval printed as README prints it: the same on every seed."""
    lines = table.splitlines()
    i = next(i for i, line in enumerate(lines) if line.startswith("| exact KL"))
    cells = lines[i].split(" | ")
    cells[3] = f"{kl:.3f} [{kl:.3f}, {kl:.3f}]"
    lines[i] = " | ".join(cells)
    return "\n".join(lines) + "\n"


def test_a_number_the_same_on_every_seed_is_checked_as_printed_and_n_comes_from_readme(run, tmp_path, capsys):
    """The pretrained model's KL is the same on every seed (README: [0.00, 0.00]): no band widens it and it counts
    out of the Bonferroni m (11 intervals); n is README's "Student-t, n = N": more seeds, a narrower band. A README
    that does not say n is refused."""
    with open(os.path.join(run, "report.json")) as f:
        report = json.load(f)
    path = tmp_path / "README.md"
    kl, kl0 = report["rlhf"]["kl"], report["pretrained"]["kl"]
    for n in (5, 10):
        f = claims.joint_factor(11, n)
        edge = 0.5 * f + (2 * f - 1) * 0.0005
        for shift, code in ((edge - 0.002, 0), (edge + 0.002, 1)):
            table = smoke_table(report["pretrained"], report["rlhf"], centre={("rlhf", "kl"): kl + shift})
            path.write_text(pretrained_kl_fixed(table, kl0) + f"\n(Student-t, n = {n})\n")
            assert claims.main([f"--out_dir={run}", f"--readme={path}"]) == code, (n, shift)
            said = capsys.readouterr().out
            assert f"widened {f:.2f}x for 11 numbers at once (n = {n})" in said
    assert claims.joint_factor(11, 10) < claims.joint_factor(11, 5)
    # The fixed number itself: only its rounding is allowed.
    moved = dict(report, pretrained=dict(report["pretrained"], kl=kl0 + 0.002))
    out = tmp_path / "out"
    out.mkdir()
    (out / "report.json").write_text(json.dumps(moved))
    assert claims.main([f"--out_dir={out}", f"--readme={path}"]) == 1
    assert "exact KL to reference (nats / sequence), pretrained (kl): run " in capsys.readouterr().out
    table = smoke_table(report["pretrained"], report["rlhf"])
    for prose in ("", "(Student-t, n = 1)"):
        path.write_text(table + "\n" + prose + "\n")
        with pytest.raises(SystemExit) as e:
            claims.main([f"--out_dir={run}", f"--readme={path}"])
        err = capsys.readouterr().err
        assert e.value.code == 2 and "Student-t, n = N" in err and err.count("\n") == 1


def test_the_joint_factor_is_bonferronis_t_ratio():
    """Against quantiles computed elsewhere (mpmath): t(0.975, 4) = 2.7764, t(1 - 0.025/11, 4) = 5.7465 and
    t(1 - 0.025/12, 4) = 5.8853, t(1 - 0.025/11, 9) = 3.7513 and t(0.975, 9) = 2.2622; one interval alone is not
    widened."""
    assert claims.joint_factor(11, 5) == pytest.approx(5.7465 / 2.7764, abs=2e-4)
    assert claims.joint_factor(12, 5) == pytest.approx(5.8853 / 2.7764, abs=2e-4)
    assert claims.joint_factor(11, 10) == pytest.approx(3.7513 / 2.2622, abs=2e-4)
    assert claims.joint_factor(1, 5) == 1.0


@pytest.mark.parametrize("change, why", [
    ("twice", "appears twice"), ("n_twice", "found: 2, 5)"), ("n_huge", "2 <= N <= 10000"),
    ("n_before", "found: none"), ("mean_outside", "low <= mean <= high")])
def test_a_readme_that_would_loosen_the_band_is_refused(run, tmp_path, capsys, change, why):
    """A row given twice (it would raise m and widen every interval), two n or a huge one under the table, an n only
    before it, a mean outside its own interval: one line, exit 2."""
    path, _ = smoke_readme(run, tmp_path)
    text = open(path).read()
    lines = text.splitlines()
    if change == "twice":
        i = next(i for i, line in enumerate(lines) if line.startswith("| distinct-2"))
        text = "\n".join(lines[:i + 1] + [lines[i]] + lines[i + 1:]) + "\n"
    elif change == "n_twice":
        text = text.replace("(Student-t, n = 5).", "(Student-t, n = 5; Student-t, n = 2).")
    elif change == "n_huge":
        text = text.replace("n = 5", "n = " + "9" * 400)
    elif change == "n_before":
        text = "Over 5 seeds (Student-t, n = 5).\n\n" + text.replace(" (Student-t, n = 5).", ".")
    else:
        i = next(i for i, line in enumerate(lines) if line.startswith("| distinct-2"))
        cells = lines[i].split(" | ")
        cells[3] = "9.000 [0.100, 0.900]"
        lines[i] = " | ".join(cells)
        text = "\n".join(lines) + "\n"
    open(path, "w").write(text)
    with pytest.raises(SystemExit) as e:
        claims.main([f"--out_dir={run}", f"--readme={path}"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and why in err and err.count("\n") == 1, err


@pytest.mark.parametrize("name", ["normal", "gamma6"])
def test_a_new_seed_passes_the_default_check_95_percent_of_the_time(name):
    """Simulated through claims.differences: README's 12 numbers, 11 of them over 5 seeds (normal, or gamma with
    shape 6, skewed) written as seeds.py writes README's table (tables.t_prediction), the pretrained model's KL 0 on
    every seed; a 6th seed as the run. The joint band holds all 12 at once 94.4-95.8 % of the time for the normal,
    90.5-93.5 % for the skewed one; each number's own 95 % interval alone would fail a new seed about 4 times in
    10 (1 - 0.95^11 = 0.43), which is why the check does not use them one by one."""
    from lab.tables import t_prediction, t_quantile
    rng = np.random.default_rng(20261206)
    draw = functools.partial(rng.normal, 0.0, 1.0) if name == "normal" else functools.partial(rng.gamma, 6.0, 1.0)
    cols = [(p, c) for c in ("gold_mean", "proxy_mean", "kl", "wellformed_rate", "distinct_2", "ref_ppl")
            for p in claims.POLICIES]
    passed = clean = 0
    sims = 10000
    draws = [(draw(5 * len(cols)).reshape(len(cols), 5), draw(len(cols))) for _ in range(sims)]
    # t_prediction's arithmetic for every simulation at once (mean ± t·s·√(1 + 1/n) along the seeds), as
    # t_prediction itself gives it: checked cell for cell on the first 200 simulations.
    seeds = np.stack([d[0] for d in draws])                             # (sims, 12, 5)
    means = seeds.mean(-1)                                              # (sims, 12)
    halves = t_quantile(0.975, 4) * seeds.std(-1, ddof=1) * np.sqrt(1 + 1 / 5)
    for i, j in ((i, j) for i in range(200) for j in range(len(cols))):
        own = "{:.5f} [{:.5f}, {:.5f}]".format(*t_prediction(seeds[i, j]))
        assert own == f"{means[i, j]:.5f} [{means[i, j] - halves[i, j]:.5f}, {means[i, j] + halves[i, j]:.5f}]"
    for (_, new), mean, half in zip(draws, means.tolist(), halves.tolist()):
        cells, report = {}, {p: {"gold_std": 1.0} for p in claims.POLICIES}
        for (policy, col), m, h, y in zip(cols, mean, half, new):
            cells[policy, col] = f"{m:.5f} [{m - h:.5f}, {m + h:.5f}]"
            report[policy][col] = float(y)
        # As in README: the pretrained model's KL is 0 on every seed.
        cells["pretrained", "kl"] = "0.00000 [0.00000, 0.00000]"
        report["pretrained"]["kl"] = 0.0
        lines = [claims.HEADER, "|---" * claims.CELLS + "|---|"]
        for row, (col, std) in claims.ROWS.items():
            own = ["1.0 ± 1.0" if std else "1.0"] * len(claims.POLICIES)
            new_cells = f"{cells['pretrained', col]} | {cells['rlhf', col]}"
            lines.append(f"| {row} | {' | '.join(own)} | {new_cells} | — |")
        checked, failed, notes = claims.differences("\n".join(lines) + "\n\n(Student-t, n = 5)\n", report)
        assert checked == 12
        passed += not failed
        clean += not failed and not notes
    # Bonferroni's t holds a normal's 11 random numbers at once (1 - 0.05/11)^11 = 95.1 % of the time (10,000
    # draws: ± 0.7 % at 3 s.e.; t with n instead of n - 1 degrees of freedom would give 93.4 %); the skewed
    # distribution's far tail, where the band's ends lie, is longer than t's: about 92 % there.
    low, high = {"normal": (0.944, 0.958), "gamma6": (0.905, 0.935)}[name]
    assert low <= passed / sims <= high, passed / sims
    assert 0.40 <= clean / sims <= 0.68, clean / sims


def test_a_number_moved_past_its_rounding_is_named_and_slack_admits_it(run, tmp_path, capsys):
    with open(os.path.join(run, "report.json")) as f:
        kl = json.load(f)["rlhf"]["kl"]
    path, _ = smoke_readme(run, tmp_path, kl=kl + 0.02)              # printed to 2 decimals: ±0.005 allowed
    assert claims.main([f"--out_dir={run}", f"--readme={path}", "--exact"]) == 1
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 2 and out[0].startswith("exact KL to reference (nats / sequence), rlhf (kl): README")
    assert out[1].startswith("1 of 14 numbers")
    assert claims.main([f"--out_dir={run}", f"--readme={path}", "--exact", "--slack=0.03"]) == 0


@pytest.mark.parametrize("argv,why", [(["--slack=-1"], "--slack"), (["--bogus=1"], "unknown flag"),
                                      (["--exact=yes"], "a boolean flag takes true, false, 1 or 0"),
                                      (["--out_dir"], "write --out_dir=VALUE"),
                                      (["--out_dir=/nonexistent"], "cannot read /nonexistent/report.json")])
def test_bad_input_is_one_line_and_exit_2(run, tmp_path, capsys, argv, why):
    path, _ = smoke_readme(run, tmp_path)
    given = {a.partition("=")[0] for a in argv}
    base = [f"--readme={path}"] + ([] if "--out_dir" in given else [f"--out_dir={run}"])
    with pytest.raises(SystemExit) as e:
        claims.main(base + argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1 and why in err[0]


def test_a_readme_without_the_table_or_with_an_unknown_row_is_refused(run, tmp_path, capsys):
    path, _ = smoke_readme(run, tmp_path)
    text = open(path).read()
    no_row = "\n".join(line for line in text.splitlines() if not line.startswith("| distinct-2"))
    for bad in (text.replace("| metric |", "| measure |"), text.replace("distinct-2", "distinct-3"), no_row):
        open(path, "w").write(bad)
        with pytest.raises(SystemExit) as e:
            claims.main([f"--out_dir={run}", f"--readme={path}"])
        err = capsys.readouterr().err
        assert e.value.code == 2 and err.startswith("error: lab.claims: ") and path in err


def test_readmes_own_table_parses_into_the_numbers_it_checks():
    with open(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "README.md")) as f:
        rows = claims.table_rows(f.read())
    assert [name for name, _ in rows] == list(claims.ROWS)
    own = [c for _, cells in rows for c in cells[:len(claims.POLICIES)]]
    new = [c for _, cells in rows for c in cells[len(claims.POLICIES):2 * len(claims.POLICIES)]]
    assert sum(len(claims.numbers(c)) for c in own) == 14 and all(len(claims.numbers(c)) == 3 for c in new)


def test_a_nan_in_the_report_always_differs(run, tmp_path, capsys):
    path, report = smoke_readme(run, tmp_path)
    report["rlhf"]["kl"] = float("nan")
    out = tmp_path / "out"
    out.mkdir()
    (out / "report.json").write_text(json.dumps(report))
    for flags, said in (([], "rlhf (kl): run nan"), (["--exact"], "rlhf (kl): README")):
        assert claims.main([f"--out_dir={out}", f"--readme={path}", *flags]) == 1
        assert said in capsys.readouterr().out


def test_help_prints_the_docstring_and_exits_0(capsys):
    with pytest.raises(SystemExit) as e:
        claims.main(["--help"])
    out = capsys.readouterr().out
    assert e.value.code == 0 and "python -m lab.claims --out_dir=" in out and "--slack" in out and "--exact" in out


def run_with(tmp_path, report):
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    (out / "report.json").write_text(report if isinstance(report, str) else json.dumps(report))
    return str(out)


def test_the_tolerance_is_half_a_unit_of_the_last_printed_digit(run, tmp_path, capsys):
    """README prints 2 decimals: a run 0.0049 away matches, 0.0051 away differs (a tolerance of a full unit would
    let README's 1.23 pass a run's 1.238)."""
    path, report = smoke_readme(run, tmp_path)
    printed = float(f"{report['rlhf']['kl']:.2f}")
    for offset, code in ((0.0049, 0), (-0.0049, 0), (0.0051, 1), (-0.0051, 1), (0.008, 1)):
        moved = json.loads(json.dumps(report))
        moved["rlhf"]["kl"] = printed + offset
        assert claims.main([f"--out_dir={run_with(tmp_path, moved)}", f"--readme={path}", "--exact"]) == code, offset
    capsys.readouterr()


def test_a_unicode_minus_is_a_minus(run, tmp_path, capsys):
    path, report = smoke_readme(run, tmp_path)
    assert claims.numbers("−0.12") == ["-0.12"] and claims.numbers("**−2.50** ± 1.17") == ["-2.50", "1.17"]
    text = open(path).read()
    pretrained_proxy = f"{report['pretrained']['proxy_mean']:+.2f}"
    flipped = pretrained_proxy.replace("+", "−") if pretrained_proxy.startswith("+") else pretrained_proxy[1:]
    open(path, "w").write(text.replace(f"| {pretrained_proxy} |", f"| {flipped} |"))
    assert claims.main([f"--out_dir={run}", f"--readme={path}", "--exact"]) == 1   # the sign is read, not dropped
    assert "proxy score (reward model), pretrained" in capsys.readouterr().out


@pytest.mark.parametrize("change, why", [
    (lambda r: r["rlhf"].update(kl=10 ** 400), "rlhf.kl is an integer of 401 digits"),
    (lambda r: r["rlhf"].update(kl=None), "rlhf.kl is null, not a number"),
    (lambda r: r["rlhf"].update(kl=[1.0]), "rlhf.kl is [1.0], not a number"),
    (lambda r: r["rlhf"].update(kl="6.36"), 'rlhf.kl is "6.36", not a number'),
    (lambda r: r["rlhf"].update(kl=True), "rlhf.kl is true, not a number"),
    (lambda r: r["rlhf"].pop("kl"), "has no rlhf.kl"),
    (lambda r: r.pop("rlhf"), "no 'rlhf' section"),
])
def test_a_report_field_that_is_not_a_number_is_one_line_naming_file_and_field(run, tmp_path, capsys, change, why):
    path, report = smoke_readme(run, tmp_path)
    change(report)
    out = run_with(tmp_path, report)
    with pytest.raises(SystemExit) as e:
        claims.main([f"--out_dir={out}", f"--readme={path}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1 and why in err[0] and "report.json" in err[0], err


def test_a_deeply_nested_report_is_one_line(run, tmp_path, capsys):
    path, _ = smoke_readme(run, tmp_path)
    out = run_with(tmp_path, "[" * 100000 + "]" * 100000)
    with pytest.raises(SystemExit) as e:
        claims.main([f"--out_dir={out}", f"--readme={path}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1 and "nests too deep" in err[0]


@pytest.mark.parametrize("cells", ["| 0.00 |", "| 0.00 | 6.36 |", "| 0.00 | 6.36 | 0.0 [0, 0] | 6.0 [5, 7] | — | 1 |"])
def test_a_row_without_one_cell_per_policy_is_one_line(run, tmp_path, capsys, cells):
    path, report = smoke_readme(run, tmp_path)
    text = open(path).read()
    row = next(line for line in text.splitlines() if line.startswith("| exact KL"))
    open(path, "w").write(text.replace(row, "| exact KL to reference (nats / sequence) " + cells))
    with pytest.raises(SystemExit) as e:
        claims.main([f"--out_dir={run}", f"--readme={path}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1 and "value cells" in err[0] and path in err[0]


@pytest.mark.parametrize("argv, why", [(["--slack=inf"], "finite"), (["--slack=nan"], "finite"),
                                      (["--slack=0.1", "--slack=0.2"], "--slack is given twice"),
                                      (["--out_dir=a", "--out_dir=b"], "--out_dir is given twice")])
def test_a_slack_that_admits_everything_or_a_repeated_flag_is_refused(argv, why, capsys):
    with pytest.raises(SystemExit) as e:
        claims.main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1 and why in err[0]


@pytest.mark.parametrize("cell", ["6.0", "6.0 [7.0, 5.0]", "6.0 [5.0]"])
def test_a_new_seeds_cell_that_is_not_an_interval_is_one_line(run, tmp_path, capsys, cell):
    path, report = smoke_readme(run, tmp_path)
    text = open(path).read()
    row = next(line for line in text.splitlines() if line.startswith("| exact KL"))
    cells = row.split(" | ")
    cells[4] = cell
    open(path, "w").write(text.replace(row, " | ".join(cells)))
    with pytest.raises(SystemExit) as e:
        claims.main([f"--out_dir={run}", f"--readme={path}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1 and "a new seed's rlhf" in err[0] and "mean [low, high]" in err[0]


def refused_line(argv, capsys):
    with pytest.raises(SystemExit) as e:
        claims.main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1, err
    return err[0]


def test_a_flag_and_its_value_as_two_words_gets_the_way_to_write_it(run, capsys):
    """As train.py's flags do: the flag and its value are one word."""
    assert "write --out_dir=/x (" in refused_line(["--out_dir", "/x"], capsys)
    assert "write --readme=VALUE" in refused_line([f"--out_dir={run}", "--readme"], capsys)


def test_exact_takes_the_values_train_pys_booleans_take(run, tmp_path, capsys):
    path, _ = smoke_readme(run, tmp_path)
    for flag, what in (("--exact=1", "14 numbers inside the run's own"), ("--exact=true", "14 numbers inside"),
                       ("--exact=0", "12 numbers inside a new seed's"), ("--exact=false", "12 numbers inside")):
        assert claims.main([f"--out_dir={run}", f"--readme={path}", flag]) == 0
        assert what in capsys.readouterr().out, flag


def test_a_readme_that_is_not_text_or_too_large_is_named_so(run, tmp_path, capsys):
    path = tmp_path / "README.md"
    for content, why in ((bytes(range(256)) * 4, "is not text (not UTF-8): not a README"),
                         (b"| metric |\x00\x00", "is not text (it holds NUL bytes): not a README"),
                         (b" " * ((10 << 20) + 1), "is over 10 MB: not a README")):
        path.write_bytes(content)
        err = refused_line([f"--out_dir={run}", f"--readme={path}"], capsys)
        assert why in err and "JSON" not in err, err
    report = tmp_path / "out" / "report.json"
    report.parent.mkdir()
    report.write_bytes(b"\xff\xfe{}")
    path, _ = smoke_readme(run, tmp_path)
    assert "is not text (not UTF-8): not a report.json" in refused_line([f"--out_dir={report.parent}",
                                                                         f"--readme={path}"], capsys)


def test_a_table_without_its_separator_line_is_named_so(run, tmp_path, capsys):
    """Not "has no row 'gold score ...'": markdown makes no table of it."""
    path, _ = smoke_readme(run, tmp_path)
    text = open(path).read()
    separator = "|---" * claims.CELLS + "|---|"
    for bad in ("", "|---|---|", "| --- | x |" + "---|" * (claims.CELLS - 1)):
        open(path, "w").write(text.replace(separator + "\n", bad + "\n" if bad else ""))
        err = refused_line([f"--out_dir={run}", f"--readme={path}"], capsys)
        assert "not a markdown table" in err and "separator" in err and path in err, err
    # A separator with alignment colons and spaces is one.
    open(path, "w").write(text.replace(separator, "| :--- " + "| ---: " * claims.CELLS + "|"))
    assert claims.main([f"--out_dir={run}", f"--readme={path}"]) == 0
