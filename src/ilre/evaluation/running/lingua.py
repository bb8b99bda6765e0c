"""The LLMLingua / LongLLMLingua peer as a subprocess (see evaluation/running/lingua_worker.py).

`llmlingua` 0.2.2 only runs on transformers 4.x, so it lives in its own virtual environment,
`.venv-lingua/` (`make lingua`, run by `make eval`), or the python named by ILRE_LINGUA_PYTHON. It is
driven by the same embedded model as every other strategy.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[4]  # src/ilre/evaluation/running/lingua.py
WORKER = Path(__file__).resolve().with_name("lingua_worker.py")
METHODS = ("llmlingua", "longllmlingua")


def lingua_python() -> Path:
    return Path(os.environ.get("ILRE_LINGUA_PYTHON") or REPO / ".venv-lingua" / "bin" / "python")


def lingua_unavailable() -> str | None:
    """None when the lingua environment can import llmlingua, else why not (one line)."""
    python = lingua_python()
    if not python.is_file():
        return f"no LLMLingua environment at {python} (run `make lingua`)"
    probe = subprocess.run([str(python), "-c", "import llmlingua, transformers; print(transformers.__version__)"],
                           capture_output=True, text=True, timeout=120)
    if probe.returncode != 0:
        return f"{python} cannot import llmlingua: {probe.stderr.strip().splitlines()[-1:]}"
    return None


class LinguaPeer:
    """One long-lived worker process; `compress` is one JSON request/response round trip. dtype: the
    model's weights and activations there ("float32" or "bfloat16", as the compressor's)."""

    def __init__(self, checkpoint: Path, work_dir: Path, dtype: str = "float32"):
        self.dtype = dtype
        self.process = subprocess.Popen(
            [str(lingua_python()), str(WORKER), str(checkpoint), str(work_dir), dtype],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
            env={**os.environ, "TOKENIZERS_PARALLELISM": "false"},
        )
        ready = self._read()
        if not ready.get("ready"):
            raise RuntimeError(f"lingua: the worker did not start ({ready})")
        self.info = ready
        self._next = 0

    def _read(self) -> dict:
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"lingua: the worker exited (status {self.process.poll()})")
        return json.loads(line)

    def compress(self, method: str, chunks: list[str], question: str, target_token: int) -> tuple[str, float]:
        """-> (compressed context text, seconds the worker spent)."""
        reply = self._ask({"method": method, "context": chunks, "question": question, "target_token": target_token})
        return reply["compressed"], float(reply["seconds"])

    def call(self, context: str | list[str], **kwargs) -> dict:
        """LLMLingua's own `compress_prompt(context, **kwargs)`, its whole answer dict as it returned it."""
        return self._ask({"method": "call", "context": context, "kwargs": kwargs})["answer"]

    def _ask(self, request: dict) -> dict:
        """One request line out, its reply line back (RuntimeError carrying the worker's error)."""
        self._next += 1
        self.process.stdin.write(json.dumps({"id": self._next, **request}) + "\n")
        self.process.stdin.flush()
        reply = self._read()
        if "error" in reply:
            raise RuntimeError(f"lingua: {reply['error']}")
        return reply

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.stdin.close()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
