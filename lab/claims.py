"""README's first table, checked against a finished run: does the run lie where a new seed lands
(the default), or does it give the table's own numbers (--exact)?

    python -m lab.claims                       # out/report.json inside README's new-seed intervals
    python -m lab.claims --exact               # ... equal to the run's own columns, to rounding
    python -m lab.claims --out_dir=/tmp/run --readme=README.md --slack=0.05
    python -m lab.claims --help                # this text

The table is the first markdown table whose header is HEADER; each row names a report column
(ROWS). The first two value cells are the run README was made from ("mean ± std" allowed, bold
allowed); the next two, "mean [low, high]", a new seed's 95 % prediction interval from several
whole-pipeline seeds (lab/seeds.py writes the table); the last, the sampling standard error, is
not checked. By default the run's numbers (the mean of a row; not the "± std" part) must lie
inside the intervals taken together: a run on another CPU, which rounds differently, passes when
it lands where a new seed would. With 11 numbers each at 95 %, a new seed has one outside its own
interval often (about 4 times in 10 were they independent), so each interval is widened to a joint
band that holds all of a new seed's numbers at once 95 % of the time for normal numbers (about
92 % for a skewed distribution; averaged over the tables five seeds can give: Bonferroni over
the intervals that have a width, with the Student-t n that README states under the table); a
number outside its own interval but inside the band is printed as a note and passes.
--exact checks the run's own columns instead: a number may differ by half a unit of its last
printed digit (the same seed on the same machine gives the same numbers). Both add --slack. Each
number outside is printed with both values, and the exit code is 1; when all agree, one line says
so and the exit code is 0.
Bad input (a README or report that is not text or is over 10 MB, no table, a table without its
|---| line, an unknown or a missing row, a row without one cell per column, a cell without its
numbers, an interval that does not hold its mean, a missing or unreadable report, a field that is
not a number, a flag given twice or without its '=', a slack that is not a finite number >= 0, a
row named twice, no single "Student-t, n = N" under the table) is one line on stderr naming the
file and the field, exit 2; --exact takes =true, =false, =1 or =0 like train.py's booleans. A
number that is not finite in the report always differs. A minus sign may be written as prose
writes it (−).
Left out: the tables of answers/ (each names the command that made it).
"""
# Ctrl-C while the imports below load torch (seconds) is one line and exit 130.
if __name__ == "__main__":
    from machinery.errors import ctrl_c_while_starting
    ctrl_c_while_starting()
import json, math, os, re, sys

from machinery.config import boolean, check_once, no_value
from machinery.errors import die, run_main
from lab.tables import t_quantile

# README's row name -> (report.json column, the column of the "± std" part or None).
ROWS = {"gold score (mean ± std)": ("gold_mean", "gold_std"),
        "proxy score (reward model)": ("proxy_mean", None),
        "exact KL to reference (nats / sequence)": ("kl", None),
        "well-formed rate": ("wellformed_rate", None),
        "distinct-2": ("distinct_2", None),
        "perplexity under the reference": ("ref_ppl", None)}
HEADER = ("| metric | pretrained | RLHF actor | a new seed: pretrained | a new seed: RLHF actor "
          "| sampling s.e. |")
# The table's columns -> report.json's policies (the run's own columns, then a new seed's).
POLICIES = ("pretrained", "rlhf")
CELLS = 2 * len(POLICIES) + 1
# A markdown table's separator line: |---|:---:|...
SEPARATOR = re.compile(r"\|(\s*:?-+:?\s*\|)+")
# README is tens of kB and a report.json less: a file over this is neither (and /dev/zero, read
# whole, would never end).
MAX_BYTES = 10 << 20
# More seeds than any table is made from: a larger n is a typo (and t's quantile loses precision).
MAX_SEEDS = 10000


