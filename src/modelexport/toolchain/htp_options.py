"""User-facing HTP knobs → ONNX Runtime QNN EP provider options (names checked in the EP library).

| knob                  | EP option                                   | values                          |
| --vtcm-mb / --vtcm-size | vtcm_mb                                   | whole MB, 1 .. the target's VTCM |
| --optimization-level  | htp_graph_finalization_optimization_mode    | 1, 2, 3 (3 = best, slowest)     |
| LLM host twins        | htp_graph_finalization_optimization_mode    | HOST_TWIN_OPTIMIZATION_LEVEL    |
| fp16 (float graphs)   | enable_htp_fp16_precision                   | 1                               |
| --perf-profile (run)  | htp_performance_mode                        | PERF_PROFILES                   |
| target                | soc_model                                   | targets.SoC.soc_model           |
"""
from __future__ import annotations

from ..core.arguments import size_in_bytes
from ..core.errors import InputError, TargetError, UnsupportedError
from ..core.targets import SoC, get_target

OPTIMIZATION_LEVELS = (1, 2, 3)
DEFAULT_OPTIMIZATION_LEVEL = 3
PERF_PROFILES = ("burst", "sustained_high_performance", "high_performance", "balanced", "low_balanced",
                 "high_power_saver", "power_saver", "low_power_saver", "extreme_power_saver", "default")


def check_knobs(socs: list[SoC], vtcm_mb: int | None, optimization_level: int) -> None:
    if optimization_level not in OPTIMIZATION_LEVELS:
        raise InputError(f"--optimization-level {optimization_level} is not one of 1, 2, 3",
                         "use 3 (default: slowest compile, fastest graph) or 1 for quick iterations")
    vtcm_whole_mb(vtcm_mb, socs)


def vtcm_whole_mb(vtcm: int | float | str | None, socs: list[SoC] | list[str]) -> int | None:
    """A VTCM size (--vtcm-mb: a bare number is MB; '512KB', '1048576B' with a unit) → the whole MB the
    QNN EP takes, checked against every target's VTCM. The EP's `vtcm_mb` is an integer it hands to
    QNN's graph config `vtcmSizeInMB`, so a size that is not a whole MB cannot be compiled here."""
    size = size_in_bytes("--vtcm-mb", vtcm, "MB")
    if size is None:
        return None
    shown = f"{size} bytes ({size / (1 << 20):g} MB)"
    for soc in (s if isinstance(s, SoC) else get_target(s) for s in socs):
        if size > soc.vtcm_bytes:
            raise TargetError(f"VTCM {shown} exceeds {soc.name}'s VTCM ({soc.vtcm_mb} MB)",
                              f"use at most {soc.vtcm_mb}MB ({soc.vtcm_bytes} bytes) for {soc.name}, or leave the VTCM size out")
    if size % (1 << 20):
        lower, upper = size >> 20, (size >> 20) + 1
        choices = " or ".join(f"{n}MB ({n << 20} bytes)" for n in (lower, upper) if n >= 1)
        raise UnsupportedError(f"VTCM {shown} is not a whole MB: ONNX Runtime's QNN EP passes VTCM to QNN in whole MB "
                               "(its vtcm_mb option, QNN's vtcmSizeInMB)", f"use {choices}, or leave the VTCM size out")
    return size >> 20


def compile_provider_options(soc: SoC, vtcm_mb: int | None, optimization_level: int) -> dict[str, str]:
    opts = {"soc_model": str(soc.soc_model),
            "htp_graph_finalization_optimization_mode": str(optimization_level),
            # float ops (all of an fp16 graph, any float islands of a QDQ graph) run in float16;
            # float32 on the HTP simulator fails with QNN_COMMON_ERROR_MEM_ALLOC.
            "enable_htp_fp16_precision": "1"}
    if vtcm_mb is not None:
        opts["vtcm_mb"] = str(vtcm_whole_mb(vtcm_mb, [soc]))
    return opts


# The LLM host twins run only on the x86 simulator (and Genie's build-time dialog there): they are
# finalized at the QNN EP's cheapest level ('1': "faster preparation time, less optimal graph" in
# ONNX Runtime's QNN EP documentation), while the device binaries keep the user's level (3 by default).
# The level changes how QNN schedules the graph, not the quantized arithmetic: SmolLM2's twins gave the
# same simulator logits at 1 and 3 (docs/llm_export.md, "Compile time").
HOST_TWIN_OPTIMIZATION_LEVEL = 1


def host_twin_provider_options(device_options: dict[str, str]) -> dict[str, str]:
    """The device binary's compile options with the cheapest graph finalization (host-only twins)."""
    return device_options | {"htp_graph_finalization_optimization_mode": str(HOST_TWIN_OPTIMIZATION_LEVEL)}


def run_provider_options(soc_model: int, perf_profile: str | None) -> dict[str, str]:
    opts = {"soc_model": str(soc_model)}
    if perf_profile:
        if perf_profile not in PERF_PROFILES:
            raise InputError(f"unknown --perf-profile {perf_profile!r}", f"choose one of: {', '.join(PERF_PROFILES)}")
        opts["htp_performance_mode"] = perf_profile
    return opts
