from __future__ import annotations

import inspect
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.markup import escape
from rich.table import Table

from ...core.arguments import size_in_bytes
from ...core.atomic import check_output
from ...core.compile_flags import CALIB_HELP, COMPILE_FLAGS, FORMAT_HELP, PRECISION_HELP
from ...core.errors import InputError
from ...core.vocab import BundleKind
from ..app import app, console, emit_json, err_console, option, progress
from .llm_plan import print_llm_plan
from .llm_summary import llm_summary
from .numerics_lines import print_numerics

if TYPE_CHECKING:
    from ...contract.manifest import Manifest, PartEntry

SPLIT_SHARE = 0.10          # a CPU share of the nodes from which compile says so


def _split_warnings(m: Manifest, rows: dict, sizes: dict) -> list[str]:
    """One line per part and target that leaves much on the CPU or splits into several HTP graphs."""
    out = []
    for (part, target, _), gs in rows.items():
        pl = m.placement.get(part, {}).get(target or "", {})
        on, cpu = pl.get("htp_nodes") or 0, len(pl.get("cpu_fallbacks", []))
        share = cpu / max(1, on + cpu)
        if share < SPLIT_SHARE and len(gs) <= 1:
            continue
        shipped = sum(v for k, v in sizes.items() if k.startswith(f"{part}/{target}/"))
        out.append(f"{part}@{target}: {share:.0%} of the nodes run on the CPU ({cpu} of {on + cpu}), the HTP part is "
                   f"split into {len(gs)} graph(s), {shipped / 1e6:.1f} MB to ship for this target; each split costs a "
                   "round trip between the CPU and the HTP: `modelexport audit MODEL` names each CPU node and its fix")
    return out


def _search_summary(search: dict) -> None:
    """--precision auto: every candidate, and the flags of the chosen one."""
    table = Table("#", "flags", "worst dB", "cycles", "CPU nodes", "", header_style="bold")
    for i, c in enumerate(search["candidates"]):
        mark = "[green]chosen[/]" if i == search["chosen"] else ("[red]" + escape(c["refused"]) + "[/]" if c.get("refused")
                                                                else ("pass" if c["passed"] else "below budget"))
        table.add_row(str(i + 1), escape(c["flags"]), "-inf" if c["worst_sqnr_db"] is None else f"{c['worst_sqnr_db']:.1f}",
                      f"{c['cycles']:,.0f}" if c.get("cycles") else "-", str(c["cpu_nodes"]), mark)
    console.print(table)
    ratio = search.get("cycles_vs_8a8w")
    console.print(f"precision auto: {escape(search['flags'])}" + (f"  ({ratio:.2f}x the cycles of plain 8a8w)" if ratio else "")
                  + f"  on {search['held_out_samples']} held-out sample(s)")


# what `compile --json` prints of the manifest, with the value of a section it does not hold
JSON_FIELDS = {"targets": [], "htp_arch": {}, "precision": None, "format": None, "qairt_build": None, "placement": {},
               "graphs": [], "files": [], "cache": None, "timings": None}


def _precision_of(m: Manifest, part: PartEntry | None) -> str | None:
    return part.precision if part is not None else m.precision


def _graph_rows(m: Manifest) -> dict[tuple, list]:
    """One row per part, target and file: a split graph's pieces together."""
    rows: dict[tuple, list] = {}
    for g in m.graphs:
        rows.setdefault((g.name if g.part is None else g.part, g.target, g.file or ""), []).append(g)
    return rows


def _notes(m: Manifest, parts: dict[str, PartEntry]) -> None:
    """Repairs that dequantized a part, random calibration, compile's own numerics, --precision auto's search."""
    for p in m.parts:
        for r in p.repairs or []:
            if r.get("name") == "dequantize":
                console.print(f"[yellow]note[/]: {p.name} shipped quantized ({r['weights_dequantized'] + r['dynamic_matmuls']} "
                              f"int8 weight(s), {r['activation_pairs_dropped']} activation encoding(s)): compiled from its "
                              f"float equivalent at {p.precision}; its own encodings are not kept"
                              + (f" (left as they are: {', '.join(r['left_quantized'])})" if r.get("left_quantized") else ""))
    for part, cal in m.calibration.items():
        if cal.get("representative") is False:
            console.print(f"[yellow]warning[/]: {part} was calibrated on random data; ranges are not representative")
    num = m.numerics
    print_numerics(num, _precision_of(m, parts.get(num.get("part"))) != "fp16")
    if m.precision_search:
        _search_summary(m.precision_search)


