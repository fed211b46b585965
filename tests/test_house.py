"""How the files stand on each other: the root is the card (at most 12 .py files: the RLHF path and the world),
the rest lives in machinery/, options/, pipeline/ and lab/; imports only go down (no circle, counting imports
inside functions), also with each folder taken as one floor; machinery/ is the ground (it imports nothing of the
root or another folder) and pipeline/ is imported by nothing below it; the ground files import nothing of the
pipeline; model.py imports only torch; nothing outside lab/
reaches it, even through another file; and TRL's world stays in lab/bench_trl.py."""
import ast, glob, os
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FOLDERS = ("machinery", "options", "pipeline", "lab")
# May import only these.
GROUND = {"machinery.errors": set(), "machinery.config": {"machinery.errors"},
          "machinery.store": {"machinery.errors"}, "machinery.dist": {"machinery.errors"},
          # TensorBoard's view of the logs: under every stage's loop, on the ground files alone.
          "machinery.tblog": {"machinery.errors", "machinery.store", "machinery.dist"}}
MAX_ROOT_FILES = 12


def module_of(path):
    rel = os.path.relpath(path, ROOT)[:-3]
    return rel.replace(os.sep, ".").removesuffix(".__init__")


def sources():
    """{module name: source} of every .py file of the project: the root's and its folders' (the tests are not
    part of the house)."""
    paths = glob.glob(os.path.join(ROOT, "*.py"))
    paths += [p for f in FOLDERS for p in glob.glob(os.path.join(ROOT, f, "*.py"))]
    return {module_of(p): open(p).read() for p in sorted(paths)}


def resolve(name, project):
    """The project module a dotted import name reaches ("machinery.store.save_json" -> "machinery.store"), or
    None."""
    while name and name not in project:
        name = name.rpartition(".")[0]
    return name or None


def imports(src, project):
    """The project modules `src` imports, at any depth: module level, inside functions, under if __name__.
    `from machinery import store` imports machinery.store (and the package)."""
    out = set()
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        else:
            continue
        out |= {resolve(n, project) for n in names}
    # A package's own __init__ is a docstring: importing a module of it is importing that module.
    return {m for m in out if m and m not in FOLDERS}


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


def reached(graph, start):
    """Every module `start` imports, directly or through others."""
    seen, todo = set(), [start]
    while todo:
        for n in graph[todo.pop()]:
            if n not in seen:
                seen.add(n)
                todo.append(n)
    return seen


def test_the_checker_finds_a_circle_closed_by_an_import_inside_a_function():
    srcs = {"a": "import b\n", "b": "from c import x\n", "c": "def f():\n    import a\n", "d": "import a, os\n"}
    assert find_circle(graph_of(srcs)) == ["a", "b", "c", "a"]
    srcs["c"] = "def f():\n    import os\n"
    assert find_circle(graph_of(srcs)) is None


def test_the_checker_reads_imports_from_folders():
    srcs = {"train": "from pipeline import stages\n", "pipeline.stages": "from lab.ablate import x\n",
            "lab.ablate": "def f():\n    import pipeline.stages as s\n"}
    graph = graph_of(srcs)
    assert graph["train"] == {"pipeline.stages"} and graph["pipeline.stages"] == {"lab.ablate"}
    assert find_circle(graph) == ["lab.ablate", "pipeline.stages", "lab.ablate"]
    assert "lab.ablate" in reached(graph, "train")


def test_no_circle_of_imports():
    circle = find_circle(graph_of(sources()))
    assert circle is None, "imports go in a circle: " + " -> ".join(circle)


def test_the_root_is_the_card():
    root = sorted(m for m in sources() if "." not in m and m not in FOLDERS)
    assert len(root) <= MAX_ROOT_FILES, f"{len(root)} .py files at the root: {root}"
    assert {"model", "ref", "kl", "reward", "ppo", "train", "data", "tokenizer"} <= set(root)


def test_nothing_outside_the_laboratory_reaches_it():
    graph = graph_of(sources())
    lab = {m for m in graph if m.startswith("lab.")}
    assert {"lab.ablate", "lab.bench", "lab.claims", "lab.seeds"} <= lab
    bad = {m: sorted(reached(graph, m) & lab) for m in graph if m not in lab}
    bad = {m: v for m, v in bad.items() if v}
    assert not bad, f"files outside lab/ that reach it: {bad}"


@pytest.mark.parametrize("name", sorted(GROUND))
def test_the_ground_files_import_nothing_of_the_pipeline(name):
    srcs = sources()
    assert imports(srcs[name], srcs) <= GROUND[name], f"{name} imports {sorted(imports(srcs[name], srcs))}"


def test_model_py_imports_only_torch():
    tree = ast.parse(sources()["model"])
    names = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    names |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert names <= {"torch", "dataclasses", "math"}, names


def test_trl_stays_in_bench_trl():
    """lab/bench_trl.py measures TRL from a scratch venv (its docstring): no file of the project or its tests
    imports it, and no other file imports trl or transformers, at any depth (tether never depends on them)."""
    srcs = sources()
    tests = {os.path.basename(f)[:-3]: open(f).read() for f in glob.glob(os.path.join(ROOT, "tests", "*.py"))}
    outside = {"lab.bench_trl", "trl", "transformers", "tokenizers", "accelerate", "peft", "datasets",
               "bitsandbytes"}
    bad = {m: sorted(imports(s, outside)) for m, s in {**srcs, **tests}.items() if m != "lab.bench_trl"}
    bad = {m: v for m, v in bad.items() if v}
    assert not bad, f"imports of TRL's world outside lab/bench_trl.py: {bad}"
    # The check sees what it looks for.
    assert imports(srcs["lab.bench_trl"], outside) >= {"trl", "transformers"}


def floors(graph):
    """The graph with each folder as one node (a floor) and each root file as its own."""
    def floor(m):
        return m.split(".")[0] if "." in m else m
    out = {}
    for m, deps in graph.items():
        out.setdefault(floor(m), set()).update(floor(d) for d in deps if floor(d) != floor(m))
    return out


def test_the_checker_sees_a_floor_that_stands_both_under_and_over_a_root_file():
    srcs = {"ppo": "from machinery import state\n", "machinery.state": "import kl\n",
            "machinery.stages": "import ppo\n", "kl": "import torch\n"}
    assert find_circle(graph_of(srcs)) is None
    assert find_circle(floors(graph_of(srcs))) == ["machinery", "ppo", "machinery"]


def test_no_floor_stands_both_under_and_over_another():
    circle = find_circle(floors(graph_of(sources())))
    assert circle is None, "a folder both imports and is imported by: " + " -> ".join(circle)


def test_the_ground_imports_nothing_outside_it():
    srcs = sources()
    bad = {m: sorted(d for d in imports(s, srcs) if not d.startswith("machinery."))
           for m, s in srcs.items() if m.startswith("machinery.")}
    bad = {m: v for m, v in bad.items() if v}
    assert not bad, f"machinery/ is the ground, yet: {bad}"


def test_the_pipeline_is_imported_only_by_the_driver_and_the_laboratory():
    graph = graph_of(sources())
    bad = sorted(m for m, deps in graph.items() if any(d.startswith("pipeline.") for d in deps)
                 and not m.startswith(("pipeline.", "lab.")) and m != "train")
    assert not bad, f"files below the pipeline that import it: {bad}"
