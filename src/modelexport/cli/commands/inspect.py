from __future__ import annotations

from pathlib import Path

import typer
from rich.markup import escape
from rich.table import Table

from ...core.errors import InputError, IntegrityError
from ...inspection import inspect_path
from ...inspection.render_pte import RENDERERS as PTE_RENDERERS
from ...inspection.render_qnn import RENDERERS as QNN_RENDERERS
from ..app import app, console, emit_json


def _render_bundle(info: dict) -> None:
    m = info["manifest"]
    console.print(f"[bold]bundle[/] {info['path']}  (schema {m.get('schema_version')}, {m.get('kind')})")
    src = m.get("source", {})
    console.print(f"  source     {src.get('path')}  sha256 {str(src.get('sha256'))[:16]}…  ({src.get('format')})")
    console.print(f"  targets    {', '.join(m.get('targets', [])) or '-'}   HTP arch {m.get('htp_arch') or '-'}")
    console.print(f"  precision  {m.get('precision')}   format {m.get('format')}   QAIRT {m.get('qairt_build')}")
    console.print("  versions   " + ", ".join(f"{k} {v}" for k, v in m.get("versions", {}).items()))
    for g in m.get("graphs", []):
        console.print(f"  [bold]graph[/] {g['name']}  ({g.get('kind')}, {g.get('file')}, {g.get('target') or ''})")
        for direction in ("inputs", "outputs"):
            for t in g.get(direction, []):
                enc = t.get("encoding") or {}
                q = f"  scale {enc.get('scale')} zp {enc.get('zero_point')}" if enc.get("scale") is not None else ""
                console.print(f"      {direction[:-1]:6} {t['name']}  {t['shape']}  {t['dtype']}{q}")
    table = Table("file", "role", "bytes", "sha256", header_style="bold")
    for f in m.get("files", []):
        table.add_row(f["path"], f.get("role", ""), f"{f['size']:,}", f["sha256"][:16] + "…")
    console.print(table)
    _render_deployment(info.get("deployment") or {})
    for file, verdict in (info.get("genie_config_check") or {}).items():
        if verdict.get("pipeline"):
            console.print(f"Genie {file}: {escape(verdict['message'])}", highlight=False, soft_wrap=True)
        elif verdict.get("accepted"):
            console.print(f"[green]Genie accepts[/] {file} (GenieDialogConfig_createFromJson, libGenie.so on this host)")
        elif verdict.get("accepted") is False:
            console.print(f"[bold red]{verdict.get('message')}[/]", highlight=False, soft_wrap=True)
        else:
            console.print(f"[yellow]Genie not checked[/] {file}: {verdict.get('message')}")
    for t, e in ((m.get("llm") or {}).get("executorch") or {}).items():
        check = e.get("check") or {}
        console.print(f"[green]ExecuTorch's runtime ran[/] {e['host_twin']} ({t}) as qnn_llama_runner does, at compile: "
                      f"{'the bundle' if check.get('same_tokens') else 'NOT the bundle'}'s tokens, {check.get('steps')} steps; "
                      f"{e['file']} holds {e['binaries_stored']} shared binary(ies)", highlight=False, soft_wrap=True)
    integ = info["integrity"]
    if integ["ok"]:
        console.print("[green]integrity OK[/]: every file matches its sha256")
    else:
        for p in integ["problems"]:
            console.print(f"[bold red]integrity FAIL[/] {p}")


def _render_deployment(d: dict) -> None:
    """What goes to the phone, per target and runtime (contract/deployment.py)."""
    if not d.get("runtimes"):
        return
    console.print("[bold]on the phone[/]")
    for r in d["runtimes"]:
        bpp = f", {r['bytes_per_parameter']} bytes/param" if r.get("bytes_per_parameter") else ""
        console.print(f"  {r['target']} · [bold]{r['runtime']}[/]: model files {r['model_bytes']:,} B{bpp}"
                      + (f" (+ {r['extra_bytes']:,} B config/tokenizer)" if r.get("extra_bytes") else ""))
        console.print(f"      files  {', '.join(r['files'])}", highlight=False, soft_wrap=True)
        console.print(f"      needs  {r['needs']}", highlight=False, soft_wrap=True)
    for p in d.get("parts") or []:
        est = f"{p['estimate_mb']:.1f} MB" if p.get("estimate_mb") is not None else "no estimate"
        lim = (f" of {p['limit_mb']:g} MB ({'within' if p['within_limit'] else '[red]over[/]'})"
               if p.get("limit_mb") is not None and p.get("within_limit") is not None else "")
        layers = f" layers {p['layers'][0]}-{p['layers'][1] - 1}" if p.get("layers") else ""
        console.print(f"  part {p['graph']}{layers}: memory {est}{lim}")
    for t, tps in (d.get("decode_ceiling_tok_s") or {}).items():
        console.print(f"  decode ceiling on {t}: {tps:,.0f} tok/s (DRAM bandwidth / weight bytes per token)")
    if d.get("placement"):
        console.print(f"  placement: {d['placement']}")
    console.print(f"  stays on this host: {len(d.get('host_only_files') or [])} files, {d.get('host_only_bytes', 0):,} B "
                  "(host twins, QDQ graphs, report)")


