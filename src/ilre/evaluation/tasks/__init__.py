"""The samples: RULER-style and structured tasks, passkeys, haystacks and windows of real files; pure functions
of their seeds, used by the evaluation, the calibration, Locret's training, the tests and the benchmarks."""
