"""Edits take effect: each stage's record holds a hash of each piece of code it reaches (parsed, so comments,
docstrings and layout do not count; derived from names and imports, never listed by hand). An edit of that code
redoes the stage and what follows, with one line naming the piece; a comment-only edit keeps everything; an edit
of seeding or of what runs on import is seen; PPO's resume and ablate.py's run reuse obey the same rule."""
import glob, os, shutil, subprocess, sys
import pytest
from lab import ablate
from machinery import records, store
from pipeline import stages
from test_state import SMOKE, copy_run

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def code_copy(tmp_path, edits):
    """The project's .py files (the root's and its folders') copied to tmp_path/code, with `edits` {file:
    function(text) -> text} applied."""
    code = tmp_path / "code"
    code.mkdir(parents=True)
    for f in glob.glob(os.path.join(ROOT, "*.py")) + glob.glob(os.path.join(ROOT, "*", "*.py")):
        rel = os.path.relpath(f, ROOT)
        if rel.startswith("tests"):
            continue
        os.makedirs(code / os.path.dirname(rel), exist_ok=True)
        shutil.copy(f, code / rel)
    for name, edit in edits.items():
        p = code / name
        p.write_text(edit(p.read_text()))
    return str(code)


def comment_only(text):
    """A new comment, a changed docstring and a blank line: nothing the interpreter runs."""
    first = text.index('"""', 3)
    return text[:first] + " (edited)" + text[first:] + "\n\n# a comment added by a learner\n"


def new_statement(text):
    """A statement that acts when the file is imported."""
    return text + "\nprint(end='')\n"


def new_constant(text):
    """A new name nothing refers to: no stage runs it."""
    return text + "\nEDITED = 1\n"


def edit_function(name, old, new):
    """An edit of one function's body: `old` replaced by `new` within `def name(`."""
    def edit(text):
        start = text.index(f"def {name}(")
        end = text.find("\ndef ", start + 1)
        end = len(text) if end < 0 else end
        assert old in text[start:end], (name, old)
        return text[:start] + text[start:end].replace(old, new, 1) + text[end:]
    return edit


def gpt_forward_edit(text):
    """One more operation in the GPT's forward: the token ids multiplied by 1."""
    marker = "    def forward(self, idx, targets=None, mask=None, cache=None):\n"
    assert marker in text
    return text.replace(marker, marker + "        idx = idx * 1\n")


def test_the_code_digest_ignores_comments_docstrings_and_layout():
    import ast
    a = 'def f(x):\n    """Doubles."""\n    return 2 * x\n'
    b = 'def f(x):\n    # twice x\n    return (2 *\n            x)\n'
    c = 'def f(x):\n    return 3 * x\n'
    assert records.code_digest(ast.parse(a)) == records.code_digest(ast.parse(b))
    assert records.code_digest(ast.parse(a)) != records.code_digest(ast.parse(c))


ALL = {"world", "pretrain", "reference", "preferences", "reward", "ppo", "report", "dpo"}


@pytest.mark.parametrize("edits, changed", [
    # dpo: its evaluation reaches kl.py.
    ({"kl.py": new_statement}, {"ppo", "report", "dpo"}),
    ({"kl.py": new_constant}, set()),
    ({"kl.py": edit_function("kl_k1", "logp - logp_ref", "logp - logp_ref + 0")}, {"ppo"}),
    ({"model.py": gpt_forward_edit}, {"pretrain", "reference", "preferences", "reward", "ppo", "report", "dpo"}),
    # dpo: online DPO's gold judge and its rounds' gold scores.
    ({"data.py": edit_function("gold_score", "return", "return 0 +")},
     {"pretrain", "preferences", "ppo", "dpo"}),
    ({"model.py": comment_only, "kl.py": comment_only, "ppo.py": comment_only}, set()),
    ({"pipeline/stages.py": lambda t: t.replace('print(f"reference: frozen copy', 'print(f"reference: a frozen copy')},
     {"reference"}),
    # The seeding every stage starts from (stages.run_stage): an edit changes every number.
    ({"pipeline/stages.py": edit_function("seed_everything", "torch.manual_seed(seed)",
                                           "torch.manual_seed(seed + 1)")}, ALL),
    ({"pipeline/stages.py": edit_function("run_stage", "seed_everything(cfg.run.seed)",
                                           "seed_everything(cfg.run.seed + 1)")}, ALL)])