def _render_gguf(info: dict) -> None:
    console.print(f"[bold]GGUF[/] {info['path']}  (v{info['gguf_version']}, {info['file_size']:,} bytes, {info.get('file_type')})")
    console.print(f"  model        {info.get('name')}  architecture [bold]{info['architecture']}[/]"
                  f"  ({'supported' if info['supported'] else '[red]not supported[/]'})")
    console.print(f"  parameters   {info['n_params']:,}   layers {info['n_layers']}   hidden {info['hidden_size']}"
                  f"   intermediate {info['intermediate_size']}")
    console.print(f"  attention    {info['n_heads']} heads / {info['n_kv_heads']} KV heads, head dim {info['head_dim']},"
                  f" rope theta {info['rope_theta']}, rms eps {info['rms_norm_eps']}")
    if info.get("rope_scaling_type") not in (None, "none"):
        console.print(f"  rope scaling {info['rope_scaling_type']}: {_rope_scaling_line(info)}")
    console.print(f"  context      {info['context_length']} tokens   vocab {info['vocab_size']:,}"
                  f"   tied embeddings {info['tied_embeddings']}")
    console.print(f"  tokenizer    {info['tokenizer_model']} (pre {info['tokenizer_pre']}), bos {info['bos_token_id']},"
                  f" eos {info['eos_token_id']}")
    fam = info.get("family")
    if fam:
        console.print(f"  family       {_family_line(fam)}")
    tpl = info.get("chat_template") or ""
    console.print(f"  chat template {len(tpl)} chars" + (f": {tpl[:120]!r}…" if tpl else " (none)"))
    console.print("  quant types  " + ", ".join(f"{k} ×{v}" for k, v in info["quant_types"].items()))
    table = Table("tensor", "type", "shape", "bytes", header_style="bold")
    for t in info["tensors"]:
        table.add_row(t["name"], t["quant_type"], "×".join(map(str, t["shape"])), f"{t['n_bytes']:,}")
    console.print(table)


def _rope_scaling_line(info: dict) -> str:
    """The rope parameters a GGUF's scaling becomes (factor lists as their length), or why not."""
    rs = info.get("rope_scaling")
    if not rs:
        return f"[red]{info.get('rope_scaling_problem') or 'not carried over'}[/]"
    return ", ".join(f"{k} [{len(v)} values]" if isinstance(v, list) else f"{k} {v}" for k, v in rs.items())


def _family_line(fam: dict) -> str:
    """The family row's facts that are set (the builders' choices), one line."""
    skip = {"model_type", "label", "gguf_architectures", "layers", "rope_parameters"}
    shown = [f"{k}={v}" for k, v in fam.items() if k not in skip and v not in (False, None, "", (), [], "none")]
    return f"[bold]{fam['label']}[/] ({fam['model_type']}): " + ", ".join(shown)


def _render_hf_folder(info: dict) -> None:
    console.print(f"[bold]HF folder[/] {info['path']}  model type [bold]{info['model_type']}[/]"
                  f"  ({'supported' if info['supported'] else '[red]not supported[/]'})")
    if not info["supported"]:
        console.print(f"  {info['problem']}\n  fix: {info['fix']}")
        return
    console.print(f"  layers {info['n_layers']}   hidden {info['hidden_size']}   intermediate {info['intermediate_size']}"
                  f"   heads {info['n_heads']} / {info['n_kv_heads']} KV, head dim {info['head_dim']}"
                  f"   vocab {info['vocab_size']:,}   context {info['context_length']}")
    vlm = info.get("vlm")
    if vlm:
        image = (f"image {vlm['image_size']} px -> {vlm['tokens_per_image']} image tokens" if "image_size" in vlm else
                 f"image size by --max-seq-len (below; --image-size up to {vlm['max_image_size']} px)")
        console.print(f"  vision       [bold]{vlm['label']}[/] ({vlm['family']}): {image} (id {vlm['image_token_id']}), "
                      f"patch {vlm['patch_size']}, positions {vlm['position_rule']}, placement {vlm['placement']}")
        for n, size in vlm.get("by_max_seq_len", {}).items():
            console.print(f"  --max-seq-len {n:<5} " + (f"image {size['image_size']} px, {size['tokens_per_image']} tokens"
                                                       if "image_size" in size else f"[red]{size['problem']}[/]"))
        console.print("  text model   (the decoder below)")
    fam = info["family"]
    console.print(f"  family       {_family_line(fam)}")
    for i, layer in enumerate(fam["layers"]):
        console.print(f"  layer {i:<3}    rope {layer['rope']}, window {layer['window'] or 'none'}")


