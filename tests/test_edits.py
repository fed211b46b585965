"""Edits take effect: each stage's record holds a hash of the code it ran (parsed, so comments, docstrings and
layout do not count). An edit of that code redoes the stage and what follows, with one line naming the file; a
comment-only edit keeps everything; PPO's resume and ablate.py's run reuse obey the same rule."""
import glob, os, shutil, subprocess, sys
import pytest
import ablate, stages, store
from test_state import SMOKE, copy_run

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def code_copy(tmp_path, edits):
    """The project's .py files copied to tmp_path/code, with `edits` {file: function(text) -> text} applied."""
    code = tmp_path / "code"
    code.mkdir(parents=True)
    for f in glob.glob(os.path.join(ROOT, "*.py")):
        shutil.copy(f, code)
    for name, edit in edits.items():
        p = code / name
        p.write_text(edit(p.read_text()))
    return str(code)


def comment_only(text):
    """A new comment, a changed docstring and a blank line: nothing the interpreter runs."""
    first = text.index('"""', 3)
    return text[:first] + " (edited)" + text[first:] + "\n\n# a comment added by a learner\n"


def new_statement(text):
    return text + "\nEDITED = 1\n"


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
    assert store.code_digest(ast.parse(a)) == store.code_digest(ast.parse(b))
    assert store.code_digest(ast.parse(a)) != store.code_digest(ast.parse(c))


@pytest.mark.parametrize("edits, changed", [
    ({"kl.py": new_statement}, {"ppo", "report"}),
    ({"model.py": gpt_forward_edit}, {"pretrain", "reference", "preferences", "reward", "ppo", "report"}),
    ({"data.py": new_statement}, {"world", "pretrain", "preferences", "ppo", "report"}),
    ({"model.py": comment_only, "kl.py": comment_only, "ppo.py": comment_only}, set()),
    ({"stages.py": lambda t: t.replace('print(f"reference: frozen copy', 'print(f"reference: a frozen copy')},
     {"reference"})])
def test_each_stage_hashes_the_code_it_runs_and_no_more(tmp_path, edits, changed):
    code = code_copy(tmp_path, edits)
    moved = {st.name for st in stages.STAGES if stages.code_of(st, code) != stages.code_of(st)}
    assert moved == changed


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
    assert "---- stage ppo: its code changed since it was made (kl.py): redone ----" in said
    assert "---- stage pretrain: done with this config, kept ----" in said
    assert "---- stage report ----" in said and said.count("done with this config, kept") == 5
    assert store.load_json(os.path.join(out, "stages.json"))["ppo"]["code"]["kl.py"] != \
        store.load_json(os.path.join(run, "stages.json"))["ppo"]["code"]["kl.py"]


def test_an_earlier_stage_edited_is_refused_for_one_later_stage(run, tmp_path):
    out = copy_run(run, tmp_path)
    p = subprocess.run([sys.executable, "train.py", *SMOKE, f"--out_dir={out}", "--stage=report"],
                       cwd=code_copy(tmp_path, {"kl.py": new_statement}), capture_output=True, text=True,
                       timeout=900)
    assert p.returncode == 2 and p.stderr.count("\n") == 1
    assert "stage ppo" in p.stderr and "kl.py changed since" in p.stderr


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