def test_each_stage_hashes_the_code_it_runs_and_no_more(tmp_path, edits, changed):
    code = code_copy(tmp_path, edits)
    moved = {st.name for st in stages.STAGES if stages.code_of(st, code) != stages.code_of(st)}
    assert moved == changed


def test_a_file_edited_after_its_stage_was_hashed_in_this_process_changes_the_hash(tmp_path):
    """code_of keeps its answer between calls in a process (ablate hashes the PPO stage for every run): an edit made
    after the first call, in the same process, is still seen, and undoing it gives the first answer back."""
    code = code_copy(tmp_path, {})
    ppo = stages.BY_NAME["ppo"]
    first = stages.code_of(ppo, code)
    assert stages.code_of(ppo, code) == first
    kl = tmp_path / "code" / "kl.py"
    text = kl.read_text()
    kl.write_text(new_statement(text))
    edited = stages.code_of(ppo, code)
    assert edited != first and edited["kl.py:<module>"] != first["kl.py:<module>"]
    kl.write_text(text)
    assert stages.code_of(ppo, code) == first


def run_train(code, argv):
    p = subprocess.run([sys.executable, "train.py", *argv], cwd=code, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr
    return p.stdout


def test_an_edit_of_kl_py_redoes_ppo_and_report_and_a_comment_keeps_everything(run, tmp_path):
    out = copy_run(run, tmp_path)
    said = run_train(code_copy(tmp_path / "a", {"kl.py": comment_only, "model.py": comment_only}),
                     SMOKE + [f"--out_dir={out}"])
    assert said.count("done with this config, kept") == 7
    said = run_train(code_copy(tmp_path / "b", {"kl.py": new_statement}), SMOKE + [f"--out_dir={out}"])
    assert "---- stage ppo: its code changed since it was made (kl.py:<module>): redone ----" in said
    assert "---- stage pretrain: done with this config, kept ----" in said
    assert "---- stage report ----" in said and said.count("done with this config, kept") == 5
    assert store.load_json(os.path.join(out, "stages.json"))["ppo"]["code"]["kl.py:<module>"] != \
        store.load_json(os.path.join(run, "stages.json"))["ppo"]["code"]["kl.py:<module>"]


def test_an_earlier_stage_edited_is_refused_for_one_later_stage(run, tmp_path):
    out = copy_run(run, tmp_path)
    p = subprocess.run([sys.executable, "train.py", *SMOKE, f"--out_dir={out}", "--stage=report"],
                       cwd=code_copy(tmp_path, {"kl.py": new_statement}), capture_output=True, text=True,
                       timeout=900)
    assert p.returncode == 2 and p.stderr.count("\n") == 1
    assert "stage ppo" in p.stderr and "kl.py:<module> changed since" in p.stderr


def test_ppo_s_resume_and_ablate_s_reuse_refuse_state_made_by_other_code(tmp_path):
    stamp = {"config": {}, "inputs": {}, "defaults": {}, "code": {"kl.py": "new"}}
    import torch
    torch.save(dict(stamp=dict(stamp, code={"kl.py": "old"}), iter=2), tmp_path / "ppo_state.pt")
    assert store.load_resumable(str(tmp_path / "ppo_state.pt"), stamp, ["iter"])[1] == \
        "made under another config, inputs or code"
    (tmp_path / "ppo_state.pt").unlink()
    for n in ("actor.pt", "metrics.jsonl", "ppo.json"):
        (tmp_path / n).write_text(n)
    outputs = ["actor.pt", "metrics.jsonl", "ppo.json"]
    store.save_json(str(tmp_path / ablate.RECORD), ablate.run_record(str(tmp_path), stamp, outputs))
    assert ablate.finished(str(tmp_path), stamp) is True
    old = dict(stamp, code={"kl.py": "old"})
    store.save_json(str(tmp_path / ablate.RECORD), ablate.run_record(str(tmp_path), old, outputs))
    assert ablate.finished(str(tmp_path), stamp) is False


# ---- what a stage runs, traced, against what its digest holds ----
def top_level(path):
    """[(first line, last line, name)] of each top-level statement of a file that binds a name (decorators
    included)."""
    import ast
    out = []
    for node in ast.parse(open(path).read()).body:
        first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
        for name in records.bound_names(node):
            out.append((first, node.end_lineno, name))
    return out


def executed(fn):
    """fn() run under a profiler: the project's pieces ("file.py:NAME") whose functions, methods or lambdas were
    called meanwhile, each mapped to the top-level statement that holds it (what runs on import is not a
    call made by the stage)."""
    import sys
    codes = set()

    def hook(frame, event, arg):
        if event == "call":
            codes.add(frame.f_code)
    sys.setprofile(hook)
    try:
        fn()
    finally:
        sys.setprofile(None)
    spans, out = {}, set()
    for c in codes:
        path = c.co_filename
        # The project's own files: the root's and its folders' (not the tests, not a venv inside it).
        folder = os.path.dirname(os.path.relpath(path, ROOT))
        if not path.startswith(ROOT + os.sep) or folder not in ("", "machinery", "options", "pipeline", "lab") \
                or c.co_name == "<module>":
            continue
        if path not in spans:
            spans[path] = top_level(path)
        hits = [name for first, last, name in spans[path] if first <= c.co_firstlineno <= last]
        assert hits, f"{path}:{c.co_firstlineno} ({c.co_name}) is in no top-level statement"
        out |= {f"{os.path.relpath(path, ROOT)}:{name}" for name in hits}
    return out


def test_every_function_a_stage_runs_is_in_its_digest(tmp_path, monkeypatch):
    """The smoke pipeline, made smaller, run with each stage under a profiler, then PPO again under options that
    take other paths (a KL limit, a moving anchor, LoRA, GRPO, evaluation during PPO, the pretraining mix, int8),
    and DPO offline and online:
    every project function, method and lambda that ran inside a stage is a piece of that stage's code digest, so
    no code a stage runs can change without the stage being redone."""
    import train
    ran = {}
    real = stages.run_stage

    def traced(cfg, st, stamp, **kw):
        ran.setdefault(st.name, set()).update(executed(lambda: real(cfg, st, stamp, **kw)))
    monkeypatch.setattr(train, "run_stage", traced)
    small = SMOKE + [f"--out_dir={tmp_path}", "--max_iters=20", "--n_pairs=200", "--ppo_iters=2",
                     "--n_eval=8", "--n_samples=4"]
    train.main(small)
    # DPO first: under --stage=dpo, PPO's flags must be the folder's PPO's.
    offline = ["--dpo_epochs=0.2", "--dpo_batch_size=8"]
    for flags in (offline + ["--dpo_eval_every=1", "--eval_n=4"],
                  offline + ["--dpo_loss=ipo", "--dpo_reference=none"],
                  ["--dpo_pairs=online", "--online_rounds=2", "--online_prompts=4", "--dpo_judge=gold",
                   "--dpo_logps=mean", "--dpo_eval_every=2", "--eval_n=4"]):
        train.main(small + ["--stage=dpo"] + flags)
    options = [["--kl_max=5", "--ref_update=sync", "--ref_sync_every=1", "--eval_every=1", "--eval_n=4"],
               ["--ref=lora", "--ptx_coef=0.1", "--minibatch_order=length"],
               ["--advantage=grpo", "--group_size=4", "--kl_in=loss", "--kl_estimator=full", "--reward=gold"],
               ["--stop_kl=0.001", "--ref=int8"]]
    for flags in options:
        train.main(small + ["--stage=ppo"] + flags)
    assert set(ran) == {st.name for st in stages.STAGES}
    for st in stages.STAGES:
        missing = sorted(ran[st.name] - set(stages.code_of(st)))
        assert not missing, f"stage {st.name} ran code its digest does not hold: {missing}"
