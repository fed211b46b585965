"""The tables the answers quote, checked against the archive: every suite's tables rebuilt from the
kept runs alone (each suite's --tables_only, COMMANDS), then every markdown table of ANSWER.md and
answers/*.md whose header row is one of theirs compared with them, row by row and cell by cell.

    python -m lab.ablate --tables_only --check     # exit 1 on any difference, naming each
    python -m pytest -q tests/test_check.py

A quoted table is matched to the rebuilt table of the same header that shares the most of its
rows (a row is known by its first cells: as many as make the rebuilt table's rows distinct); each
row it quotes must be one of that table's, every cell as rebuilt. A quoted table may leave rows
out; it may not change one. A table whose header no rebuilt table has is not a quoted one (a table
of the prose): the check counts them and names where they are.
Left out: the numbers in the prose (the answers quote them from these tables).
"""
import glob, os, subprocess, sys, tempfile

# The commands whose tables the answers quote (each with --tables_only, into a folder of its own),
# each on the pretrained model its tables were made on (--base: the AVX-512 EPYC's 9974174c, the
# AVX2 EPYC's c0279a02).
MAIN, AVX2 = "--base=9974174c", "--base=c0279a02"
COMMANDS = [
    ["lab.ablate", "--suite=core", MAIN],
    ["lab.ablate", "--suite=estimators", MAIN],
    ["lab.ablate", "--suite=reference", MAIN],
    ["lab.ablate", "--suite=anchors", MAIN],
    ["lab.ablate", "--suite=cheap", MAIN],
    ["lab.ablate", "--suite=beta", "--conditions=no_kl,beta_0.001,fixed_0.005,beta_0.01,beta_0.03,"
     "fixed_0.05,beta_0.1,beta_0.3,fixed_0.5,beta_1,adaptive,adaptive_fast", MAIN],
    ["lab.ablate", "--suite=verifiable", MAIN],
    ["lab.ablate", "--suite=models", MAIN],
    ["lab.ablate", "--suite=overopt", MAIN],
    ["lab.ablate", "--suite=controls", AVX2],
    ["lab.dpo_suite", "--subdir=dpo_epochs", "--arms=frontier", "--dpo_epochs=4",
     "--dpo_eval_every=26", "--models=", AVX2],
    ["lab.dpo_suite", "--subdir=dpo_epochs", "--arms=ipo_0.1,ipomean_0.1", "--dpo_epochs=4",
     "--dpo_eval_every=26", "--models=", AVX2],
    ["lab.dpo_suite", "--arms=dpo_0.05,dpo_0.1,dpo_0.3,dpo_1,dpo_5,ipo_0.1,ipo_1,noref_0.05,"
     "noref_0.1,noref_0.3,noref_1,noref_5,ppo_adaptive,ppo_fixed_0.05", MAIN],
]
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def cells(line):
    """The cells of one markdown table line, stripped."""
    return [c.strip() for c in line.strip().strip("|").split("|")]


def tables(text):
    """The markdown tables of a text: [(line number of the header, header cells, [row cells])]."""
    lines = text.splitlines()
    out = []
    i = 0
    while i + 1 < len(lines):
        head, rule = lines[i].strip(), lines[i + 1].strip()
        if head.startswith("|") and rule.startswith("|") and set(rule) <= set("|-: "):
            rows = []
            j = i + 2
            while j < len(lines) and lines[j].strip().startswith("|"):
                rows.append(cells(lines[j]))
                j += 1
            out.append((i + 1, cells(head), rows))
            i = j
        else:
            i += 1
    return out


def key_width(rows):
    """How many first cells tell a table's rows apart (all of them when nothing fewer does)."""
    width = max((len(r) for r in rows), default=1)
    for k in range(1, width + 1):
        if len({tuple(r[:k]) for r in rows}) == len(rows):
            return k
    return width


def compare(documents, made):
    """documents: {name: text} (the answers); made: [text] (the rebuilt tables' files). Returns
    (differences, checked, unquoted): each difference one line naming the file, the table (its
    line and header) and the row and column; checked: how many quoted tables were compared;
    unquoted: "file:line" of each table whose header no rebuilt table has."""
    rebuilt = {}
    for text in made:
        for _, head, rows in tables(text):
            rebuilt.setdefault(tuple(head), []).append(rows)
    differences, unquoted, checked = [], [], 0
    for name, text in documents.items():
        for line, head, rows in tables(text):
            if tuple(head) not in rebuilt:
                unquoted.append(f"{name}:{line}")
                continue
            checked += 1
            where = f"{name}, the table at line {line} ({' | '.join(head[:3])} | ...)"
            differences += compare_table(where, head, rows, rebuilt[tuple(head)])
    return differences, checked, unquoted


