"""seeds.py: the main pipeline under other seeds. On a copy of the tiny smoke run (seed 1337, kept as
it is) and one more seed: the other seed's pipeline is reseeded from its world on, the table's mean and
min-max and prediction interval are those of the runs' own report.json, README's table written from
them passes lab.claims (both modes) against the main run and, in the default mode, against the other
seed's run, a second command makes nothing again, bad --seeds is one line and exit 2."""
import os, shutil

import pytest

from lab import claims, seeds
from lab.tables import t_prediction
from machinery import store
from conftest import TINY


def test_another_seed_reseeds_the_world_and_the_table_is_the_runs(tiny_run, tmp_path, capsys):
    out = str(tmp_path / "out")
    shutil.copytree(tiny_run, out)
    main_report = store.file_hash(os.path.join(out, "report.json"))
    seeds.main(["--seeds=1337,1338", *TINY, f"--out_dir={out}"])
    other = os.path.join(out, "seeds", "seed1338")
    # The main seed is the run already there; the other has a world of its own.
    assert store.file_hash(os.path.join(out, "report.json")) == main_report
    corpus = [store.file_hash(os.path.join(d, "train.txt")) for d in (out, other)]
    assert corpus[0] != corpus[1]
    reports = [store.load_json(os.path.join(d, "report.json")) for d in (out, other)]
    kl = [r["rlhf"]["kl"] for r in reports]
    gain = [(r["rlhf"]["gold_mean"] - r["pretrained"]["gold_mean"]) / r["pretrained"]["gold_std"]
            for r in reports]
    text = open(os.path.join(out, "seeds", "seeds.md")).read()
    lines = text.splitlines()
    kl_name = "| exact KL to reference (nats / sequence), rlhf |"
    kl_row = next(line for line in lines if line.startswith(kl_name))
    _, lo, hi = t_prediction(kl)
    assert kl_row.split(" | ")[1:] == [f"{kl[0]:.3f}", f"{kl[1]:.3f}", f"{(kl[0] + kl[1]) / 2:.3f}",
                                        f"{min(kl):.3f}–{max(kl):.3f}", f"[{lo:.3f}, {hi:.3f}] |"]
    gain_row = next(line for line in lines if line.startswith("| gold gain (pretrained std) |"))
    assert gain_row.split(" | ")[-2] == f"{min(gain):.3f}–{max(gain):.3f}"
    # README's table, as seeds.md gives it (with the n claims.py reads under it), read by claims.py:
    # the main run is its own columns and lies in the intervals; the other seed's run lies in them
    # too (two seeds: a wide interval).
    assert "\nA new seed's intervals: Student-t, n = 2.\n" in text
    readme = tmp_path / "README.md"
    readme.write_text(text)
    for d, flags, code in ((out, ["--exact"], 0), (out, [], 0), (other, [], 0), (other, ["--exact"], 1)):
        assert claims.main([f"--out_dir={d}", f"--readme={readme}", *flags]) == code, (d, flags)
    gold_row = next(line for line in lines if line.startswith("| gold score (mean ± std) |"))
    pre = reports[0]["pretrained"]
    assert gold_row.split(" | ")[1] == f"{pre['gold_mean']:.2f} ± {pre['gold_std']:.2f}"
    n_eval = store.load_json(os.path.join(out, "config.json"))["eval"]["n_eval"]
    assert gold_row.split(" | ")[-1].startswith(f"{pre['gold_std'] / n_eval ** 0.5:.2f} / ")
    assert text.rstrip().splitlines()[-1].startswith("Made by `python ")
    # Again: every stage of both seeds kept.
    before = store.file_hash(os.path.join(other, "report.json"))
    capsys.readouterr()
    seeds.main(["--seeds=1337,1338", *TINY, f"--out_dir={out}"])
    assert "---- stage ppo: done with this config, kept ----" in capsys.readouterr().out
    assert store.file_hash(os.path.join(other, "report.json")) == before


@pytest.mark.parametrize("flag", ["--seeds=1337,x", "--seeds=1337,1337", "--seeds=1337,-1", "--seeds=1337",
                                  "--seeds=1337,2147483648", "--stage=ppo", "--nope=1"])
def test_bad_input_is_one_line_and_exit_2_before_any_run(flag, capsys, tmp_path):
    with pytest.raises(SystemExit) as e:
        seeds.main([flag, "--preset=smoke", f"--out_dir={tmp_path / 'out'}"])
    assert e.value.code == 2 and len(capsys.readouterr().err.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_help_prints_seeds_own_docstring_and_exits_0(capsys):
    with pytest.raises(SystemExit) as e:
        seeds.main(["--help"])
    out = capsys.readouterr().out
    assert e.value.code == 0 and "python -m lab.seeds --seeds=" in out
    assert "every stage of RLHF" not in out


def test_a_repeated_flag_and_a_seeds_folder_that_is_a_file_are_refused_before_any_run(tmp_path, capsys):
    for argv, why in ((["--seeds=1,2", "--seeds=3"], "--seeds is given twice"),
                      (["--seeds=1337,1338"], "seeds is a file")):
        (tmp_path / "seeds").write_text("a file where the seeds' folder goes")
        with pytest.raises(SystemExit) as e:
            seeds.main([*argv, "--preset=smoke", f"--out_dir={tmp_path}"])
        err = capsys.readouterr().err.strip().splitlines()
        assert e.value.code == 2 and len(err) == 1 and why in err[0], err
        assert os.listdir(tmp_path) == ["seeds"]


def test_ctrl_c_between_seeds_is_one_line_and_exit_130(run, tmp_path, capsys, monkeypatch):
    out = str(tmp_path / "out")
    shutil.copytree(run, out)

    def interrupted(run_dir):
        raise KeyboardInterrupt
    monkeypatch.setattr(seeds, "numbers", interrupted)
    # A KeyboardInterrupt that got out would be a traceback for the user (and stop pytest): caught here.
    with pytest.raises(BaseException) as e:
        seeds.main(["--seeds=1337,1338", "--preset=smoke", f"--out_dir={out}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.type is SystemExit and e.value.code == 130 and len(err) == 1 and err[0].startswith("error: interrupted")
