"""Progress while the work runs, and nothing else changed by it: pretraining prints a line every --log_interval
iterations and at each evaluation, each with its eta, and two pretrainings that differ only by it write the same
pretrain_metrics.jsonl rows (bar the clock) and the same pretrain.pt; the reward model prints a line every
--rm_log_every steps and DPO every --dpo_log_every steps and at its last, each with its eta; none of the three flags
is a stage's field, so changing one keeps a finished run; the evaluation's and best-of-k's counter shows on a
terminal only (not through a pipe, not in a worker, not off rank 0) and changes no number.

    python -m pytest -q tests/test_progress.py

One small pipeline (world to reward model) is made once for the file: TINY with 12 pretraining iterations, 60
preference pairs and responses of at most 16 tokens."""
import contextlib, io, multiprocessing, os, re, shutil, sys, time
import pytest
import torch

import data, tokenizer, train
from ref import load_reference
from reward import load_scalar_model
from machinery import progress, records, store
from options import evaluate
from pipeline import stages
from machinery.config import override
from ref import load_checkpoint
from conftest import TINY

# 12 iterations with an evaluation at 6 and 12; 60 pairs: 15 held out, 45 to train on, in 6 batches of 8; responses
# of at most 16 tokens.
FLAGS = override(TINY, ["--max_iters=12", "--eval_interval=6", "--n_samples=1", "--n_pairs=60", "--rm_batch_size=8",
                        "--n_eval=4", "--bestofk_n=2", "--response_length=16"])
ETA = r"eta \d+m\d\ds"


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """The stages up to the reward model under FLAGS, a line every 4 pretraining iterations and every 3 reward
    model steps: (folder, what they printed)."""
    out = str(tmp_path_factory.mktemp("progress"))
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        cfg = train.parse(FLAGS + [f"--out_dir={out}", "--log_interval=4", "--rm_log_every=3"])
        with train.open_folder(cfg):
            train.run_stages(cfg, upto="reward")
    return out, printed.getvalue()


def test_pretraining_prints_a_line_every_log_interval_and_at_each_evaluation_with_its_eta(made):
    lines = [line for line in made[1].splitlines() if line.startswith("iter ")]
    assert [int(line.split()[1].split("/")[0]) for line in lines] == [4, 6, 8, 12]
    assert ["| val " in line for line in lines] == [False, True, False, True]
    for line in lines:
        assert re.fullmatch(r"iter \d+/12 \| loss \d+\.\d{3}( \| val \d+\.\d{3})? \| lr \S+ \| [\d.]+k tok/s \| "
                            + ETA, line), line
    assert lines[-1].endswith("eta 0m00s")


def test_log_interval_changes_no_row_and_no_weight(made, tmp_path):
    """The same world pretrained again, a line at the evaluations only: the same rows (their clock aside), the
    same pretrain.pt to the byte, the same record."""
    out, _ = made
    for name in stages.WORLD:
        shutil.copy(os.path.join(out, name), tmp_path / name)
    store.save_json(str(tmp_path / "stages.json"), {"world": records.load_records(out)["world"]})
    train.main(FLAGS + [f"--out_dir={tmp_path}", "--log_interval=1000", "--stage=pretrain"])
    rows = [store.load_json(os.path.join(d, "pretrain_metrics.jsonl"), lines=True) for d in (out, str(tmp_path))]
    assert len(rows[0]) == 12 and [list(r) for r in rows[0]] == [list(r) for r in rows[1]]
    clockless = [[{k: v for k, v in r.items() if k != "elapsed"} for r in rs] for rs in rows]
    assert clockless[0] == clockless[1]
    assert store.file_hash(os.path.join(out, "pretrain.pt")) == store.file_hash(str(tmp_path / "pretrain.pt"))
    recs = [records.load_records(d)["pretrain"] for d in (out, str(tmp_path))]
    assert recs[0]["config"] == recs[1]["config"] and "log_interval" not in recs[0]["config"]


def test_the_reward_model_prints_a_line_every_rm_log_every_steps_with_its_eta(made):
    lines = [line for line in made[1].splitlines() if line.startswith("reward model step ")]
    assert [line.split()[3] for line in lines] == ["3/6", "6/6"]
    for line in lines:
        assert re.fullmatch(r"reward model step \d/6 \| bt loss \d+\.\d{3} \| acc [\d.]+ \| \d+ ms/step \| " + ETA,
                            line), line
    assert "reward model epoch 1/1: bt loss " in made[1]


