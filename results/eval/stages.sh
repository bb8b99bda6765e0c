#!/bin/bash
# The staged CPU run behind docs/results.md: each stage appends to results/eval/raw.jsonl (a rerun
# skips what is there) and rewrites docs/results.md. `make eval` runs the whole FULL_PLAN instead.
set -x
ILRE=".venv/bin/ilre eval"
T4=niah_single_1,niah_single_2,niah_single_3,niah_multikey_1
$ILRE --tasks $T4 --lengths 4K,8K,16K,32K --samples 1 --strategies full,ilre,ilre_nodca,snapkv,streaming_llm,rag --full-max-length 4096 --max-new-tokens 32
$ILRE --tasks niah_multikey_2,niah_multikey_3,niah_multivalue,niah_multiquery,vt,cwe,fwe --lengths 4K,8K,16K,32K --samples 1 --strategies ilre,snapkv,streaming_llm,rag --no-e2e
$ILRE --tasks niah_single_1,niah_single_2 --lengths 4K --samples 1 --strategies llmlingua,longllmlingua --max-new-tokens 32 --lingua-max-length 8192
$ILRE --tasks $T4 --lengths 64K,128K --samples 1 --strategies ilre,snapkv,streaming_llm,rag --no-e2e
$ILRE --tasks $T4 --lengths 8K,16K --samples 1 --strategies full --full-max-length 16384 --max-new-tokens 32
$ILRE --tasks niah_single_3,niah_multikey_1 --lengths 4K --samples 1 --strategies llmlingua,longllmlingua --max-new-tokens 32 --lingua-max-length 8192
$ILRE --tasks $T4 --lengths 4K,8K,16K,32K --samples 2 --strategies full,ilre,ilre_nodca,snapkv,streaming_llm,rag --full-max-length 4096 --max-new-tokens 32