def table_rows(text, where="README"):
    """The rows of README's first table under HEADER: [(row name, [cell] * CELLS)]. ValueError
    naming `where` and the row when a row has not CELLS value cells or appears twice."""
    lines = text.splitlines()
    if HEADER not in lines:
        raise ValueError(f"{where} has no table with the header {HEADER!r}")
    at = lines.index(HEADER)
    # A markdown table's header is followed by its separator, one |---| per column.
    below = lines[at + 1].strip() if at + 1 < len(lines) else ""
    if not SEPARATOR.fullmatch(below) or below.count("|") != HEADER.count("|"):
        raise ValueError(f"{where}: the line under the header {HEADER[:30]!r}... is not its "
                         f"separator {'|---' * (1 + CELLS)}|: not a markdown table")
    rows = []
    for line in lines[at + 2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 1 + CELLS:
            raise ValueError(f"{where}: the row {cells[0]!r} has {len(cells) - 1} value cells, not "
                             f"{CELLS} (the run's and a new seed's for {', '.join(POLICIES)}, "
                             "then the sampling s.e.)")
        if cells[0] in [name for name, _ in rows]:
            raise ValueError(f"{where}: the row {cells[0]!r} appears twice")
        rows.append((cells[0], cells[1:]))
    return rows


def numbers(cell):
    """The numbers of a cell, as printed: "**2.66** ± 1.17" -> ["2.66", "1.17"]; a minus sign
    (U+2212, as prose writes it) is a minus."""
    text = cell.replace("**", "").replace("\u2212", "-")
    return re.findall(r"[-+]?[0-9]+(?:\.[0-9]+)?", text)


def allowed(printed, slack):
    """How far the run's number may be from a printed one: half a unit of its last digit, plus
    slack."""
    decimals = len(printed.split(".")[1]) if "." in printed else 0
    return 0.5 * 10 ** -decimals + slack


def value(report, policy, column, where):
    """report[policy][column] as a float; ValueError naming `where` and the field when it is not
    a number a run writes (missing, null, a list, a string, a boolean, an integer no float holds).
    NaN and inf pass: they differ from every printed number."""
    field = f"{policy}.{column}"
    if not isinstance(report, dict) or not isinstance(report.get(policy), dict):
        raise ValueError(f"{where} has no {policy!r} section: not a report.json train.py writes")
    if column not in report[policy]:
        raise ValueError(f"{where} has no {field}")
    v = report[policy][column]
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ValueError(f"{where}: {field} is {json.dumps(v)[:40]}, not a number")
    try:
        return float(v)
    except OverflowError:
        raise ValueError(f"{where}: {field} is an integer of {len(str(v))} digits, too large for a "
                         "number a run writes") from None


def seeds_of(text, where="README"):
    """n, the number of seeds a new seed's intervals are over: "Student-t, n = N" in the paragraph
    right under the table (README's prose says it there; seeds.py writes it there). ValueError
    naming `where` when it is missing, says two different n, or is outside 2..MAX_SEEDS."""
    lines = text.splitlines()
    after = lines[lines.index(HEADER) + 2:]
    # The table's own rows end at its first line that is not a row.
    rows = next((i for i, line in enumerate(after) if not line.startswith("|")), len(after))
    rest = after[rows:]
    start = next((i for i, line in enumerate(rest) if line.strip()), len(rest))
    end = next((i for i in range(start, len(rest)) if not rest[i].strip()), len(rest))
    paragraph = " ".join(rest[start:end])
    found = sorted(set(re.findall(r"Student-t, n = ([0-9]+)", paragraph)))
    # An n of more digits than any seed count is too large (int() of thousands of digits is
    # refused by Python itself).
    said = {int(n) if len(n) <= 9 else MAX_SEEDS + 1 for n in found}
    if len(said) != 1 or not 2 <= min(said) <= MAX_SEEDS:
        shown = ", ".join(n if len(n) <= 12 else n[:12] + "..." for n in found[:3]) or "none"
        raise ValueError(f"{where} says no single \"Student-t, n = N\" (2 <= N <= {MAX_SEEDS}) in "
                         "the paragraph under its first table: the seeds a new seed's intervals "
                         f"are over (found: {shown})")
    return min(said)


def joint_factor(m, n, level=0.95):
    """How much wider than its own 95 % prediction interval each of m intervals over n seeds is
    made so that a new seed lands inside all m at once `level` of the time (for normal numbers,
    averaged over the tables n seeds can give): Bonferroni, t(1 - (1 - level) / 2m, n - 1) /
    t(0.975, n - 1). Its coverage is simulated in tests/test_claims.py (a skewed distribution's
    is lower)."""
    if m < 2:
        return 1.0
    return t_quantile(1 - (1 - level) / (2 * m), n - 1) / t_quantile(0.975, n - 1)


def differences(text, report, slack=0.0, where=("README", "report.json"), exact=False):
    """(number of values checked, [lines naming each value outside what is allowed], [notes]).
    Default: each row's mean inside a new seed's prediction intervals taken together: each
    interval's two halves widened by joint_factor over the m intervals that have a width (a
    number the same on every seed, KL 0 of the pretrained model, is checked as printed), then
    each end by its printed numbers' rounding (scaled as they are) and slack; a number inside
    that band but outside its own 95 % interval passes with a note. exact: the run's own
    columns, each number within allowed(). where: the names of the README and the report, for
    the messages."""
    checked, lines, notes, intervals = 0, [], [], []
    rows = table_rows(text, where[0])
    missing = [name for name in ROWS if name not in [r[0] for r in rows]]
    if missing:
        raise ValueError(f"{where[0]}'s table has no row {missing[0]!r}")
    for name, cells in rows:
        if name not in ROWS:
            raise ValueError(f"{where[0]}: the row {name!r} names no report column "
                             f"(known: {', '.join(ROWS)})")
        columns = [c for c in ROWS[name] if c is not None]
        for i, policy in enumerate(POLICIES):
            own, new = numbers(cells[i]), numbers(cells[len(POLICIES) + i])
            if len(own) != len(columns):
                raise ValueError(f"{where[0]}: row {name!r}, {policy}: {cells[i]!r} has "
                                 f"{len(own)} numbers, not {len(columns)}")
            if len(new) != 3 or not float(new[1]) <= float(new[0]) <= float(new[2]):
                raise ValueError(f"{where[0]}: row {name!r}, a new seed's {policy}: "
                                 f"{cells[len(POLICIES) + i]!r} is not \"mean [low, high]\" with "
                                 "low <= mean <= high")
            if exact:
                for column, shown in zip(columns, own):
                    actual = value(report, policy, column, where[1])
                    checked += 1
                    # A NaN is never within any tolerance.
                    if not abs(float(shown) - actual) <= allowed(shown, slack):
                        lines.append(f"{name}, {policy} ({column}): README {shown}, run "
                                     f"{actual:.4f} (allowed ±{allowed(shown, slack):.4g})")
            else:
                actual = value(report, policy, columns[0], where[1])
                checked += 1
                intervals.append((f"{name}, {policy} ({columns[0]})", new, actual))
    if exact:
        return checked, lines, notes
    n = seeds_of(text, where[0])
    m = sum(float(new[1]) < float(new[2]) for _, new, _ in intervals)
    factor = joint_factor(m, n)
    for label, (mean, low, high), actual in intervals:
        # A band end is (1 - factor)·mean + factor·low: each printed number's rounding, scaled.
        rounding_lo = (factor - 1) * allowed(mean, 0) + factor * allowed(low, 0)
        rounding_hi = (factor - 1) * allowed(mean, 0) + factor * allowed(high, 0)
        lo = float(mean) - factor * (float(mean) - float(low)) - rounding_lo - slack
        hi = float(mean) + factor * (float(high) - float(mean)) + rounding_hi + slack
        own_lo = float(low) - allowed(low, slack)
        own_hi = float(high) + allowed(high, slack)
        band = (f"a new seed's [{low}, {high}], widened {factor:.2f}x for {m} numbers at once "
                f"(n = {n}), + rounding and slack: [{lo:.4g}, {hi:.4g}]")
        # A NaN is never within any tolerance.
        if not lo <= actual <= hi:
            lines.append(f"{label}: run {actual:.4f}, outside {band}")
        elif not own_lo <= actual <= own_hi:
            notes.append(f"{label}: run {actual:.4f}, outside its own interval but inside {band}")
    return checked, lines, notes


def parse(argv):
    # --help (or -h) prints this file's docstring and exits 0.
    if "--help" in argv or "-h" in argv:
        print(__doc__.strip())
        sys.exit(0)
    check_once(argv)
    opts = dict(out_dir="out", readme="README.md", slack="0", exact=False)
    for i, a in enumerate(argv):
        name, eq, v = a[2:].partition("=")
        if not a.startswith("--") or name not in opts:
            die(f"unknown flag {a!r} (lab.claims takes --out_dir, --readme, --slack, --exact)")
        # --exact, like train.py's booleans, alone or =true, =false, =1, =0.
        if name == "exact":
            try:
                opts["exact"] = boolean(v)
            except ValueError:
                die(f"bad value for --exact: {v!r} (a boolean flag takes true, false, 1 or 0)")
        elif not eq:
            die(no_value(name, argv, i))
        else:
            opts[name] = v
    try:
        opts["slack"] = float(opts["slack"])
    except ValueError:
        die(f"bad value for --slack: {opts['slack']!r}")
    if not (math.isfinite(opts["slack"]) and opts["slack"] >= 0):
        die(f"bad value for --slack: {opts['slack']} (must be finite and >= 0)")
    return opts


def load(path, what):
    """A file's text (what: "text", a README) or JSON (what: "json", a report.json); ValueError
    naming the file. At most MAX_BYTES + 1 bytes are read: a larger file is refused, an endless one
    at once."""
    kind = "a README" if what == "text" else "a report.json"
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_BYTES + 1)
    except OSError as e:
        raise ValueError(f"cannot read {path} ({e.strerror})") from None
    if len(raw) > MAX_BYTES:
        raise ValueError(f"{path} is over {MAX_BYTES >> 20} MB: not {kind}")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"{path} is not text (not UTF-8): not {kind}") from None
    if "\0" in text:
        raise ValueError(f"{path} is not text (it holds NUL bytes): not {kind}")
    if what == "text":
        return text
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError(f"{path} nests too deep to be a report") from None
    except ValueError as e:
        raise ValueError(f"{path} is not JSON ({e})") from None


def main(argv):
    opts = parse(argv)
    report_path = os.path.join(opts["out_dir"], "report.json")
    try:
        text = load(opts["readme"], "text")
        report = load(report_path, "json")
        checked, lines, notes = differences(text, report, opts["slack"],
                                            (opts["readme"], report_path), opts["exact"])
    except ValueError as e:
        die(f"lab.claims: {e}")
    except KeyboardInterrupt:
        die("interrupted", 130)
    for line in notes + lines:
        print(line)
    if opts["exact"]:
        what = "the run's own numbers, each within its rounding"
    else:
        what = "a new seed's prediction intervals, taken together"
    if lines:
        print(f"{len(lines)} of {checked} numbers of {report_path} are outside {opts['readme']}'s "
              f"first table ({what})")
        return 1
    # A new seed has a number or two outside its own 95 % interval often: said, not failed.
    outside = f"; {len(notes)} outside its own 95 % interval" if notes else ""
    print(f"{report_path} matches {opts['readme']}'s first table: {checked} numbers inside {what} "
          f"(+ slack {opts['slack']:g}){outside}")
    return 0


if __name__ == "__main__":
    run_main(main, sys.argv[1:])
