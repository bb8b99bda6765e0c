"""A GGUF file as a checkpoint whose tensors are read by name, so that only the layers up to l_R are ever read.

`gguf_checkpoint` makes a folder holding what the file's metadata gives (config.json, the tokenizer) and a link to
the file; `read_gguf_tensors` reads the tensors a truncated model wants from the file itself: each GGUF tensor is
named by transformers' own map of GGUF names to the model's (`get_gguf_hf_weights_map`), de-quantised and turned as
transformers turns it (its per-architecture tensor processors: Llama's q/k order, merged MoE experts, ...), and
only where the model wants it: a tensor of a layer above is never de-quantised, nor read past its header. Each tensor
is de-quantised once: kept in the folder as float32 safetensors (DEQUANTISED, one file a tensor), which later
processes read as they read a converted checkpoint (Gemma 3 270M to l_R 6: seconds, not a minute)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import torch

from ..kernels.cache_dir import built_folder

GGUF_LINK = "ilre-gguf.json"  # in a checkpoint folder: the GGUF file its tensors are read from
DEQUANTISED = "dequantised-v1"  # in that folder: the tensors de-quantised so far (a new name when their making changes)
_BLOCK = re.compile(r"^blk\.(\d+)\.")


def gguf_checkpoint(gguf: Path, target: Path) -> Path:
    """A checkpoint folder at `target` for a GGUF file: config.json and tokenizer files from its metadata, and
    GGUF_LINK naming the file (its size and time, so that another file at the same path makes a new folder).
    Made once (atomic); returns `target`."""
    stat = gguf.stat()
    link = {"file": str(gguf.resolve()), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}
    if (target / GGUF_LINK).is_file() and json.loads((target / GGUF_LINK).read_text()) == link:
        return target
    from transformers import AutoConfig, AutoTokenizer

    with built_folder(target, replace=True) as tmp:
        folder, name = str(gguf.parent), gguf.name
        config = AutoConfig.from_pretrained(folder, gguf_file=name)
        values = config.to_dict()
        values.pop("quantization_config", None)
        (tmp / "config.json").write_text(json.dumps(values, indent=2))
        AutoTokenizer.from_pretrained(folder, gguf_file=name).save_pretrained(tmp)
        (tmp / GGUF_LINK).write_text(json.dumps(link))
    return target


def linked_gguf(checkpoint: Path) -> Path | None:
    """The GGUF file a checkpoint folder reads its tensors from, or None (safetensors)."""
    link = checkpoint / GGUF_LINK
    return Path(json.loads(link.read_text())["file"]) if link.is_file() else None


def read_gguf_tensors(checkpoint: Path, wanted: list[str], device: torch.device | str = "cpu",
                      dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """The named tensors (the model's names without `model.`) from the checkpoint's GGUF file, de-quantised to
    float32 (then `dtype`), onto `device`; KeyError naming the first one the file does not hold. Those de-quantised
    before are read from the folder's DEQUANTISED copies; the others are de-quantised now and kept there."""
    from safetensors import safe_open

    kept = checkpoint / DEQUANTISED
    missing = [name for name in wanted if not (kept / f"{name}.safetensors").is_file()]
    made = _dequantise(checkpoint, missing) if missing else {}
    for name, tensor in made.items():
        _keep(kept, name, tensor)
    found = {}
    for name in wanted:
        tensor = made.get(name)
        if tensor is None:
            with safe_open(str(kept / f"{name}.safetensors"), framework="pt", device=str(device)) as f:
                tensor = f.get_tensor(name)
        found[name] = tensor.to(device=device, dtype=dtype if dtype is not None else tensor.dtype)
    return found


def _keep(folder: Path, name: str, tensor: torch.Tensor) -> None:
    """Write one de-quantised tensor (float32) to folder/<name>.safetensors, atomically (processes may race)."""
    from safetensors.torch import save_file

    folder.mkdir(exist_ok=True)
    part = folder / f".{name}.{os.getpid()}.part"
    save_file({name: tensor.contiguous()}, str(part))
    os.replace(part, folder / f"{name}.safetensors")


def _dequantise(checkpoint: Path, wanted: list[str]) -> dict[str, torch.Tensor]:
    """The named tensors de-quantised from the checkpoint's GGUF file, float32 on the CPU (module docstring)."""
    from gguf import GGUFReader, dequantize
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.modeling_gguf_pytorch_utils import (TENSOR_PROCESSORS, TensorProcessor,
                                                          get_gguf_hf_weights_map, load_gguf_checkpoint)

    path = linked_gguf(checkpoint)
    parsed = load_gguf_checkpoint(str(path), return_tensors=False)  # the metadata: config and architecture
    reader = GGUFReader(str(path))
    architecture = bytes(reader.fields["general.architecture"].parts[-1]).decode()
    processor = TENSOR_PROCESSORS.get(architecture, TensorProcessor)(config=parsed.get("config", {}))
    with torch.device("meta"):
        names = get_gguf_hf_weights_map(AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(str(checkpoint))),
                                        processor)  # GGUF name -> the model's (model.layers.N...)
    want = {"model." + name for name in wanted} | set(wanted)
    last = max((int(m.group(1)) for n in wanted if (m := re.match(r"^layers\.(\d+)\.", n))), default=-1)
    tensors: dict[str, torch.Tensor] = {}
    out = {"tensors": tensors, "config": parsed.get("config", {})}  # what a processor may add to (merged experts)
    for tensor in reader.tensors:
        block = _BLOCK.match(tensor.name)
        if block is not None and int(block.group(1)) > last:
            continue  # a layer above: never de-quantised
        if tensor.name in names and names[tensor.name] not in want:
            continue
        result = processor.process(weights=dequantize(tensor.data, tensor.tensor_type), name=tensor.name,
                                   tensor_key_mapping=names, parsed_parameters=out)
        if result.name in names and names[result.name] in want:
            tensors[names[result.name]] = torch.from_numpy(result.weights.copy())
    found = {}
    for name in wanted:
        tensor = tensors.get("model." + name, tensors.get(name))
        if tensor is None:
            raise KeyError(f"model: tensor {name} missing from {path}")
        found[name] = tensor
    return found
