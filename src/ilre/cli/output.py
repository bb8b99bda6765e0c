"""What the command line prints: the one-line error type and the one-line result summary."""

from __future__ import annotations

from typing import Any

EXIT_INPUT = 2


class CliError(Exception):
    """A run that cannot proceed: printed as one line, exit status EXIT_INPUT."""


def summary(result: dict[str, Any]) -> str:
    """One line for people: what was kept, how, and how long it took."""
    return (f"kept {result['compressed_tokens']} of {result['original_tokens']} context tokens "
            f"({100 * result['ratio']:.1f}%) with {result['strategy']} at layer {result['layer']} of "
            f"{result['model']}{' with DCA' if result['dca'] else ''} in {result['timings_ms']['total'] / 1000:.2f} s")
