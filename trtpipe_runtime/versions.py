"""TensorRT-LLM releases: the one version parser, and which LLM-API options file an installed release reads.

The repository's ``tensorrt_llm/1/`` holds ``llm_api_options.yaml`` (the oldest supported release's spelling)
and ``llm_api_options-<release>.yaml`` for each later release that spells an option differently
(``builders.llmapi_options.options_files``). The Triton model and ``trtpipe serve --server trtllm-serve`` choose with
:func:`options_file`; the deployment's ``trtllm-serve.sh`` carries this file's text and runs :func:`main`, so it
chooses the same way before anything of the project is importable.
"""

from __future__ import annotations

import os
import re
import sys

OPTIONS_FILE = "llm_api_options.yaml"
"""The options file of the oldest supported release."""


def release(text: str) -> tuple[int, int, int]:
    """(major, minor, patch) of a version string, release numbers only: ``"1.3.0rc5"`` -> (1, 3, 0),
    ``"1.4"`` -> (1, 4, 0). Missing parts are 0; a string with no digits is (0, 0, 0)."""
    parts = [int(x) for x in re.findall(r"\d+", str(text))[:3]]
    return tuple(parts + [0] * (3 - len(parts)))  # type: ignore[return-value]


_LATER_PREFIX = "llm_api_options-"


def options_file_name(version: str) -> str:
    """``llm_api_options-<version>.yaml``: the file a later release's options are written to."""
    return f"{_LATER_PREFIX}{version}.yaml"


def newest_not_after(installed: str | None, by_release: dict[str, str], default: str) -> str:
    """The value of ``by_release`` (release -> options file) whose release's major.minor is the newest not newer
    than ``installed``'s; ``default`` when none is, or ``installed`` is None (unknown)."""
    if installed is None:
        return default
    have = release(installed)[:2]
    fits = [(release(r)[:2], path) for r, path in by_release.items() if release(r)[:2] <= have]
    return max(fits)[1] if fits else default


def options_file(folder: str, installed: str | None) -> str:
    """The options file of ``folder`` for TensorRT-LLM ``installed`` (:func:`newest_not_after` over its
    ``llm_api_options-<release>.yaml`` files; ``llm_api_options.yaml`` otherwise)."""
    names = sorted(os.listdir(folder)) if os.path.isdir(folder) else []
    later = {n[len(_LATER_PREFIX):-len(".yaml")]: os.path.join(folder, n) for n in names
             if n.startswith(_LATER_PREFIX) and n.endswith(".yaml")}
    return newest_not_after(installed, later, os.path.join(folder, OPTIONS_FILE))


def main(argv: list[str]) -> int:
    """``python3 versions.py MINIMUM DEFAULT HINT [RELEASE=FILE ...]`` (trtllm-serve.sh runs this file's text): exit 1
    with the reason and HINT when the importable tensorrt_llm is older than MINIMUM or absent, else print the
    options file it reads (:func:`newest_not_after`). TRTPIPE_SKIP_VERSION_CHECK set: no check (DEFAULT where
    none imports)."""
    minimum, default, hint, *pairs = argv
    by_release = dict(p.split("=", 1) for p in pairs)
    skip = bool(os.environ.get("TRTPIPE_SKIP_VERSION_CHECK"))
    try:
        import tensorrt_llm
    except ImportError as exc:
        if skip:
            print(default)
            return 0
        print(f"tensorrt_llm does not import here ({exc}): {hint}", file=sys.stderr)
        return 1
    found = tensorrt_llm.__version__
    if release(found) < release(minimum) and not skip:
        print(f"TensorRT-LLM {found} is older than {minimum}, the first release this build's LLM-API options are "
              f"checked against: {hint}", file=sys.stderr)
        return 1
    print(newest_not_after(found, by_release, default))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
