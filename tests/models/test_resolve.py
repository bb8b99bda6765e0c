"""Model references: the embedded default, folders, GGUF files and hub ids resolve or fail clearly."""

from __future__ import annotations

from pathlib import Path

import pytest

from ilre.models.embedded import EMBEDDED_NAME
from ilre.models.loader import load_spec, load_truncated, resolve_checkpoint
from tests.tiny_models import tiny_checkpoint


@pytest.mark.parametrize("alias", [None, "", "embedded", "SmolLM2-135M-Instruct", "HuggingFaceTB/SmolLM2-135M-Instruct"])
def test_embedded_aliases_resolve_to_the_cached_conversion(alias):
    checkpoint = resolve_checkpoint(alias)
    assert checkpoint.name == EMBEDDED_NAME
    assert (checkpoint.path / "config.json").is_file() and (checkpoint.path / "model.safetensors").is_file()
    spec = load_spec(checkpoint.path)
    assert (spec.num_layers, spec.num_heads, spec.num_kv_heads, spec.native_context) == (30, 9, 3, 8192)


def test_embedded_model_truncates_to_the_requested_layer():
    model = load_truncated(resolve_checkpoint(None).path, 8)
    assert model.n_layers == 8 and len(model.layers) == 8
    assert not hasattr(model.layers[-1], "mlp") and hasattr(model.layers[-2], "mlp")


def test_local_folder_resolves_by_its_name():
    folder = tiny_checkpoint("llama")
    checkpoint = resolve_checkpoint(str(folder))
    assert checkpoint.path == Path(folder) and checkpoint.name == Path(folder).name


@pytest.mark.parametrize("reference, message", [
    ("/no/such/model.gguf", "GGUF file /no/such/model.gguf not found"),
    ("./no-such-folder", "neither a checkpoint folder"),
    ("a/b/c", "neither a checkpoint folder"),
])
def test_bad_references_fail_with_the_field_named(reference, message):
    with pytest.raises(FileNotFoundError, match="model: ") as err:
        resolve_checkpoint(reference)
    assert message in str(err.value)


def test_folder_without_config_is_rejected(tmp_path):
    with pytest.raises(FileNotFoundError, match="has no config.json"):
        resolve_checkpoint(str(tmp_path))


def test_unreachable_hub_id_fails_clearly(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(FileNotFoundError, match="could not fetch 'nobody-here/no-such-model'"):
        resolve_checkpoint("nobody-here/no-such-model")
