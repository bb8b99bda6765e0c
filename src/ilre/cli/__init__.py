"""The `ilre` command line, at the top of the house: it composes the service (serve, worker, sidecar),
the engine (compress, batch, demo) and the evaluation (calibrate, eval, train-locret); neither of
those imports the other. Argument parsing (parser.py), the run_* functions (main.py), batch files,
the demo, what is printed."""

from .main import main

__all__ = ["main"]
