"""How the files stand on each other: imports only go down (no circle, counting imports inside functions), the
ground files import nothing of the pipeline, and TRL's world stays in bench_trl.py."""
import ast, glob, os
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GROUND = {"errors": set(), "config": {"errors"}, "store": {"errors"}, "dist": {"errors"}}   # may import only these


def sources():
    """{module name: source} of every top-level .py file (the project; tests are not part of the house)."""
    return {os.path.basename(f)[:-3]: open(f).read() for f in sorted(glob.glob(os.path.join(ROOT, "*.py")))}


def imports(src, project):
    """The project modules `src` imports, at any depth: module level, inside functions, under if __name__."""
    out = set()
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, ast.Import):
            out |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.add(node.module.split(".")[0])
    return out & set(project)


def find_circle(graph):
    """A circle of imports as a list [a, b, ..., a], or None. Depth-first, in sorted order, so always the same one."""
    state = {}                                            # absent: not seen; 1: on the current path; 2: done

    def visit(m, path):
        state[m] = 1
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                return path[path.index(n):] + [n]
            if n not in state:
                found = visit(n, path + [n])
                if found:
                    return found
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state:
            found = visit(m, [m])
            if found:
                return found
    return None


def graph_of(srcs):
    return {m: imports(s, srcs) - {m} for m, s in srcs.items()}


def test_the_checker_finds_a_circle_closed_by_an_import_inside_a_function():
    srcs = {"a": "import b\n", "b": "from c import x\n", "c": "def f():\n    import a\n", "d": "import a, os\n"}
    assert find_circle(graph_of(srcs)) == ["a", "b", "c", "a"]
    srcs["c"] = "def f():\n    import os\n"
    assert find_circle(graph_of(srcs)) is None


def test_no_circle_of_imports():
    circle = find_circle(graph_of(sources()))
    assert circle is None, "imports go in a circle: " + " -> ".join(circle)


@pytest.mark.parametrize("name", sorted(GROUND))
def test_the_ground_files_import_nothing_of_the_pipeline(name):
    srcs = sources()
    assert imports(srcs[name], srcs) <= GROUND[name], f"{name}.py imports {sorted(imports(srcs[name], srcs))}"


def test_trl_stays_in_bench_trl():
    """bench_trl.py measures TRL from a scratch venv (its docstring): no file of the project or its tests imports
    it, and no other file imports trl or transformers, at any depth (tether never depends on them)."""
    srcs = sources()
    tests = {os.path.basename(f)[:-3]: open(f).read() for f in glob.glob(os.path.join(ROOT, "tests", "*.py"))}
    outside = {"bench_trl", "trl", "transformers", "tokenizers", "accelerate"}
    bad = {m: sorted(imports(s, outside)) for m, s in {**srcs, **tests}.items() if m != "bench_trl"}
    bad = {m: v for m, v in bad.items() if v}
    assert not bad, f"imports of TRL's world outside bench_trl.py: {bad}"
    assert imports(srcs["bench_trl"], outside) >= {"trl", "transformers"}     # the check sees what it looks for