def compare_table(where, head, rows, candidates):
    """One quoted table against the rebuilt tables of its header: the one sharing the most rows
    (then the most keys) is its source. Returns the differences, one line each."""
    def score(source):
        k = key_width(source)
        keys = {tuple(r[:k]) for r in source}
        return (sum(r in source for r in rows), sum(tuple(r[:k]) in keys for r in rows))
    source = max(candidates, key=score)
    k = key_width(source)
    by_key = {tuple(r[:k]): r for r in source}
    # A table whose rows are mostly in no rebuilt table of its header quotes none of them (another
    # suite's table of the same header, or one the archive cannot rebuild yet): one line.
    known = sum(tuple(r[:k]) in by_key for r in rows)
    if 2 * known < len(rows):
        return [f"{where}: {len(rows) - known} of its {len(rows)} rows are in no rebuilt table of "
                "this header"]
    out = []
    for r in rows:
        key = " | ".join(r[:k])
        want = by_key.get(tuple(r[:k]))
        if want is None:
            out.append(f"{where}: row '{key}' is in no rebuilt table of this header")
            continue
        for col, (have, made) in enumerate(zip(r, want)):
            if have != made:
                name = head[col] if col < len(head) else f"column {col + 1}"
                out.append(f"{where}: row '{key}', column '{name}': the text has '{have}', the "
                           f"archive gives '{made}'")
                break
        else:
            if len(r) != len(want):
                out.append(f"{where}: row '{key}' has {len(r)} cells, the rebuilt row {len(want)}")
    return out


def documents(root=None):
    """{path relative to root (default ROOT): text} of ANSWER.md and answers/*.md."""
    root = root or ROOT
    paths = [os.path.join(root, "ANSWER.md")] + sorted(glob.glob(os.path.join(root, "answers",
                                                                              "*.md")))
    out = {}
    for p in paths:
        with open(p, encoding="utf-8") as f:
            out[os.path.relpath(p, root)] = f.read()
    return out


def argv_of(command, out_dir, kept):
    """A command of COMMANDS as it runs: its module, its flags, --tables_only into out_dir from
    kept, its figures left there (not copied where the documents show them)."""
    return [*command, "--tables_only", f"--out_dir={out_dir}", f"--kept={kept}", "--figures="]


def as_a_user(command, out_dir, kept):
    """One command's tables, run as a user runs it (its own Python), into out_dir: None, or why it
    could not rebuild them (its one-line error)."""
    argv = [sys.executable, "-m", *argv_of(command, out_dir, kept)]
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True)
    if done.returncode == 0:
        return None
    return (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]


def check(kept, commands=None, docs=None, run=None):
    """Every command's tables (default COMMANDS) rebuilt from kept (run(command, out_dir, kept),
    default as_a_user: None or why not), then the answers (docs, default documents()) compared
    with them. Returns (lines to print, ok): ok when every command rebuilt its tables and no
    quoted cell differs."""
    docs = documents() if docs is None else docs
    commands = COMMANDS if commands is None else commands
    run = run or as_a_user
    lines, made = [], []
    with tempfile.TemporaryDirectory() as out:
        for i, command in enumerate(commands):
            folder = os.path.join(out, str(i))
            os.makedirs(folder)
            why = run(command, folder, kept)
            if why is not None:
                lines.append(f"python -m {' '.join(command)} --tables_only: {why}")
            for path in sorted(glob.glob(os.path.join(folder, "**", "*.md"), recursive=True)):
                with open(path, encoding="utf-8") as f:
                    made.append(f.read())
    differences, checked, unquoted = compare(docs, made)
    lines += differences
    ok = not lines
    where = ""
    if unquoted:
        more = ", ..." if len(unquoted) > 6 else ""
        where = f" ({', '.join(unquoted[:6])}{more})"
    lines.append(f"check: {checked} quoted tables compared in {len(docs)} files, "
                 f"{len(differences)} differences; {len(unquoted)} tables quote no rebuilt "
                 f"table{where}")
    return lines, ok
