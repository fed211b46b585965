"""A finished run with one flag changed, in one command; and a resumed stage's time, whole.

    python -m pytest -q tests/test_change_a_flag.py

A changed flag is refused with the command that redoes its stage and every later one (--redo_from), and that
command does so, the report included, keeping the earlier stages; timings.json gives a resumed stage the seconds of
every piece it was made in (running.json holds the piece under way)."""
import os, time
import pytest

import train
from machinery import state, store
from test_state import SMOKE, copy_run, hashes, refused


def test_a_changed_flag_names_the_one_command_that_redoes_its_stage_and_what_follows(run, tmp_path, capsys):
    out = copy_run(run, tmp_path)
    before = hashes(out)
    err = refused(SMOKE + [f"--out_dir={out}", "--init_kl_coef=0.1"], capsys)
    assert "--redo_from=ppo" in err and hashes(out) == before
    train.main(SMOKE + [f"--out_dir={out}", "--init_kl_coef=0.1", "--redo_from=ppo"])
    said = capsys.readouterr().out
    assert "stage ppo: --redo_from=ppo: redone" in said and "stage report ----" in said
    after = hashes(out)
    for name in ("pretrain.pt", "reward.pt", "prefs.jsonl"):
        key = os.path.join(out, name)
        assert after[key] == before[key]
    for name in ("actor.pt", "report.md", "report.json"):
        key = os.path.join(out, name)
        assert after[key] != before[key]
    # The same command again: everything is kept, nothing redone but the stage it names.
    recs = store.load_json(os.path.join(out, "stages.json"))
    assert recs["ppo"]["config"]["init_kl_coef"] == 0.1


@pytest.mark.parametrize("flags, why", [(["--redo_from=ppo", "--stage=ppo"], "without --stage"),
                                        (["--redo_from=ppo", "--fresh"], "--fresh"),
                                        (["--redo_from=dpo"], "choose")])
def test_redo_from_is_refused_with_stage_fresh_or_an_optional_stage(tmp_path, capsys, flags, why):
    assert why in refused(SMOKE + [f"--out_dir={tmp_path}", *flags], capsys)


class Killed(BaseException):
    """Stands for kill -9."""


def test_a_resumed_stage_s_time_adds_up_its_pieces(run, tmp_path, monkeypatch, capsys):
    """PPO killed after its second iteration's state, 3 s into its first piece: timings.json's ppo holds those
    seconds and the second piece's, not the second piece's alone."""
    out = copy_run(run, tmp_path)
    save = state.save_ppo_state

    def slow_then_killed(path, stamp, it, *a, **kw):
        if it == 2:
            time.sleep(3)
        save(path, stamp, it, *a, **kw)
        if it == 2:
            raise Killed
    with monkeypatch.context() as m:
        m.setattr(state, "save_ppo_state", slow_then_killed)
        with pytest.raises(Killed):
            train.main(SMOKE + [f"--out_dir={out}", "--stage=ppo"])
    t = time.time()
    train.main(SMOKE + [f"--out_dir={out}", "--stage=ppo"])
    second = time.time() - t
    assert "ppo: resuming" in capsys.readouterr().out
    timings = store.load_json(os.path.join(out, "timings.json"))
    assert timings["ppo"] > second + 2.5
    assert not os.path.exists(os.path.join(out, "running.json"))
