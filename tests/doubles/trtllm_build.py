#!/usr/bin/env python3
"""Test double for TensorRT-LLM 1.2.1's ``trtllm-build``.

It accepts exactly the flags (names, aliases, value sets, case rules) that ``trtllm-build`` 1.2 accepts
and rejects anything else with argparse's usage error (exit 2), like the real one. The parser is built
from tests/facts/trtllm_1_2_1/trtllm_build.json, the facts recorded from TensorRT-LLM's
``tensorrt_llm/commands/build.py`` (parse_arguments) and ``tensorrt_llm/plugin/plugin.py``
(cli_plugin_args) with their commits, so the double and the facts cannot drift apart. Values the real
tool converts before checking (``--kv_cache_type`` through ``KVCacheType.from_string``, which
upper-cases) are accepted in any case, as there.

Then it writes a fake engine folder (config.json with ``build_config`` and ``pretrained_config``,
one ``rank{r}.engine`` per rank of the checkpoint's mapping) so the output check can run.
Environment knobs for tests: TRTPIPE_DOUBLE_SLEEP (seconds to sleep mid-build, printing
progress), TRTPIPE_DOUBLE_MISMATCH=1 (write a max_batch_size different from the request),
TRTPIPE_DOUBLE_SKIP_RANK=1 (leave out the last rank file), TRTPIPE_DOUBLE_ARGV (file that
receives the argv as JSON).
"""

import argparse
import json
import os
import sys
import time
from pathlib import Path

FACTS = Path(__file__).resolve().parents[1] / "facts" / "trtllm_1_2_1" / "trtllm_build.json"


def _choice(choices, case_insensitive):
    """argparse type for a value set; case-insensitive ones are compared upper-cased, as from_string does."""
    allowed = {str(c).upper() if case_insensitive else str(c): str(c) for c in choices}

    def convert(value):
        key = value.upper() if case_insensitive else value
        if key not in allowed:
            raise argparse.ArgumentTypeError(f"invalid choice: {value!r} (choose from {', '.join(map(str, choices))})")
        return allowed[key]
    return convert


def parser() -> argparse.ArgumentParser:
    facts = json.loads(FACTS.read_text())
    p = argparse.ArgumentParser(prog="trtllm-build")
    for flag, f in {**facts["flags"], **facts["plugin_flags"]}.items():
        names = [flag, *f.get("aliases", [])]
        kw = {"dest": f["dest"]} if f.get("dest") else {}
        if f.get("nargs"):
            kw["nargs"] = f["nargs"]
        if f["type"] == "store_true":
            p.add_argument(*names, action="store_true", **kw)
        elif f["type"] == "int":
            p.add_argument(*names, type=int, **kw)
        elif f["type"] == "choice":
            p.add_argument(*names, type=_choice(f["choices"], f.get("case_insensitive")), **kw)
        else:
            p.add_argument(*names, type=str, **kw)
    return p


VERSIONS = {"tensorrt-llm": "1.2.1", "tensorrt": "10.14.1.48"}
"""What the double stands in for: TensorRT-LLM 1.2.1 with the TensorRT of the NGC 26.07 container."""


def toolchain():
    """The double as a ``builders.engine_trtllm.Toolchain``, for ``run_build(..., toolchain=...)``."""
    from builders.engine_trtllm import Toolchain

    return Toolchain((sys.executable, str(Path(__file__).resolve())), dict(VERSIONS))


def main() -> int:
    args = parser().parse_args()
    if os.environ.get("TRTPIPE_DOUBLE_ARGV"):
        Path(os.environ["TRTPIPE_DOUBLE_ARGV"]).write_text(json.dumps(sys.argv))
    if args.checkpoint_dir is None:
        print("error: --checkpoint_dir is required here", file=sys.stderr)
        return 2
    ckpt = json.loads((Path(args.checkpoint_dir) / "config.json").read_text())
    world = ckpt.get("mapping", {}).get("world_size", 1)
    print("[TRT-LLM] [I] Set dtype to %s." % ckpt.get("dtype"), flush=True)
    delay = float(os.environ.get("TRTPIPE_DOUBLE_SLEEP", "0"))
    out = Path(args.output_dir or "engine_outputs")  # the real default
    out.mkdir(parents=True, exist_ok=True)
    for r in range(world):
        print(f"[TRT-LLM] [I] building rank {r}", flush=True)
        time.sleep(delay)
        if os.environ.get("TRTPIPE_DOUBLE_SKIP_RANK") and r == world - 1:
            continue
        (out / f"rank{r}.engine").write_bytes(b"fake engine " + bytes(str(r), "ascii"))
    mbs = args.max_batch_size + (1 if os.environ.get("TRTPIPE_DOUBLE_MISMATCH") else 0)
    if args.logits_dtype:  # build.py sets the model config's logits_dtype from the flag
        ckpt = {**ckpt, "logits_dtype": args.logits_dtype}
    cfg = {"version": "1.2.1", "pretrained_config": ckpt,
           "build_config": {"max_batch_size": mbs, "max_input_len": args.max_input_len,
                            "max_seq_len": args.max_seq_len, "max_num_tokens": args.max_num_tokens,
                            "max_beam_width": args.max_beam_width,
                            "gather_context_logits": bool(args.gather_context_logits or args.gather_all_token_logits),
                            "plugin_config": {"tokens_per_block": args.tokens_per_block}}}
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    if args.output_timing_cache:
        Path(args.output_timing_cache).write_bytes(b"timing cache")
    print("[TRT-LLM] [I] Total time of building all engines: 00:00:00", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
