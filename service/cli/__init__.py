"""The `ilre` command line: argument parsing (main.py), batch files, the demo, what is printed."""

from .main import main

__all__ = ["main"]
