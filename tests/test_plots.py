"""The plots, from tiny JSONL logs written here (no training): `python -m lab.plot` draws one panel
per key and one line per run, labelled by its folder, and refuses bad input in one line, exit 2;
ppo.png holds the panels a PPO user reads (the critic's left out without a critic), the reward
model's and DPO's plots their per-step curves, with no legend entry for what a run did not log."""
import json, os
import pytest

pytest.importorskip("matplotlib")
from lab import plot
from machinery import store
from pipeline import report


def write_log(folder, name, rows):
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, name), "w") as f:
        f.write("".join(json.dumps(r) + "\n" for r in rows))
    return str(folder)


def ppo_rows(n, scale=1.0, critic=True, eval_every=0):
    rows = []
    for i in range(1, n + 1):
        r = {"iter": i, "objective/scores": scale * i, "objective/gold": 0.5 * i,
             "objective/kl_exact": 0.1 * i, "objective/kl_coef": 0.05, "policy/entropy_avg": 1.0,
             "policy/clipfrac_avg": 0.02, "policy/approxkl_avg": 0.001,
             "loss/value_avg": 0.1 if critic else 0.0,
             "val/explained_variance": 0.5 if critic else 0.0, "val/response_length": 20.0,
             "policy/rollbacks": 0, "policy/kl_before_rollback": 0.1 * i}
        if eval_every and i % eval_every == 0:
            r.update({"eval/gold_mean": 1.0, "eval/proxy_mean": 1.5})
        rows.append(r)
    return rows


@pytest.fixture
def figures(monkeypatch):
    """Every figure store.save_figure is given, {path: figure}, the PNG still written."""
    saved, save = {}, store.save_figure

    def keep(fig, path):
        saved[path] = fig
        save(fig, path)
    monkeypatch.setattr(store, "save_figure", keep)
    return saved


def panels(fig):
    """{title: [legend labels]} of a figure's visible panels."""
    out = {}
    for ax in fig.axes:
        if ax.get_visible() and ax.get_title():
            legend = ax.get_legend()
            out[ax.get_title()] = [t.get_text() for t in legend.get_texts()] if legend else []
    return out


def test_two_runs_one_panel_per_key_one_line_per_run(tmp_path, figures, capsys):
    a = write_log(tmp_path / "runs" / "a", "metrics.jsonl", ppo_rows(5))
    b = write_log(tmp_path / "runs" / "b", "metrics.jsonl", ppo_rows(8, 2.0, eval_every=4))
    out = str(tmp_path / "both.png")
    assert plot.main([a, b, "--keys=objective/scores,eval/gold_mean", f"--out={out}"]) == 0
    assert open(out, "rb").read(8) == b"\x89PNG\r\n\x1a\n"
    fig = figures[out]
    shown = [ax for ax in fig.axes if ax.get_visible()]
    assert [ax.get_title() for ax in shown] == ["objective/scores", "eval/gold_mean"]
    scores, evals = ([line.get_ydata().tolist() for line in ax.get_lines()] for ax in shown)
    # Run b's scores are twice its iterations; only b has evaluations (at 4 and 8).
    assert scores == [[1.0, 2.0, 3.0, 4.0, 5.0], [2.0 * i for i in range(1, 9)]]
    assert [d for d in evals if d] == [[1.0, 1.0]]
    assert [t.get_text() for t in fig.legends[0].get_texts()] == [a, b]
    assert "both.png" in capsys.readouterr().out


def test_file_picks_another_log_with_its_own_steps(tmp_path, figures):
    rows = [{"step": s, "loss": 1.0 / s, "rewards/margins": 0.1 * s} for s in range(1, 4)]
    a = write_log(tmp_path / "a", "dpo_metrics.jsonl", rows)
    out = str(tmp_path / "dpo.png")
    plot.main([a, "--file=dpo_metrics.jsonl", "--keys=rewards/margins", f"--out={out}"])
    ax = figures[out].axes[0]
    assert ax.get_xlabel() == "step" and ax.get_lines()[0].get_xdata().tolist() == [1, 2, 3]


