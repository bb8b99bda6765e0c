"""Locret (section 4): the retaining head and the chunked eviction against the literal loops of
tests/reference.py, the training loss and its smoothness term, deterministic training on a tiny
model, and the strategy through the pipeline without a query."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from ilre.compressor.pipeline import select_context, select_query
from ilre.compressor.prefill import HEAD_INPUTS, PrefillConfig, RetrievalState, encode_context
from ilre.compressor.strategies import ScoreInputs, make_strategy
from ilre.evaluation.locret_data import Example, dense_answer_logits
from ilre.evaluation.train_locret import TrainPlan, fit_head, locret_loss
from ilre.models.loader import load_spec, load_truncated
from ilre.models.retaining_head import RetainingHead, attach_head, head_path
from tests.reference import literal_locret, literal_retaining_scores
from tests.tiny_models import N_LAYERS, random_ids, tiny_checkpoint


def run(scores: torch.Tensor, budget: int, sink: int, **options) -> list[int]:
    strategy = make_strategy("locret", options)
    state = RetrievalState(keys={}, queries={}, parts={"retaining": scores.reshape(1, -1, 1)})
    ranked = strategy.score(ScoreInputs(length=scores.numel(), state=state, sink=sink, budget=budget))
    return strategy.select(ranked, budget, sink).tolist()


@pytest.mark.parametrize("length,chunk,stabilisers,local,sink", [
    (61, 8, 3, 2, 4), (97, 13, 0, 5, 0), (40, 40, 6, 1, 2), (23, 5, 9, 0, 4), (130, 16, 16, 7, 4), (77, 1, 2, 3, 1)])
def test_eviction_equals_the_literal_algorithm(length, chunk, stabilisers, local, sink):
    gen = torch.Generator().manual_seed(length * chunk + stabilisers)
    scores = torch.randn(length, generator=gen)
    for budget in sorted({1, 2, sink + 1, local + sink + 1, length // 3, length // 2, length - 1}):
        if not 0 < budget < length:
            continue
        got = run(scores, budget, sink, chunk=chunk, stabilisers=stabilisers, local=local)
        want = literal_locret(scores.tolist(), budget, sink, local, stabilisers, chunk)
        assert got == want, (budget, got, want)
        assert len(got) == budget and got == sorted(set(got))


def test_ties_go_to_the_lower_index_and_the_defaults_scale_with_the_budget():
    scores = torch.randint(0, 3, (300,), generator=torch.Generator().manual_seed(5)).float()  # many equal scores
    for budget in (20, 64, 150):
        stabilisers, local, chunk = make_strategy("locret").sizes(budget)
        assert run(scores, budget, 4) == literal_locret(scores.tolist(), budget, 4, local, stabilisers, chunk)
    assert make_strategy("locret").sizes(1024) == (156, 6, 64)  # Table 9's Llama row x 1024 / 16384


def test_stabilisers_keep_recent_tokens_that_a_global_top_k_drops():
    scores = torch.arange(40, 0, -1).float()  # older = better: a global top-k keeps the start
    no_stab = run(scores, 10, 0, chunk=10, stabilisers=0, local=0)
    assert no_stab == list(range(10))
    with_stab = run(scores, 10, 0, chunk=10, stabilisers=4, local=0)
    assert with_stab != no_stab and len(with_stab) == 10  # protected units pushed older ones out for good


def test_head_scores_equal_the_literal_mlp():
    gen = torch.Generator().manual_seed(2)
    raw_q, raw_k, values = torch.randn(4, 7, 3, generator=gen), torch.randn(2, 7, 3, generator=gen), torch.randn(2, 7, 3, generator=gen)
    head = RetainingHead(4 * 3 + 2 * 2 * 3, 5, 2)
    with torch.no_grad():
        head.w1.normal_(generator=gen)
        head.w2.normal_(generator=gen)
    got = head.score(raw_q, raw_k, values)[..., 0]
    want = torch.tensor(literal_retaining_scores(raw_q, raw_k, values, head.w1.detach(), head.w2.detach()))
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


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


def test_runs_without_a_query_once_per_context_and_a_missing_head_names_the_command(tmp_path, monkeypatch):
    checkpoint = tiny_checkpoint("llama")
    model = load_truncated(checkpoint, N_LAYERS)
    config = PrefillConfig(sink=2, window=5, chunk=7)
    context = random_ids(90, seed=9)
    strategy = make_strategy("locret", {"chunk": 16, "stabilisers": 4, "local": 3})
    with pytest.raises(ValueError, match="train-locret --layer 4"):
        encode_context(model, context, config, parts=strategy.context_parts)
    head = RetainingHead.for_spec(load_spec(checkpoint), 8, seed=1)
    head.save(head_path("tiny-model", N_LAYERS, tmp_path))
    monkeypatch.setenv("ILRE_LOCRET_DIR", str(tmp_path))
    attach_head(model, "Tiny-Model")
    alone = select_context(model, context, torch.empty(0, dtype=torch.int64), 30, strategy, config)
    state = encode_context(model, context, config, parts=strategy.context_parts)
    first = select_query(model, state, random_ids(5, seed=1), 30, strategy)
    assert first.kept.tolist() == alone.kept.tolist() and len(alone.kept) == 30
    memo = dict(state.scores)
    assert select_query(model, state, random_ids(3, seed=2), 30, strategy).kept.tolist() == first.kept.tolist()
    assert all(state.scores[k] is memo[k] for k in memo)  # scored once per context
    raw = encode_context(model, context, config, parts=HEAD_INPUTS)
    want = torch.tensor(literal_retaining_scores(*(raw.parts[p] for p in HEAD_INPUTS), head.w1, head.w2))
    torch.testing.assert_close(state.parts["retaining"][..., 0], want, rtol=1e-4, atol=1e-4)
    scores = want.amax(dim=0).tolist()
    assert first.kept.tolist() == literal_locret(scores, 30, 2, 3, 4, 16)
    assert not math.isnan(sum(scores))


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
