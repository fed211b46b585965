"""lab/check.py: the tables the answers quote, compared cell by cell with the tables rebuilt from the archive."""
import pytest
from lab import ablate, check, dpo_suite

MADE = """# a suite

| condition | seeds | gold | KL |
|---|---|---|---|
| no_kl | 5 | -5.31 [-5.65, -4.98] | 85.9 |
| adaptive | 5 | +2.37 [+2.26, +2.47] | 6.6 |

| penalty | its β = 0 run | KL | penalty − frontier |
|---|---|---|---|
| long_adaptive | free | 5.83 | +1.790 |
| long_adaptive | free_lr_x0.25 | 5.83 | +1.500 |
"""


def test_a_quoted_table_may_leave_rows_out_but_not_change_a_cell():
    doc = ("Prose.\n\n| condition | seeds | gold | KL |\n|---|---|---|---|\n"
           "| adaptive | 5 | +2.37 [+2.26, +2.47] | 6.6 |\n\n"
           "| penalty | its β = 0 run | KL | penalty − frontier |\n|---|---|---|---|\n"
           "| long_adaptive | free_lr_x0.25 | 5.83 | +1.500 |\n\n"
           "| what | formula |\n|---|---|\n| k1 | log p - log q |\n")
    differences, checked, unquoted = check.compare({"answers/x.md": doc}, [MADE])
    assert differences == [] and checked == 2 and unquoted == ["answers/x.md:11"]
    # One cell changed: the file, the table (its line and header), the row and the column are named.
    changed = doc.replace("| 5.83 | +1.500 |", "| 5.83 | +1.510 |")
    differences, _, _ = check.compare({"answers/x.md": changed}, [MADE])
    assert differences == ["answers/x.md, the table at line 7 (penalty | its β = 0 run | KL | ...): row "
                           "'long_adaptive | free_lr_x0.25', column 'penalty − frontier': the text has '+1.510', "
                           "the archive gives '+1.500'"]
    # A row the rebuilt tables do not have (beside one they have), a table whose rows they mostly lack (one line,
    # not one per row: another suite's table of the same header), and a row cut short.
    extra = doc.replace("| adaptive | 5 | +2.37 [+2.26, +2.47] | 6.6 |\n",
                        "| adaptive | 5 | +2.37 [+2.26, +2.47] | 6.6 |\n| band | 5 | +2.30 | 6.0 |\n")
    assert "row 'band' is in no rebuilt table of this header" in check.compare({"x": extra}, [MADE])[0][0]
    other = doc.replace("| adaptive | 5 |", "| band | 5 |")
    assert check.compare({"x": other}, [MADE])[0] == [
        "x, the table at line 3 (condition | seeds | gold | ...): 1 of its 1 rows are in no rebuilt table of this header"]
    short = doc.replace("| +2.37 [+2.26, +2.47] | 6.6 |", "| +2.37 [+2.26, +2.47] |")
    assert "row 'adaptive' has 3 cells, the rebuilt row 4" in check.compare({"x": short}, [MADE])[0][0]


def test_a_quoted_table_is_matched_to_the_rebuilt_table_of_its_header_that_shares_most_rows():
    other = MADE.replace("+2.37 [+2.26, +2.47]", "+1.00 [+0.90, +1.10]").replace("# a suite", "# another")
    doc = "| condition | seeds | gold | KL |\n|---|---|---|---|\n| adaptive | 5 | +1.00 [+0.90, +1.10] | 6.6 |\n"
    assert check.compare({"x": doc}, [MADE, other])[0] == []
    assert check.key_width([["a", "b"], ["a", "c"]]) == 2 and check.key_width([["a", "b"], ["c", "b"]]) == 1


def test_every_command_the_check_runs_is_one_its_suite_takes():
    for command in check.COMMANDS:
        argv = check.argv_of(command, "out", "lab/runs")[1:]
        module = {"lab.ablate": ablate, "lab.dpo_suite": dpo_suite}[command[0]]
        opts, _ = module.parse(argv)
        assert opts["tables_only"]


def test_the_check_s_commands_leave_the_documents_figures_alone():
    assert check.argv_of(["lab.ablate", "--suite=core"], "o", "k")[-1] == "--figures="


def test_a_command_that_cannot_rebuild_its_tables_fails_the_check():
    lines, ok = check.check("kept", commands=[["lab.ablate", "--suite=core"]], docs={"x": MADE},
                            run=lambda command, out, kept: "error: lacks pretrained")
    assert not ok and lines[0] == "python -m lab.ablate --suite=core --tables_only: error: lacks pretrained"
