"""A `.gguf` file as `--model`: its metadata made into a folder once, its tensors read from the file by name, only
those of the layers up to l_R de-quantised; the model equals the one converted whole (the embedded SmolLM2's
GGUF under another name)."""

from __future__ import annotations

import os

import pytest
import torch

from ilre.models.embedded import embedded_checkpoint, embedded_gguf_path
from ilre.models.gguf_tensors import linked_gguf
from ilre.models.loader import load_truncated, resolve_checkpoint

L_R = 4


@pytest.fixture(scope="module")
def gguf_model(tmp_path_factory):
    link = tmp_path_factory.mktemp("gguf") / "smol-copy.gguf"
    os.symlink(embedded_gguf_path(), link)
    return resolve_checkpoint(str(link))


def test_the_folder_holds_the_metadata_and_links_the_file(gguf_model):
    folder = gguf_model.path
    assert (folder / "config.json").is_file() and (folder / "tokenizer.json").is_file()
    assert not list(folder.glob("*.safetensors"))
    assert linked_gguf(folder) == embedded_gguf_path().resolve()
    assert resolve_checkpoint(str(linked_gguf(folder))).name == embedded_gguf_path().stem


def test_tensors_read_by_name_equal_the_whole_conversion_and_stop_at_l_r(gguf_model, monkeypatch):
    from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS

    processed: list[str] = []
    processor = TENSOR_PROCESSORS["llama"]
    process = processor.process
    monkeypatch.setattr(processor, "process", lambda self, **kw: processed.append(kw["name"]) or process(self, **kw))
    ours = load_truncated(gguf_model.path, L_R).state_dict()
    whole = load_truncated(embedded_checkpoint(), L_R).state_dict()
    assert ours.keys() == whole.keys()
    for name, tensor in ours.items():
        assert torch.equal(tensor, whole[name]), name
    blocks = {int(name.split(".")[1]) for name in processed if name.startswith("blk.")}
    assert blocks == set(range(L_R))  # 0-based: layers 1..l_R de-quantised, none above
    top = [name for name in processed if name.startswith(f"blk.{L_R - 1}.")]
    assert top and not any("ffn" in name for name in top)  # l_R's MLP is not
