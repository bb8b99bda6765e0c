"""Locret's training (`ilre train-locret`, section 4.2): the loss and its smoothness term, deterministic
training on a tiny model, and the command on the embedded model."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from ilre.compressor.context_state import HEAD_INPUTS
from ilre.compressor.prefill import encode_context
from ilre.compressor.prefill_config import PrefillConfig
from ilre.models.loader import load_spec, load_truncated
from ilre.models.retaining_head import RetainingHead, head_path
from ilre.training.locret_data import Example, dense_answer_logits
from ilre.training.train_locret import TrainPlan, fit_head, locret_loss
from tests.tiny_models import N_LAYERS, random_ids, tiny_checkpoint


def test_the_smoothness_term_is_in_the_loss():
    labels = torch.tensor([[0.0], [5.0], [0.0], [5.0]])
    exact = labels.clone()  # SmoothL1 is 0: only the adjacent-token term remains
    assert float(locret_loss(exact, labels, 0.0)) == 0.0
    assert float(locret_loss(exact, labels, 0.01)) == pytest.approx(0.01 * 25.0)
    smooth = torch.full_like(labels, 2.5)
    assert locret_loss(smooth, labels, 1.0) < locret_loss(exact, labels, 1.0)  # it prefers neighbours alike


def tiny_examples(model, n: int) -> list[Example]:
    config = PrefillConfig(sink=2, window=8, chunk=16)
    out = []
    for i in range(n):
        ids = random_ids(48, seed=100 + i)
        state = encode_context(model, ids[:40], config, parts=HEAD_INPUTS)
        features = RetainingHead.features(*(state.parts[p] for p in HEAD_INPUTS))
        labels = dense_answer_logits(model, ids, 40, slice(44, 48)).transpose(0, 1).contiguous()
        out.append(Example(features, labels, torch.tensor([3, 4]), "tiny"))
    return out


def test_training_is_deterministic_loss_falls_and_the_head_round_trips(tmp_path):
    checkpoint = tiny_checkpoint("llama")
    model = load_truncated(checkpoint, N_LAYERS)
    examples = tiny_examples(model, 12)
    spec = load_spec(checkpoint)
    plan = TrainPlan(hidden=16, epochs=5, lr=3e-3, seed=7)
    heads, histories = [], []
    for _ in range(2):
        head = RetainingHead.for_spec(spec, plan.hidden, seed=plan.seed)
        histories.append(fit_head(head, examples[:10], examples[10:], plan))
        heads.append(head)
    assert torch.equal(heads[0].w1, heads[1].w1) and histories[0] == histories[1]
    assert plan.alpha > 0
    unsmoothed = RetainingHead.for_spec(spec, plan.hidden, seed=plan.seed)
    fit_head(unsmoothed, examples[:10], examples[10:], dataclasses.replace(plan, alpha=0.0))
    assert not torch.equal(unsmoothed.w1, heads[0].w1)  # training reads the smoothness weight
    losses = [row["train_loss"] for row in histories[0]]
    assert losses[-1] < losses[0] * 0.8, losses
    heads[0].meta = {"model": "tiny", "layer": N_LAYERS}
    path = heads[0].save(head_path("tiny", N_LAYERS, tmp_path))
    back = RetainingHead.load(path)
    assert torch.equal(back.w1, heads[0].w1) and back.meta == heads[0].meta and back.activation == "silu"


def test_train_locret_from_the_command_line(tmp_path):
    """The command on the embedded model with a tiny plan: a head file with its command and history."""
    import json
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "ilre.cli", "train-locret", "--samples", "4", "--lengths", "1024",
                          "--epochs", "2", "--hidden", "8", "--output-dir", str(tmp_path)],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    from ilre.models.profiles import load_profile

    layer = load_profile("SmolLM2-135M-Instruct", 30).retrieval_layer  # no --layer: the profile's l_R
    path = tmp_path / f"smollm2-135m-instruct.locret-layer{layer}.safetensors"
    assert json.loads(out.stdout) == {"head": str(path)}
    epochs = [json.loads(line) for line in out.stderr.splitlines() if line.startswith('{"epoch"')]
    assert [row["epoch"] for row in epochs] == [1, 2] and all("valid_loss" in row for row in epochs)
    head = RetainingHead.load(path)
    assert head.hidden == 8 and head.meta["layer"] == layer and "train-locret --samples 4" in head.meta["command"]
    assert len(head.meta["history"]) == 2
    bad = subprocess.run([sys.executable, "-m", "ilre.cli", "train-locret", "--samples", "1"],
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "samples: must be >= 2" in bad.stderr and "Traceback" not in bad.stderr
