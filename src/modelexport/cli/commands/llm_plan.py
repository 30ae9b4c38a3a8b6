"""`compile --dry-run` of an LLM: the parts and the host memory and disk estimate, nothing loaded."""
from __future__ import annotations

from pathlib import Path

from ...core.errors import InputError
from ..app import console, emit_json


def print_llm_plan(models: list[str], json_out: bool, precision: str | None = None, **options) -> None:
    from ...backends.llm_qnn.compile import plan_llm
    from ...frontends.gguf_file import _is_gguf_path   # deferred: ~7 ms on every CLI start (frontends.llm_families)
    from ...frontends.hf_folder import _is_hf_folder   # deferred: ~7 ms on every CLI start (frontends.llm_families)
    if len(models) != 1 or not (_is_gguf_path(models[0]) or _is_hf_folder(models[0])):
        raise InputError("--dry-run plans LLM compiles: give one .gguf file or Hugging Face model folder",
                         "leave --dry-run out for ONNX and PyTorch models")
    report = plan_llm(Path(models[0]), precision, **options)
    if json_out:
        emit_json(report)
        return
    est = report["estimate"]
    console.print(f"[bold]{report['architecture']}[/], {est['n_params']:,} parameters ({report['weights_held_as']} weights), "
                  f"{report['precision']}, {', '.join(report['variants'])}, "
                  f"cl {', '.join(str(c) for c in report.get('context_lengths') or [report['max_seq_len']])}")
    console.print(f"parts: {est['n_parts']} (layers {', '.join(f'{a}-{b - 1}' for a, b in est['parts'])}); "
                  f"limits: {report['context_limit_mb']:g} MB per HTP context, {report['host_part_mb']:g} MB float32 per part "
                  f"and {report['host_chunk_mb']:g} MB per exported chunk on the host")
    console.print("estimated peak host memory: " + ", ".join(f"{k} {v / 2**30:.1f} GB" for k, v in est["phases"].items())
                  + f" -> {est['peak_gb']} GB (available: {est['available_gb']} GB), {report['jobs']} worker(s)")
    if est.get("mapped_gb"):
        console.print(f"beside it, the checkpoint's {est['mapped_gb']} GB stay mapped from disk as stored (page cache "
                      "the system drops and reads again when memory is short)")
    console.print(f"estimated disk: {est['disk_gb']} GB (free: {est['disk_available_gb']} GB)")
    if report.get("jobs_note"):
        console.print(report["jobs_note"])
    if report["fits"]:
        console.print("[green]fits this machine[/]")
    else:
        console.print(f"[red]would be refused[/]: {report['refusal']}")
