"""bench.py's and bench_trl.py's command lines: bad input is one line on stderr and exit 2, before
any work; and bench_trl.py's help needs no trl."""
import importlib.util, os, shutil, subprocess, sys
import pytest
import train
from lab import bench

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUN_FILES = ["pretrain.pt", "ref.pt", "reward.pt", "tokenizer.bpe", "prompts.json"]


def refused(argv, capsys):
    """bench.main(argv) must stop with exit 2, one line on stderr and nothing on stdout; returns
    that line."""
    with pytest.raises(SystemExit) as e:
        bench.main(argv)
    out, err = capsys.readouterr()
    assert e.value.code == 2 and len(err.splitlines()) == 1 and err.startswith("error: "), err
    assert out == ""
    return err


def test_refs_on_a_missing_or_empty_folder_is_one_line(tmp_path, capsys):
    for d in (tmp_path / "none", tmp_path):
        err = refused(["--refs", "--preset=smoke", f"--out_dir={d}"], capsys)
        assert "pretrain.pt, ref.pt, reward.pt" in err and f"--out_dir={d}" in err
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("damaged", ["ref.pt", "reward.pt", "prompts.json", "tokenizer.bpe"])
def test_refs_on_a_run_with_a_damaged_file_is_one_line_before_the_table(damaged, run, tmp_path,
                                                                          capsys):
    for name in RUN_FILES:
        shutil.copy(os.path.join(run, name), tmp_path / name)
    (tmp_path / damaged).write_bytes(b"not what it was")
    assert damaged in refused(["--refs", "--preset=smoke", f"--out_dir={tmp_path}"], capsys)


def test_two_grid_points_that_share_a_folder_are_refused_before_any_work(tmp_path, capsys):
    grids = ["adamw:0.004,0.0040000001:600", "adamw:4e-3:600;adamw:0.004:600", "muon:0.02:5,5"]
    for grid in grids:
        err = refused([f"--bar={grid}", "--preset=smoke", f"--out_dir={tmp_path}"], capsys)
        assert "would share" in err
    assert os.listdir(tmp_path) == []


def test_bar_gives_train_parse_each_flag_once(tmp_path, capsys, monkeypatch):
    """--bar's own flags for each run (the grid's lr and max_iters, its folder) replace the user's,
    never repeat them: train.py takes each flag once."""
    parse = train.parse

    def once(argv):
        names = [a.partition("=")[0] for a in argv]
        assert len(set(names)) == len(names), argv
        return parse(argv)
    monkeypatch.setattr(train, "parse", once)
    argv = ["--bar=adamw:4e-3:600", "--preset=smoke", "--lr=1e-3", f"--out_dir={tmp_path}"]
    # As far as it goes without a world: every run's flags are parsed before that check.
    assert "python train.py --stage=world" in refused(argv, capsys)


@pytest.mark.parametrize("argv, flag", [(["--threads=1", "--threads=-1"], "--threads"),
                                        (["--refs", "--refs"], "--refs"),
                                        (["--bar", "--bar=x"], "--bar")])
def test_a_flag_given_twice_is_refused(argv, flag, tmp_path, capsys):
    assert f"{flag} is given twice" in refused(argv + [f"--out_dir={tmp_path}"], capsys)


def test_bench_trl_help_needs_no_trl():
    p = subprocess.run([sys.executable, "-m", "lab.bench_trl", "--help"], cwd=ROOT, capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 0 and p.stderr == ""
    assert p.stdout.startswith("tether's PPO iteration beside TRL's")
    # Without trl (the project's venv) a run is still one line, as before.
    if importlib.util.find_spec("trl") is None:
        p = subprocess.run([sys.executable, "-m", "lab.bench_trl"], cwd=ROOT, capture_output=True,
                           text=True, timeout=60)
        assert p.returncode == 2 and p.stderr.count("\n") == 1, p.stderr
