"""claims.py: README's first table against a finished run. On the smoke run: a table written from its report.json,
rounded as README rounds, passes; one number moved past its rounding is named and exits 1; slack admits it; bad
input is one line and exit 2. And README's own table parses into the 14 numbers the checker compares."""
import json, os
import pytest

from lab import claims

SMOKE_TABLE = """| metric | pretrained | RLHF actor |
|---|---|---|
| gold score (mean ± std) | {p[gold_mean]:.2f} ± {p[gold_std]:.2f} | **{r[gold_mean]:.2f}** ± {r[gold_std]:.2f} |
| proxy score (reward model) | {p[proxy_mean]:+.2f} | {r[proxy_mean]:.2f} |
| exact KL to reference (nats / sequence) | {p[kl]:.2f} | {r[kl]:.2f} |
| well-formed rate | {p[wellformed_rate]:.3f} | {r[wellformed_rate]:.3f} |
| distinct-2 | {p[distinct_2]:.3f} | {r[distinct_2]:.3f} |
| perplexity under the reference | {p[ref_ppl]:.2f} | {r[ref_ppl]:.2f} |
"""


def smoke_readme(run, tmp_path, **moved):
    with open(os.path.join(run, "report.json")) as f:
        report = json.load(f)
    rlhf = dict(report["rlhf"], **moved)
    path = tmp_path / "README.md"
    path.write_text("# smoke\n\nSome text.\n\n" + SMOKE_TABLE.format(p=report["pretrained"], r=rlhf) + "\nMore.\n")
    return str(path), report


def test_a_table_written_from_the_run_matches_it(run, tmp_path, capsys):
    path, _ = smoke_readme(run, tmp_path)
    assert claims.main([f"--out_dir={run}", f"--readme={path}"]) == 0
    assert "matches" in capsys.readouterr().out


def test_a_number_moved_past_its_rounding_is_named_and_slack_admits_it(run, tmp_path, capsys):
    with open(os.path.join(run, "report.json")) as f:
        kl = json.load(f)["rlhf"]["kl"]
    path, _ = smoke_readme(run, tmp_path, kl=kl + 0.02)              # printed to 2 decimals: ±0.005 allowed
    assert claims.main([f"--out_dir={run}", f"--readme={path}"]) == 1
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 2 and out[0].startswith("exact KL to reference (nats / sequence), rlhf (kl): README")
    assert out[1].startswith("1 of 14 numbers")
    assert claims.main([f"--out_dir={run}", f"--readme={path}", "--slack=0.03"]) == 0


@pytest.mark.parametrize("argv,why", [(["--slack=-1"], "--slack"), (["--bogus=1"], "unknown flag"),
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
    assert sum(len(claims.numbers(c)) for _, cells in rows for c in cells) == 14


def test_a_nan_in_the_report_always_differs(run, tmp_path, capsys):
    path, report = smoke_readme(run, tmp_path)
    report["rlhf"]["kl"] = float("nan")
    out = tmp_path / "out"
    out.mkdir()
    (out / "report.json").write_text(json.dumps(report))
    assert claims.main([f"--out_dir={out}", f"--readme={path}"]) == 1
    assert "rlhf (kl): README" in capsys.readouterr().out


def test_help_prints_the_docstring_and_exits_0(capsys):
    with pytest.raises(SystemExit) as e:
        claims.main(["--help"])
    out = capsys.readouterr().out
    assert e.value.code == 0 and "python -m lab.claims --out_dir=" in out and "--slack" in out


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
        assert claims.main([f"--out_dir={run_with(tmp_path, moved)}", f"--readme={path}"]) == code, offset
    capsys.readouterr()


def test_a_unicode_minus_is_a_minus(run, tmp_path, capsys):
    path, report = smoke_readme(run, tmp_path)
    assert claims.numbers("−0.12") == ["-0.12"] and claims.numbers("**−2.50** ± 1.17") == ["-2.50", "1.17"]
    text = open(path).read()
    pretrained_proxy = f"{report['pretrained']['proxy_mean']:+.2f}"
    flipped = pretrained_proxy.replace("+", "−") if pretrained_proxy.startswith("+") else pretrained_proxy[1:]
    open(path, "w").write(text.replace(f"| {pretrained_proxy} |", f"| {flipped} |"))
    assert claims.main([f"--out_dir={run}", f"--readme={path}"]) == 1          # the sign is read, not dropped
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


@pytest.mark.parametrize("cells", ["| 0.00 |", "| 0.00 | 6.36 | 7.00 |"])
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
