"""claims.py: README's first table against a finished run. On the smoke run: a table written from its report.json,
rounded as README rounds, with intervals around it, passes both modes; in --exact a number moved past its rounding is
named and exits 1, and slack admits it; by default a number moved inside its interval (another CPU) passes and one
moved outside it (by any amount past the interval's rounding) fails; bad input is one line and exit 2. And README's
own table parses into the numbers the checker compares."""
import json, os
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
    path.write_text("# smoke\n\nSome text.\n\n" + smoke_table(report["pretrained"], rlhf, half, centre) + "\nMore.\n")
    return str(path), report


def test_a_table_written_from_the_run_matches_it_in_both_modes(run, tmp_path, capsys):
    path, _ = smoke_readme(run, tmp_path)
    assert claims.main([f"--out_dir={run}", f"--readme={path}", "--exact"]) == 0
    assert "14 numbers inside the run's own numbers" in capsys.readouterr().out
    assert claims.main([f"--out_dir={run}", f"--readme={path}"]) == 0
    assert "12 numbers inside a new seed's prediction intervals" in capsys.readouterr().out


def test_by_default_a_run_inside_the_intervals_passes_and_one_outside_fails(run, tmp_path, capsys):
    """Another CPU's run: every number moved, inside its interval: passes by default, fails --exact. A run whose KL
    lies outside its interval, by a little (past the interval's rounding) or by much, fails and is named."""
    with open(os.path.join(run, "report.json")) as f:
        report = json.load(f)
    moved = {k: report["rlhf"][k] + 0.3 for k in ("gold_mean", "proxy_mean", "kl", "ref_ppl")}
    path, _ = smoke_readme(run, tmp_path, **moved)
    # The table says the run moved by +0.3: the run itself is 0.3 below each centre, inside ±0.5.
    assert claims.main([f"--out_dir={run}", f"--readme={path}"]) == 0
    assert claims.main([f"--out_dir={run}", f"--readme={path}", "--exact"]) == 1
    capsys.readouterr()
    kl = report["rlhf"]["kl"]
    for shift, code in ((0.4995, 0), (-0.4995, 0), (0.5015, 1), (-0.5015, 1), (5.0, 1)):
        path, _ = smoke_readme(run, tmp_path, centre={("rlhf", "kl"): kl + shift})
        assert claims.main([f"--out_dir={run}", f"--readme={path}"]) == code, shift
        out = capsys.readouterr().out.splitlines()
        if code:
            assert len(out) == 2 and out[0].startswith("exact KL to reference (nats / sequence), rlhf (kl): run ")
            assert out[1].startswith("1 of 12 numbers")
    # Slack widens the interval's ends.
    assert claims.main([f"--out_dir={run}", f"--readme={path}", "--slack=4.6"]) == 0
    capsys.readouterr()


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
                                      (["--exact=1"], "unknown flag"), (["--out_dir"], "unknown flag"),
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
