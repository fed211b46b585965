import os, sys
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import torch
torch.set_num_threads(min(2, torch.get_num_threads()))
import pytest


@pytest.fixture(scope="session")
def run(tmp_path_factory):
    """One full `python train.py --preset=smoke` run, shared by the end-to-end tests."""
    import train
    out = str(tmp_path_factory.mktemp("smoke"))
    train.main(["--preset=smoke", f"--out_dir={out}"])
    return out
