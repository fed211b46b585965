"""Stage records: what each output was made from (config, input files, code), how a new command
is checked against them, and the hash of the code a stage runs.

`out_dir/stages.json` holds one record per finished stage: {"config": {field: value}, "inputs":
{file: sha256}, "outputs": {file: sha256}, "defaults": {field: default}, "code": {piece: hash}}.
`plan` compares the records with the current flags, files and code before any work: a stage whose
config or inputs changed is refused, one whose code changed is redone (with every later one).
A stage's code is derived, not listed (`code_of`): every function, class and constant of the
project that its function reaches through names and imports, each hashed as the interpreter runs
it (comments, docstrings and layout aside). lab/ablate.py's runs keep the same records in run.json.
Left out: hashing third-party code (torch's version is in every made-by line instead).
"""
import ast, copy, hashlib, os

from machinery.errors import RunError
from machinery.store import file_hash, load_json


def _drop_docstrings(tree):
    """The tree without the docstring of its module, classes and functions (a body left empty
    gets `pass`)."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            first = node.body[0] if node.body else None
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
                    and isinstance(first.value.value, str):
                node.body = node.body[1:] or [ast.Pass()]
    return tree


def code_digest(tree):
    """A hash of Python code as the interpreter runs it: the parsed tree without docstrings, so an
    edit of a comment, a docstring or the layout keeps it, and any other edit changes it. `tree`:
    ast.parse's, or a node."""
    text = ast.dump(_drop_docstrings(tree))
    return hashlib.sha256(text.encode()).hexdigest()[:16]



def records_path(out_dir):
    return os.path.join(out_dir, "stages.json")


def damaged_record(rec):
    """Why `rec` is not a record as make_record writes it, in a few words; None when it is one."""
    if not isinstance(rec, dict):
        return f"a {type(rec).__name__}, not a record"
    for part in ("config", "inputs", "outputs"):
        if not isinstance(rec.get(part), dict):
            return f"no {part}"
    if not isinstance(rec.get("defaults", {}), dict) or not isinstance(rec.get("code", {}), dict):
        return "its defaults or code are not a mapping"
    hashes = list(rec["inputs"].values()) + list(rec["outputs"].values())
    if not all(isinstance(h, str) for h in hashes):
        return "a hash that is not a string"
    return None


def load_records(out_dir, notes=None):
    """stages.json's records, {stage: record}. A record that cannot be read, or that does not have
    the shape make_record writes, is left out, as if its stage had not run (the stage is redone);
    each such one adds a line to `notes` when given. Nothing is deleted here."""
    p = records_path(out_dir)
    if not os.path.exists(p):
        return {}
    notes = [] if notes is None else notes
    try:
        records = load_json(p)
    except RunError:
        notes.append(f"{p} cannot be read: every stage is redone")
        return {}
    if not isinstance(records, dict):
        notes.append(f"{p} holds a {type(records).__name__}, not records: every stage is redone")
        return {}
    kept = {}
    for name, rec in records.items():
        why = damaged_record(rec)
        if why:
            notes.append(f"{p}: the record of stage {name} is damaged ({why}): it is redone")
        else:
            kept[name] = rec
    return kept


def make_record(out_dir, config, inputs, outputs, defaults=None, code=None):
    """The record of a finished stage: its config, the hashes of its input and output files and,
    as the list of fields the code knew, each field's code default, and the hash of each piece of
    code it ran. Every output named must exist (a stage that did not make one is not finished:
    RunError)."""
    missing = [n for n in outputs if not os.path.exists(os.path.join(out_dir, n))]
    if missing:
        raise RunError(f"{', '.join(missing)} was not made in {out_dir}: the stage is not "
                       "finished", 1)
    rec = dict(config=config, inputs={n: file_hash(os.path.join(out_dir, n)) for n in inputs},
               outputs={n: file_hash(os.path.join(out_dir, n)) for n in outputs})
    if defaults is not None:
        rec["defaults"] = defaults
    if code is not None:
        rec["code"] = code
    return rec


def damaged_output(out_dir, record, expected=()):
    """Why the outputs of a record are not as its stage wrote them, in a few words naming the file
    (missing, changed since, or one of `expected` it never made); None when every one exists with
    the hash the stage wrote."""
    for n in expected:
        if n not in record["outputs"]:
            return f"it made no {n}"
    for n, h in record["outputs"].items():
        p = os.path.join(out_dir, n)
        if not os.path.exists(p):
            return f"{n} is missing"
        if file_hash(p) != h:
            return f"{n} has changed since it was made"
    return None


