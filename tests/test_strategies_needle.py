"""LagKV, ReAttention, Locret (the shipped head) and ActQKV on the real embedded model through the
command line, on the ~9K-token passkey haystack of test_needle.py (beyond the model's 8K window), at the profile's
"fast" layer (8, where the shipped head is): the budget is met, and what each keeps is reported (LagKV and Locret never
see the question, so whether they keep the passkey is their own business)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from ilre.evaluation.tasks.passkey import make_passkey_sample
from tests.test_needle import HAYSTACK_TOKENS


@pytest.mark.slow
@pytest.mark.parametrize("strategy, with_query", [("lagkv", False), ("reattention", True), ("locret", False),
                                                   ("actqkv", True)])
def test_cli_on_the_9k_needle(engine, tmp_path, strategy, with_query):
    sample = make_passkey_sample(engine.tokenizer, HAYSTACK_TOKENS, 0.5, digits=6, seed=11)
    context = tmp_path / "haystack.txt"
    context.write_text(engine.tokenizer.decode(sample.context_ids), encoding="utf-8")
    query = ["--query", engine.tokenizer.decode(sample.query_ids)] if with_query else []
    out = subprocess.run([sys.executable, "-m", "ilre.cli", "compress", "--context-file", str(context), *query,
                          "--strategy", strategy, "--layer", "fast", "--budget", "1024", "--json"], capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["strategy"] == strategy and result["compressed_tokens"] == 1024 and result["dca"]
    assert result["kept_indices"] == sorted(set(result["kept_indices"]))
    passkey = engine.tokenizer.decode(sample.context_ids[sample.needle[0]:sample.needle[1]])
    print(f"\n{strategy}: {result['original_tokens']} tokens -> 1024, passkey {'kept' if passkey in result['compressed_context'] else 'lost'}"
          f", {result['timings_ms']['total'] / 1000:.1f} s")
    if not with_query:
        assert result["query"] == "" and len(result["token_ids"]) == 1024  # the kept context alone
