"""--log_to=tensorboard: every row of every stage's JSONL log is a TensorBoard scalar under
out_dir/tb/STAGE/, its key the tag and its iter or step the step, read back with TensorBoard's own
reader; a resumed stage shows each step once; a stage that starts over keeps no old events; the
flag is no stage's field; without tensorboard installed the flag is one line and exit 2."""
import importlib.util, json, math, os
import numpy as np
import pytest

pytest.importorskip("tensorboard")
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import ppo, train
from conftest import TINY
from machinery import tblog
from pipeline import stages
from machinery.config import override

# TINY, smaller still (20 pretraining iterations, 100 pairs, 2 PPO iterations of shorter responses),
# with evaluations during PPO and DPO, so that some keys are in some rows only.
FLAGS = override(TINY, ["--max_iters=20", "--eval_interval=10", "--n_pairs=100", "--ppo_iters=2",
                        "--response_length=24", "--n_eval=8", "--eval_every=2", "--eval_n=8",
                        "--log_to=tensorboard"])
DPO = ["--stage=dpo", "--dpo_epochs=0.3", "--dpo_batch_size=8", "--dpo_eval_every=2"]
LOGS = {"pretrain": ("pretrain_metrics.jsonl", "iter"), "reward": ("reward_metrics.jsonl", "step"),
        "ppo": ("metrics.jsonl", "iter"), "dpo": ("dpo_metrics.jsonl", "step")}


def events(folder):
    """{tag: [(step, value), ...]} of the events in `folder`, as TensorBoard shows them."""
    acc = EventAccumulator(folder, size_guidance={"scalars": 0})
    acc.Reload()
    return {t: [(e.step, e.value) for e in acc.Scalars(t)] for t in acc.Tags()["scalars"]}


def expected(rows, step_key):
    """{tag: [(step, value), ...]} that rows should give: every number but the step's."""
    out = {}
    for r in rows:
        for k, v in r.items():
            if k != step_key and tblog.is_number(v):
                out.setdefault(k, []).append((r[step_key], v))
    return out


def same(a, b):
    """Two logged values the same, to float32 (what an event holds)."""
    return (math.isnan(a) and math.isnan(b)) or float(np.float32(a)) == b


@pytest.fixture(scope="module")
def logged(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("tb"))
    train.main(FLAGS + [f"--out_dir={out}"])
    train.main(FLAGS + [f"--out_dir={out}"] + DPO)
    return out


@pytest.mark.parametrize("stage", sorted(LOGS))
def test_every_row_of_the_stage_s_jsonl_is_a_scalar(logged, stage):
    name, step_key = LOGS[stage]
    with open(os.path.join(logged, name)) as f:
        rows = [json.loads(line) for line in f]
    want, got = expected(rows, step_key), events(os.path.join(logged, "tb", stage))
    assert len(rows) >= 2 and set(got) == set(want)
    for tag, points in want.items():
        assert [s for s, _ in got[tag]] == [s for s, _ in points], tag
        assert all(same(v, g) for (_, v), (_, g) in zip(points, got[tag])), tag
    # Some keys are in some rows only: the evaluations' (the reward model's held-out numbers at
    # each epoch's last step).
    assert any(len(p) < len(rows) for p in want.values())


class Killed(BaseException):
    """Stands for kill -9: nothing of the run's own code handles it."""


def test_ppo_killed_after_a_row_past_its_state_shows_each_step_once(logged, tmp_path, monkeypatch):
    """Killed once iteration 3's row is written, its state saved at 2: the same command resumes at 3,
    and TensorBoard shows iterations 1 to 3 once each, as metrics.jsonl has them."""
    cfg = train.parse(override(FLAGS, ["--ppo_iters=3", "--save_interval=2", f"--out_dir={logged}"]))
    st = stages.BY_NAME["ppo"]
    line = ppo.log_line

    def killed_at_3(row, *a):
        if row["iter"] == 3:
            raise Killed
        return line(row, *a)
    monkeypatch.setattr(ppo, "log_line", killed_at_3)
    with pytest.raises(Killed):
        stages.run_stage(cfg, st, stages.stamp(cfg, st), base=logged, run_dir=str(tmp_path),
                         log=print)
    monkeypatch.setattr(ppo, "log_line", line)
    stages.run_stage(cfg, st, stages.stamp(cfg, st), base=logged, run_dir=str(tmp_path), log=print)
    with open(tmp_path / "metrics.jsonl") as f:
        rows = [json.loads(line) for line in f]
    got = events(str(tmp_path / "tb" / "ppo"))
    assert [r["iter"] for r in rows] == [1, 2, 3] and len(os.listdir(tmp_path / "tb" / "ppo")) == 2
    for tag, points in expected(rows, "iter").items():
        assert [s for s, _ in got[tag]] == [s for s, _ in points], tag
        assert all(same(v, g) for (_, v), (_, g) in zip(points, got[tag])), tag


def test_a_resumed_stage_shows_each_step_once_and_a_restarted_one_no_old_step(tmp_path):
    folder = str(tmp_path)
    board = tblog.open_log("tensorboard", folder, "ppo")
    for i in range(1, 6):
        tblog.write(board, {"iter": i, "loss": float(i), "note": "text", "ok": True}, "iter")
    tblog.close(board)
    # Killed after step 5, resumed from the state of step 3: steps 4 and 5 again, then 6.
    board = tblog.open_log("tensorboard", folder, "ppo", first=4)
    for i in range(4, 7):
        tblog.write(board, {"iter": i, "loss": 10.0 * i}, "iter")
    tblog.close(board)
    assert events(os.path.join(folder, "tb", "ppo")) == {
        "loss": [(1, 1.0), (2, 2.0), (3, 3.0), (4, 40.0), (5, 50.0), (6, 60.0)]}
    # Redone from the start (--stage=ppo, an edit of its code): the former run's events go.
    board = tblog.open_log("tensorboard", folder, "ppo")
    tblog.write(board, {"iter": 1, "loss": -1.0}, "iter")
    tblog.close(board)
    assert events(os.path.join(folder, "tb", "ppo")) == {"loss": [(1, -1.0)]}
    assert len(os.listdir(os.path.join(folder, "tb", "ppo"))) == 1
    # Redone without the flag: no events, rather than those of a log that is gone.
    assert tblog.open_log("none", folder, "ppo") is None
    assert os.listdir(os.path.join(folder, "tb", "ppo")) == []


def test_none_writes_nothing_and_the_flag_is_no_stage_s_field(tmp_path):
    assert tblog.open_log("none", str(tmp_path), "ppo") is None
    tblog.write(None, {"iter": 1, "loss": 1.0}, "iter")
    tblog.close(None)
    assert os.listdir(tmp_path) == []
    # Changing it redoes nothing: no stage records it.
    assert not [st.name for st in stages.STAGES if "log_to" in st.fields]
    assert train.parse(["--preset=smoke"]).run.log_to == "none"


def test_without_tensorboard_the_flag_is_one_line(monkeypatch, capsys, tmp_path):
    find = importlib.util.find_spec

    def hidden(name, *a):
        return None if name == "tensorboard" else find(name, *a)
    monkeypatch.setattr(importlib.util, "find_spec", hidden)
    with pytest.raises(SystemExit) as e:
        train.parse(["--preset=smoke", "--log_to=tensorboard", f"--out_dir={tmp_path}"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and len(err.splitlines()) == 1 and "pip install tensorboard" in err
