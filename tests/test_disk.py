"""Faults of the disk and of the records: a full disk, a read-only folder, a damaged record or checkpoint, a field
the code does not know, and a kill after the last PPO iteration. Each is one line (or one notice and the stage
redone), loses nothing that was saved, and ends, once the fault is gone, with the numbers of an uninterrupted run.
Each probe works on a copy of the smoke run (the `run` fixture), through train.main as `python train.py` runs it."""
import errno, os, shutil, subprocess, sys, uuid
import pytest
import torch
import train
from machinery import records, store
from pipeline import stages
from machinery.errors import RunError
from test_state import SMOKE, copy_run, hashes, numbers, refused

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def no_time(rows):
    return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in rows]


def read_records(out):
    return store.load_json(os.path.join(out, "stages.json"))


def edit_records(out, change):
    """stages.json as `change(records)` leaves it (change edits in place)."""
    recs = read_records(out)
    change(recs)
    store.save_json(os.path.join(out, "stages.json"), recs)


def strays(out):
    """Temporary files left behind: none may be."""
    return [n for _, _, fs in os.walk(out) for n in fs if ".tmp" in n or n.startswith(".write_test")]


# ---- a full disk ----
class _FullDisk:
    """The file store._atomic opens, with one change: after `room` bytes, write() raises ENOSPC, as a full disk
    does (torch.save's C++ writer then raises RuntimeError, with the OSError as its context)."""

    def __init__(self, f, room):
        self.f, self.room = f, room

    def write(self, data):
        if len(data) > self.room:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self.room -= len(data)
        return self.f.write(data)

    def __getattr__(self, name):
        return getattr(self.f, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return self.f.__exit__(*exc)


def fill_disk_at(monkeypatch, name, nth):
    """From the nth write of a file called `name` on (1: the first), the disk is full."""
    seen = []

    def fake_open(path, mode="r"):
        f = open(path, mode)
        if os.path.basename(path).startswith(name + ".tmp"):
            seen.append(path)
            if len(seen) >= nth:
                return _FullDisk(f, 100)
        return f
    monkeypatch.setattr(store, "open", fake_open, raising=False)


@pytest.mark.parametrize("name, nth", [("ppo_state.pt", 2), ("report.json", 1)])
def test_a_full_disk_is_one_line_keeps_the_last_checkpoint_and_the_rerun_ends_as_uninterrupted(
        run, tmp_path, capsys, monkeypatch, name, nth):
    out = copy_run(run, tmp_path)
    edit_records(out, lambda r: r.pop("ppo"))                        # ppo and report to be done again
    fill_disk_at(monkeypatch, name, nth)
    err = refused(SMOKE + [f"--out_dir={out}"], capsys, code=1)
    assert f"cannot write {os.path.join(out, name)}: No space left on device" in err
    assert not strays(out)
    if name == "ppo_state.pt":                      # the state of iteration 1 is whole, and is where it goes on
        assert torch.load(os.path.join(out, name), weights_only=True)["iter"] == 1
    monkeypatch.undo()                              # space freed
    train.main(SMOKE + [f"--out_dir={out}"])
    assert numbers(out) == numbers(run)


def mount_tmpfs(where, size):
    """A small tmpfs at `where` (as root on Linux); False where this machine may not mount."""
    os.makedirs(where, exist_ok=True)
    p = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], capture_output=True)
    return p.returncode == 0


@pytest.fixture
def tmpfs(tmp_path):
    where = tmp_path / f"fs{uuid.uuid4().hex[:6]}"
    if sys.platform != "linux" or not mount_tmpfs(where, "8m"):
        pytest.skip("this machine may not mount a tmpfs (root on Linux can)")
    yield where
    subprocess.run(["umount", "-l", str(where)], capture_output=True)