def _summary(bundle, json_out: bool, extra: dict | None = None) -> None:
    m = bundle.manifest
    if json_out:
        data = json.loads(m.to_json())
        emit_json({"bundle": str(bundle.path), **{k: data.get(k, empty) for k, empty in JSON_FIELDS.items()},
                   **(extra or {})})
        return
    sizes = {f.path: f.size for f in m.files}
    table = Table("part", "target", "HTP arch", "precision", "file", "bytes", "HTP nodes", "CPU fallbacks", "cached",
                  header_style="bold")
    parts = {p.name: p for p in m.parts}
    memo_hit = bool(m.cache and m.cache.bundle_memo)
    rows = _graph_rows(m)
    for (part, target, file), gs in rows.items():
        g, pe = gs[0], parts.get(part)
        pl = m.placement.get(part, {}).get(target or "", {})
        fb = pl.get("cpu_fallbacks", [])
        hit = memo_hit or (pe is not None and pe.cache_hit.get(target or m.targets[0]))
        table.add_row(part, target or "-", f"V{g.htp_arch}" if g.htp_arch else "-", _precision_of(m, pe),
                      file + (f" ({len(gs)} graphs)" if len(gs) > 1 else ""),
                      f"{sizes.get(file, 0):,}", str(pl.get("htp_nodes", "")),
                      ("[red]" + escape(", ".join(f"{x['name']} ({x['op_type']})" for x in fb[:4])) + "[/]"
                       + (f" +{len(fb) - 4} more" if len(fb) > 4 else "")) if fb else "[green]none[/]",
                      "yes" if hit else "no")
    console.print(table)
    for line in _split_warnings(m, rows, sizes):
        console.print(f"[yellow]warning[/]: {escape(line)}")
    _notes(m, parts)
    took = "copied from the bundle memo" if memo_hit else f"{m.timings.total_s} s"
    console.print(f"[bold green]bundle[/] {bundle.path}  (QAIRT {m.qairt_build}, {took})")
    for line in (extra or {}).get("also_written", []):
        console.print(f"  also wrote {line}")
    if m.dlc_note:
        console.print(f"[yellow]note[/]: {m.dlc_note}")


def _vtcm(vtcm_mb: str | None, vtcm_size: str | None) -> str | None:
    """--vtcm-mb (a bare number is MB) or --vtcm-size (bytes) → one size with its unit for the API."""
    if vtcm_mb is not None and vtcm_size is not None:
        raise InputError("--vtcm-mb and --vtcm-size both give the VTCM size", "give one of them")
    size = size_in_bytes("--vtcm-size", vtcm_size, "B")
    return f"{size}B" if size is not None else vtcm_mb


def _given(name: str, value: Any) -> bool:
    """What the API is handed: an option given (None, an empty list and an unset flag were not;
    --no-cache's use_cache=False was). Other formats refuse an option they do not take, even False."""
    return value is not None and value not in ([], ()) and (value is not False or name == "use_cache")


def _compile(models: list[str], output: Path, json_out: bool, options: dict[str, Any]):
    """`modelexport.compile` with the options by the API's names (core.compile_flags)."""
    from ...api import compile as api_compile   # deferred: ~8 ms on every CLI start (api loads backends.spec, frontends)
    with progress("compiling", enabled=not json_out, total=None) as bar:
        def report(msg: str, done: float, total: float) -> None:
            bar.update(description=msg, completed=done, total=total)
        return api_compile(*models, output=output, progress=report,
                           **{k: v for k, v in options.items() if _given(k, v)})


# what `compile --dry-run` of an LLM plans with, by print_llm_plan's names
PLANNED = {("targets" if f.name == "target" else f.name): f.name for f in COMPILE_FLAGS if f.plan}
MODELS = typer.Argument(..., help="One or more .onnx models (one bundle holds them all), or a pipeline .yaml/.json; "
                        "or a PyTorch model: model.py:factory (returns (module, example_inputs)) or a .pt2.")


def compile_cmd(models: list[str], **given: Any) -> None:
    """Quantize and compile ONNX model(s) into QNN context binaries (or an LLM: a .gguf or Hugging Face
    folder → arN static decoders sharing one copy of the weights, 16a4w, Genie config) for one or more Snapdragon SoCs,
    written as one bundle (manifest.json with graphs, IO encodings, targets and HTP arch read back
    from the binaries, QAIRT build, options, calibration). Results are cached by content.

    Pipeline file (several parts, one bundle):

        targets: [SM8650]
        parts:
          - {name: encoder, model: enc.onnx, precision: 8a8w, calibration: calib/}
          - {name: embedder, model: emb.onnx, precision: fp16}
    """
    json_out, output = given.pop("json_out"), given.pop("output")
    if given["vision_encoder"] is not None:
        given["vision_encoder"] = str(given["vision_encoder"])
    if given.pop("dry_run"):
        print_llm_plan(models, json_out, **{k: given[name] for k, name in PLANNED.items()})   # the same checks as the compile it plans
        return
    if output is None:
        raise InputError("compile needs --output / -o: the bundle folder to write", "add -o OUT (or --dry-run to only plan)")
    given["vtcm_mb"] = _vtcm(given["vtcm_mb"], given.pop("vtcm_size"))
    given["use_cache"] = not given.pop("no_cache")
    bundle = _compile(models, output, json_out, given)
    if bundle.manifest.kind == BundleKind.LLM:
        llm_summary(bundle, json_out)
        return
    _summary(bundle, json_out)


