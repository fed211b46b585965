"""State that cannot go stale or be lost: stage records, the lock, atomic writes, kill and resume, bad input.
Each probe works on a copy of the smoke run (the `run` fixture; `tiny_run`, smaller, where a probe builds whole
pipelines), through train.main as `python train.py` runs it."""
import os, shutil, signal, subprocess, sys, threading
import pytest
import torch
import train
from lab import inspect_page
from machinery import store
from pipeline import stages
from machinery.errors import RunError
from conftest import TINY

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The smoke preset without figures: the smoke run (conftest.py's `run`) draws every one, and a stage run
# again here has no figure to check (a figure is half a short PPO stage's time).
SMOKE = ["--preset=smoke", "--plots=false"]


def copy_run(run, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(run, out)
    return str(out)


def hashes(out):
    """Every file under out (the lock file aside) -> its hash."""
    return {os.path.join(d, f): store.file_hash(os.path.join(d, f)) for d, _, fs in os.walk(out) for f in fs
            if f != ".lock"}


def refused(argv, capsys, main=None, code=2):
    """main (train.main) must stop with `code` and one line on stderr; returns that line."""
    with pytest.raises(SystemExit) as e:
        (main or train.main)(argv)
    err = capsys.readouterr().err.strip()
    assert e.value.code == code and len(err.splitlines()) == 1, err
    return err


def numbers(out):
    """Every number a run reports, without the clock."""
    strip = lambda d: {k: v for k, v in d.items() if k not in ("seconds", "tokens_per_second", "log")}
    rows = [{k: v for k, v in r.items() if not k.startswith("time/")} for r in store.load_json(
        os.path.join(out, "metrics.jsonl"), lines=True)]
    report = store.load_json(os.path.join(out, "report.json"))
    return dict(pretrain=strip(store.load_json(os.path.join(out, "pretrain.json"))), metrics=rows,
                reward=store.load_json(os.path.join(out, "reward.json")),
                report={k: report[k] for k in ("pretrained", "rlhf")},
                ppo=store.load_json(os.path.join(out, "ppo.json"))["final"])


@pytest.mark.parametrize("args, message", [
    (["--nope=1"], "unknown flag"), (["max_iters=3"], "unknown flag"), (["--max_iters=abc"], "bad value"),
    (["--fresh=maybe"], "bad value"), (["--stage=bogus"], "bad value for --stage"), (["--seed=1", "--seed=2"], "--seed is given twice"), (["--fresh=yes"], "true, false, 1 or 0"),
    (["--kl_estimator=k9"], "bad value"), (["--ref_sync_alpha=0"], "(0,1]"), (["--ref_update=soft"], "bad value"), (["--ref=int8", "--ref_update=sync"], "needs --ref=full"), (["--device=tpu"], "bad value"), (["--lr=nan"], "finite"),
    (["--lr=inf"], "finite"), (["--lr=0"], "must be >0"), (["--gamma=1.5"], "[0,1]"), (["--n_pairs=1"], "--n_pairs=1"),
    (["--n_reviews=20"], "--n_reviews"), (["--minibatch_size=100"], "--minibatch_size=100"),
    (["--response_length=100"], "--block_size=96"), (["--n_head=3"], "not divisible"),
    (["--fresh", "--stage=ppo"], "--fresh redoes every stage")])
def test_bad_input_is_one_line_exit_2_and_writes_nothing(args, message, tmp_path, capsys):
    assert message in refused(SMOKE + [f"--out_dir={tmp_path}"] + args, capsys)
    assert not os.listdir(tmp_path)


def test_bad_flag_from_the_command_line():
    p = subprocess.run([sys.executable, "train.py", "--ppo_iters=-1"], cwd=ROOT, capture_output=True, text=True,
                       timeout=600)                                     # a hang guard, not a speed bound
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "--ppo_iters" in p.stderr


def test_help_lists_every_flag_with_its_rule():
    p = subprocess.run([sys.executable, "train.py", "--help"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0
    for name in ["--max_iters=500 (>0)", "--kl_ctl=adaptive (fixed|adaptive|band|linear)", "--n_pairs=", "--gamma=1.0",
                 "--out_dir=", "--missing_eos_penalty=", "--save_interval="]:
        assert name in p.stdout, name


def test_out_dir_that_cannot_be_a_folder(tmp_path, capsys):
    (tmp_path / "f").write_text("x")
    assert "is a file" in refused(SMOKE + [f"--out_dir={tmp_path / 'f'}"], capsys)
    assert "cannot be made" in refused(SMOKE + [f"--out_dir={tmp_path / 'f' / 'sub'}"], capsys)


def test_a_long_prompt_is_refused_before_sampling(run, tmp_path, capsys):
    import sample
    out = copy_run(run, tmp_path)
    err = refused([f"--out_dir={out}", "--prompt=review: " + "very " * 80], capsys, sample.main)
    assert "40 new tokens exceed the model's block_size 96" in err


@pytest.mark.parametrize("flag, stage", [("--n_layer=1", "pretrain"), ("--n_pairs=700", "preferences"),
                                         ("--vocab_size=400", "world"), ("--kl_ctl=fixed", "ppo"),
                                         ("--dtype=bf16", "pretrain")])
def test_a_changed_flag_is_refused_not_silently_reused(run, tmp_path, capsys, flag, stage):
    out = copy_run(run, tmp_path)
    before = hashes(out)
    err = refused(SMOKE + [f"--out_dir={out}", flag], capsys)
    name, _, new = flag[2:].partition("=")
    assert f"stage {stage}" in err and f"now --{name}={new}" in err and "--fresh" in err
    assert hashes(out) == before                                                # nothing written, nothing lost


def test_redoing_a_stage_removes_what_was_made_from_it(run, tmp_path, capsys):
    out = copy_run(run, tmp_path)
    train.main(SMOKE + [f"--out_dir={out}", "--stage=reference"])
    assert os.path.exists(os.path.join(out, "ref.pt")) and not os.path.exists(os.path.join(out, "prefs.jsonl"))
    assert not os.path.exists(os.path.join(out, "actor.pt")) and not os.path.exists(os.path.join(out, "report.json"))
    assert "needs stage preferences" in refused(SMOKE + [f"--out_dir={out}", "--stage=ppo"], capsys)


def test_a_damaged_output_is_redone_with_the_same_numbers(run, tmp_path):
    out = copy_run(run, tmp_path)
    with open(os.path.join(out, "metrics.jsonl")) as f:
        lines = f.readlines()
    with open(os.path.join(out, "metrics.jsonl"), "w") as f:                     # cut at a line boundary
        f.writelines(lines[:len(lines) // 2])
    train.main(SMOKE + [f"--out_dir={out}"])
    assert numbers(out) == numbers(run)


# The stage that makes each file.
MADE_BY = {"tokenizer.bpe": "world", "pretrain.pt": "pretrain", "ref.pt": "reference", "prefs.jsonl": "preferences",
           "reward.pt": "reward", "actor.pt": "ppo"}


@pytest.mark.parametrize("name", sorted(MADE_BY))
def test_a_deleted_input_is_redone_with_one_line_naming_it(tiny_run, tmp_path, capsys, name):
    """A file a later stage reads, deleted from a finished run: the stage that makes it is redone (and what follows),
    with one line naming the file, never a traceback from hashing it as a later stage's input."""
    out = copy_run(tiny_run, tmp_path)
    os.remove(os.path.join(out, name))
    train.main(TINY + [f"--out_dir={out}"])
    said = capsys.readouterr().out
    assert f"---- stage {MADE_BY[name]}: {name} is missing: redone ----" in said
    assert os.path.exists(os.path.join(out, name)) and os.path.exists(os.path.join(out, "report.json"))
    if name == "ref.pt":
        assert numbers(out) == numbers(tiny_run)


def test_a_damaged_output_says_so_as_it_is_redone(run, tmp_path, capsys):
    out = copy_run(run, tmp_path)
    with open(os.path.join(out, "reward.pt"), "ab") as f:
        f.write(b"x")
    train.main(SMOKE + [f"--out_dir={out}"])
    assert "---- stage reward: reward.pt has changed since it was made: redone ----" in capsys.readouterr().out


@pytest.mark.parametrize("kind", ["grpo", "rloo"])
def test_a_changed_flag_on_a_finished_critic_free_folder_is_refused(run, tmp_path, capsys, kind):
    """A GRPO or RLOO run leaves no critic.pt: under another --advantage (or any other changed flag) the folder is
    still a finished run, made with other flags, and is refused like any other; it is never retrained silently."""
    out = copy_run(run, tmp_path)
    flags = [f"--advantage={kind}", "--group_size=4"]
    train.main(SMOKE + [f"--out_dir={out}", "--stage=ppo", *flags])
    train.main(SMOKE + [f"--out_dir={out}", *flags])
    before = hashes(out)
    assert "done with this config, kept" in capsys.readouterr().out
    for other in ([], [*flags, "--ppo_lr=1e-4"]):
        err = refused(SMOKE + [f"--out_dir={out}", *other], capsys)
        assert "stage ppo" in err and ("--advantage=" in err or "--ppo_lr=" in err)
        assert hashes(out) == before


def test_a_second_run_on_the_same_folder_is_refused(run, tmp_path, capsys):
    out = copy_run(run, tmp_path)
    with store.Lock(out):
        assert "another run" in refused(SMOKE + [f"--out_dir={out}"], capsys)


def test_a_stale_reference_stops_ppo_at_the_first_rollout(run, tmp_path):
    out = copy_run(run, tmp_path)
    shutil.copy(os.path.join(out, "actor.pt"), os.path.join(out, "ref.pt"))    # not the pretrained model
    cfg = train.parse(SMOKE + [f"--out_dir={out}"])
    with pytest.raises(RunError, match="first rollout"):
        stages.run_ppo(cfg, out, str(tmp_path / "ppo"), stages.stamp(cfg, stages.BY_NAME["ppo"]))


def test_loads_that_fail_name_the_file(tmp_path):
    bad = tmp_path / "ref.pt"
    bad.write_bytes(b"not a checkpoint")
    with pytest.raises(RunError, match="ref.pt"):
        store.load_torch(str(bad))
    (tmp_path / "x.json").write_text('{"a": ')
    with pytest.raises(RunError, match="x.json"):
        store.load_json(str(tmp_path / "x.json"))


def test_no_nan_reaches_a_checkpoint(tmp_path):
    with pytest.raises(RunError, match="non-finite"):
        store.save_torch({"model": {"w": torch.tensor([1.0, float("nan")])}}, str(tmp_path / "m.pt"))
    assert not os.listdir(tmp_path)


class _CtrlCOnWrite:
    """The file _atomic opens, with one change: its `at`-th write() sends this process SIGINT, then goes on, so the
    interrupt lands inside torch.save's writer on every machine, however loaded (a timer's would not)."""

    def __init__(self, f, at):
        self.f, self.at, self.calls, self.sent = f, at, 0, None

    def write(self, data):
        if self.calls == self.at:
            self.sent = self.calls
            os.kill(os.getpid(), signal.SIGINT)         # the default handler raises here, inside torch's writer
        self.calls += 1
        return self.f.write(data)

    def __getattr__(self, name):                        # flush, fileno, close: the real file's
        return getattr(self.f, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return self.f.__exit__(*exc)


@pytest.fixture
def sigint_as_from_a_terminal():
    """SIGINT handled as `python train.py` from a terminal has it (default_int_handler), however
    pytest was started: a shell starts a background job (`python -m pytest &`) with SIGINT ignored,
    Python then leaves it ignored, and store's hold is rightly skipped (no Ctrl-C can come). The
    handler before is given back after the test."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
@pytest.mark.parametrize("where", ["first", "middle", "last"])
def test_ctrl_c_during_a_checkpoint_write_is_an_interrupt_and_the_file_is_whole(
        tmp_path, monkeypatch, where, sigint_as_from_a_terminal):
    """Without the hold, Ctrl-C in torch.save's first write raises KeyboardInterrupt and keeps the old file, in a
    middle one raises RuntimeError from its C++ writer ("unexpected pos"), in the last ones is lost. save_torch must
    hold it until the new file is whole, then raise KeyboardInterrupt."""
    assert threading.current_thread() is threading.main_thread()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler   # what `python train.py` runs with
    target, files = tmp_path / "ckpt.pt", []

    def opener(at):
        def fake_open(path, mode):
            files.append(_CtrlCOnWrite(open(path, mode), at))
            return files[-1]
        return fake_open

    obj = lambda k: dict(k=torch.tensor(k), w=[torch.randn(64, 64, generator=torch.Generator().manual_seed(k))
                                               for _ in range(20)])
    monkeypatch.setattr(store, "open", opener(None), raising=False)     # count the writes of one save
    store.save_torch(obj(0), target)
    n = files[-1].calls
    assert n >= 3
    at = dict(first=0, middle=n // 2, last=n - 1)[where]
    monkeypatch.setattr(store, "open", opener(at), raising=False)
    with pytest.raises(KeyboardInterrupt):
        store.save_torch(obj(1), target)
    assert files[-1].sent == at and files[-1].calls == n               # the signal landed mid-save; the save went on
    saved = torch.load(target, weights_only=True)                       # the new file, whole
    assert int(saved["k"]) == 1 and all(torch.equal(a, b) for a, b in zip(saved["w"], obj(1)["w"], strict=True))
    assert os.listdir(tmp_path) == ["ckpt.pt"]                          # no temporary left behind
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler   # the handler is given back


def test_a_diverging_run_stops_with_one_line(run, tmp_path, capsys):
    out = copy_run(run, tmp_path)
    assert "diverged" in refused(SMOKE + [f"--out_dir={out}", "--stage=ppo", "--ppo_lr=10"], capsys, code=1)
    state = os.path.join(out, "ppo_state.pt")
    assert not os.path.exists(state) or store._all_finite(torch.load(state, weights_only=True))


# `python train.py ARGV` that sends itself SIG right after printing a line that starts with MARKER: the signal lands
# there on any machine, however loaded, and whether or not stdout is flushed (a signal sent by the test on reading
# the line could come after the run has moved on, or ended).
_SIGNAL_AT = """import builtins, os, runpy, sys
marker, sig, sent = sys.argv[1], int(sys.argv[2]), []
sys.argv = ["train.py", *sys.argv[3:]]
real_print = builtins.print
def print(*args, **kw):
    real_print(*args, **kw)
    if args and str(args[0]).startswith(marker) and not sent:
        sent.append(1)
        sys.stdout.flush()
        os.kill(os.getpid(), sig)
builtins.print = print
runpy.run_path("train.py", run_name="__main__")
"""


def _run_until(argv, marker, sig):
    """Run train.py with `argv` until a stdout line starts with `marker`, then `sig`; returns (rc, stderr)."""
    p = subprocess.run([sys.executable, "-c", _SIGNAL_AT, marker, str(int(sig)), *argv], cwd=ROOT,
                       capture_output=True, text=True, timeout=900,
                       preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))   # as from a terminal
    assert marker in p.stdout, p.stdout[-2000:]                         # the signal came at the marker
    return p.returncode, p.stderr


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
def test_killed_twice_and_rerun_ends_as_if_never_interrupted(tiny_run, tmp_path):
    """Ctrl-C in pretraining, kill -9 in PPO, then the same command: the numbers of an uninterrupted run."""
    argv = TINY + [f"--out_dir={tmp_path}", f"--threads={torch.get_num_threads()}"]
    rc, err = _run_until(argv, "iter 20/40", signal.SIGINT)
    assert rc == 130 and err.startswith("error: interrupted") and err.count("\n") == 1
    rc, _ = _run_until(argv, "iter 2/3", signal.SIGKILL)
    assert rc == -signal.SIGKILL and os.path.exists(tmp_path / "ppo_state.pt")
    p = subprocess.run([sys.executable, "train.py", *argv], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0 and "ppo: resuming" in p.stdout and "stage pretrain: done" in p.stdout
    assert numbers(str(tmp_path)) == numbers(tiny_run)


# ---- read-only stages: state stays true ----
def test_sample_and_inspect_leave_config_json_and_the_records_alone(run, tmp_path):
    """Their flags say how to sample, not what the run is: sample.py changes no file; inspect's --n_layer=3 on the
    2-layer run writes inspect.html and nothing else (config.json still says 2)."""
    out = copy_run(run, tmp_path)
    store.remove(os.path.join(out, "inspect.html"))                     # test_inspect.py may have made one
    before = hashes(out)
    import sample
    sample.main([f"--out_dir={out}", "--temperature=0.7", "--top_k=5", "--num_samples=2"])
    assert hashes(out) == before
    inspect_page.main(SMOKE + [f"--out_dir={out}", "--n_layer=3", "--inspect_n=1"])
    after = hashes(out)
    assert after.pop(os.path.join(out, "inspect.html")) and after == before
    assert store.load_json(os.path.join(out, "config.json"))["gpt"]["n_layer"] == 2


def test_read_only_stages_refuse_another_tokenizer_than_the_world_s(run, tmp_path, capsys, monkeypatch):
    import tokenizer
    monkeypatch.setattr(tokenizer, "gpt2_missing", lambda: None)        # as where tiktoken's gpt2 is cached
    out = copy_run(run, tmp_path)
    before = hashes(out)
    err = refused(SMOKE + [f"--out_dir={out}", "--tokenizer=gpt2"], capsys, inspect_page.main)
    assert "--tokenizer=bpe, now --tokenizer=gpt2" in err
    assert hashes(out) == before


@pytest.mark.parametrize("changed", ["pretrain.pt", "ref.pt", "reward.pt"])
def test_inspect_refuses_an_actor_trained_from_other_models(run, tmp_path, capsys, changed):
    """out_dir's own actor (stages.json's ppo record) and one in another folder (the ppo.json PPO wrote beside it,
    as ablate.py's runs have) are both refused once a model they were trained from has changed."""
    out = copy_run(run, tmp_path)
    other = tmp_path / "other"
    other.mkdir()
    for n in ("actor.pt", "critic.pt", "ppo.json"):
        shutil.copy(os.path.join(out, n), other / n)
    src = "critic.pt" if changed == "reward.pt" else "actor.pt"           # another model of the same kind
    shutil.copy(os.path.join(out, src), os.path.join(out, changed))
    before = hashes(str(tmp_path))
    for extra in ([], [f"--inspect_actor={other / 'actor.pt'}"]):
        err = refused(SMOKE + [f"--out_dir={out}", *extra], capsys, inspect_page.main)
        assert f"another {changed}" in err
    assert hashes(str(tmp_path)) == before


def test_inspect_refuses_an_actor_the_ppo_stage_did_not_make(run, tmp_path, capsys):
    out = copy_run(run, tmp_path)
    store.remove(os.path.join(out, "inspect.html"))                     # test_inspect.py may have made one
    shutil.copy(os.path.join(out, "pretrain.pt"), os.path.join(out, "actor.pt"))   # copied in by hand
    assert "not the actor the ppo stage made" in refused(SMOKE + [f"--out_dir={out}"], capsys, inspect_page.main)
    assert not os.path.exists(os.path.join(out, "inspect.html"))


def test_a_bad_preset_is_refused(tmp_path, capsys):
    assert "bad value for --preset" in refused([f"--out_dir={tmp_path}", "--preset=huge"], capsys)
    assert not os.listdir(tmp_path)


# ---- Ctrl-C at any moment ----
CTRL_C_AT_IMPORT = """import builtins, os, runpy, signal, sys
real = builtins.__import__
def imp(name, *a, **k):
    # The first `import torch`: Ctrl-C, from inside the import, as a user's arrives while torch loads.
    if name == "torch" and not getattr(imp, "sent", False):
        imp.sent = True
        os.kill(os.getpid(), signal.SIGINT)
    return real(name, *a, **k)
builtins.__import__ = imp
target = sys.argv[1]
sys.argv = [target, *sys.argv[2:]]
if target.endswith(".py"):
    runpy.run_path(target, run_name="__main__")
else:
    runpy.run_module(target, run_name="__main__", alter_sys=True)
"""


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
@pytest.mark.parametrize("target", ["train.py", "lab.seeds", "lab.ablate", "lab.bench",
                                    "lab.inspect_page", "lab.recipes"])
def test_ctrl_c_while_torch_imports_is_one_line_and_exit_130(target, tmp_path):
    p = subprocess.run([sys.executable, "-c", CTRL_C_AT_IMPORT, target, f"--out_dir={tmp_path}"], cwd=ROOT,
                       capture_output=True, text=True, timeout=300,
                       preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert p.returncode == 130 and p.stderr.startswith("error: interrupted") and p.stderr.count("\n") == 1, \
        (p.returncode, p.stderr)
    assert os.listdir(tmp_path) == []


def test_a_killed_write_leaves_no_temporary_file_after_the_run_that_resumes(run, tmp_path):
    """kill -9 during a checkpoint's write leaves FILE.tmpPID beside it (store._atomic's name): the next run on the
    folder, holding its lock, removes it; a file that only looks alike is kept."""
    out = copy_run(run, tmp_path)
    for n in ("ppo_state.pt.tmp12345", "pretrain_ckpt.pt.tmp7", ".write_test99"):
        with open(os.path.join(out, n), "wb") as f:
            f.write(b"half a checkpoint")
    keep = os.path.join(out, "notes.tmp")
    open(keep, "w").write("mine")
    train.main(SMOKE + [f"--out_dir={out}"])
    assert not [n for n in os.listdir(out) if store.STRAY.fullmatch(n)] and os.path.exists(keep)


def test_eval_every_beyond_the_run_is_refused(tmp_path, capsys):
    err = refused(SMOKE + [f"--out_dir={tmp_path}", "--eval_every=4"], capsys)
    assert "--eval_every=4 is more than --ppo_iters=3" in err and not os.listdir(tmp_path)


def test_another_thread_count_is_refused_like_a_changed_flag(run, tmp_path, capsys):
    """torch's thread count changes how a matmul's sums are split, so the numbers (at smoke size pretrain.pt
    differs between 1 and 2 threads): a folder made under one count is refused under another, not continued."""
    import torch
    out = copy_run(run, tmp_path)
    before = torch.get_num_threads()
    other = 1 if before > 1 else 2
    try:
        err = refused(SMOKE + [f"--out_dir={out}", f"--threads={other}"], capsys)
    finally:
        torch.set_num_threads(before)
    assert f"now --threads={other}" in err and "stage pretrain" in err


PLOTTED = ["--preset=smoke"]


def test_plots_false_draws_no_figure_redoes_no_stage_and_a_redone_stage_leaves_no_old_one(run, tmp_path, capsys):
    """--plots=false changes no number: on a finished folder nothing is redone; PPO redone under it draws no ppo.png
    and leaves none from before (nor the report's bestofk.png); with figures on again, no stage is redone to draw
    one."""
    out = copy_run(run, tmp_path)
    figures = ("pretrain.png", "reward.png", "ppo.png", "bestofk.png")
    assert all(os.path.exists(os.path.join(out, n)) for n in figures)
    config = os.path.join(out, "config.json")
    before = hashes(out)
    train.main(PLOTTED + [f"--out_dir={out}", "--plots=false"])
    assert "---- stage ppo ----" not in capsys.readouterr().out
    assert {k: v for k, v in hashes(out).items() if k != config} == {k: v for k, v in before.items() if k != config}
    train.main(PLOTTED + [f"--out_dir={out}", "--plots=false", "--redo_from=ppo"])
    assert "---- stage ppo ----" in capsys.readouterr().out
    assert [n for n in figures if os.path.exists(os.path.join(out, n))] == ["pretrain.png", "reward.png"]
    assert numbers(out) == numbers(run)
    records = store.load_json(os.path.join(out, "stages.json"))
    assert "ppo.png" not in records["ppo"]["outputs"] and "metrics.jsonl" in records["ppo"]["outputs"]
    made = hashes(out)
    train.main(PLOTTED + [f"--out_dir={out}"])
    said = capsys.readouterr().out
    assert "---- stage ppo: done with this config, kept ----" in said and "---- stage report ----" not in said
    assert not os.path.exists(os.path.join(out, "ppo.png"))
    assert {k: v for k, v in hashes(out).items() if k != config} == {k: v for k, v in made.items() if k != config}
    assert store.load_json(config)["run"]["plots"] is True