def _render_plain(info: dict) -> None:
    console.print(info)   # rich pretty-prints a dict (rich.pretty, loaded by rich on first use: ~10 ms)


RENDERERS = {"bundle": _render_bundle, "gguf": _render_gguf, "hf-folder": _render_hf_folder}
RENDERERS.update({k: (lambda f: lambda info: f(info, console))(f) for k, f in QNN_RENDERERS.items()})
RENDERERS.update({k: (lambda f: lambda info: f(info, console))(f) for k, f in PTE_RENDERERS.items()})


SCHEMAS = ("modelexport", "qnn")


def _qnn_schema(path: Path, info: dict) -> dict:
    """A context binary (or a bundle / EPContext model holding exactly one) in qnn-context-binary-utility's
    JSON layout (toolchain.qnn_context.utility_json)."""
    from ...toolchain.qnn_context.utility_json import utility_json   # deferred: ~22 ms on every CLI start, for --schema qnn alone
    if "binary" in info:
        return utility_json(info["binary"])
    if info["kind"] == "bundle":
        bins = sorted({g["file"] for g in info["manifest"].get("graphs", []) if g.get("kind") == "context-binary"})
        if len(bins) == 1:
            return _qnn_schema(path, inspect_path(Path(info["path"]) / bins[0]))
        if bins:
            raise InputError(f"{path} holds {len(bins)} context binaries; --schema qnn describes one",
                             f"name one: modelexport inspect {Path(info['path']) / bins[0]} --json --schema qnn")
    what = f"{info['kind']}, format {info['manifest'].get('format')}" if info["kind"] == "bundle" else info["kind"]
    raise InputError(f"{path} ({what}) holds no QNN context binary: --schema qnn has nothing to describe",
                     "pass a context binary (.bin), an EPContext .onnx or a context-binary bundle, or leave --schema out")


@app.command()
def inspect(
    path: Path = typer.Argument(..., help="A bundle folder, context binary (.bin), EPContext .onnx, .pte, .gguf or HF model folder."),
    json_out: bool = typer.Option(False, "--json", help="Print everything as JSON."),
    schema: str = typer.Option("modelexport", "--schema", help="JSON layout: modelexport (ours), or qnn: a context "
                               "binary as QAIRT's `qnn-context-binary-utility --json_file` writes it "
                               "(`.info.graphs[0].info.graphOutputs[0]`; implies --json)."),
) -> None:
    """Show what an artifact holds: graphs, inputs and outputs with their encodings, target and
    HTP arch, QAIRT build, sizes. For bundles every file's sha256 is checked (exit 4 on mismatch).

    `--json --schema qnn` prints a context binary in qnn-context-binary-utility's JSON layout, so its
    scripts work unchanged: `modelexport inspect model_ctx.bin --json --schema qnn | jq '.info.graphs[0].info.graphOutputs[0]'`."""
    if schema not in SCHEMAS:
        raise InputError(f"unknown --schema {schema!r}", f"choose one of: {', '.join(SCHEMAS)}")
    info = inspect_path(path)
    if schema == "qnn":
        integ = info.get("integrity")
        if integ and not integ["ok"]:
            raise IntegrityError(f"{path} does not match its manifest ({len(integ['problems'])} problem(s))",
                                 "rebuild the bundle; do not edit files inside it")
        emit_json(_qnn_schema(path, info))
        return
    if json_out:
        emit_json(info)
    else:
        RENDERERS.get(info["kind"], _render_plain)(info)
    integ = info.get("integrity")
    if integ and not integ["ok"]:
        raise IntegrityError(f"{path} does not match its manifest ({len(integ['problems'])} problem(s))",
                             "rebuild the bundle; do not edit files inside it")