def outputs_intact(out_dir, record, expected=()):
    """True when every output the record names, and every one in `expected`, exists with the hash
    the stage wrote."""
    return damaged_output(out_dir, record, expected) is None


def first_difference(record, stamp):
    """The first way a stamp (current config and input hashes) differs from a record, in words;
    None if none.
    - A field the record holds that the stage does not take (a flag removed or renamed since): a
      difference.
    - A field the record lacks but whose default it lists: a damaged record, a difference.
    - A field the record lacks and does not list was added to the code after the record was made.
      The code it was made with behaved as the field's default does (the rule for a new field), so
      it matches at that default (stamp["defaults"]) and only there: adding a flag keeps finished
      work, and using it does not."""
    for k, v in record["config"].items():
        if k not in stamp["config"]:
            return f"--{k}={v}, a flag this code's stage does not take"
    for k, v in stamp["config"].items():
        if k not in record["config"]:
            if k in record.get("defaults", {}):
                return f"no --{k} in its record (damaged), now --{k}={v}"
            if k in stamp.get("defaults", {}) and stamp["defaults"][k] == v:
                continue
            return f"no --{k}, now --{k}={v}"
        if record["config"][k] != v:
            return f"--{k}={record['config'][k]}, now --{k}={v}"
    for n, h in stamp["inputs"].items():
        if record["inputs"].get(n) != h:
            return f"another {n} (it has changed since)"
    return None


def code_difference(record, stamp):
    """The first project file (or function) whose code differs between the record and the stamp,
    or None. A record made before records held code counts as made by other code."""
    for n, h in stamp.get("code", {}).items():
        if record.get("code", {}).get(n) != h:
            return n
    return None


def own_fields(st, stages):
    """The fields only stage `st` reads, of all `stages`' (DPO's own flags, say)."""
    others = {f for s in stages if s is not st for f in s.fields}
    return [f for f in st.fields if f not in others]


def without(rec, names):
    """A record (or stamp) whose config leaves out the fields in `names`."""
    return dict(rec, config={k: v for k, v in rec["config"].items() if k not in names})


def stale_optional(st, records, todo, stamp_of):
    """Why a finished optional stage that this command does not run no longer matches the folder,
    in a few words; None when it still does: a stage before it is redone (its inputs go), or its
    code changed. Its flags are its record's, whatever this command's (train.py keeps them in
    config.json; a flag only it reads is refused without --stage=NAME)."""
    rec = records.get(st.name)
    if rec is None:
        return None
    if todo:
        return f"stage {todo[0].name}, before it, is redone"
    edited = code_difference(rec, stamp_of(st))
    return edited and f"its code changed since it was made ({edited})"


def plan(stages, target, out_dir, records, stamp_of, outputs_of, say=print, redo=""):
    """Which stages to run, in order, for `target` ("all" or a stage name); which finished ones
    are kept; and which finished optional stages go, unread (`stale_optional`). With "all": a
    stage runs when its outputs (outputs_of(stage, record): those it makes under the config it was
    made with) are missing or damaged, or its code changed, with one line saying which; then every
    later stage runs too, unread (its inputs may be gone). With a name: that stage runs, and every
    earlier one must be finished. redo (--redo_from): with "all", that stage is redone (and so every
    later one), whatever its record says. A finished stage that is kept must have been made with
    the current config and inputs: else RunError, naming the ways out, before anything is
    written."""
    todo, kept, dropped = [], [], []
    for st in stages:
        # An optional stage (dpo) runs when it is asked for, never as part of "all"; made earlier
        # and out of date now, its outputs go, with one line.
        if st.optional and target != st.name:
            why = stale_optional(st, records, todo, stamp_of)
            if why:
                say(f"---- stage {st.name}: {why}: its outputs go (--stage={st.name} makes them "
                    "again) ----")
                dropped.append(st)
            continue
        # Once one stage runs, every later one is made again.
        if todo and target == "all":
            todo.append(st)
            continue
        rec = records.get(st.name)
        # After an optional target (dpo) the later stages stay as they are; the flags the target
        # does not read must still be theirs, or config.json would describe a run the folder does
        # not hold.
        if todo and todo[-1].optional:
            read = set(stamp_of(todo[-1])["config"])
            diff = rec and first_difference(without(rec, read), without(stamp_of(st), read))
            if diff:
                raise RunError(f"stage {st.name} in {out_dir} was made with {diff}, and "
                               f"--stage={target} does not redo it: leave that flag out (or "
                               f"redo {st.name} first: --stage={st.name})")
            continue
        why = "not made" if rec is None else damaged_output(out_dir, rec, outputs_of(st, rec))
        # An edit of the code a finished stage ran is never kept silently: with "all", that stage
        # is redone.
        edited = code_difference(rec, stamp_of(st)) if why is None else None
        if edited and target == "all":
            why = f"its code changed since it was made ({edited})"
        elif edited and target != st.name:
            raise RunError(f"stage {st.name} in {out_dir} was made by other code ({edited} "
                           "changed since): python train.py redoes it and what follows (or "
                           f"--stage={st.name})")
        if st.name == redo and not why:
            why = f"--redo_from={redo}"
        if target == st.name or (target == "all" and why):
            # A stage that was made and is made again says why.
            if target == "all" and rec is not None:
                say(f"---- stage {st.name}: {why}: redone ----")
            todo.append(st)
            # After an optional stage, the finished later ones stay: they are checked as kept.
            if target == st.name and not st.optional:
                break
            continue
        if why:
            raise RunError(f"stage {target} needs stage {st.name}'s outputs in {out_dir}: run "
                           f"--stage={st.name} first (or every stage: no --stage)")
        diff = first_difference(rec, stamp_of(st))
        if diff:
            raise RunError(f"stage {st.name} in {out_dir} was made with {diff}: add "
                           f"--redo_from={st.name} to redo it and every stage after it, --fresh to "
                           "redo every stage, or use another --out_dir")
        kept.append(st.name)
    return todo, kept, dropped


