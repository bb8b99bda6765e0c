"""The evaluation, by job: `tasks` generates the samples (RULER-style tasks, passkeys, haystacks, real files),
`running` runs the strategies and baselines on them and records raw results (`ilre eval`), `report` writes
the results page from those records. Each floor imports only the ones before it (tests/test_layers.py)."""
