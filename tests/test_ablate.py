"""A tiny ablation: every condition runs and reports finite numbers."""
import json, math, os
import ablate


def test_every_condition_appears_with_finite_values(run):
    ablate.main(["--preset=smoke", f"--out_dir={run}", "--quick", "--ppo_iters=2", "--n_eval=8"])
    adir = os.path.join(run, "ablate")
    with open(os.path.join(adir, "results.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    assert {r["condition"] for r in rows} == set(ablate.CONDITIONS) | {"pretrained"}
    for r in rows:
        for c in ablate.COLUMNS:
            assert math.isfinite(r[c]), (r["condition"], c)
    table = open(os.path.join(adir, "results.md")).read()
    assert all(f"| {c} |" in table for c in ablate.CONDITIONS)
    examples = open(os.path.join(adir, "examples.md")).read()
    assert "## pretrained" in examples and "## no_kl" in examples
    no_kl = next(r for r in rows if r["condition"] == "no_kl")
    assert no_kl["kl_coef_final"] == 0.0


def test_bad_condition_is_a_clear_error(capsys):
    import pytest
    with pytest.raises(SystemExit) as e:
        ablate.main(["--conditions=no_kl,magic"])
    assert e.value.code == 2 and "unknown condition" in capsys.readouterr().err
