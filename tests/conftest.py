import os, sys
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import torch
torch.set_num_threads(min(2, torch.get_num_threads()))
import pytest
import workers


def recording_controller(make, fed):
    """ppo.make_kl_controller's stand-in: the controller `make` builds, with every KL its update is fed appended to
    `fed` (what β is controlled by), then passed on unchanged."""
    def recording(*a):
        ctl = make(*a)
        update = ctl.update
        ctl.update = lambda kl, n: (fed.append(kl), update(kl, n))
        return ctl
    return recording


@pytest.fixture(scope="session")
def run(tmp_path_factory):
    """One full `python train.py --preset=smoke` run, shared by the end-to-end tests."""
    import train
    out = str(tmp_path_factory.mktemp("smoke"))
    return workers.made_once("smoke", lambda d: train.main(["--preset=smoke", f"--out_dir={d}"]), out)


# The smoke preset made smaller still, for tests that build whole pipelines of their own to check
# how state behaves (kills, resumes, deleted files, reseeds, other models), not how well a model
# learns: 40 pretraining iterations instead of 150, 200 preference pairs, one reward epoch, and no
# figures (a quarter of a tiny pipeline's time; the smoke run draws every one).
TINY = ["--preset=smoke", "--max_iters=40", "--eval_interval=20", "--n_pairs=200", "--rm_epochs=1",
        "--n_samples=8", "--plots=false"]


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory):
    """One full `python train.py` run under TINY, shared by the tests that build pipelines."""
    import train
    out = str(tmp_path_factory.mktemp("tiny"))
    return workers.made_once("tiny", lambda d: train.main(TINY + [f"--out_dir={d}"]), out)


# The fast loop over the core files, `python -m pytest -q -m core`: every test of these files that needs no
# pipeline run (the session's `run` or `tiny_run`, which train models for a minute or more) is in it.
CORE_FILES = {"test_model.py", "test_kl.py", "test_estimators.py", "test_ppo.py", "test_grpo.py",
              "test_minibatches.py", "test_ref.py", "test_dpo.py", "test_sample.py", "test_core.py"}
PIPELINE_RUNS = workers.PIPELINE_RUNS


def pytest_addoption(parser):
    workers.add_option(parser)


def pytest_configure(config):
    config.addinivalue_line("markers", "core: the fast loop over the core files (python -m pytest -q -m core)")
    # Two test processes on two cores (tests/workers.py).
    config.pluginmanager.register(workers, "workers")


def pytest_collection_modifyitems(items):
    for item in items:
        core = os.path.basename(str(item.fspath)) in CORE_FILES
        if core and not PIPELINE_RUNS & set(item.fixturenames):
            item.add_marker(pytest.mark.core)
