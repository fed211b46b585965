"""README and docs/ against the code, so neither can go stale: README is a front page of at most 200 lines whose
links lead to files that exist; every file row's line count is the file's and every name it gives is defined in
that file; every project function the PPO loop calls is named in "Read the code"; each recipe's line is where the
recipe says, and each recipe applies (lab/recipes.py's parsing); every `module.name` the docs cite is defined; every
command README, docs and ANSWER show answers --help."""
import ast, os, re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(ROOT, "README.md")
DOCS = sorted(os.path.join(ROOT, "docs", n) for n in os.listdir(os.path.join(ROOT, "docs")) if n.endswith(".md"))
ANSWER = os.path.join(ROOT, "ANSWER.md")
# One file per question (and per piece of the machinery), ANSWER.md their index.
ANSWERS = sorted(os.path.join(ROOT, "answers", n) for n in os.listdir(os.path.join(ROOT, "answers"))
                 if n.endswith(".md"))
# The PPO loop and what it runs per iteration: each project function they call is named in README.
LOOP = ["train_ppo", "rollout", "make_experience", "ppo_update", "collect_experience"]
# How things are stored, reduced, configured and drawn, not the algorithm: their names need not be in README
# (tblog: the rows as TensorBoard events, beside the JSONL store writes).
GROUND = {"machinery.store", "machinery.dist", "machinery.errors", "machinery.config", "machinery.tblog", "data"}
ROW = re.compile(r"^\|(?: \d+ \|)? `(\w+(?:/\w+)*\.py)` \| (\d+) \|(.*)\|\s*$")
RECIPE = re.compile(r"^# (\w+\.py):(\d+), in (\w+)$")


def read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def readme():
    return read(README)


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


def section(text, title):
    """The text of the section `## title`, up to the next `## `."""
    start = text.index(f"## {title}")
    end = text.find("\n## ", start + 3)
    return text[start:end if end > 0 else len(text)]


