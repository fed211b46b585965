"""README's first table, checked against a finished run: every number of it beside the one in
out/report.json, and the ones that differ by more than they may.

    python -m lab.claims                       # README.md's table against out/report.json
    python -m lab.claims --out_dir=/tmp/run --readme=README.md --slack=0.05
    python -m lab.claims --help                # this text

The table is the first markdown table whose header is `| metric | pretrained | RLHF actor |`;
each row names a report column (ROWS), each cell holds a number or "mean ± std" (bold allowed).
A number may differ from the run's by half a unit of its last printed digit (the table's own
rounding: the same seed on the same machine gives the same numbers), plus --slack (another seed
or CPU moves them; README says by how much). Each number that differs by more is printed with
both values, and the exit code is 1; when all agree, one line says so and the exit code is 0.
Bad input (no table, an unknown or a missing row, a missing report) is one line on stderr, exit 2;
a number that is not finite in the report always differs.
Left out: ANSWER.md's tables (each names the command that made it).
"""
import json, os, re, sys

from machinery.errors import die

# README's row name -> (report.json column, the column of the "± std" part or None).
ROWS = {"gold score (mean ± std)": ("gold_mean", "gold_std"),
        "proxy score (reward model)": ("proxy_mean", None),
        "exact KL to reference (nats / sequence)": ("kl", None),
        "well-formed rate": ("wellformed_rate", None),
        "distinct-2": ("distinct_2", None),
        "perplexity under the reference": ("ref_ppl", None)}
HEADER = "| metric | pretrained | RLHF actor |"
# The table's columns -> report.json's policies.
POLICIES = ("pretrained", "rlhf")


def table_rows(text):
    """The rows of README's first table under HEADER: [(row name, [cell, cell])]."""
    lines = text.splitlines()
    if HEADER not in lines:
        raise ValueError(f"no table with the header {HEADER!r}")
    rows = []
    for line in lines[lines.index(HEADER) + 2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows.append((cells[0], cells[1:]))
    return rows


def numbers(cell):
    """The numbers of a cell, as printed: "**2.66** ± 1.17" -> ["2.66", "1.17"]."""
    return re.findall(r"[-+]?\d+(?:\.\d+)?", cell.replace("**", ""))


def allowed(printed, slack):
    """How far the run's number may be from a printed one: half a unit of its last digit, plus
    slack."""
    decimals = len(printed.split(".")[1]) if "." in printed else 0
    return 0.5 * 10 ** -decimals + slack


def differences(text, report, slack=0.0):
    """(number of values checked, [lines naming each value that differs by more than allowed])."""
    checked, lines = 0, []
    rows = table_rows(text)
    missing = [name for name in ROWS if name not in [r[0] for r in rows]]
    if missing:
        raise ValueError(f"the table has no row {missing[0]!r}")
    for name, cells in rows:
        if name not in ROWS:
            raise ValueError(f"the table's row {name!r} names no report column (known: "
                             f"{', '.join(ROWS)})")
        columns = [c for c in ROWS[name] if c is not None]
        for policy, cell in zip(POLICIES, cells, strict=True):
            printed = numbers(cell)
            if len(printed) != len(columns):
                raise ValueError(f"row {name!r}, {policy}: {cell!r} has {len(printed)} numbers, "
                                 f"not {len(columns)}")
            for column, shown in zip(columns, printed):
                actual = report[policy][column]
                checked += 1
                # A NaN is never within any tolerance.
                if not abs(float(shown) - actual) <= allowed(shown, slack):
                    lines.append(f"{name}, {policy} ({column}): README {shown}, run {actual:.4f} "
                                 f"(allowed ±{allowed(shown, slack):.4g})")
    return checked, lines


def parse(argv):
    # --help (or -h) prints this file's docstring and exits 0.
    if "--help" in argv or "-h" in argv:
        print(__doc__.strip())
        sys.exit(0)
    opts = dict(out_dir="out", readme="README.md", slack="0")
    for a in argv:
        name, _, value = a[2:].partition("=")
        if not a.startswith("--") or name not in opts:
            die(f"unknown flag {a!r} (claims.py takes --out_dir, --readme, --slack)")
        opts[name] = value
    try:
        opts["slack"] = float(opts["slack"])
    except ValueError:
        die(f"bad value for --slack: {opts['slack']!r}")
    if not opts["slack"] >= 0:
        die(f"bad value for --slack: {opts['slack']} (must be >= 0)")
    return opts


def main(argv):
    opts = parse(argv)
    report_path = os.path.join(opts["out_dir"], "report.json")
    try:
        with open(opts["readme"]) as f:
            text = f.read()
        with open(report_path) as f:
            report = json.load(f)
        checked, lines = differences(text, report, opts["slack"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        die(f"claims.py: {type(e).__name__}: {e}")
    for line in lines:
        print(line)
    if lines:
        print(f"{len(lines)} of {checked} numbers of {opts['readme']}'s first table differ from "
              f"{report_path}")
        return 1
    print(f"{opts['readme']}'s first table matches {report_path}: {checked} numbers, each within "
          f"its rounding (+ slack {opts['slack']:g})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
