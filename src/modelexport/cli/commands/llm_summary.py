"""The `compile` summary of an LLM bundle (graphs, weight sharing, parts, Genie check)."""
from __future__ import annotations

from rich.table import Table

from ..app import console, emit_json
from .numerics_lines import print_numerics


def _dump(section):
    return None if section is None else section.model_dump(mode="json", exclude_none=True)


def llm_summary(bundle, json_out: bool) -> None:
    m = bundle.manifest
    llm = m.llm
    if json_out:
        emit_json({"bundle": str(bundle.path), "kind": "llm", "targets": m.targets, "htp_arch": m.htp_arch,
                   "precision": m.precision, "qairt_build": m.qairt_build,
                   "graphs": [g.model_dump(mode="json", exclude_none=True) for g in m.graphs],
                   "files": [f.model_dump(mode="json") for f in m.files], "llm": _dump(llm) or {},
                   "parameters": m.parameters, "numerics": m.numerics, "cache": _dump(m.cache),
                   "timings": _dump(m.timings)})
        return
    table = Table("graph", "target", "HTP arch", "layers", "QNN graph", "const B", "shared weights B", "est. MB",
                  header_style="bold")
    for g in m.graphs:
        table.add_row(g.name, g.target or "-", f"V{g.htp_arch}" if g.htp_arch else "-", f"{g.layers[0]}-{g.layers[1] - 1}",
                      str(g.qnn_graph_name), f"{g.const_bytes or 0:,}", f"{g.shared_weights_bytes or 0:,}",
                      str(g.memory_estimate.total_mb if g.memory_estimate else None))
    console.print(table)
    if llm is not None:
        for key, ws in llm.weight_sharing.items():
            console.print(f"  {ws.file}: {len(ws.graphs)} graphs, weights stored once "
                          f"({ws.shared_weights_bytes} B shared), {ws.bytes:,} B vs {ws.unshared_twins_bytes:,} B unshared")
        if llm.split_note:
            console.print(f"[yellow]note[/]: {llm.split_note}")
        for t, g in llm.genie.items():
            note = (f"; no dialog: {g.dialog_note}" if not g.dialog_created else f" ({g.dialog_note})") if g.dialog_note else ""
            console.print(f"  Genie accepts {g.file} ({t}){note}")
        _executorch_lines(console, llm)
        if llm.inputs != "tokens":
            console.print(f"  inputs: {llm.inputs}" + (f" (no_token_id {llm.no_token_id})" if llm.no_token_id is not None else ""))
        if llm.embedder is not None:
            e = llm.embedder
            for t, n in e.bytes.items():
                check = e.check.get(t)
                console.print(f"  embedder part ({e.precision}, {t}): {len({g.n_tokens for g in e.graphs})} graphs, {n:,} B"
                              + (f"; twin vs float lookup {check.sqnr_db:.1f} dB" if check else ""))
        if llm.vision is not None:
            v = llm.vision
            for g in v.graphs:
                check = v.check.get(g.target)
                console.print(f"  vision part ({v.family}, {v.precision}, {g.target}): {v.image_size}x{v.image_size} image → "
                              f"{v.tokens_per_image} image tokens (id {v.image_token_id}, {v.placement}"
                              + (f", M-RoPE positions on the {v.grid_thw} grid" if v.position_rule == "mrope_grid" else "") + ")"
                              + (f"; simulator vs float {check.sqnr_db:.1f} dB" if check else ""))
    if llm is not None and llm.weight_rounding is not None:
        r = llm.weight_rounding
        console.print(f"  4-bit weights: --rounding {r.method} ({r.modules} linears"
                      f"{f', inputs from {r.tokens} calibration tokens' if r.tokens else ''})")
    if llm is not None and llm.quality_recipe is not None:
        q = llm.quality_recipe
        console.print(f"  --max-ppl-ratio {q.max_ppl_ratio:g}: perplexity {q.quantized_ppl:.2f} = {q.ratio:.3f}x float "
                      f"({q.float_ppl:.2f}) on {q.held_out.get('tokens')} held-out tokens (weights as compiled, activations "
                      f"float; {q.ratio_before:.3f}x before), {len(q.raised)} modules raised to {q.precision} "
                      f"(+{q.added_bytes_per_param:.3f} bytes/param). To reuse the recipe:")
        console.print("    " + (" ".join(f"--override '{o}'" for o in q.overrides) or "(no override needed)"), soft_wrap=True)
    _numerics_lines(m.numerics or {})
    console.print(f"  {llm.bytes_per_parameter if llm else None} bytes per parameter on the device "
                  f"({(llm.device_bytes if llm else 0):,} B for {m.parameters or 0:,} parameters)")
    console.print(f"[bold green]bundle[/] {bundle.path}  (QAIRT {m.qairt_build}, {m.timings.total_s} s"
                  f"{', cached' if m.cache and m.cache.quantize_hit else ''})")
    if m.cache and m.cache.resumed_graphs:
        console.print(f"  resumed: {len(m.cache.resumed_graphs)} quantized graphs reused from an interrupted compile "
                      f"({', '.join(m.cache.resumed_graphs)})")


def _numerics_lines(num: dict) -> None:
    """Compile's own check: an LLM's logits against float (backends/llm_qnn/self_check.py), or a .pte
    bundle's twin vs float per method."""
    if num.get("kind") == "llm" or num.get("not_checked"):
        print_numerics(num, True)
        return
    for o in num.get("outputs", []):
        mark = num.get("threshold_db")
        ok = mark is None or o["sqnr_db"] >= mark
        pair = f", {num['compared']}" if num.get("compared") else ""
        console.print(f"  {o['name']}{pair}: SQNR {o['sqnr_db']:.2f} dB (on {num.get('inputs')}; pass mark {mark} dB"
                      f"{'' if ok else ', [red]below[/]'})")


def _executorch_lines(console, llm) -> None:
    for t, e in llm.executorch.items():
        console.print(f"  {e.file} ({t}): qnn_llama_runner's loop on its host twin gave the bundle's tokens "
                      f"({e.check.get('steps')} steps, logits {e.check.get('worst_logits_sqnr_db')} dB); "
                      f"{e.binaries_stored} binary(ies) stored, {e.bytes:,} B")
