#!/bin/bash
# The staged CPU run behind docs/results.md, in the order it was run: each stage appends to
# results/eval/raw.jsonl (a rerun skips what is there) and rewrites docs/results.md; the page states the
# widest cap any stage ran with. `make eval` runs the whole FULL_PLAN instead.
set -ex
ILRE=".venv/bin/ilre eval"
T4=niah_single_1,niah_single_2,niah_single_3,niah_multikey_1
# 1. the four target tasks, 4K-32K, every strategy but LLMLingua, with end to end
$ILRE --tasks $T4 --lengths 4K,8K,16K,32K --samples 1 --strategies full,ilre,ilre_nodca,snapkv,streaming_llm,rag --full-max-length 4096 --max-new-tokens 32
# 2. the target tasks at 64K and 128K, retention only
$ILRE --tasks $T4 --lengths 64K,128K --samples 1 --strategies ilre,snapkv,streaming_llm,rag --no-e2e
# 3. the other seven tasks, 4K-32K, retention only
$ILRE --tasks niah_multikey_2,niah_multikey_3,niah_multivalue,niah_multiquery,vt,cwe,fwe --lengths 4K,8K,16K,32K --samples 1 --strategies ilre,snapkv,streaming_llm,rag --no-e2e
# 4. LLMLingua and LongLLMLingua (in .venv-lingua, `make lingua`) on the target tasks at 4K and 16K
$ILRE --tasks $T4 --lengths 4K --samples 1 --strategies llmlingua,longllmlingua --max-new-tokens 32 --lingua-max-length 8192
$ILRE --tasks $T4 --lengths 16K --samples 1 --strategies llmlingua,longllmlingua --max-new-tokens 32 --lingua-max-length 16384
# 5. full context beyond 4K (8K native, 16K beyond the window), end to end
$ILRE --tasks $T4 --lengths 8K,16K --samples 1 --strategies full --full-max-length 16384 --max-new-tokens 32
# 6. a second sample of stage 1
$ILRE --tasks $T4 --lengths 4K,8K,16K,32K --samples 2 --strategies full,ilre,ilre_nodca,snapkv,streaming_llm,rag --full-max-length 4096 --max-new-tokens 32
# 7. LongLLMLingua (the query-aware one) at 32K
$ILRE --tasks $T4 --lengths 32K --samples 1 --strategies longllmlingua --max-new-tokens 32 --lingua-max-length 32768
# 8. a second sample of the other seven tasks where the peers are compared (16K, 32K)
$ILRE --tasks niah_multikey_2,niah_multikey_3,niah_multivalue,niah_multiquery,vt,cwe,fwe --lengths 16K,32K --samples 2 --strategies ilre,snapkv,streaming_llm,rag --no-e2e
# 9. LagKV and ReAttention beside ILRe, SnapKV, StreamingLLM and RAG: all 11 tasks, 4K-32K, 3 samples per
#    cell, retention only, bfloat16 (the default since the speed work: ILRe's and SnapKV's float32 records of
#    samples 0-1 are measured again; the page keeps each cell's latest record)
$ILRE --tasks $T4,niah_multikey_2,niah_multikey_3,niah_multivalue,niah_multiquery,vt,cwe,fwe --lengths 4K,8K,16K,32K --samples 3 --strategies ilre,snapkv,lagkv,reattention,streaming_llm,rag --no-e2e
# 10. the same strategies on the target tasks at 64K and 128K, retention only
$ILRE --tasks $T4 --lengths 64K,128K --samples 1 --strategies ilre,snapkv,lagkv,reattention,streaming_llm,rag --no-e2e
# 11. end to end on the target tasks, 4K-32K, 3 samples per cell, for the strategies of stages 9-10 (their bfloat16
#     records of stage 9 were retention only; a rerun measures again what a record lacks)
$ILRE --tasks $T4 --lengths 4K,8K,16K,32K --samples 3 --strategies ilre,snapkv,lagkv,reattention,streaming_llm,rag --max-new-tokens 32
# 12. Locret (the shipped retaining head) and ActQKV (fixed and automatic budget): all 11 tasks, 4K-32K, 3 samples
#     per cell, retention only; then end to end on the target tasks; then the target tasks at 64K and 128K
$ILRE --tasks $T4,niah_multikey_2,niah_multikey_3,niah_multivalue,niah_multiquery,vt,cwe,fwe --lengths 4K,8K,16K,32K --samples 3 --strategies locret,actqkv,actqkv_auto --no-e2e
$ILRE --tasks $T4 --lengths 4K,8K,16K,32K --samples 3 --strategies locret,actqkv,actqkv_auto --max-new-tokens 32
$ILRE --tasks $T4 --lengths 64K,128K --samples 1 --strategies locret,actqkv,actqkv_auto --no-e2e
# 13. fixed budgets beside ActQKV's automatic one, on the same samples (ILRe and ActQKV at 512 and 256)
$ILRE --tasks $T4,niah_multikey_2,niah_multikey_3,niah_multivalue,niah_multiquery,vt,cwe,fwe --lengths 4K,8K,16K,32K --samples 3 --strategies ilre,actqkv --budget 512 --no-e2e
$ILRE --tasks $T4,niah_multikey_2,niah_multikey_3,niah_multivalue,niah_multiquery,vt,cwe,fwe --lengths 4K,8K,16K,32K --samples 3 --strategies ilre,actqkv --budget 256 --no-e2e
# Stages 14-17 ran partly on a CPU with native bfloat16 (the compressors in bfloat16) and partly on one without
# (float32, where bfloat16 is emulated): --any-dtype keeps the other dtype's records instead of measuring them again.
ILRE="$ILRE --any-dtype"
# 14. the >= 10-sample run: every strategy that reads the model, StreamingLLM and RAG on all 11 tasks plus
#     niah_paraphrase at 4K, 16K and 32K, 10 samples per cell (samples 0-2 are those of stages 9-13), retention only
ALL=$T4,niah_multikey_2,niah_multikey_3,niah_multivalue,niah_multiquery,vt,cwe,fwe,niah_paraphrase
S14=ilre,snapkv,lagkv,reattention,locret,actqkv,actqkv_auto,streaming_llm,rag
$ILRE --tasks $ALL --lengths 4K,16K,32K --samples 10 --strategies $S14 --no-e2e
# 15. the target tasks at 64K and 128K, 5 samples per cell
$ILRE --tasks $T4 --lengths 64K,128K --samples 5 --strategies $S14 --no-e2e
# 15b. ILRe scoring with layer 8's attention beside l_R's (ilre_fast_too) on stage 14's samples, to keep or drop it
$ILRE --tasks $ALL --lengths 4K,16K,32K --samples 10 --strategies ilre_fast_too --no-e2e
# 16. end to end on the target tasks at the new l_R (ILRe; the 4K full-context records are layer-free), and ILRe
#     without DCA beside it
$ILRE --tasks $T4 --lengths 4K,8K,16K,32K --samples 3 --strategies ilre --max-new-tokens 32
$ILRE --tasks $T4 --lengths 4K --samples 3 --strategies full --max-new-tokens 32   # the reference on the same 3 samples
$ILRE --tasks $T4 --lengths 16K,32K --samples 2 --strategies ilre_nodca --no-e2e
# 16b. the no-shared-words group at 8K too (10 samples), so its comparison with RAG has samples at every length
#      stage 14 skipped
$ILRE --tasks vt,niah_paraphrase --lengths 8K --samples 10 --strategies ilre,ilre_fast_too,locret,rag --no-e2e
# 17. LongLLMLingua (bfloat16, like the compressors) on every task at 16K and 32K, 5 samples per cell
$ILRE --tasks $ALL --lengths 16K,32K --samples 5 --strategies longllmlingua --no-e2e --lingua-max-length 32768
# 18. `also_weight`: layer 8's attention at half weight beside l_R's, on stage 14's samples (to keep or drop it),
#     and on stage 16b's no-shared-words samples at 8K
$ILRE --tasks $ALL --lengths 4K,16K,32K --samples 10 --strategies ilre_fast_half --no-e2e
$ILRE --tasks vt,niah_paraphrase --lengths 8K --samples 10 --strategies ilre_fast_half --no-e2e
# 19. the cascade (the new default: layer 8 picks 4x the budget as candidates, l_R = 19 ranks them, layer 8 at
#     half weight beside it) on stage 14's and 15's samples, paired against ILRe at l_R
$ILRE --tasks $ALL --lengths 4K,16K,32K --samples 10 --strategies cascade --no-e2e
$ILRE --tasks $T4 --lengths 64K,128K --samples 5 --strategies cascade --no-e2e
#     and passkeys in Python's reference documentation (a corpus no other stage uses): the default, ILRe at 8 and 19
.venv/bin/python -m ilre.evaluation.report.other_corpus --lengths 16K,32K --depths 8
# 20. whole units (granularity "unit", compressor/units.py) against today's token selection and RAG:
#     end to end on the target tasks at 4K-32K, 24 samples per length (6 per task), generation capped at 32 tokens
$ILRE --tasks $T4 --lengths 4K,8K,16K,32K --samples 6 --strategies cascade,cascade_units,rag --max-new-tokens 32
#     twice the pairs at 16K and 32K (48 per length), where units must lead tokens with an interval above zero
$ILRE --tasks $T4 --lengths 16K,32K --samples 12 --strategies cascade,cascade_units,rag --max-new-tokens 32
#     the same units with a line break between kept units that are not adjacent (the reader's prompt only)
$ILRE --tasks $T4 --lengths 4K,8K,16K,32K --samples 6 --strategies cascade_units_nl --max-new-tokens 32
#     retention on every task, the structured ones included, at 4K-32K (10 samples per cell), then 64K and 128K (5)
NEW=records_jsonl,records_json,records_csv,code_python,logs,markdown_table
$ILRE --tasks $ALL,$NEW --lengths 4K,16K,32K --samples 10 --strategies cascade,cascade_units,rag --no-e2e
$ILRE --tasks $T4,$NEW --lengths 64K,128K --samples 5 --strategies cascade,cascade_units,rag --no-e2e
#     the record rule (compressor/units.py: a bracket group of up to 192 tokens is one unit), chosen on the
#     service's own path among record caps 128, 160 and 256 (10 samples per cell), then the unit rows of the three
#     tasks whose units it changes dropped from raw.jsonl and the two lines above run again
.venv/bin/python -m ilre.evaluation.running.record_caps --tasks records_json,records_jsonl --lengths 4K,16K,32K --samples 10
#     and on real files the suite does not generate (a PyPI package table, Debian's package log): token against unit
#     (and LiteLLM's model price table, JSON records often over 192 tokens, once `make litellm` has built its environment)
.venv/bin/python -m ilre.evaluation.report.real_files --lengths 16K,32K --samples 10
#     the record cap checked on the real price table's records
.venv/bin/python -m ilre.evaluation.running.record_caps --tasks litellm_prices --lengths 16K,32K --samples 10 --caps 192,384,512 --output results/eval/record_caps_real.jsonl
# 21. table headers (compressor/table_headers.py): a kept table row brings its header, and a table row up to
#     the record cap is one unit. Only the two table tasks have tables (their units change; every other
#     task's are as before), so their cascade and cascade_units records were removed and measured again.
$ILRE --tasks records_csv,markdown_table --lengths 4K,16K,32K --samples 10 --strategies cascade,cascade_units --no-e2e
$ILRE --tasks records_csv,markdown_table --lengths 64K,128K --samples 5 --strategies cascade,cascade_units --no-e2e
#     and at half the budget (512), where a row's header is less often kept by the token selection alone
$ILRE --tasks records_csv,markdown_table --lengths 16K,32K --samples 10 --strategies cascade,cascade_units --no-e2e --budget 512
# 22. the cascade's fallback (`deepen_below`, the profile's 0.6): when l_R's peak strength over the candidates
#     is below it, the whole context runs to l_R. Where it is not taken nothing changes; 4K contexts are ILRe at
#     l_R already. So the default's records were removed and measured again where a sample of three per cell
#     (16K and 32K) saw it taken: the paraphrased needles, and the tasks below.
$ILRE --tasks niah_paraphrase --lengths 16K,32K --samples 10 --strategies cascade,cascade_units --no-e2e
$ILRE --tasks fwe,niah_multivalue,cwe,niah_multikey_2,logs,code_python,records_jsonl,records_json,records_csv --lengths 16K --samples 10 --strategies cascade,cascade_units --no-e2e
$ILRE --tasks fwe,niah_multivalue,cwe,niah_multikey_2,logs,code_python,records_jsonl,records_json,records_csv --lengths 32K --samples 10 --strategies cascade,cascade_units --no-e2e
# 23. where the default falls back: every cascade record now carries the peak strength it measured and whether
#     it fell back, and `cascade_candidates` (the default with `deepen_below` 0) the candidates alone; the
#     page's fallback section replays the threshold with it (evaluation/report/fallback.py). The default's
#     records at 64K and 128K (made before stage 22) were removed and measured again.
$ILRE --tasks $T4,$NEW --lengths 64K --samples 5 --strategies cascade,cascade_units,cascade_candidates --no-e2e
$ILRE --tasks $T4,$NEW --lengths 128K --samples 5 --strategies cascade,cascade_units,cascade_candidates --no-e2e
$ILRE --tasks $ALL --lengths 16K,32K --samples 10 --strategies cascade_candidates --no-e2e
$ILRE --tasks $NEW --lengths 16K,32K --samples 10 --strategies cascade_candidates --no-e2e
# 24. the real files measured again with the default's fallback (each record now says whether it fell back, and
#     the compressor's dtype); stages 20-21's records moved to real_files_stage20.jsonl, which the page shows for
#     the cells not yet measured again. The cascade_units records whose time lacks the fallback's pass (stages
#     22-23, measured before the eval charged it to every row) are marked in raw.jsonl (`timing`), not measured again.
.venv/bin/python -m ilre.evaluation.report.real_files --lengths 16K,32K --samples 10
# 26. a second model: Gemma 3 270M's default (plain ILRe at l_R 6: its profile has no cascade) in its own folder,
#     on the needle, record and mixed-content tasks, and SmolLM2's default at 128K on the same tasks (samples 0-4
#     of the tasks stage 23 ran are its records, made with the fallback on; the rest with the current default),
#     the mixed-content tasks at 128K too.
#     The page sets Gemma beside SmolLM2 (`--beside`, evaluation/report/models.py).
GEMMA="--model gemma-3-270m --strategies cascade --no-e2e --budget 1024 --results-dir results/eval-gemma"
$ILRE $GEMMA --samples 10 --lengths 4K,16K,32K,128K --tasks niah_single_3,niah_multikey_1,niah_multikey_2,niah_multikey_3,niah_paraphrase,records_json,records_jsonl,logs
$ILRE $GEMMA --samples 10 --lengths 4K,16K,32K,128K --tasks code_python,records_csv,markdown_table
$ILRE --strategies cascade --no-e2e --samples 10 --lengths 128K --tasks niah_single_3,niah_multikey_1,niah_multikey_2,niah_multikey_3,niah_paraphrase,records_json,records_jsonl,logs,code_python,records_csv,markdown_table
$ILRE --report-only --beside results/eval-gemma
