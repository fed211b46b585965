"""The options the PPO loop can take, each entered from ppo.train_ppo through one call: a moving
anchor (anchors.py), a KL limit with rollbacks or an early stop (rollback.py), group baselines
instead of a critic (grpo.py), cheaper ways to hold the reference (cheap_ref.py), and the actor
judged on held-out prompts during training (evaluate.py, --eval_every: the same functions give
every stage's final evaluation).

With every option at its default, none of them changes what the loop computes.
"""
