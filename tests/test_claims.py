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
                                      (["--out_dir=/nonexistent"], "FileNotFoundError")])
def test_bad_input_is_one_line_and_exit_2(run, tmp_path, capsys, argv, why):
    path, _ = smoke_readme(run, tmp_path)
    with pytest.raises(SystemExit) as e:
        claims.main([f"--out_dir={run}", f"--readme={path}"] + argv)
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
        assert e.value.code == 2 and "claims.py: ValueError" in capsys.readouterr().err


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
