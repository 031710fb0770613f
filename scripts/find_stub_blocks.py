# Which venv packages break under numpy<2 when importing the runtime's model class: block them.
import os, re, subprocess, sys
pp = sys.argv[1]
blocked = ["sklearn"]
for _ in range(8):
    code = ("import sys\nfor n in %r: sys.modules[n]=None\n" % blocked) + \
        "import numpy\nimport transformers.models.llama.modeling_llama as m\nfrom transformers import LlamaForCausalLM, AutoTokenizer, GenerationConfig\nprint('IMPORT_OK')"
    r = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": pp}, capture_output=True, text=True)
    out = r.stdout + r.stderr
    if "IMPORT_OK" in out:
        break
    pkgs = re.findall(r"site-packages/([A-Za-z0-9_]+)/", out)
    pkgs = [p for p in pkgs if p not in ("transformers", "torch", "numpy", "importlib") and p not in blocked]
    print(out[-1500:], file=sys.stderr)
    if not pkgs:
        break
    blocked.append(pkgs[-1])
print(",".join(blocked))
