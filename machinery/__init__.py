"""The ground the RLHF path stands on: flags (config.py), errors, files on disk (store.py) and their
records (records.py), resumable state (state.py), process groups (dist.py), precision, optimizers,
progress lines, TensorBoard logs and the line under every table that says what made it
(provenance.py). Nothing here imports a file of the root or of another folder, so every file may
use it.

A learner following one PPO iteration can leave this folder closed: what it holds makes runs
resumable, checked and reproducible, not what PPO computes.
"""