def test_a_real_full_disk_under_torch_save_is_one_line_and_keeps_the_old_file(tmpfs):
    """A real ENOSPC inside torch.save's writer (its RuntimeError "unexpected pos") becomes the one line."""
    target = str(tmpfs / "ckpt.pt")
    store.save_torch({"w": torch.zeros(10)}, target)
    with pytest.raises(RunError, match="No space left on device") as e:
        store.save_torch({"w": torch.zeros(4 * 1024 * 1024)}, target)      # 16 MB in 8 MB
    assert e.value.code == 1 and target in str(e.value) and "\n" not in str(e.value)
    assert torch.equal(torch.load(target, weights_only=True)["w"], torch.zeros(10))
    assert os.listdir(tmpfs) == ["ckpt.pt"]


def remount_read_only(where):
    subprocess.run(["mount", "-o", "remount,ro", str(where)], check=True, capture_output=True)


def test_a_read_only_folder_is_one_line_for_every_command_and_sample_still_reads_it(run, tmpfs, capsys):
    finished, empty = tmpfs / "finished", tmpfs / "empty"
    os.makedirs(empty)
    for n in ("actor.pt", "tokenizer.bpe", "prompts.json", "stages.json", ".lock"):
        os.makedirs(finished, exist_ok=True)
        shutil.copy(os.path.join(run, n), finished / n)
    remount_read_only(tmpfs)
    for argv in ([f"--out_dir={empty}"], [f"--out_dir={finished}"], [f"--out_dir={finished}", "--stage=ppo"],
                 [f"--out_dir={finished}", "--fresh"], [f"--out_dir={tmpfs / 'new'}"]):
        err = refused(SMOKE + argv, capsys)
        assert "Read-only file system" in err, err
    import sample
    sample.main([f"--out_dir={finished}"])                            # reads, writes nothing
    assert capsys.readouterr().out.count("[gold ") == 8


# ---- damaged records ----
@pytest.mark.parametrize("content", ["null", "[]", "[1, 2]", '{"world": ', "7"])
def test_stages_json_that_is_not_records_is_no_records(tmp_path, content):
    (tmp_path / "stages.json").write_text(content)
    notes = []
    assert records.load_records(str(tmp_path), notes) == {} and len(notes) == 1 and "every stage" in notes[0]
    assert (tmp_path / "stages.json").read_text() == content          # nothing deleted while reading


@pytest.mark.parametrize("damage", [5, None, [], {"inputs": {}, "outputs": {}}, {"config": {}, "inputs": {}},
                                    {"config": [], "inputs": {}, "outputs": {}},
                                    {"config": {}, "inputs": {}, "outputs": {"report.md": 3}}])
def test_a_damaged_record_has_its_stage_redone_alone_with_one_line(run, tmp_path, capsys, damage):
    out = copy_run(run, tmp_path)
    edit_records(out, lambda r: r.__setitem__("report", damage))
    actor = store.file_hash(os.path.join(out, "actor.pt"))
    train.main(SMOKE + [f"--out_dir={out}"])
    said = capsys.readouterr().out
    assert "the record of stage report is damaged" in said and "---- stage report ----" in said
    assert said.count("done with this config, kept") == 6                 # every other stage kept
    assert store.file_hash(os.path.join(out, "actor.pt")) == actor
    assert numbers(out) == numbers(run)


@pytest.mark.parametrize("content", ["[1, 2]", '{"world": "fast"}', "{"])
def test_damaged_timings_are_a_notice_before_anything_is_deleted(run, tmp_path, capsys, content):
    out = copy_run(run, tmp_path)
    edit_records(out, lambda r: r.pop("report"))
    with open(os.path.join(out, "timings.json"), "w") as f:
        f.write(content)
    train.main(SMOKE + [f"--out_dir={out}"])
    assert "timings.json is damaged" in capsys.readouterr().out
    assert numbers(out) == numbers(run) and os.path.exists(os.path.join(out, "report.md"))
    assert set(store.load_json(os.path.join(out, "timings.json"))) == {"report"}


