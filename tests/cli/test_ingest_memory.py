"""Bounded-memory ingest: `ilre compress --context-file` of a long document, in its own process,
needs beyond the loaded engine about the layer-l_R key cache (twice: DCA's moved copy that a query
reads beside it), the IDs and the text plus one chunk's working set, never anything of the order of
the context times the hidden size.

It runs bfloat16 on every CPU (emulated, and slower, where the CPU has none): the point is a ratio of
sizes, and in float32 the layer-l_R keys (3 kv heads x 64), DCA's copy and what else grows with the
context weigh as much as one float32 hidden state (576), which the bound could then not tell apart
(measured on a CPU without native bfloat16, at l_R = 2: 243 MiB beyond the engine at 64K tokens, 393 at
130K, 2.4 KB a token against a hidden state's 2.3). At l_R = 1: the bound is the same at any l_R, and
the emulated bfloat16 is paid for one layer."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ilre.evaluation.tasks.haystack import shakespeare_text

PROBE = Path(__file__).resolve().parents[2] / "bench" / "rss_probe.py"  # peak RSS beyond the loaded engine
LONG_CHARS = 400_000  # about 130K tokens of Shakespeare


def compress_file(path, layer: int) -> tuple[dict, float]:
    out = subprocess.run([sys.executable, str(PROBE), "compress", "--context-file", str(path), "--query",
                          " Who is the king? Answer:", "--budget", "256", "--layer", str(layer), "--json",
                          "--dtype", "bfloat16", "--device", "cpu"], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    memory = json.loads(out.stderr.splitlines()[-1])
    return json.loads(out.stdout.splitlines()[-1]), memory["peak_mib"] - memory["loaded_mib"]


@pytest.mark.slow
def test_peak_memory_beyond_the_engine_is_the_key_cache(tmp_path):
    short, long = tmp_path / "short.txt", tmp_path / "long.txt"
    text = shakespeare_text()
    short.write_text(text[:6_000], encoding="utf-8")
    long.write_text(text[:LONG_CHARS], encoding="utf-8")
    base_result, base_beyond = compress_file(short, layer=1)  # l_R = 1: the same bound, one emulated layer
    result, beyond = compress_file(long, layer=1)
    tokens = result["original_tokens"]
    assert tokens > 100_000 and result["compressed_tokens"] == 256 and base_result["original_tokens"] < 3000
    keys_mib = tokens * 3 * 64 * 2 / 2**20      # layer-l_R keys: kv heads x head dim x bfloat16
    # the query reads them where they are: DCA's moves (eq. 7) move the query instead (kernels/rope.MovedKeys; a
    # moved copy beside them was 161 MiB at the peak against 143 without, at this length)
    read_keys_mib = keys_mib
    ids_and_text_mib = (tokens * 8 + LONG_CHARS * 2) / 2**20
    hidden_mib = tokens * 576 * 4 / 2**20       # one float32 hidden state of the whole context: must never exist
    print(f"\n{tokens} tokens: {beyond:.0f} MiB beyond the loaded engine ({base_beyond:.0f} MiB for "
          f"{base_result['original_tokens']} tokens); keys {keys_mib:.0f} MiB, ids+text {ids_and_text_mib:.0f} MiB, "
          f"a whole hidden state would be {hidden_mib:.0f} MiB")
    working_set_mib = 128  # one prefill chunk, one 256K-character tokenizer piece, the scoring blocks: fixed sizes
    assert keys_mib <= beyond < read_keys_mib + ids_and_text_mib + working_set_mib < hidden_mib
