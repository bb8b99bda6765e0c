"""The real embedded model finds a passkey in a ~9K-token haystack (beyond its 8,192-token window: DCA auto), at
10 depths, first token to last. The depths are two xdist groups, so `make test`'s two workers share them; longer
haystacks (16K-128K) are the evaluation's and `make bench`'s."""

from __future__ import annotations

import pytest

from ilre.contract.messages import CompressRequest
from ilre.evaluation.tasks.passkey import make_passkey_sample

DEPTHS = [d / 9 for d in range(10)]  # first token .. last, evenly
HAYSTACK_TOKENS = 9000  # beyond the model's native 8,192: DCA on


@pytest.mark.slow
@pytest.mark.parametrize("depth", [pytest.param(d, id=f"depth{d:.2f}", marks=pytest.mark.xdist_group(f"test_needle.py#{i % 2}"))
                                   for i, d in enumerate(DEPTHS)])
def test_whole_passkey_survives_at_every_depth(engine, depth):
    sample = make_passkey_sample(engine.tokenizer, HAYSTACK_TOKENS, depth, digits=6, seed=11)
    result = engine.compress(CompressRequest(context_ids=sample.context_ids, query_ids=sample.query_ids, budget=1024))
    assert len(sample.context_ids) > engine.spec.native_context and result.dca and result.compressed_tokens == 1024 and result.layer == engine.layer
    kept = set(result.kept_indices)
    assert all(i in kept for i in range(*sample.needle))  # README: the default keeps it at all 10 depths
