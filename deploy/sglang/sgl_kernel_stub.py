"""Test-environment shim standing in for `sgl_kernel`, which SGLang imports unconditionally and which
PyPI ships only as a CUDA build. Every top-level name resolves to a function that raises
NotImplementedError when called, so a kernel the CPU path really needs shows up at once rather than as
a wrong answer. Submodules stay missing, so SGLang's own ImportError fallbacks apply. Installed as
`sgl_kernel/__init__.py` in SGLang's test virtualenv only (deploy/sglang/build.sh)."""

from __future__ import annotations

__version__ = "0.0.0+ilre.stub"


def __getattr__(name: str):
    if name.startswith("__"):
        raise AttributeError(name)

    def kernel(*args, **kwargs):
        raise NotImplementedError(f"sgl_kernel.{name}: no CPU build of sgl_kernel here (ilre test shim)")

    kernel.__name__ = name
    return kernel
