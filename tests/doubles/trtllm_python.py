#!/usr/bin/env python3
"""Test double for an interpreter with TensorRT-LLM 1.2.1 running builders/prequant_trtllm.py's conversion program.

Invoked as ``trtllm_python.py PROGRAM SPEC.json HF_DIR OUT_DIR`` (how builders.prequant_trtllm.convert runs the
program). It does not run PROGRAM (it imports tensorrt_llm); it checks what the program would hand TensorRT-LLM
against tests/facts/trtllm_1_2_1/prequantized.json (the model class is one whose from_hugging_face takes AutoAWQ/
AutoGPTQ folders, the QuantConfig is what upstream's update_quant_config_from_hf sets for the folder's
quantization_config, use_autoawq exactly for AutoAWQ) and that the program text calls the recorded API, then writes
what save_checkpoint writes: config.json (``quantization``, ``mapping``) and one ``rank{r}.safetensors`` per rank.
Exit 1 with a message on any disagreement, like a failed conversion.
"""

import json
import sys
from pathlib import Path

FACTS = Path(__file__).resolve().parents[1] / "facts" / "trtllm_1_2_1" / "prequantized.json"


def main() -> int:
    program, spec_path, hf_dir, out_dir = sys.argv[1:5]
    route = json.loads(FACTS.read_text())["engine_path"]["hf_quantization_config_route"]
    text = Path(program).read_text()
    for call in ("from_hugging_face(", "save_checkpoint(", "save_config=(rank == 0)", "Mapping(", "QuantConfig("):
        if call not in text or call.split("(")[0] not in json.dumps(route):
            print(f"error: the program does not call {call} as recorded", file=sys.stderr)
            return 1
    spec = json.loads(Path(spec_path).read_text())
    qc = json.loads((Path(hf_dir) / "config.json").read_text())["quantization_config"]
    if spec["model_class"] not in route["families"]:
        print(f"error: {spec['model_class']} is not a recorded family", file=sys.stderr)
        return 1
    method = qc["quant_method"]
    want_kwargs = {"use_autoawq": True} if method == "awq" else {}
    want_zero = qc.get("zero_point", False) if method == "awq" else True
    q = spec["quant_config"]
    if (q["quant_algo"], q["group_size"], q["has_zero_point"], spec["kwargs"]) != (
            "W4A16_GPTQ", qc.get("group_size", 128), want_zero, want_kwargs):
        print(f"error: quant_config {q} kwargs {spec['kwargs']} differ from upstream's for {qc}", file=sys.stderr)
        return 1
    if method == "gptq" and qc.get("desc_act"):
        print("ValueError: GPTQ with desc_act=True is not implemented!", file=sys.stderr)
        return 1
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    world = spec["tp_size"] * spec["pp_size"]
    hf = json.loads((Path(hf_dir) / "config.json").read_text())
    cfg = {"architecture": hf["architectures"][0], "dtype": spec["dtype"],
           "num_hidden_layers": hf["num_hidden_layers"], "num_attention_heads": hf["num_attention_heads"],
           "num_key_value_heads": hf.get("num_key_value_heads"), "hidden_size": hf["hidden_size"],
           "vocab_size": hf["vocab_size"],
           "quantization": {"quant_algo": q["quant_algo"], "group_size": q["group_size"],
                            "has_zero_point": q["has_zero_point"], "pre_quant_scale": q["pre_quant_scale"]},
           "mapping": {"world_size": world, "tp_size": spec["tp_size"], "pp_size": spec["pp_size"]}}
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    for r in range(world):
        (out / f"rank{r}.safetensors").write_bytes(b"converted rank " + str(r).encode())
        print(f"rank {r} of {world} converted", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