def refused(argv, capsys):
    with pytest.raises(SystemExit) as e:
        plot.main(argv)
    out, err = capsys.readouterr()
    assert e.value.code == 2 and len(err.splitlines()) == 1 and out == "", err
    return err


def test_bad_input_is_one_line(tmp_path, capsys):
    a = write_log(tmp_path / "a", "metrics.jsonl", ppo_rows(3))
    empty = tmp_path / "empty"
    empty.mkdir()
    err = refused([a, str(empty), "--keys=objective/gold"], capsys)
    assert f"{empty} has no metrics.jsonl" in err
    err = refused([a, "--keys=objective/gold,objective/nope"], capsys)
    assert "'objective/nope'" in err and "objective/kl_exact, objective/scores" in err
    assert "reward_metrics.jsonl" in refused([a, "--keys=loss", "--file=reward_metrics.jsonl"],
                                             capsys)
    assert "--keys" in refused([a], capsys)
    assert "no RUN" in refused(["--keys=loss"], capsys)
    assert "none of" in refused([a, "--keys=loss", "--file=other.jsonl"], capsys)
    assert "not a .png" in refused([a, "--keys=loss", "--out=plot.pdf"], capsys)
    (tmp_path / "a" / "metrics.jsonl").write_text("{not json\n")
    assert "not a JSONL log" in refused([a, "--keys=loss"], capsys)
    assert not list(tmp_path.glob("*.png"))


def test_ppo_png_has_the_panels_a_ppo_user_reads(tmp_path, figures):
    gae, grpo = str(tmp_path / "gae.png"), str(tmp_path / "grpo.png")
    report.plot_metrics(ppo_rows(6, eval_every=3), gae)
    report.plot_metrics(ppo_rows(6, critic=False), grpo, critic=False)
    shown = panels(figures[gae])
    assert list(shown) == [t for t, _ in report.PPO_PANELS]
    assert shown["score"] == ["proxy (reward model)", "gold (simulated human)", "held-out proxy",
                              "held-out gold"]
    assert shown["KL to the reference (nats/seq) and β"] == ["KL", "β (right axis)"]
    # No critic: no value loss, no explained variance; no evaluation: no held-out entries.
    shown = panels(figures[grpo])
    assert "value loss" not in shown and "explained variance" not in shown and len(shown) == 6
    assert shown["score"] == ["proxy (reward model)", "gold (simulated human)"]


def test_reward_and_dpo_plots_show_their_steps(tmp_path, figures):
    rows = [{"step": s, "epoch": 1, "loss": 0.7, "accuracy": 0.5, "lr": 1e-3} for s in range(1, 61)]
    rows[-1].update(val_loss=0.6, acc_noisy=0.6, acc_gold=0.7)
    report.plot_reward(rows, str(tmp_path / "reward.png"))
    shown = panels(figures[str(tmp_path / "reward.png")])
    assert shown["Bradley-Terry loss"] == ["train (batch) (mean of 2)", "held-out"]
    assert len(shown) == 2
    dpo = [{"step": s, "loss": 0.69, "rewards/margins": 0.0, "rewards/chosen": 0.0,
            "rewards/rejected": 0.0, "rewards/accuracies": 0.5} for s in range(1, 6)]
    report.plot_dpo(dpo, str(tmp_path / "dpo.png"))
    shown = panels(figures[str(tmp_path / "dpo.png")])
    # Without --dpo_eval_every: three panels, and no held-out entry anywhere.
    assert len(shown) == 3 and not any("held-out" in t or "KL" in " ".join(v)
                                       for t, v in shown.items())
    dpo[-1].update({"eval/kl": 1.0, "eval/gold_mean": 0.5})
    report.plot_dpo(dpo, str(tmp_path / "dpo_eval.png"))
    shown = panels(figures[str(tmp_path / "dpo_eval.png")])
    assert shown["held-out samples"] == ["KL to the reference", "gold (right axis)"]
