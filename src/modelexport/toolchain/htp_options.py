"""User-facing HTP knobs → ONNX Runtime QNN EP provider options (names checked in the EP library).

| knob                  | EP option                                   | values                          |
| --vtcm-mb             | vtcm_mb                                     | 1 .. the target's VTCM size     |
| --optimization-level  | htp_graph_finalization_optimization_mode    | 1, 2, 3 (3 = best, slowest)     |
| fp16 (float graphs)   | enable_htp_fp16_precision                   | 1                               |
| --perf-profile (run)  | htp_performance_mode                        | PERF_PROFILES                   |
| target                | soc_model                                   | targets.SoC.soc_model           |
"""
from __future__ import annotations

from ..core.errors import InputError, TargetError
from ..core.targets import SoC

OPTIMIZATION_LEVELS = (1, 2, 3)
DEFAULT_OPTIMIZATION_LEVEL = 3
PERF_PROFILES = ("burst", "sustained_high_performance", "high_performance", "balanced", "low_balanced",
                 "high_power_saver", "power_saver", "low_power_saver", "extreme_power_saver", "default")


def check_knobs(socs: list[SoC], vtcm_mb: int | None, optimization_level: int) -> None:
    if optimization_level not in OPTIMIZATION_LEVELS:
        raise InputError(f"--optimization-level {optimization_level} is not one of 1, 2, 3",
                         "use 3 (default: slowest compile, fastest graph) or 1 for quick iterations")
    if vtcm_mb is None:
        return
    if vtcm_mb <= 0:
        raise InputError(f"--vtcm-mb must be a positive number of MB, got {vtcm_mb}", "leave it out to use the target's default")
    for soc in socs:
        if vtcm_mb > soc.vtcm_mb:
            raise TargetError(f"--vtcm-mb {vtcm_mb} exceeds {soc.name}'s VTCM ({soc.vtcm_mb} MB)",
                              f"use at most {soc.vtcm_mb} for {soc.name}, or leave --vtcm-mb out")


def compile_provider_options(soc: SoC, vtcm_mb: int | None, optimization_level: int) -> dict[str, str]:
    opts = {"soc_model": str(soc.soc_model),
            "htp_graph_finalization_optimization_mode": str(optimization_level),
            # float ops (all of an fp16 graph, any float islands of a QDQ graph) run in float16;
            # float32 on the HTP simulator fails with QNN_COMMON_ERROR_MEM_ALLOC.
            "enable_htp_fp16_precision": "1"}
    if vtcm_mb is not None:
        opts["vtcm_mb"] = str(vtcm_mb)
    return opts


def run_provider_options(soc_model: int, perf_profile: str | None) -> dict[str, str]:
    opts = {"soc_model": str(soc_model)}
    if perf_profile:
        if perf_profile not in PERF_PROFILES:
            raise InputError(f"unknown --perf-profile {perf_profile!r}", f"choose one of: {', '.join(PERF_PROFILES)}")
        opts["htp_performance_mode"] = perf_profile
    return opts
