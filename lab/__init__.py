"""The laboratory: what measures tether rather than runs it. Ablation suites and their tables,
best-of-n and Gao et al.'s fits, seed ranges, the check of README's table, benchmarks (TRL side by
side), the token-by-token page. Each entry point runs from the project's root:

    python -m lab.ablate --help
    python -m lab.bench --help

Nothing outside this folder imports it.
"""
