"""The machinery around the RLHF path: flags, files on disk and their records, resumable state,
process groups, precision, optimizers, pretraining, evaluation and the stage table.

A learner following one PPO iteration can leave this folder closed: what it holds makes runs
resumable, checked and reproducible, not what PPO computes.
"""
