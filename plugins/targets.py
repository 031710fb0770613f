"""GPU/CPU target profiles: ``configs/targets/*.yaml`` loaded into one registry.

Each profile gives what the planner and the rules need: compute capability, memory,
memory bandwidth, interconnect, GPUs per node, the runtimes that can run there,
and the dtype the portable runtime computes in. Sources are cited in each YAML file. What follows from
the compute capability (FP8 support) is derived from it, not stated again.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Literal, Optional

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from plugins.errors import Problem, SpecError, did_you_mean
from plugins.resolve import SM_FP8_MIN

TARGETS_DIR = Path(__file__).resolve().parents[1] / "configs" / "targets"
"""The profiles, package data: ``configs/targets`` of the checkout, or of site-packages in an installed copy."""


class TensorThroughput(BaseModel):
    """Dense tensor-core peak of one device by math precision, in TFLOPS (TOPS for int8), without sparsity (the
    datasheets' starred figures are 2:4 structured sparsity, twice these); null where the tensor cores lack it."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    fp16: float = Field(gt=0)
    """FP16 / BF16 inputs, FP32 accumulate: unquantized GEMMs and the weight-only INT4 recipes (dequantized to
    16-bit before the MMA)."""
    fp8: Optional[float] = Field(gt=0)
    """FP8 (E4M3) inputs: the fp8 and w4a8_awq recipes (SM >= 8.9)."""
    int8: Optional[float] = Field(gt=0)
    """INT8 inputs (TOPS): SmoothQuant (int8_sq)."""
    fp4: Optional[float] = Field(gt=0)
    """FP4 inputs: nvfp4 (SM >= 10.0)."""


class TargetProfile(BaseModel):
    """One hardware target."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)
    # Every field is required: a profile states its hardware in full (configs/targets/h100.yaml is a template).

    name: str
    """Profile name (file stem)."""
    kind: Literal["cpu", "gpu"]
    """cpu: no accelerator; gpu: an NVIDIA GPU."""
    device: Literal["cpu", "cuda"]
    """torch device the portable runtime uses."""
    compute_capability: Optional[tuple[int, int]] = None
    """CUDA compute capability (major, minor); null for CPU."""
    memory_gib: float = Field(gt=0)
    """Memory per device in GiB (GPU memory, or the host budget for cpu)."""
    memory_bandwidth_gbps: float = Field(gt=0)
    """Peak memory bandwidth per device in GB/s (datasheet)."""
    tensor_tflops: Optional[TensorThroughput]
    """Dense tensor-core peak per device by math precision (datasheet; the YAML names it); null for CPU. With
    memory_bandwidth_gbps it bounds the first-principles estimate of builders/roofline.py."""
    interconnect: str
    """GPU-to-GPU link (nvlink4, pcie4...)."""
    gpus_per_node: int = Field(ge=1)
    """Devices per node."""
    runtimes: tuple[str, ...]
    """Runtimes that can serve on this target."""
    runtime_dtype: Literal["float32", "float16", "bfloat16"]
    """dtype the portable pytorch runtime computes in."""
    aiconfigurator_system: Optional[str]
    """NVIDIA aiconfigurator's system name for this GPU (``aiconfigurator_core/systems/<name>.yaml``), whose
    measured-kernel database predicts the build's speed; null where it has none (the plan says so)."""

    @property
    def sm(self) -> Optional[int]:
        """Compute capability as an int (9.0 -> 90), None for CPU."""
        return None if self.compute_capability is None else self.compute_capability[0] * 10 + \
            self.compute_capability[1]

    @property
    def fp8(self) -> bool:
        """Whether the tensor cores support FP8: SM >= :data:`plugins.resolve.SM_FP8_MIN` (Ada 8.9, Hopper 9.0 and
        later; TensorRT-LLM's ``builder.py`` gates FP8 on ``get_sm_version() >= 89``, the rule the SM gates use)."""
        return self.sm is not None and self.sm >= SM_FP8_MIN


@lru_cache(maxsize=None)
def registry(directory: str = str(TARGETS_DIR)) -> dict[str, TargetProfile]:
    """All profiles in ``directory`` keyed by name."""
    out, problems = {}, []
    for path in sorted(Path(directory).glob("*.yaml")):
        try:
            data = yaml.safe_load(path.read_text()) or {}
            profile = TargetProfile.model_validate(data)
        except yaml.YAMLError as exc:
            problems.append(Problem(str(path), None, f"not valid YAML ({exc.__class__.__name__})",
                                    "fix the YAML syntax", code="target_yaml"))
            continue
        except ValidationError as exc:
            for err in exc.errors():
                field = ".".join(str(x) for x in err["loc"])
                problems.append(Problem(f"{path}: {field}", err.get("input") if err["type"] != "missing" else None,
                                        err["msg"], "every profile needs the fields of TargetProfile "
                                        "(plugins/targets.py); copy configs/targets/h100.yaml and edit it",
                                        code=f"target_{err['type']}"))
            continue
        if profile.name != path.stem:
            problems.append(Problem(f"{path}: name", profile.name, f"must equal the file name {path.stem!r}",
                                    f"set name: {path.stem}", code="target_name"))
            continue
        out[profile.name] = profile
    if problems:
        raise SpecError(problems, str(directory), what="the target profiles")
    return out


def get_target(name: str) -> TargetProfile:
    """Return the profile ``name`` or raise SpecError listing the known ones."""
    reg = registry()
    if name not in reg:
        raise SpecError([Problem("target", name, "no such target profile in configs/targets/",
                                 f"use one of {sorted(reg)}.{did_you_mean(name, reg)}", code="unknown_target")])
    return reg[name]
