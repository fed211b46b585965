"""Code as plain as nanoGPT's: the rules every .py file of the project keeps.

Each rule is a plain function taking a file's source text and returning a list of (line, message),
empty when the text keeps the rule. The tests run every rule on every file of the project (tests/ is
not checked), and first run every rule on planted snippets, so that no rule's test can pass by
never finding anything.

    python tests/test_style.py [FILE ...]

prints every violation of the given files (default: all of the project's .py files) and a count per file.
"""
import ast
import glob
import io
import os
import re
import sys
import tokenize

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAX_WIDTH = 100
MAX_SHAPE_COMMENT = 40
# a tensor shape opens the comment: "(B, T, V)", "(B,)" or "()"; a comma marks it from "(re)done"
SHAPE = re.compile(r"#\s*\((?:[^(),]*,[^()]*|\s*)\)")


def tokens(src):
    return list(tokenize.generate_tokens(io.StringIO(src).readline))


def once_per_line(found):
    """The (line, message) pairs sorted by line, the first of each line only: a line to fix."""
    out = {}
    for line, message in found:
        out.setdefault(line, message)
    return sorted(out.items())


def lines_of(src):
    return [line.rstrip("\r") for line in src.split("\n")]


def long_lines(src):
    """Every line at most 100 characters (MAX_WIDTH), counted as characters, not bytes."""
    out = []
    for i, line in enumerate(lines_of(src), 1):
        if len(line) > MAX_WIDTH:
            out.append((i, f"{len(line)} characters, over {MAX_WIDTH}"))
    return once_per_line(out)


def semicolons(src):
    """No semicolon between statements.

    One in a string or a comment is not an OP token ';' and passes."""
    out = []
    for tok in tokens(src):
        if tok.type == tokenize.OP and tok.string == ";":
            out.append((tok.start[0], "a semicolon between statements"))
    return once_per_line(out)


def walruses(src):
    """No walrus operator `:=`."""
    out = []
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, ast.NamedExpr):
            out.append((node.lineno, "a walrus `:=`: assign on a line of its own"))
    return once_per_line(out)


def named_lambdas(src):
    """No lambda bound to a name.

    Write a def instead; a lambda as an argument or a dict value is fine."""
    out = []
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(node.value, ast.Lambda):
            out.append((node.lineno, "a lambda bound to a name: write a def"))
    return once_per_line(out)


def long_conditional_expressions(src):
    """A conditional expression `a if c else b` only where it fits on one line."""
    out = []
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, ast.IfExp) and node.lineno != node.end_lineno:
            out.append((node.lineno, f"`a if c else b` over lines {node.lineno}-{node.end_lineno}"))
    return once_per_line(out)


def statements_per_line(src):
    """One statement per line.

    No body on its header's line (`if x: return y`), no two statements on one line: a statement
    keeps the rule when only blanks stand before it on its line."""
    lines = lines_of(src)
    out = []
    for node in ast.walk(ast.parse(src)):
        if not isinstance(node, ast.stmt):
            continue
        # col_offset counts bytes of UTF-8
        before = lines[node.lineno - 1].encode()[:node.col_offset].decode().strip()
        if before.endswith(":"):
            out.append((node.lineno, f"a body on its header's line, after `{before}`"))
        elif before:
            out.append((node.lineno, "two statements on one line"))
    return once_per_line(out)


def trailing_comments(src):
    """Comments sit above the lines they explain.

    A comment on a line of code is allowed only as a tensor shape, `# (B, T, V)` or `# (B,)` and
    maybe a few words, MAX_SHAPE_COMMENT characters at most; no other trailing comment, pragmas
    (`# noqa`, `# type:`) included."""
    lines = lines_of(src)
    out = []
    for tok in tokens(src):
        if tok.type != tokenize.COMMENT:
            continue
        row, col = tok.start
        if not lines[row - 1][:col].strip():
            continue
        if not SHAPE.match(tok.string):
            out.append((row, "a trailing comment: put it on its own line above"))
        elif len(tok.string) > MAX_SHAPE_COMMENT:
            out.append((row, f"a shape comment of {len(tok.string)} characters, over "
                             f"{MAX_SHAPE_COMMENT}: put the words on their own line above"))
    return once_per_line(out)


