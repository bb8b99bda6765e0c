"""The committed gRPC stubs (src/ilre/v1/*_pb2*.py) match src/ilre/v1/*.proto: regenerated from the .proto files
with grpcio-tools, they describe the same messages (the serialized file descriptor) and the same
service methods. A failure means an edit of a .proto without `make proto`."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PROTO = Path(__file__).resolve().parents[1] / "src"  # the .proto and its stubs side by side: src/ilre/v1


def descriptor_bytes(source: str) -> bytes:
    """The serialized FileDescriptorProto a generated *_pb2.py registers (AddSerializedFile's argument)."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "AddSerializedFile":
            return ast.literal_eval(node.args[0])
    raise AssertionError("no AddSerializedFile call in the generated module")


def methods(source: str) -> list[str]:
    """The RPC paths a generated *_pb2_grpc.py binds, e.g. '/ilre.v1.Compressor/Compress', sorted."""
    return sorted(set(re.findall(r"'(/[\w.]+/\w+)'", source)))


def test_committed_stubs_match_the_proto_files(tmp_path):
    protoc = pytest.importorskip("grpc_tools.protoc", reason="grpcio-tools: pip install -e '.[proto]'")
    protos = sorted(str(p.relative_to(PROTO)) for p in (PROTO / "ilre" / "v1").glob("*.proto"))
    assert protos, "no .proto files under src/ilre/v1"
    well_known = Path(protoc.__file__).parent / "_proto"  # google/protobuf/*.proto, as `python -m grpc_tools.protoc` adds
    args = ["protoc", f"-I{PROTO}", f"-I{well_known}", f"--python_out={tmp_path}", f"--grpc_python_out={tmp_path}", *protos]
    assert protoc.main(args) == 0
    for proto in protos:
        stem = proto.removesuffix(".proto")
        for suffix, read in (("_pb2.py", descriptor_bytes), ("_pb2_grpc.py", methods)):
            committed, fresh = PROTO / f"{stem}{suffix}", tmp_path / f"{stem}{suffix}"
            assert committed.is_file(), f"{committed} is missing: run `make proto` and commit it"
            assert read(committed.read_text()) == read(fresh.read_text()), \
                f"{committed.name} differs from {proto}: run `make proto` and commit the stubs"