@pytest.mark.parametrize("damage", ["truncated", "no metrics"])
def test_a_damaged_ppo_state_starts_ppo_over_with_one_line(run, tmp_path, capsys, damage):
    out = copy_run(run, tmp_path)
    state = os.path.join(out, "ppo_state.pt")
    cfg = train.parse(SMOKE + [f"--out_dir={out}"])
    made = dict(stamp=stages.stamp(cfg, stages.BY_NAME["ppo"]), iter=2)
    if damage == "truncated":
        torch.save(made, state)
        with open(state, "r+b") as f:
            f.truncate(os.path.getsize(state) // 2)
    else:
        torch.save(made, state)
    edit_records(out, lambda r: r.pop("ppo"))                        # ppo and report to be done again
    train.main(SMOKE + [f"--out_dir={out}"])
    said = capsys.readouterr().out
    assert "ppo_state.pt is damaged" in said and "starting over" in said and "ppo: resuming" not in said
    assert numbers(out) == numbers(run)


def test_a_damaged_pretraining_checkpoint_starts_pretraining_over(run, tmp_path, capsys):
    out = copy_run(run, tmp_path)
    with open(os.path.join(out, "pretrain_ckpt.pt"), "wb") as f:
        f.write(b"PK\x03\x04 torn")
    train.main(SMOKE + [f"--out_dir={out}", "--stage=pretrain", "--max_iters=2", "--n_samples=2"])
    said = capsys.readouterr().out
    assert "pretrain_ckpt.pt is damaged" in said and "starting over" in said
    assert not os.path.exists(os.path.join(out, "pretrain_ckpt.pt"))


def test_load_resumable_says_why_it_does_not_resume(tmp_path):
    p, stamp = str(tmp_path / "s.pt"), {"config": {"a": 1}}
    assert store.load_resumable(p, stamp, ["iter"]) == (None, "missing")
    torch.save({"stamp": {"config": {"a": 2}}, "iter": 3}, p)
    assert store.load_resumable(p, stamp, ["iter"])[1] == "made under another config, inputs or code"
    for damaged in ({"stamp": stamp}, [1, 2], None):
        torch.save(damaged, p)
        assert "damaged" in store.load_resumable(p, stamp, ["iter"])[1]
    torch.save({"stamp": stamp, "iter": 3}, p)
    assert store.load_resumable(p, stamp, ["iter"]) == ({"stamp": stamp, "iter": 3}, None)


# ---- fields: unknown, or lacking where the record says the field existed ----
def test_a_record_holding_a_field_the_code_does_not_know_is_refused(run, tmp_path, capsys):
    out = copy_run(run, tmp_path)
    edit_records(out, lambda r: r["ppo"]["config"].__setitem__("kl_warmup", 5))
    before = hashes(out)
    err = refused(SMOKE + [f"--out_dir={out}"], capsys)
    assert "stage ppo" in err and "--kl_warmup=5, a flag this code's stage does not take" in err
    assert hashes(out) == before


def test_a_record_lacking_a_field_it_was_made_with_is_refused(run, tmp_path, capsys):
    """A GRPO actor whose record lost its --advantage is not kept under --advantage=gae (the default)."""
    out = copy_run(run, tmp_path)
    edit_records(out, lambda r: r["ppo"]["config"].pop("advantage"))
    before = hashes(out)
    err = refused(SMOKE + [f"--out_dir={out}"], capsys)
    assert "stage ppo" in err and "no --advantage in its record (damaged), now --advantage=gae" in err
    assert hashes(out) == before


# ---- every check before any deletion ----
@pytest.mark.parametrize("how", [["--fresh"], ["--stage=world"], ["--vocab_size=290", "--stage=world"]])
def test_a_world_that_does_not_fit_is_refused_before_anything_is_removed(run, tmp_path, capsys, how):
    """--response_length=80 passes config.check (80 + 2 <= 96), but no prompt of the world fits beside it."""
    out = copy_run(run, tmp_path)
    before = hashes(out)
    err = refused(SMOKE + [f"--out_dir={out}", "--response_length=80"] + how, capsys)
    assert "--response_length=80" in err and "--block_size=96" in err
    assert hashes(out) == before and not strays(out) and not os.path.exists(os.path.join(out, stages.ASIDE))


@pytest.mark.parametrize("stage", ["sample", "inspect"])
def test_a_read_only_stage_makes_nothing_in_a_folder_without_a_run(tmp_path, capsys, stage):
    from lab import inspect_page
    empty, missing = tmp_path / "empty", tmp_path / "missing"
    empty.mkdir()
    import sample
    main, flags, what = (sample.main, [], "has no actor.pt") if stage == "sample" else \
        (inspect_page.main, SMOKE, "the inspect page needs")
    for out in (empty, missing):
        assert what in refused([*flags, f"--out_dir={out}"], capsys, main)
    assert not os.listdir(empty) and not missing.exists()


@pytest.mark.parametrize("flag", ["--bestofk_n=1000000", "--n_eval=1000000", "--n_samples=1000000"])
def test_evaluation_sizes_are_bounded_before_any_work(tmp_path, capsys, flag):
    assert "[1,100000]" in refused(SMOKE + [f"--out_dir={tmp_path}", flag], capsys)
    assert not os.listdir(tmp_path)


# ---- a kill after the last iteration, during the final evaluation ----
class Killed(BaseException):
    """Stands for kill -9: nothing of the run's own code handles it."""


@pytest.mark.parametrize("advantage", ["gae", "grpo", "rloo"])
def test_killed_in_the_final_evaluation_the_rerun_makes_every_output(run, tmp_path, monkeypatch, advantage):
    flags = [f"--advantage={advantage}"]
    if advantage == "gae":
        whole = run
    else:
        whole = copy_run(run, tmp_path / "whole")
        train.main(SMOKE + [f"--out_dir={whole}", "--stage=ppo", *flags])
    out = copy_run(run, tmp_path / "killed")

    def killed(*a, **k):
        raise Killed
    monkeypatch.setattr(stages, "evaluate_policy", killed)
    with pytest.raises(Killed):
        train.main(SMOKE + [f"--out_dir={out}", "--stage=ppo", *flags])
    assert torch.load(os.path.join(out, "ppo_state.pt"), weights_only=True)["iter"] == 3
    monkeypatch.undo()
    train.main(SMOKE + [f"--out_dir={out}", *flags])
    cfg = train.parse(SMOKE + [f"--out_dir={out}", *flags])
    expected = stages.files(cfg, stages.BY_NAME["ppo"].outputs)
    assert sorted(read_records(out)["ppo"]["outputs"]) == sorted(expected)
    assert all(os.path.exists(os.path.join(out, n)) for n in expected)
    rows = [store.load_json(os.path.join(d, "metrics.jsonl"), lines=True) for d in (out, whole)]
    assert no_time(rows[0]) == no_time(rows[1])
    ppo = [store.load_json(os.path.join(d, "ppo.json"))["final"] for d in (out, whole)]
    assert ppo[0] == ppo[1]


def test_a_stage_that_does_not_make_an_output_is_not_finished(tmp_path):
    (tmp_path / "a").write_text("x")
    with pytest.raises(RunError, match="b was not made"):
        records.make_record(str(tmp_path), {}, [], ["a", "b"])


# ---- progress shows through a pipe ----
def test_ppo_s_log_lines_reach_a_pipe_as_they_are_printed(run, tmp_path):
    out = copy_run(run, tmp_path)
    # As a user's pipe has it: Python's stdout block-buffered (no PYTHONUNBUFFERED).
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    p = subprocess.Popen([sys.executable, "train.py", *SMOKE, f"--out_dir={out}", "--stage=ppo"], cwd=ROOT,
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
    try:
        for line in p.stdout:
            if line.startswith("iter 1/3"):
                # Block-buffered, the line would come only as the process ends, after ppo.json is written.
                assert p.poll() is None and not os.path.exists(os.path.join(out, "ppo.json"))
                break
        else:
            pytest.fail("no iteration line")
    finally:
        p.kill()
        p.wait()


@pytest.mark.parametrize("content", ["[]", "null", '{"config": {}}', '{"config": 1, "inputs": {}, "outputs": {}}'])
def test_an_ablation_run_with_a_damaged_run_json_is_not_finished(tmp_path, content):
    """ablate.py asks this of every run folder: a damaged run.json means the run is done again, no traceback."""
    from lab import ablate
    (tmp_path / ablate.RECORD).write_text(content)
    assert ablate.finished(str(tmp_path), {"config": {}, "inputs": {}, "defaults": {}}) is False
