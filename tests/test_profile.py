"""lab/profile_ppo.py: the profile of PPO iterations on a finished run, through ppo.train_ppo."""
import pytest
import torch

import ppo
from lab import profile_ppo


def test_op_classes():
    assert profile_ppo.op_class("aten::mm", False) == "matmul"
    assert profile_ppo.op_class("aten::addmm", True) == "optimizer"
    assert profile_ppo.op_class("aten::_scaled_dot_product_flash_attention_for_cpu",
                                False) == "attention"
    assert profile_ppo.op_class("aten::exponential_", False) == "sampling"
    assert profile_ppo.op_class("aten::gelu", False) == "element-wise and other"


def test_profile_of_the_smoke_run(run, capsys):
    originals = (ppo.rollout, ppo.make_experience, ppo.ppo_update,
                 torch.nn.utils.clip_grad_norm_)
    profile_ppo.main(["--preset=smoke", f"--out_dir={run}", "--iters=2", "--eval_n=8"])
    # The wrapped functions are put back.
    assert originals == (ppo.rollout, ppo.make_experience, ppo.ppo_update,
                         torch.nn.utils.clip_grad_norm_)
    rows = {line.split(" | ")[0][2:]: line.split(" | ") for line in capsys.readouterr().out
            .splitlines() if line.startswith("| ")}
    for phase in profile_ppo.PHASES:
        shares = [float(c.strip(" |%")) for c in rows[phase][3:]]
        # Each phase's classes add up to its profiled time.
        assert sum(shares) == pytest.approx(100, abs=4)
    update = [float(c.strip(" |%")) for c in rows["update"][3:]]
    # The update multiplies matrices and steps an optimizer; the rollout samples.
    assert update[0] > 0 and update[2] > 0
    assert float(rows["rollout"][6].strip(" %")) > 0
    seconds = [float(rows[p][1]) for p in profile_ppo.PHASES[:3]]
    assert float(rows["iteration (rollout + experience + update)"][1]) == pytest.approx(
        sum(seconds), abs=2e-3)


def test_profile_bad_iters(capsys):
    with pytest.raises(SystemExit) as e:
        profile_ppo.main(["--iters=1"])
    assert e.value.code == 2
    assert "--iters=1" in capsys.readouterr().err
