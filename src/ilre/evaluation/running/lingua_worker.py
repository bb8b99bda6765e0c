"""LLMLingua / LongLLMLingua peer, run inside its own virtual environment (.venv-lingua).

`llmlingua` 0.2.2 needs transformers 4.x (the legacy tuple KV cache), so it cannot live in the
main environment (transformers 5). evaluation/running/lingua.py starts this file as a subprocess with the
lingua environment's python and talks JSON lines over stdin/stdout:

  argv: CHECKPOINT_DIR WORK_DIR [DTYPE: float32 (default) or bfloat16]
  stdin:  {"id", "method": "llmlingua"|"longllmlingua", "context": [chunk texts], "question", "target_token"}
  stdout: {"id", "compressed", "seconds"} or {"id", "error"}; first line {"ready": true}
  or stdin {"id", "method": "call", "context", "kwargs": {...}}: compress_prompt(context, **kwargs) as it is
  -> {"id", "answer": its whole result, "seconds"} (the compatible API's tests compare with it)

Two things are patched here and nowhere else:
- tiktoken: LLMLingua counts tokens with tiktoken's gpt-3.5 encoding, fetched from the internet
  on first use; the model's own tokenizer counts them instead (the budget is in its tokens anyway).
- the config: the checkpoint's config.json is written by transformers 5 (`rope_parameters`, no
  top-level `rope_theta`); transformers 4.46 would silently fall back to rope_theta 10000, so the
  model is loaded from a copy whose config carries rope_theta explicitly (and whose
  tokenizer_config names a tokenizer class transformers 4 knows).
This file imports nothing from ilre (it runs in the other environment).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path


class _ModelTokenCounter:
    """Stands in for a tiktoken Encoding: only `.encode` is used by LLMLingua."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def encode(self, text: str, *args, **kwargs) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False).input_ids

    def decode(self, ids, *args, **kwargs) -> str:
        return self.tokenizer.decode(ids)


def legacy_checkpoint(checkpoint: Path, work: Path) -> Path:
    """A folder with the checkpoint's files linked and a transformers-4 config.json."""
    work.mkdir(parents=True, exist_ok=True)
    config = json.loads((checkpoint / "config.json").read_text())
    rope = config.pop("rope_parameters", None) or {}
    config.setdefault("rope_theta", rope.get("rope_theta", 10000.0))
    if rope.get("rope_type", "default") != "default":
        config["rope_scaling"] = {k: v for k, v in rope.items() if k != "rope_theta"}
    config["torch_dtype"] = config.pop("dtype", "float32")
    tok_config = json.loads((checkpoint / "tokenizer_config.json").read_text())
    tok_config["tokenizer_class"] = "PreTrainedTokenizerFast"  # transformers 5 writes "TokenizersBackend"
    (work / "tokenizer_config.json").write_text(json.dumps(tok_config, indent=2))
    for item in checkpoint.iterdir():
        target = work / item.name
        if item.name in ("config.json", "tokenizer_config.json"):
            continue
        if not target.exists():
            os.symlink(item.resolve(), target)
    (work / "config.json").write_text(json.dumps(config, indent=2))
    return work


def _common(request: dict) -> dict:
    """The evaluation's settings: its question, its budget in context tokens, the question left out."""
    return dict(question=request["question"], target_token=request["target_token"], concate_question=False)


def main() -> int:
    checkpoint, work = Path(sys.argv[1]), Path(sys.argv[2])
    dtype = sys.argv[3] if len(sys.argv) > 3 else "float32"
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ["HF_HUB_OFFLINE"] = "1"
    import tiktoken
    from transformers import AutoTokenizer

    folder = legacy_checkpoint(checkpoint, work)
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    counter = _ModelTokenCounter(tokenizer)
    tiktoken.encoding_for_model = lambda *args, **kwargs: counter  # no network fetch
    tiktoken.get_encoding = lambda *args, **kwargs: counter
    from llmlingua import PromptCompressor

    compressor = PromptCompressor(model_name=str(folder), device_map="cpu", model_config={"trust_remote_code": False})
    import torch

    compressor.model.to(getattr(torch, dtype))  # the compressor's dtype (float32 or bfloat16)
    theta = getattr(compressor.model.config, "rope_theta", None)
    print(json.dumps({"ready": True, "rope_theta": theta, "dtype": str(compressor.model.dtype), "transformers": __import__("transformers").__version__}),
          flush=True)
    for line in sys.stdin:
        if not line.strip():
            continue
        request = json.loads(line)
        start = time.perf_counter()
        try:
            if request["method"] == "call":
                result = compressor.compress_prompt(request["context"], **request.get("kwargs", {}))
            elif request["method"] == "longllmlingua":  # the LongLLMLingua settings of the package's README
                result = compressor.compress_prompt(
                    request["context"], rank_method="longllmlingua", condition_in_question="after_condition",
                    reorder_context="original", dynamic_context_compression_ratio=0.3, condition_compare=True,
                    context_budget="+100", **_common(request))
            elif request["method"] == "llmlingua":
                result = compressor.compress_prompt(request["context"], rank_method="llmlingua", **_common(request))
            else:
                raise ValueError(f"method: unknown {request['method']!r}")
            out = {"id": request["id"], "compressed": result["compressed_prompt"],
                   "seconds": round(time.perf_counter() - start, 3)}
            if request["method"] == "call":
                out["answer"] = result
        except Exception as exc:  # one bad request must not end the worker
            out = {"id": request.get("id"), "error": f"{type(exc).__name__}: {exc}"}
        print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
