"""A `.gguf` file as `--model`: its metadata made into a folder once, its tensors read from the file by name, only
those of the layers up to l_R de-quantised, each once (later reads take the folder's float32 copies); the model
equals the one converted whole (the embedded SmolLM2's GGUF under another name)."""

from __future__ import annotations

import os

import pytest
import torch

from ilre.models.embedded import embedded_checkpoint, embedded_gguf_path
import ilre.models.gguf_tensors as gguf_tensors
from ilre.models.gguf_tensors import DEQUANTISED, gguf_checkpoint, linked_gguf
from ilre.models.loader import load_truncated, resolve_checkpoint

L_R = 4


@pytest.fixture(scope="module")
def gguf_model(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gguf")
    link = folder / "smol-copy.gguf"
    os.symlink(embedded_gguf_path(), link)
    return gguf_checkpoint(link, folder / "smol-copy-gguf")  # a folder of this run's own: nothing de-quantised yet


def test_the_folder_holds_the_metadata_and_links_the_file(gguf_model):
    folder = gguf_model
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
    ours = load_truncated(gguf_model, L_R).state_dict()
    whole = load_truncated(embedded_checkpoint(), L_R).state_dict()
    assert ours.keys() == whole.keys()
    for name, tensor in ours.items():
        assert torch.equal(tensor, whole[name]), name
    blocks = {int(name.split(".")[1]) for name in processed if name.startswith("blk.")}
    assert blocks == set(range(L_R))  # 0-based: layers 1..l_R de-quantised, none above
    top = [name for name in processed if name.startswith(f"blk.{L_R - 1}.")]
    assert top and not any("ffn" in name for name in top)  # l_R's MLP is not


def test_each_tensor_is_de_quantised_once_and_read_back_from_its_copy(gguf_model, monkeypatch):
    first = load_truncated(gguf_model, L_R).state_dict()  # de-quantises what the test above did not
    copies = list((gguf_model / DEQUANTISED).glob("*.safetensors"))
    assert copies and not list((gguf_model / DEQUANTISED).glob(".*"))  # no part left behind
    asked: list[str] = []
    dequantise = gguf_tensors._dequantise
    monkeypatch.setattr(gguf_tensors, "_dequantise", lambda folder, names: asked.extend(names) or dequantise(folder, names))
    again = load_truncated(gguf_model, L_R).state_dict()
    assert asked == []  # every tensor from its copy, the GGUF not opened
    for name, tensor in first.items():
        assert torch.equal(tensor, again[name]), name
    deeper = load_truncated(gguf_model, L_R + 2).state_dict()
    # 0-based: the two new layers, and the rest of l_R's (its q and k were kept)
    assert {int(n.split(".")[1]) for n in asked if n.startswith("layers.")} == {L_R - 1, L_R, L_R + 1}
    assert f"layers.{L_R - 1}.self_attn.k_proj.weight" not in asked and f"layers.{L_R - 1}.mlp.up_proj.weight" in asked
    for name, tensor in first.items():
        if name in deeper and not name.startswith(f"layers.{L_R - 1}."):  # l_R's layer is q/k only in `first`
            assert torch.equal(tensor, deeper[name]), name