def module_docstring(src):
    """Each file opens with a module docstring."""
    if ast.get_docstring(ast.parse(src)):
        return []
    return [(1, "no module docstring: open the file with one saying what it is for")]


RULES = [long_lines, semicolons, walruses, named_lambdas, long_conditional_expressions,
         statements_per_line, trailing_comments, module_docstring]


def problems(src):
    """{rule's name: [(line, message), ...]} of every rule the source breaks."""
    found = {rule.__name__: rule(src) for rule in RULES}
    return {name: v for name, v in found.items() if v}


def project_files():
    """Every .py file of the project: the root's and those of its folders (the tests are not
    checked)."""
    paths = glob.glob(os.path.join(ROOT, "*.py"))
    for folder in ("machinery", "options", "pipeline", "lab"):
        paths += glob.glob(os.path.join(ROOT, folder, "*.py"))
    return sorted(paths)


def read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def report(name, rule, found, shown=20):
    """A failure message: the offending file:line entries, `shown` at most, then a count."""
    head = f"{name} breaks {rule.__name__} ({rule.__doc__.splitlines()[0]}) on {len(found)} lines:"
    rows = [f"  {name}:{line}: {message}" for line, message in found[:shown]]
    if len(found) > shown:
        rows.append(f"  ... and {len(found) - shown} more")
    return "\n".join([head] + rows)


# ---- the checker on planted snippets: each bad snippet turns its rule red at the lines named

WIDE = "x = '" + "a" * (MAX_WIDTH - 6) + "'\n"

BAD = [
    # 100 characters pass, 101 do not; characters are counted, not bytes
    (long_lines, '"""D."""\n' + WIDE + "y" + WIDE + "# " + "é" * (MAX_WIDTH - 2) + "\n"
     + "# " + "é" * MAX_WIDTH + "\n", [3, 5]),
    (semicolons, '"""D."""\nx = 1; y = 2\nz = 3;\n', [2, 3]),
    (walruses, '"""D."""\nif (n := 3) > 1:\n    print(n)\nf([y := 1])\n', [2, 4]),
    (named_lambdas, '"""D."""\nf = lambda x: x\ng: object = lambda: 0\nh = i = lambda: 1\n',
     [2, 3, 4]),
    (long_conditional_expressions, '"""D."""\ny = (1 if x\n     else 2)\nz = f(a,\n      b if c\n'
                                   '      else d)\n', [2, 5]),
    (statements_per_line, '"""D."""\nif x: y()\nelif z: pass\nelse: w()\nfor i in a: f(i)\n'
                          'while x: g()\nwith o: h()\ndef f(): return 1\nclass A: pass\n'
                          'try: f()\nexcept E: g()\nfinally: h()\nx = 1; y = 2\n'
                          'if (a and\n        b): f()\n',
     [2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 15]),
    (trailing_comments, '"""D."""\nx = 1  # set x\n'
                        'y = f(x)  # (B, T, V) then far too many words here, over forty\n'
                        'import os  # noqa\nz = 3  # type: int\nw = f(x)  # (re)done\n'
                        'v = g(  # the call\n    x)\n', [2, 3, 4, 5, 6, 7]),
    (module_docstring, "import os\n", [1]),
    (module_docstring, '# a comment\nx = 1\n"""not a module docstring"""\n', [1]),
]

CLEAN = '''"""A clean file: every rule passes it."""
import torch


# a comment on its own line, above what it explains
def f(x, names):
    """A docstring; with a semicolon, a walrus := and a # in it."""
    y = x if x is not None else 0
    table = {"a": lambda: 1, "b": lambda t: t + 1}
    names = sorted(names, key=lambda n: n[1])
    s = "a; b # c"
    logits = torch.zeros(2, 3, 5)  # (B, T, V)
    last = logits[:, -1, 0]  # (B,) the last token
    total = torch.zeros(())  # ()
    calls = g(
        # a comment inside brackets, on its own line
        y,
        table,
    )
    if (y and
            s):
        return names
    elif s:
        pass
    else:
        y = 1
    try:
        h()
    except ValueError:
        raise
    finally:
        h()
    for i in range(3):
        print(i)
    while False:
        break
    with open("x") as fh:
        fh.read()
    return calls, last, total


@decorated
class A:
    """A class."""
    width: int = 0
''' + "x = '" + "é" * (MAX_WIDTH - 6) + "'\n"


