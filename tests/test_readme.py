"""README's "Read the code" and "Change it" against the code, so neither can go stale: every file
row's line count is the file's, every function it names is defined in that file, every project
function the PPO loop calls is named in it, and each recipe's line is where the recipe says."""
import ast, os, re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(ROOT, "README.md")
# The PPO loop and what it runs per iteration: each project function they call is named in README.
LOOP = ["train_ppo", "rollout", "make_experience", "ppo_update"]
# Ground-floor and data modules: how things are stored, reduced and drawn, not the algorithm.
GROUND = {"store", "dist", "errors", "config", "data"}
ROW = re.compile(r"^\|(?: \d+ \|)? `(\w+\.py)` \| (\d+) \|(.*)\|\s*$")
RECIPE = re.compile(r"^# (\w+\.py):(\d+), in (\w+)$")


def readme():
    with open(README) as f:
        return f.read()


def file_rows(text):
    """(file, lines, [names]) for each table row of the form | # | `file.py` | lines | ... |."""
    rows = []
    for line in text.splitlines():
        m = ROW.match(line)
        if m:
            # The names of the last cell, the one that says what to read.
            last = m.group(3).split("|")[-1]
            names = re.findall(r"`([A-Za-z_]\w*)`", last)
            rows.append((m.group(1), int(m.group(2)), names))
    return rows


def defined(path):
    """Every def and class name in a file, at any depth (methods too)."""
    with open(path) as f:
        tree = ast.parse(f.read())
    kinds = (ast.FunctionDef, ast.ClassDef)
    return {n.name for n in ast.walk(tree) if isinstance(n, kinds)}


def loop_calls():
    """{name} of project functions called in ppo.py's LOOP functions, resolved through imports:
    `module.f(...)` and `f(...)` imported from a project module or defined in ppo.py."""
    with open(os.path.join(ROOT, "ppo.py")) as f:
        tree = ast.parse(f.read())
    project = {os.path.basename(p)[:-3] for p in os.listdir(ROOT) if p.endswith(".py")}
    imported = {}
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module in project:
            for a in node.names:
                imported[a.asname or a.name] = (node.module, a.name)
    local = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    found = set()
    for fn in (n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in LOOP):
        for call in (c for c in ast.walk(fn) if isinstance(c, ast.Call)):
            f = call.func
            if isinstance(f, ast.Name) and f.id in imported:
                module, name = imported[f.id]
                if module not in GROUND:
                    found.add(name)
            elif isinstance(f, ast.Name) and f.id in local:
                found.add(f.id)
            elif isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name):
                if f.value.id in project and f.value.id not in GROUND:
                    found.add(f.attr)
    return found


def test_the_tables_name_files_and_functions_that_exist_with_their_line_counts():
    rows = file_rows(readme())
    assert len(rows) >= 8, "README's Read the code has lost its tables"
    for name, lines, names in rows:
        path = os.path.join(ROOT, name)
        with open(path) as f:
            actual = len(f.read().splitlines())
        assert lines == actual, f"README says {name} has {lines} lines; it has {actual}"
        missing = sorted(set(names) - defined(path))
        assert not missing, f"README names {missing} in {name}, which defines no such thing"


def test_every_function_the_ppo_loop_calls_is_named():
    named = {n for _, _, names in file_rows(readme()) for n in names}
    calls = loop_calls()
    # The checker must see the loop's own calls, or this test could never fail.
    assert {"make_experience", "ppo_update", "rollout", "shaped_rewards"} <= calls
    missing = sorted(calls - named)
    assert not missing, f"the PPO loop calls {missing}: name them in README's Read the code"


def recipes(text):
    """(file, line number, function, the '-' lines) of each ```diff block in README."""
    out = []
    for block in re.findall(r"```diff\n(.*?)```", text, re.S):
        lines = block.splitlines()
        m = RECIPE.match(lines[0])
        assert m, f"a diff block must open with '# file.py:LINE, in FUNCTION': {lines[0]!r}"
        minus = [line[1:] for line in lines[1:] if line.startswith("-")]
        out.append((m.group(1), int(m.group(2)), m.group(3), minus))
    return out


def test_each_recipe_names_the_line_it_changes_in_its_function():
    found = recipes(readme())
    assert len(found) >= 3
    for name, number, function, minus in found:
        with open(os.path.join(ROOT, name)) as f:
            src = f.read()
        lines = src.splitlines()
        assert lines[number - 1:number - 1 + len(minus)] == minus, \
            f"README's recipe: {name}:{number} is not {minus[0]!r}"
        fn = next(n for n in ast.walk(ast.parse(src)) if getattr(n, "name", None) == function)
        assert fn.lineno <= number <= fn.end_lineno, f"{name}:{number} is not in {function}"


def test_the_checkers_fail_on_stale_text():
    stale = "| 1 | `ppo.py` | 3 | `train_ppo`, `no_such_function` |\n"
    assert file_rows(stale) == [("ppo.py", 3, ["train_ppo", "no_such_function"])]
    assert "no_such_function" not in defined(os.path.join(ROOT, "ppo.py"))
    with pytest.raises(AssertionError):
        recipes("```diff\n-    x = 1\n```")
