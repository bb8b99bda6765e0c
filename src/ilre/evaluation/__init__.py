"""Synthetic long-context tasks: haystacks, passkey needles (calibration, tests, benchmarks)."""
