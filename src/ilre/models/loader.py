"""Resolve a model reference to a checkpoint folder and build a truncated model from it.

A reference is a local folder (config.json + safetensors), a `.gguf` file (its metadata made into a folder in the
cache once, its tensors read from it by name), a packaged model's short name (`gemma-3-270m`:
models/packaged.py), a Hugging Face id (downloaded when the hub is reachable), or empty/"embedded" for the
embedded default. Only the embeddings and layers 1..l_R are read from the safetensors files.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from ..kernels.cache_dir import cache_root
from .embedded import EMBEDDED_NAME, embedded_checkpoint
from .gguf_tensors import gguf_checkpoint, linked_gguf, read_gguf_tensors
from .llama import TruncatedLM
from .packaged import GEMMA_ALIASES, GEMMA_NAME, gemma_gguf
from .packed_linear import pack_linears
from .spec import ModelSpec, fast_path_applies, fast_spec, load_hf_config, rope_inv_freq
from .transformers_lm import TransformersLM
from .transformers_loader import load_transformers_lm
from .transformers_spec import transformers_spec

EMBEDDED_ALIASES = ("", "embedded", "default", EMBEDDED_NAME.lower(), f"huggingfacetb/{EMBEDDED_NAME.lower()}")


@dataclass(frozen=True)
class Checkpoint:
    """A resolved model: its display name and the folder holding config, weights and tokenizer."""

    name: str
    path: Path


def resolve_checkpoint(reference: str | None) -> Checkpoint:
    """Turn a model reference into a local checkpoint folder (see module docstring)."""
    ref = (reference or "").strip()
    if ref.lower() in EMBEDDED_ALIASES:
        return Checkpoint(EMBEDDED_NAME, embedded_checkpoint())
    if ref.lower() in GEMMA_ALIASES:
        return Checkpoint(GEMMA_NAME, gguf_checkpoint(gemma_gguf(), cache_root() / "models" / GEMMA_NAME))
    path = Path(ref).expanduser()
    if path.suffix == ".gguf":
        if not path.is_file():
            raise FileNotFoundError(f"model: GGUF file {ref} not found")
        return Checkpoint(path.stem, gguf_checkpoint(path, cache_root() / "models" / f"{path.stem}-gguf"))
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise FileNotFoundError(f"model: {ref} has no config.json")
        return Checkpoint(path.name, path)
    if path.exists() or ref.startswith((".", "/")) or ref.count("/") != 1:
        raise FileNotFoundError(f"model: {ref!r} is neither a checkpoint folder, a .gguf file nor a hub id")
    return Checkpoint(ref.split("/")[-1], _download(ref))


def _download(repo_id: str) -> Path:
    from huggingface_hub import snapshot_download

    try:
        folder = snapshot_download(
            repo_id, allow_patterns=["*.json", "*.safetensors", "tokenizer*", "*.model", "*.txt"]
        )
    except Exception as exc:  # offline, unknown id, gated repo...
        raise FileNotFoundError(f"model: could not fetch {repo_id!r} from the hub ({type(exc).__name__})") from exc
    return Path(folder)


def _tensor_files(checkpoint: Path) -> dict[str, Path]:
    """Map every tensor name to the safetensors file holding it (sharded or single-file)."""
    index = checkpoint / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        return {name: checkpoint / file for name, file in weight_map.items()}
    from safetensors import safe_open

    names: dict[str, Path] = {}
    for file in sorted(checkpoint.glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as f:
            names.update(dict.fromkeys(f.keys(), file))
    if not names:
        raise FileNotFoundError(f"model: no safetensors weights in {checkpoint}")
    return names


def read_tensors(
    checkpoint: Path, wanted: list[str], device: torch.device | str = "cpu", dtype: torch.dtype | None = None
) -> dict[str, torch.Tensor]:
    """Read only the named tensors (names without the `model.` prefix) from the checkpoint, each
    straight onto `device` and converted to `dtype` (None = as stored) as it is read (from a GGUF file where the
    folder links one: models/gguf_tensors.py)."""
    from safetensors import safe_open

    if linked_gguf(checkpoint) is not None:
        return read_gguf_tensors(checkpoint, wanted, device, dtype)
    files = _tensor_files(checkpoint)
    prefix = "model." if any(n.startswith("model.") for n in files) else ""
    by_file: dict[Path, list[str]] = {}
    for name in wanted:
        full = prefix + name
        if full not in files:
            raise KeyError(f"model: tensor {full} missing from {checkpoint}")
        by_file.setdefault(files[full], []).append(name)
    out: dict[str, torch.Tensor] = {}
    for file, names in by_file.items():
        with safe_open(str(file), framework="pt", device=str(device)) as f:
            for name in names:
                tensor = f.get_tensor(prefix + name)
                out[name] = tensor if dtype is None else tensor.to(dtype)
    return out


def spec_from_config(config, path: str = "auto") -> ModelSpec:
    """ModelSpec from a transformers config. path: "fast" (the hand-tuned Llama decoder; ValueError for another
    architecture), "transformers" (the family's own layers: models/transformers_lm.py), "auto" (fast where it
    applies, else transformers)."""
    if path not in ("auto", "fast", "transformers"):
        raise ValueError(f"model path: one of auto, fast, transformers (got {path!r})")
    if path == "transformers" or (path == "auto" and not fast_path_applies(config)):
        return transformers_spec(config)
    return fast_spec(config)


def load_spec(checkpoint: Path, path: str = "auto") -> ModelSpec:
    """The ModelSpec of a checkpoint folder (path: as `spec_from_config`'s)."""
    return spec_from_config(load_hf_config(checkpoint), path)


def load_truncated(
    checkpoint: Path, n_layers: int, dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu",
    path: str = "auto",
) -> TruncatedLM | TransformersLM:
    """Build the model up to layer `n_layers` (the retrieval layer, q/k only) from safetensors.

    The module is created on the meta device and its parameters are assigned from the file, read
    straight onto `device` in `dtype`, so no other tensors are ever read or allocated; every
    tensor's shape is checked on assignment. The projections are then fused (TruncatedLM.fuse) and, in bfloat16
    on a CPU with native bfloat16, packed once for oneDNN (models/packed_linear.py).
    path: "auto" takes that hand-tuned decoder where it computes the checkpoint (models/spec.fast_path_applies), else
    the family's own transformers layers (models/transformers_lm.py); "fast" or "transformers" ask for one.
    """
    config = load_hf_config(checkpoint)
    spec = spec_from_config(config, path)
    if spec.path == "transformers":
        return load_transformers_lm(checkpoint, n_layers, dtype, device, read_tensors)
    inv_freq, scaling = rope_inv_freq(config)
    with torch.device("meta"):
        model = TruncatedLM(spec, n_layers, torch.empty(0), scaling)
    names = list(model.state_dict().keys())
    tensors = read_tensors(checkpoint, names, device, dtype)
    for name, tensor in tensors.items():
        expected = model.get_parameter(name).shape
        if tuple(tensor.shape) != tuple(expected):
            raise ValueError(f"model: {name} has shape {tuple(tensor.shape)}, expected {tuple(expected)}")
    model.load_state_dict(tensors, strict=True, assign=True)
    model.inv_freq = inv_freq.to(device)
    return pack_linears(model.eval().requires_grad_(False).fuse(), dtype, torch.device(device))


# tokenizer_config.json classes that are transformers' generic fast tokenizer: loaded by that class directly
_GENERIC_TOKENIZERS = ("TokenizersBackend", "PreTrainedTokenizerFast")


def load_tokenizer(checkpoint: Path):
    """The checkpoint's tokenizer: the embedded model's on `tokenizers` directly (models/fast_tokenizer.py: ~1.4 s
    less of a process start); else transformers' fast tokenizer, the class its tokenizer_config.json names where
    that is the generic one (what AutoTokenizer builds then, without reading the model's config), else AutoTokenizer."""
    if Path(checkpoint) == cache_root() / "models" / EMBEDDED_NAME:
        from .fast_tokenizer import FastTokenizer

        return FastTokenizer(checkpoint)
    try:
        named = json.loads((Path(checkpoint) / "tokenizer_config.json").read_text()).get("tokenizer_class")
    except (OSError, ValueError):
        named = None
    if named in _GENERIC_TOKENIZERS:
        from transformers import PreTrainedTokenizerFast

        return PreTrainedTokenizerFast.from_pretrained(str(checkpoint))
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(checkpoint))