def test_dpo_prints_a_line_every_dpo_log_every_steps_and_at_its_last_with_its_eta(made, tmp_path):
    out, _ = made
    cfg = train.parse(FLAGS + [f"--out_dir={out}", "--stage=dpo", "--dpo_batch_size=8", "--dpo_log_every=4"])
    st = stages.BY_NAME["dpo"]
    lines = []
    stages.run_stage(cfg, st, stages.stamp(cfg, st), base=out, run_dir=str(tmp_path), log=lines.append)
    steps = [line for line in lines if line.startswith("dpo step ")]
    assert [line.split()[2] for line in steps] == ["4/6", "6/6"]
    for line in steps:
        assert re.fullmatch(r"dpo step \d/6 \| loss \d+\.\d{3} \| margins [+-]\d+\.\d{3} \| acc [\d.]+ \| "
                            r"logp chosen -?[\d.]+ \| " + ETA, line), line
    assert len(store.load_json(str(tmp_path / "dpo_metrics.jsonl"), lines=True)) == 6


def test_the_display_flags_are_no_stage_s_fields_so_a_finished_run_keeps_its_stages(made, tmp_path, capsys):
    for name in ("log_interval", "rm_log_every", "dpo_log_every"):
        assert not [st.name for st in stages.STAGES if name in st.fields], name
    out = str(tmp_path / "run")
    shutil.copytree(made[0], out)
    cfg = train.parse(FLAGS + [f"--out_dir={out}", "--log_interval=3", "--rm_log_every=2"])
    with train.open_folder(cfg):
        train.run_stages(cfg, upto="reward")
    said = capsys.readouterr().out
    assert said.count("done with this config, kept") == 5 and "iter " not in said


def models(out):
    """(cfg.run, pretrained model, reference, reward model, tokenizer, held-out prompts) of a finished folder."""
    cfg = train.parse(FLAGS + [f"--out_dir={out}"])
    model, _ = load_checkpoint(os.path.join(out, "pretrain.pt"), "cpu")
    ref = load_reference(os.path.join(out, "ref.pt"), "cpu")
    rm, _ = load_scalar_model(os.path.join(out, "reward.pt"), "cpu")
    enc = tokenizer.load_tokenizer(out, "bpe")
    heldout = data.load_prompts(out)["heldout"]
    return cfg.run, model, ref, rm, enc, heldout


def test_the_evaluation_and_best_of_k_count_on_a_terminal_only_and_change_no_number(made, capsys, monkeypatch):
    run, model, ref, rm, enc, heldout = models(made[0])
    said, numbers = {}, {}
    for terminal in (False, True):
        monkeypatch.setattr(sys.stdout, "isatty", lambda: terminal)
        torch.manual_seed(0)
        metrics, _ = evaluate.evaluate_policy(model, enc, heldout, run, ref, rm, 3, batch=2)
        bok = evaluate.best_of_k(model, enc, heldout, run, 2, 1.25, 4)
        numbers[terminal] = (metrics, bok)
        said[terminal] = capsys.readouterr().out
    assert numbers[False] == numbers[True]
    assert said[False] == ""                                               # a pipe, a test, a CI log: nothing
    shown = said[True]
    assert shown.startswith("\revaluating: 0/3 samples\x1b[K\revaluating: 2/3 samples | eta ")
    assert "\rbest-of-k: 0/4 samples\x1b[K" in shown
    # Each counter is erased once done: what is printed after it starts on a clean line.
    assert shown.count("\r\x1b[K") == 2 and shown.endswith("\r\x1b[K") and "\n" not in shown


def test_the_counter_is_silent_in_a_worker_and_off_rank_0(capsys, monkeypatch):
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    progress.counter("evaluating", 1, 4, "samples", time.time())
    assert re.fullmatch(r"\revaluating: 1/4 samples \| eta 0m0\ds\x1b\[K", capsys.readouterr().out)
    monkeypatch.setenv("RANK", "1")
    progress.counter("evaluating", 1, 4, "samples", time.time())
    assert capsys.readouterr().out == ""
    monkeypatch.delenv("RANK")
    # lab/ablate.py's pool workers share their parent's terminal.
    monkeypatch.setattr(multiprocessing, "parent_process", lambda: object())
    progress.counter("evaluating", 1, 4, "samples", time.time())
    assert capsys.readouterr().out == ""