# compile's parameters are the rows of core.compile_flags, under their --help panels
compile_cmd.__signature__ = inspect.Signature(
    [inspect.Parameter("models", inspect.Parameter.POSITIONAL_OR_KEYWORD, default=MODELS, annotation=list[str])]
    + [inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=option(f.name), annotation=f.type)
       for f in COMPILE_FLAGS], return_annotation=None)
app.command("compile")(compile_cmd)


@app.command("compile-qnn")
def compile_qnn(
    model: str = typer.Argument(..., help="The ONNX model (or a pipeline .yaml)."),
    output: str | None = typer.Argument(None, help="model_ctx.bin / model.dlc (that file, plus a bundle folder beside it), or a folder."),
    quantize: bool = typer.Option(False, "--quantize", help="Quantize (with --act-bitwidth/--weights-bitwidth, default 8/8); without it: fp16."),
    calibration_data: str | None = typer.Option(None, "--calibration-data", "--calibration", "-c", help=CALIB_HELP),
    act_bitwidth: int | None = typer.Option(None, "--act-bitwidth", help="8 or 16."),
    weights_bitwidth: int | None = typer.Option(None, "--weights-bitwidth", help="4, 8 or 16."),
    precision: str | None = typer.Option(None, "--precision", "-p", help=PRECISION_HELP + " Overrides the bitwidth flags."),
    fmt: str | None = typer.Option(None, "--format", "-f", help=FORMAT_HELP + " compile-qnn: chosen by OUTPUT's suffix "
                                      "(*.bin → context-binary, *.dlc → dlc) when OUTPUT is a file."),
    backend: str = typer.Option("HTP", "--backend", help="QNN backend: HTP (the only one available here)."),
    device: list[str] | None = typer.Option(None, "--device", "--target", "-t", help="SoC: 'Snapdragon 8 Gen 3', SM8650, 8gen3 ... (repeatable)."),
    input_shape: list[str] | None = typer.Option(None, "--input-shape", help="Fix a dynamic input: NAME=1,3,224,224."),
    vtcm_mb: str | None = option("vtcm_mb", panel=False),
    vtcm_size: str | None = option("vtcm_size", panel=False),
    optimization_level: int = option("optimization_level", panel=False),
    strict: bool = typer.Option(False, "--strict", help="Refuse if any node falls back to the CPU."),
    no_cache: bool = typer.Option(False, "--no-cache", help="Bypass the compile cache."),
    force: bool = typer.Option(False, "--force", help="Replace existing outputs."),
    json_out: bool = option("json_out", panel=False),
) -> None:
    """The seeds' spelling of `compile`: `compile-qnn model.onnx model_ctx.bin --quantize
    --calibration-data list.txt --act-bitwidth 8 --weights-bitwidth 8 --format context-binary
    --backend HTP --device "Snapdragon 8 Gen 3"`. Same code as `compile`.

    OUTPUT names the format by its suffix: *.bin → context-binary (the target's QNN context binary),
    *.dlc → dlc (the QNN IR container the QNN EP writes through libQnnIr.so); the file is written
    with its bundle `<name>.bundle/` beside it. A folder OUTPUT is the bundle itself (--format,
    default context-binary); without OUTPUT the folder is named by model, format, precision and target."""
    from ...qnn import check_backend, plan_output, write_artifact   # deferred: ~10 ms on every CLI start (api and the ONNX backend)
    from ...quant import get_precision, precision_from_bitwidths
    check_backend(backend)
    prec = get_precision(precision) if precision else precision_from_bitwidths(act_bitwidth, weights_bitwidth, quantize)
    targets = device or ["SM8650"]
    plan = plan_output(model, output, fmt, prec, targets)
    if plan.file is not None:
        check_output(plan.file, force)
    if not json_out:
        err_console.print(f"format [bold]{plan.format}[/] ({plan.why})", highlight=False)
    bundle = _compile([model], plan.bundle, json_out, {
        "target": targets, "precision": prec, "calibration": calibration_data, "input_shapes": input_shape,
        "output_format": plan.format, "vtcm_mb": _vtcm(vtcm_mb, vtcm_size), "optimization_level": optimization_level,
        "strict": strict, "use_cache": not no_cache, "force": force})
    written = write_artifact(bundle, plan, force)
    _summary(bundle, json_out, {"format_chosen": {"format": plan.format, "why": plan.why},
                                "also_written": [written] if written else []})
