#!/usr/bin/env bash
# The whole H200 measurement of docs/benchmarks/h200.md in one detached run on the `device` machine.
#
#   scripts/h200_session.sh start     # unpack the carried wheels, launch every bench step detached (setsid)
#   scripts/h200_session.sh poll [S]  # wait up to S seconds (default 540) for the run, copy results to $OUT
#   scripts/h200_session.sh profile   # engine + repos, then scripts/profile_stub.py (py-spy wheel carried)
#
# Why detached: one device call may last 10 minutes, the measurement takes ~20, and a fresh machine
# would rebuild the 16 GB engine each time. The run keeps going on the warm machine between calls; each
# `poll` call copies what exists so far (results/*.json, the reports, the log tail) into $OUT.
#
# Carried (ignored folder, see the device README): $CARRY (default .p7/c1) holds tritonclient, pydantic and
# the tritonclient.http wheels, numpy-slim.zip (numpy 1.26 for the Python-backend stub), pytriton-slim.zip
# (the tritonserver binary + Python backend from nvidia-pytriton 0.7.0); $ASSETS/smollm2-tok the SmolLM2
# tokenizer (tokenizer.json xz-compressed). Machine facts: docs/benchmarks/h200.md "Environment traps".
set -u
W=${WORK:-/tmp/bench}
C=${CARRY:-.p7/c1}
A=${ASSETS:-.p7/assets}
STUB_PATH=/tmp/np:/tmp/site:/opt/torch/.venv/lib/python3.12/site-packages

setup() {
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site "$C"/*.whl || exit 1
  python3 -m zipfile -e "$C/numpy-slim.zip" /tmp/np
  python3 -m zipfile -e "$C/pytriton-slim.zip" /tmp/pytriton
  chmod -R +x /tmp/pytriton/pytriton/tritonserver/{bin,backends,python_backend_stubs}
  mkdir -p /tmp/tok /tmp/shim && cp -r "$A/smollm2-tok" /tmp/tok/
  python3 -c "import lzma,sys; open(sys.argv[2],'wb').write(lzma.open(sys.argv[1]).read())" \
    /tmp/tok/smollm2-tok/tokenizer.json.xz /tmp/tok/smollm2-tok/tokenizer.json
  # geventhttpclient imports brotli only to decode brotli bodies (never sent by tritonserver): a stand-in
  # saves its wheel. On the client's path only; ModelOpt's import chain breaks on it (h200.md).
  printf 'class error(Exception):\n    pass\n\ndef decompress(data):\n    raise error("brotli stand-in")\n' \
    > /tmp/shim/brotli.py
  cp -r . "$W.src" 2>/dev/null || true
}

bench() {  # bench TAG PHASES POINTS: one bench_h200.py invocation, its report kept under $W/out
  (cd "$W.src" && PYTHONPATH=/tmp/site:/tmp/shim TRTPIPE_TRITON_HOME=/tmp/pytriton/pytriton/tritonserver \
     TRTPIPE_STUB_BLOCK_MODULES=sklearn,scipy PYTHONUNBUFFERED=1 \
     python3 scripts/bench_h200.py --tokenizer /tmp/tok/smollm2-tok --work "$W" --out "$W/out" --tag "$1" \
       --phases "$2" --points "$3" --requests 2:1:128 --warmup 1 --python-path "$STUB_PATH" --phase-timeout 720)
}

run_all() {
  P="128/128:1,8,32,64,128;467/256:1,8,32,64,128"
  bench cb engine,repos,bandwidth,served "$P"
  bench inproc inproc "$P"
  bench static static "128/128:64;467/256:1,8,32,64,128"
  bench defaults defaults,inproc-defaults "128/128:32,128;467/256:32"
  echo "ALL DONE $(date -u +%FT%TZ)"
}

case "${1:-}" in
  start)
    mkdir -p "$W/out"
    setup > "$W/setup.log" 2>&1 || { tail -20 "$W/setup.log"; exit 1; }
    setsid nohup bash -c "$(declare -f bench run_all); W=$W STUB_PATH=$STUB_PATH; run_all" \
      > "$W/run.log" 2>&1 < /dev/null &
    sleep "${2:-60}"
    ;;
  profile)
    mkdir -p "$W/out" "$OUT"
    setup > "$W/setup.log" 2>&1 || { tail -20 "$W/setup.log"; exit 1; }
    bench prof engine,repos "128/128:1" > "$W/run.log" 2>&1
    (cd "$W.src" && PYTHONPATH=/tmp/site TRTPIPE_TRITON_HOME=/tmp/pytriton/pytriton/tritonserver \
       TRTPIPE_STUB_BLOCK_MODULES=sklearn,scipy PYTHONUNBUFFERED=1 python3 scripts/profile_stub.py \
       "$W/repo-cb" "$W/engine" --points "${POINTS:-128/128:1,32}" --seconds 10 --py-spy /tmp/site/bin/py-spy \
       --python-path "$STUB_PATH" --out "$OUT" ${PROFILE_ARGS:-}) >> "$W/run.log" 2>&1
    tail -c 20000 "$W/run.log" | grep -v "^[IW]1130"
    exit 0
    ;;
  poll)
    for _ in $(seq 1 $(( ${2:-540} / 10 ))); do
      grep -q "ALL DONE" "$W/run.log" 2>/dev/null && break
      sleep 10
    done
    ;;
  *) echo "usage: $0 start|poll [seconds]"; exit 2 ;;
esac
# what exists so far comes back (at most 8 files: the device tool's limit)
mkdir -p "$OUT"
tail -c 60000 "$W/run.log" > "$OUT/run.log" 2>/dev/null
(cd "$W" && tar czf "$OUT/results.tgz" results out 2>/dev/null)
grep -E "tok/s|phase|ALL DONE|Error|error" "$W/run.log" | tail -40