# ---- the code a stage runs, derived from what it reaches ----
# The project's folder: machinery/ is one level down.
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# (path, mtime, size) -> (top-level statements by the names they bind, imported names): each file
# parsed once while it is unchanged.
_PARSED = {}
# (path, mtime, size, name) -> the hash of that name's statements.
_DIGESTS = {}


def module_path(root, module):
    """The file of a project module ("ppo", "machinery.store") under root, or None when the
    project has none (torch, os: not hashed)."""
    base = os.path.join(root, *module.split("."))
    for p in (base + ".py", os.path.join(base, "__init__.py")):
        if os.path.isfile(p):
            return p
    return None


def _key(path):
    st = os.stat(path)
    return path, st.st_mtime_ns, st.st_size


def bound_names(node):
    """The names a top-level statement binds: a def or class's, an assignment's targets."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [node.name]
    targets = node.targets if isinstance(node, ast.Assign) else []
    if isinstance(node, ast.AnnAssign):
        targets = [node.target]
    return [n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)]


# The name of a module's own piece: what its top level does when it is imported.
IMPORTED = "<module>"
# Top-level statements that bind names (hashed when something refers to them) or import.
BINDING = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Assign, ast.AnnAssign,
           ast.Import, ast.ImportFrom)


def side_effect(node):
    """True for a top-level statement that does something when its module is imported (a call, a
    loop): not a def, a class, an assignment, an import, a docstring or the `__main__` block."""
    if isinstance(node, BINDING):
        return False
    if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
        return False
    main = isinstance(node, ast.If) and "__main__" in ast.dump(node.test)
    return not main


def parsed(root, module):
    """(defs, imports) of a project module: {name: [top-level statements binding it]}, with
    IMPORTED for the statements that act on import, and {local name: (module, attribute or
    None)} of every import in the file, inside functions too."""
    key = _key(module_path(root, module))
    if key not in _PARSED:
        with open(key[0]) as f:
            tree = ast.parse(f.read())
        defs, imports = {IMPORTED: [n for n in tree.body if side_effect(n)]}, {}
        for node in tree.body:
            for name in bound_names(node):
                defs.setdefault(name, []).append(node)
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    top = a.name.split(".")[0]
                    imports[a.asname or top] = (a.name if a.asname else top, None)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                for a in node.names:
                    imports[a.asname or a.name] = (node.module, a.name)
        _PARSED[key] = (defs, imports)
    return _PARSED[key]


def resolve(root, module, name):
    """What `name` stands for in `module`: (module, name) of the project's statement that binds it
    (imports followed), (module, None) for a project module, or None (not the project's)."""
    defs, imports = parsed(root, module)
    if name in defs:
        return module, name
    if name not in imports:
        return None
    target, attr = imports[name]
    if attr is None:
        return (target, None) if module_path(root, target) else None
    if module_path(root, f"{target}.{attr}"):
        return f"{target}.{attr}", None
    if module_path(root, target):
        return resolve(root, target, attr)
    return None


def _chain(node):
    """["a", "b", "c"] for the expression a.b.c; None when it does not start at a name."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return [node.id] + parts[::-1]


def local_names(fn):
    """The names a function or lambda binds itself (its arguments, what it assigns, its nested
    defs): inside it they are not the module's."""
    a = fn.args
    names = {x.arg for x in a.posonlyargs + a.args + a.kwonlyargs}
    names |= {x.arg for x in (a.vararg, a.kwarg) if x}
    body = fn.body if isinstance(fn.body, list) else [fn.body]
    for node in (n for b in body for n in ast.walk(b)):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            names.add(node.name)
    declared = {n for node in body for g in ast.walk(node) if isinstance(g, ast.Global)
                for n in g.names}
    return names - declared


def references(root, module, nodes):
    """The project statements (module, name) that the statements `nodes` of `module` refer to by a
    name or a module's attribute (store.save_json); a function's own names (its arguments and
    locals) are its own."""
    out = set()

    def visit(node, local):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            # Decorators and defaults are read where the function is defined.
            outer = [*getattr(node, "decorator_list", []), *node.args.defaults,
                     *[d for d in node.args.kw_defaults if d is not None]]
            for n in outer:
                visit(n, local)
            inner = local | local_names(node)
            for n in (node.body if isinstance(node.body, list) else [node.body]):
                visit(n, inner)
            return
        chain = _chain(node) if isinstance(node, (ast.Name, ast.Attribute)) else None
        if chain:
            if chain[0] not in local:
                add(chain)
            return
        for child in ast.iter_child_nodes(node):
            visit(child, local)

    def add(chain):
        here = resolve(root, module, chain[0])
        # Through the modules of a dotted name, to the statement it reaches.
        for attr in chain[1:]:
            if here is None or here[1] is not None:
                break
            sub = f"{here[0]}.{attr}"
            here = (sub, None) if module_path(root, sub) else resolve(root, here[0], attr)
        if here is not None and here[1] is not None:
            out.add(here)

    for node in nodes:
        visit(node, frozenset())
    return out


def fields_only(nodes):
    """True for a config dataclass: a class whose body is its fields (and a docstring). Its values
    are the config a record holds already; its help texts are not code."""
    if len(nodes) != 1 or not isinstance(nodes[0], ast.ClassDef):
        return False
    body = [s for s in nodes[0].body if not isinstance(s, ast.Expr)]
    return bool(body) and all(isinstance(s, ast.AnnAssign) for s in body)


# (roots, root) -> (what the answer was read from, with their stat keys; the answer).
_CODE_OF = {}


def read_from(root, files):
    """The stat keys of the files an answer was read from, of root and of its packages' folders (a
    module added or removed changes its folder's mtime, and so which module a name resolves to);
    None when one of the files is gone."""
    folders = [root] + sorted(e.path for e in os.scandir(root)
                              if e.is_dir() and os.path.isfile(os.path.join(e.path, "__init__.py")))
    try:
        return [_key(f) for f in files] + [_key(d) for d in folders]
    except FileNotFoundError:
        return None


def code_of(roots, root=ROOT):
    """{"file.py:NAME": hash} of the code reached from `roots`, [(module, name)] (a stage's runner
    and its function): every function, class and constant of the project that they refer to, and
    what those refer to, through the imports of each file, and each of their files' statements
    that act on import (IMPORTED: a call at the top level). A class counts whole (its methods run
    on objects the code only names). Each hash is `code_digest`'s, so a comment, a docstring or
    the layout never changes it; config dataclasses are left out (`fields_only`). The answer is
    kept while none of the files it was read from, nor the package folders, has changed."""
    cached = _CODE_OF.get((tuple(roots), root))
    if cached is not None and read_from(root, cached[0]) == cached[1]:
        return dict(cached[2])
    seen, todo = set(), list(roots)
    while todo:
        piece = todo.pop()
        if piece in seen:
            continue
        seen.add(piece)
        module, name = piece
        nodes = parsed(root, module)[0][name]
        # What its module does on import runs too.
        todo.append((module, IMPORTED))
        if not fields_only(nodes):
            todo.extend(references(root, module, nodes))
    out = {}
    for module, name in sorted(seen):
        nodes = parsed(root, module)[0][name]
        if fields_only(nodes):
            continue
        key = _key(module_path(root, module)) + (name,)
        if key not in _DIGESTS:
            # A copy: the parsed tree stays as read.
            body = ast.Module(body=[copy.deepcopy(n) for n in nodes], type_ignores=[])
            _DIGESTS[key] = code_digest(body)
        out[f"{os.path.relpath(key[0], root)}:{name}"] = _DIGESTS[key]
    files = sorted({module_path(root, module) for module, _ in seen})
    keys = read_from(root, files)
    # A file gone since it was read: nothing to compare a later call with, so nothing kept.
    if keys is not None:
        _CODE_OF[(tuple(roots), root)] = (files, keys, dict(out))
    return out