def defined(path):
    """Every def and class name in a file, at any depth (methods too), and every top-level assignment."""
    tree = ast.parse(read(path))
    names = {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else []
        names |= {t.id for t in targets if isinstance(t, ast.Name)}
    return names


def module_file(module):
    """The project file of a dotted module name ("ppo", "options.grpo"), or None."""
    path = os.path.join(ROOT, *module.split(".")) + ".py"
    return path if os.path.isfile(path) else None


def loop_calls():
    """{name} of project functions called in ppo.py's LOOP functions, resolved through imports: `module.f(...)` and
    `f(...)` imported from a project module (root or folder) or defined in ppo.py; ground modules left out."""
    tree = ast.parse(read(os.path.join(ROOT, "ppo.py")))
    imported, modules = {}, {}
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module:
            for a in node.names:
                if module_file(f"{node.module}.{a.name}"):
                    modules[a.asname or a.name] = f"{node.module}.{a.name}"
                elif module_file(node.module):
                    imported[a.asname or a.name] = (node.module, a.name)
        elif isinstance(node, ast.Import):
            for a in node.names:
                if module_file(a.name):
                    modules[a.asname or a.name] = a.name
    local = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    found = set()
    for fn in (n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in LOOP):
        for call in (c for c in ast.walk(fn) if isinstance(c, ast.Call)):
            f = call.func
            # functools.partial(f, ...) calls f.
            if isinstance(f, ast.Attribute) and f.attr == "partial" and call.args:
                f = call.args[0]
            if isinstance(f, ast.Name) and f.id in imported:
                module, name = imported[f.id]
                if module not in GROUND:
                    found.add(name)
            elif isinstance(f, ast.Name) and f.id in local:
                found.add(f.id)
            elif isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id in modules:
                if modules[f.value.id] not in GROUND:
                    found.add(f.attr)
    return found


def test_readme_is_a_front_page_whose_links_lead_somewhere():
    text = readme()
    assert len(text.splitlines()) <= 200
    for title in ("The answer, in short", "Read the code", "Change it"):
        assert f"## {title}" in text
    # The default run's own last PPO log line, not the smoke preset's.
    assert re.search(r"^iter 60/60 \| rm [+-]\d", text, re.M)
    for path in [README] + DOCS:
        for target in re.findall(r"\]\(([^)#]+\.md)(?:#[^)]*)?\)", read(path)):
            assert os.path.isfile(os.path.join(os.path.dirname(path), target)), f"{path} links to {target}"
    linked = set(re.findall(r"\]\((docs/\w+\.md)", text))
    assert {os.path.relpath(d, ROOT) for d in DOCS} <= linked, "a page of docs/ that README does not link"


def slug(heading):
    """GitHub's anchor of a heading: lower case, punctuation but hyphens dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def tracked_files():
    """The files git tracks (what a clone has), or, outside a git checkout, every file under ROOT but out/."""
    import subprocess
    try:
        out = subprocess.run(["git", "-C", ROOT, "ls-files"], capture_output=True, text=True, check=True).stdout
        return set(out.split("\n")) - {""}
    except (OSError, subprocess.CalledProcessError):
        return {os.path.relpath(os.path.join(d, f), ROOT) for d, _, fs in os.walk(ROOT) for f in fs
                if not os.path.relpath(d, ROOT).startswith(("out", ".git"))}


def test_every_link_and_image_resolves_to_a_tracked_file_or_a_heading():
    """README, ANSWER and docs: each relative link or image names a file git tracks (so a clone has it, never one
    under out/ that only a run makes) or a folder of them, and each #anchor a heading of its page."""
    tracked = tracked_files()
    folders = {os.path.dirname(t) for t in tracked}
    pages = [README, ANSWER] + ANSWERS + DOCS
    for page in pages:
        for target in re.findall(r"!?\[[^\]]*\]\(([^)\s]+)\)", read(page)):
            if target.startswith(("http://", "https://", "mailto:")):
                continue
            path, _, anchor = target.partition("#")
            where = os.path.relpath(os.path.normpath(os.path.join(os.path.dirname(page), path)), ROOT) if path \
                else os.path.relpath(page, ROOT)
            assert where in tracked or where in folders, f"{os.path.relpath(page, ROOT)} links to {target}: not tracked"
            if anchor and where.endswith(".md"):
                heads = {slug(h) for h in re.findall(r"^#+ (.*)$", read(os.path.join(ROOT, where)), re.M)}
                assert anchor in heads, f"{os.path.relpath(page, ROOT)} links to {target}: no such heading"


def test_answer_is_an_index_of_at_most_300_lines_that_links_every_answer():
    """ANSWER.md: each question with its answer in a paragraph and a link to its file; every file of answers/ is
    linked from it, and each links back."""
    text = read(ANSWER)
    assert len(text.splitlines()) <= 300
    linked = set(re.findall(r"\]\((answers/[\w-]+\.md)\)", text))
    assert {os.path.relpath(a, ROOT) for a in ANSWERS} == linked
    for a in ANSWERS:
        assert "](../ANSWER.md)" in read(a), f"{a} does not link back to the index"


def test_the_tables_name_files_and_functions_that_exist_with_their_line_counts():
    rows = file_rows(readme())
    assert len(rows) >= 10, "README's Read the code has lost its tables"
    for name, lines, names in rows + [r for d in DOCS for r in file_rows(read(d))]:
        path = os.path.join(ROOT, name)
        actual = len(read(path).splitlines())
        assert lines == actual, f"README says {name} has {lines} lines; it has {actual}"
        missing = sorted(set(names) - defined(path))
        assert not missing, f"README names {missing} in {name}, which defines no such thing"


def test_every_function_the_ppo_loop_calls_is_named():
    named = set(re.findall(r"`([A-Za-z_]\w*)`", section(readme(), "Read the code")))
    calls = loop_calls()
    # The checker must see the loop's own calls, or this test could never fail.
    assert {"make_experience", "ppo_update", "rollout", "shaped_rewards", "guard", "collect_experience"} <= calls
    missing = sorted(calls - named)
    assert not missing, f"the PPO loop calls {missing}: name them in README's Read the code"


def test_every_module_name_the_docs_cite_is_defined():
    """`ppo.compute_gae`, `options.grpo.advantages`, `machinery.optim.Muon`: the module exists and defines it."""
    checked = 0
    for path in [README] + DOCS:
        for dotted in re.findall(r"`((?:[a-z_]+\.)+[A-Za-z_]\w*)`", read(path)):
            parts = dotted.split(".")
            # A file's name, not a module's attribute.
            if parts[-1] in ("py", "md", "json", "jsonl", "pt", "png", "html", "txt", "bin", "bpe"):
                continue
            for cut in range(len(parts) - 1, 0, -1):
                module = module_file(".".join(parts[:cut]))
                if module:
                    assert parts[cut] in defined(module), f"{os.path.basename(path)} cites {dotted}"
                    checked += 1
                    break
    assert checked >= 20


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
        src = read(os.path.join(ROOT, name))
        lines = src.splitlines()
        assert lines[number - 1:number - 1 + len(minus)] == minus, \
            f"README's recipe: {name}:{number} is not {minus[0]!r}"
        fn = next(n for n in ast.walk(ast.parse(src)) if getattr(n, "name", None) == function)
        assert fn.lineno <= number <= fn.end_lineno, f"{name}:{number} is not in {function}"


def test_each_measured_recipe_applies_to_a_copy_of_the_code(tmp_path):
    from lab import recipes as measured
    found = measured.blocks(readme())
    assert len(found) == len(recipes(readme()))
    for name in measured.RECIPES:
        code = tmp_path / name
        measured.code_copy(str(code))
        for block in measured.chosen(name, found):
            measured.apply(str(code), block)
            assert block[4][0] in read(os.path.join(code, block[0]))
    # A stale block is refused, not applied somewhere else.
    stale = (found[0][0], found[0][1] + 1, *found[0][2:])
    with pytest.raises(Exception, match="stale"):
        measured.apply(str(tmp_path / "as_is"), stale)


def test_a_recipe_run_starts_from_the_main_runs_stages_and_redoes_only_ppo_and_report(
        tiny_run, tmp_path):
    import json
    from conftest import TINY
    from lab import recipes as measured
    flags = TINY + [f"--out_dir={tiny_run}"]
    row = measured.run_recipe("as_is", [], tiny_run, str(tmp_path / "as_is"), flags)
    out = tmp_path / "as_is" / "out"
    # Each stage before ppo is the main run's, restored by its record, not made again: its
    # seconds in timings.json are the main run's (a stage redone would write its own).
    with open(os.path.join(tiny_run, "timings.json")) as f:
        main_times = json.load(f)
    with open(out / "timings.json") as f:
        times = json.load(f)
    for name in ["world", "pretrain", "reference", "preferences", "reward"]:
        assert times[name] == main_times[name], f"the recipe run redid the {name} stage"
    assert not (out / "pretrain_ckpt.pt").exists()
    # The code as it is gives the main run's numbers again.
    with open(os.path.join(tiny_run, "report.json")) as f:
        report = json.load(f)["rlhf"]
    assert (row["gold"], row["kl"]) == (report["gold_mean"], report["kl"])


def test_the_checkers_fail_on_stale_text():
    stale = "| 1 | `ppo.py` | 3 | `train_ppo`, `no_such_function` |\n| `options/grpo.py` | 1 | x | `advantages` |\n"
    assert file_rows(stale) == [("ppo.py", 3, ["train_ppo", "no_such_function"]),
                                ("options/grpo.py", 1, ["advantages"])]
    assert "no_such_function" not in defined(os.path.join(ROOT, "ppo.py"))
    with pytest.raises(AssertionError):
        recipes("```diff\n-    x = 1\n```")


# ---- every command README, docs and ANSWER show answers --help ----
COMMAND = re.compile(r"python (?:-m ([a-z_]+(?:\.[a-z_]+)*)|([a-z_]+)\.py)\b")


def commands():
    """{module} of every `python FILE.py` and `python -m MODULE` the pages show (pytest and pip aside)."""
    out = set()
    for path in [README, ANSWER] + ANSWERS + DOCS:
        for m in COMMAND.finditer(read(path)):
            module = m.group(1) or m.group(2)
            if module_file(module):
                out.add(module)
    return out


def test_the_pages_show_the_laboratory_s_commands():
    assert {"train", "lab.ablate", "lab.seeds", "lab.claims", "lab.bench", "lab.inspect_page",
            "lab.recipes"} <= commands()


@pytest.mark.parametrize("module", sorted(commands() - {"lab.bench_trl"}))
def test_each_command_shown_answers_help(module, capsys):
    """In this process: `main(["--help"])` prints its text and ends with exit code 0, doing nothing else
    (lab.bench_trl's needs a subprocess: tests/test_tools.py)."""
    import importlib
    mod = importlib.import_module(module)
    code = 0
    try:
        mod.main(["--help"])
    except SystemExit as e:
        code = e.code
    out = capsys.readouterr().out
    assert code in (0, None) and len(out.splitlines()) >= 3, module