@pytest.mark.parametrize("rule, src, lines", BAD, ids=[f"{r.__name__}-{i}" for i, (r, *_) in
                                                        enumerate(BAD)])
def test_the_rule_finds_the_planted_lines(rule, src, lines):
    assert [line for line, _ in rule(src)] == lines


def test_each_rule_has_a_planted_snippet():
    assert {rule.__name__ for rule, _, _ in BAD} == {rule.__name__ for rule in RULES}


def test_a_clean_snippet_passes_every_rule():
    assert problems(CLEAN) == {}


def test_a_planted_snippet_breaks_only_its_own_rules():
    # the semicolon snippet also puts two statements on a line; each other one breaks its rule alone
    also = {"semicolons": {"statements_per_line"}, "statements_per_line": {"semicolons"}}
    for rule, src, _ in BAD:
        assert set(problems(src)) == {rule.__name__} | also.get(rule.__name__, set()), rule.__name__


def test_the_report_lists_twenty_lines_then_a_count():
    message = report("x.py", long_lines, [(i, "wide") for i in range(1, 26)])
    assert "x.py:20: wide" in message and "x.py:21:" not in message
    assert message.endswith("... and 5 more")


def test_the_project_has_files_to_check():
    names = [os.path.relpath(p, ROOT) for p in project_files()]
    assert "train.py" in names and not any("test_" in n for n in names)
    assert os.path.join("pipeline", "stages.py") in names and os.path.join("lab", "ablate.py") in names


# ---- the rules on every file of the project

FILES = [os.path.relpath(p, ROOT) for p in project_files()]


def check(rule, name):
    found = rule(read(os.path.join(ROOT, name)))
    if found:
        pytest.fail(report(name, rule, found), pytrace=False)


@pytest.mark.parametrize("name", FILES)
def test_lines_are_at_most_100_characters(name):
    check(long_lines, name)


@pytest.mark.parametrize("name", FILES)
def test_no_semicolons(name):
    check(semicolons, name)


@pytest.mark.parametrize("name", FILES)
def test_no_walrus(name):
    check(walruses, name)


@pytest.mark.parametrize("name", FILES)
def test_no_lambda_bound_to_a_name(name):
    check(named_lambdas, name)


@pytest.mark.parametrize("name", FILES)
def test_conditional_expressions_fit_on_one_line(name):
    check(long_conditional_expressions, name)


@pytest.mark.parametrize("name", FILES)
def test_one_statement_per_line(name):
    check(statements_per_line, name)


@pytest.mark.parametrize("name", FILES)
def test_comments_sit_above_the_code(name):
    check(trailing_comments, name)


@pytest.mark.parametrize("name", FILES)
def test_the_file_opens_with_a_docstring(name):
    check(module_docstring, name)


def main(paths):
    """Print every violation of `paths` as `file:line: rule: the line`, then a count per file."""
    counts = {}
    for path in paths:
        name = os.path.relpath(path)
        src = read(path)
        lines = lines_of(src)
        try:
            found = problems(src)
        except (SyntaxError, tokenize.TokenError) as e:
            print(f"{name}: does not parse: {e}")
            counts[name] = {"parse": 1}
            continue
        rows = sorted((line, rule) for rule, v in found.items() for line, _ in v)
        for line, rule in rows:
            print(f"{name}:{line}: {rule}: {lines[line - 1].strip()}")
        counts[name] = {rule: len(v) for rule, v in found.items()}
    print()
    print("violations per file:")
    for name, per_rule in counts.items():
        detail = ", ".join(f"{rule} {n}" for rule, n in per_rule.items())
        print(f"  {name}: {sum(per_rule.values())}" + (f" ({detail})" if detail else ""))
    print(f"  total: {sum(sum(v.values()) for v in counts.values())}")
    return 1 if any(counts.values()) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:] or project_files()))
