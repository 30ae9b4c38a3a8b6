from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer
from rich.markup import escape
from rich.table import Table

from ...core.vocab import BundleKind
from ..app import app, console, emit_json, err_console, progress

FORMAT_HELP = ("context-binary (EPContext .onnx + raw QNN context binary per target) or dlc (QNN IR container dumped "
               "by the QNN EP through libQnnIr.so; target-independent; run/verify need context-binary) for ONNX models; "
               "pte (ExecuTorch program with the QNN delegate) for PyTorch models. Default: the model kind's own.")
PRECISION_HELP = ("fp16, 8a8w, 16a8w, 16a16w or 16a4w (activations a, weights w; default 8a8w); PyTorch models also "
                  "16a4w_block (int4 weights, one scale per --block-size input channels; HTP V69+). ONNX models: auto "
                  "finds the plan with the fewest simulator cycles whose outputs meet --min-sqnr on held-out samples, "
                  "with no node added to the CPU, and prints the --override flags that reproduce it.")
OVERRIDE_HELP = ("'REGEX=PRECISION' gives the modules whose path matches REGEX (e.g. 'layers\\.0\\.mlp'; ONNX: the "
                 "exporter's module path such as 'features\\.3\\.conv', or the node name) another quantized precision "
                 "(repeatable; first match wins). `verify --per-layer` suggests one.")
REWRITE_HELP = "PyTorch models: apply an opt-in rewrite pass before quantization (repeatable; `modelexport audit` names them)."
VTCM_MB_HELP = ("VTCM to compile for (QNN EP option vtcm_mb): MB, or a size with a unit (1MB, 1048576B); "
                "whole MB only (the EP's limit), at most the target's (`modelexport targets`). Default: not set, QNN chooses.")
VTCM_SIZE_HELP = "The seeds' spelling: VTCM in bytes (--vtcm_size 1048576), or with a unit; same rules as --vtcm-mb."
OPTIMIZATION_LEVEL_HELP = ("HTP graph finalization level: 3 (default) prepares QNN's most optimized graph and takes "
                           "longest; 1 prepares fastest, for quick iterations; 2 is between.")
CALIB_HELP = ("Calibration data: a folder of .npy/.npz/.raw, an input list .txt (one line per sample), a .npz, or `random` "
              "(labelled not representative in the manifest). ONNX models with one input: a folder of photos "
              "(.png/.jpg, resized to the image input; --image-mean/--image-std) or of .wav recordings (cut or padded "
              "to the waveform input).")


SPLIT_SHARE = 0.10          # a CPU share of the nodes from which compile says so


def _split_warnings(m: dict, rows: dict, sizes: dict) -> list[str]:
    """One line per part and target that leaves much on the CPU or splits into several HTP graphs."""
    out = []
    for (part, target, _), gs in rows.items():
        pl = m.get("placement", {}).get(part, {}).get(target or "", {})
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


def _summary(bundle, json_out: bool, extra: dict | None = None) -> None:
    m = bundle.data          # plain JSON (schema 2): a memo hit prints without loading the manifest models
    if json_out:
        emit_json({"bundle": str(bundle.path), "targets": m.get("targets", []), "htp_arch": m.get("htp_arch", {}),
                   "precision": m.get("precision"), "format": m.get("format"), "qairt_build": m.get("qairt_build"),
                   "placement": m.get("placement", {}), "graphs": m.get("graphs", []), "files": m.get("files", []),
                   "cache": m.get("cache"), "timings": m.get("timings"), **(extra or {})})
        return
    sizes = {f["path"]: f["size"] for f in m.get("files", [])}
    table = Table("part", "target", "HTP arch", "precision", "file", "bytes", "HTP nodes", "CPU fallbacks", "cached",
                  header_style="bold")
    parts = {p["name"]: p for p in m.get("parts", [])}
    memo_hit = (m.get("cache") or {}).get("bundle_memo", False)
    rows: dict[tuple, list] = {}                 # one row per part, target and file: a split graph's pieces together
    for g in m.get("graphs", []):
        rows.setdefault((g.get("part", g["name"]), g.get("target"), g.get("file") or ""), []).append(g)
    for (part, target, file), gs in rows.items():
        g = gs[0]
        pl = m.get("placement", {}).get(part, {}).get(target or "", {})
        fb = pl.get("cpu_fallbacks", [])
        hit = memo_hit or parts.get(part, {}).get("cache_hit", {}).get(target or m["targets"][0])
        table.add_row(part, target or "-", f"V{g['htp_arch']}" if g.get("htp_arch") else "-",
                      parts.get(part, {}).get("precision", m.get("precision")),
                      file + (f" ({len(gs)} graphs)" if len(gs) > 1 else ""),
                      f"{sizes.get(file, 0):,}", str(pl.get("htp_nodes", "")),
                      ("[red]" + escape(", ".join(f"{x['name']} ({x['op_type']})" for x in fb[:4])) + "[/]"
                       + (f" +{len(fb) - 4} more" if len(fb) > 4 else "")) if fb else "[green]none[/]",
                      "yes" if hit else "no")
    console.print(table)
    for line in _split_warnings(m, rows, sizes):
        console.print(f"[yellow]warning[/]: {escape(line)}")
    for p in m.get("parts", []):
        for r in p.get("repairs") or []:
            if r.get("name") == "dequantize":
                console.print(f"[yellow]note[/]: {p['name']} shipped quantized ({r['weights_dequantized'] + r['dynamic_matmuls']} "
                              f"int8 weight(s), {r['activation_pairs_dropped']} activation encoding(s)): compiled from its "
                              f"float equivalent at {p.get('precision')}; its own encodings are not kept"
                              + (f" (left as they are: {', '.join(r['left_quantized'])})" if r.get("left_quantized") else ""))
    for part, cal in m.get("calibration", {}).items():
        if cal.get("representative") is False:
            console.print(f"[yellow]warning[/]: {part} was calibrated on random data; ranges are not representative")
    num = m.get("numerics") or {}
    if num.get("outputs") or num.get("run_error"):
        from ...core.numerics_advice import numerics_fix_for, numerics_line
        if num.get("passed") is False:
            quantized = parts.get(num.get("part"), {}).get("precision", m.get("precision")) != "fp16"
            what = "numerics not checked" if num.get("run_error") else "numerics below the pass mark"
            console.print(f"[yellow]warning[/]: {what}: {escape(numerics_line(num))}; "
                          "the bundle is written (--strict-numerics refuses it, exit 7)")
            console.print(f"  fix: {escape(numerics_fix_for(num, quantized))}")
        else:
            console.print(f"numerics: [green]pass[/] {escape(numerics_line(num))}")
    elif num.get("not_checked"):
        console.print(f"numerics: not checked ({escape(num['not_checked'])})")
    search = m.get("precision_search") or {}
    if search:
        _search_summary(search)
    took = "copied from the bundle memo" if memo_hit else f"{m.get('timings', {}).get('total_s')} s"
    console.print(f"[bold green]bundle[/] {bundle.path}  (QAIRT {m.get('qairt_build')}, {took})")
    for line in (extra or {}).get("also_written", []):
        console.print(f"  also wrote {line}")
    if m.get("dlc_note"):
        console.print(f"[yellow]note[/]: {m['dlc_note']}")


def _vtcm(vtcm_mb: Optional[str], vtcm_size: Optional[str]) -> Optional[str]:
    """--vtcm-mb (a bare number is MB) or --vtcm-size (bytes) → one size with its unit for the API."""
    from ...core.arguments import size_in_bytes
    if vtcm_mb is not None and vtcm_size is not None:
        from ...core.errors import InputError
        raise InputError("--vtcm-mb and --vtcm-size both give the VTCM size", "give one of them")
    size = size_in_bytes("--vtcm-size", vtcm_size, "B")
    return f"{size}B" if size is not None else vtcm_mb


def _compile(models: list[str], out: Path, targets: list[str], precision: str, calibration: Optional[str],
             input_shape: Optional[list[str]], fmt: Optional[str], vtcm_mb: Optional[str], optimization_level: int, strict: bool,
             no_cache: bool, jobs: Optional[int], force: bool, json_out: bool, **torch_options):
    from ...api import compile as api_compile
    with progress("compiling", enabled=not json_out, total=None) as bar:
        def report(msg: str, done: float, total: float) -> None:
            bar.update(description=msg, completed=done, total=total)
        return api_compile(*models, output=out, target=targets, precision=precision, calibration=calibration,
                           input_shapes=input_shape, force=force, output_format=fmt, vtcm_mb=vtcm_mb,
                           optimization_level=optimization_level, strict=strict, use_cache=not no_cache, jobs=jobs,
                           progress=report, **{k: v for k, v in torch_options.items() if v not in (None, [], ())})


@app.command("compile")
def compile_cmd(
    models: List[str] = typer.Argument(..., help="One or more .onnx models (one bundle holds them all), or a pipeline .yaml/.json; "
                                       "or a PyTorch model: model.py:factory (returns (module, example_inputs)) or a .pt2."),
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="The bundle folder to write (required unless --dry-run)."),
    target: Optional[List[str]] = typer.Option(None, "--target", "-t", help="SoC(s) to compile for; repeat for several (compiled concurrently). Default: a pipeline's `targets:`, else SM8650."),
    precision: Optional[str] = typer.Option(None, "--precision", "-p", help=PRECISION_HELP + " LLMs: 16a4w_block (default: 4-bit weights in blocks of --block-size 32), 16a4w, 16a8w, 16a16w, 8a8w."),
    calibration: Optional[str] = typer.Option(None, "--calibration", "-c", help=CALIB_HELP + " LLMs: a plain-text file (default: lee_background.cor)."),
    input_shape: Optional[List[str]] = typer.Option(None, "--input-shape", help="Fix a dynamic input: NAME=1,3,224,224 (repeatable)."),
    input_value: Optional[List[str]] = typer.Option(None, "--input-value", help="ONNX: fix an input to a constant, NAME=VALUE "
                                                    "(folds If on it, e.g. sr=16000; recorded in the manifest; repeatable)."),
    fmt: Optional[str] = typer.Option(None, "--format", "-f", help=FORMAT_HELP),
    block_size: Optional[int] = typer.Option(None, "--block-size", help="16a4w_block: input channels per weight scale (default 64; 32 for LLMs)."),
    override: Optional[List[str]] = typer.Option(None, "--override", help=OVERRIDE_HELP),
    rewrite: Optional[List[str]] = typer.Option(None, "--rewrite", help=REWRITE_HELP),
    fallback: Optional[str] = typer.Option(None, "--fallback", help="PyTorch models: where nodes the HTP refuses run: xnnpack (default) or portable."),
    vtcm_mb: Optional[str] = typer.Option(None, "--vtcm-mb", help=VTCM_MB_HELP),
    vtcm_size: Optional[str] = typer.Option(None, "--vtcm-size", "--vtcm_size", help=VTCM_SIZE_HELP),
    optimization_level: int = typer.Option(3, "--optimization-level", "-O", help=OPTIMIZATION_LEVEL_HELP),
    strict: bool = typer.Option(False, "--strict", help="Refuse (exit 3, nothing written) if any node falls back to the CPU."),
    strict_numerics: bool = typer.Option(False, "--strict-numerics", help="ONNX and PyTorch models: refuse (exit 7, nothing written) "
                                         "if compile's own check of the compiled graph against the float model is below "
                                         "the precision's pass mark (otherwise a warning)."),
    min_sqnr: Optional[List[str]] = typer.Option(None, "--min-sqnr", help="ONNX models: the pass mark of compile's own check in "
                                                 "dB (default per precision); with --precision auto the budget every output "
                                                 "must meet (default 25), or NAME=DB for one output (repeatable)."),
    max_drop: Optional[float] = typer.Option(None, "--max-drop", help="ONNX models, --precision auto: the most the task metric "
                                             "of --eval-fn may fall below the float model's (e.g. 0.01 of top-1 accuracy)."),
    eval_fn: Optional[str] = typer.Option(None, "--eval-fn", help="ONNX models, --precision auto: FILE.py:FUNCTION, called as "
                                          "FUNCTION(predict) -> float (higher is better) where predict({input: array}) "
                                          "returns {output: array}; it runs your evaluation data through the model."),
    calibration_method: Optional[str] = typer.Option(None, "--calibration-method", help="ONNX models, quantized: how activation "
                                                     "ranges are set from the calibration data: minmax (default: every value "
                                                     "fits) or percentile (each range clipped to the 99.99th percentile of its "
                                                     "values: more steps for the bulk of them at 8 bits). --precision auto tries both."),
    no_cache: bool = typer.Option(False, "--no-cache", help="Do not reuse or fill the compile cache (MODELEXPORT_CACHE_DIR)."),
    jobs: Optional[int] = typer.Option(None, "--jobs", "-j", help="Parallel compile processes (default: the number of cores)."),
    variants: Optional[List[str]] = typer.Option(None, "--variants", "--variant", help="LLMs: the arN decoder graphs sharing one copy of the weights, e.g. ar1,ar32 (default); repeatable (--variant ar1 --variant ar32 is the same); `full` adds the full-context graph: N = --max-seq-len, no KV cache."),
    inputs: Optional[str] = typer.Option(None, "--inputs", help="LLMs: the decoder's first input: tokens (default: input_ids), "
                                         "embeddings (inputs_embeds [1, N, hidden]; the bundle gets an embedder part that looks "
                                         "text up) or both (ids looked up + inputs_embeds added; an id >= vocab_size looks nothing up)."),
    embedder_precision: Optional[str] = typer.Option(None, "--embedder-precision", help="LLMs, --inputs embeddings: the "
                                                     "embedder's table: fp16 (default) or 8bit (one scale per table)."),
    vision_precision: Optional[str] = typer.Option(None, "--vision-precision", help="Vision-language models: "
                                                   "the vision part's precision: 16a8w (default), 8a8w (smaller) or fp16 "
                                                   "(an encoder that 8-bit weights hurt, e.g. a CNN trunk)."),
    image_size: Optional[int] = typer.Option(None, "--image-size", help="Vision-language folders: the square (pixels) the vision "
                                             "part is built for. Qwen2-VL: a multiple of 28 within the preprocessor's min/max_pixels "
                                             "(Qwen2.5-VL: of 112, whole attention windows); "
                                             "default the largest whose image tokens take at most half of --max-seq-len. "
                                             "Idefics3 / LLaVA: fixed by vision_config.image_size. "
                                             "--vision-encoder: the square a dynamic-size encoder is compiled for."),
    vision_encoder: Optional[Path] = typer.Option(None, "--vision-encoder", help="LLMs: your own vision encoder as ONNX "
                                                  "(one image [1, 3, S, S] in, rows [1, N, hidden] out, its projector "
                                                  "inside, hidden = the text model's) makes a vision-language bundle with "
                                                  "the text model: generate --image puts the N rows at the prompt's "
                                                  "--image-token places. Needs --image-token."),
    image_token: Optional[str] = typer.Option(None, "--image-token", help="--vision-encoder: the token (a special or "
                                              "reserved token of the tokenizer, or its id) whose places in the prompt "
                                              "the image's rows take; N of them are put before the text."),
    image_mean: Optional[str] = typer.Option(None, "--image-mean", help="--vision-encoder: R,G,B mean the pixels (0-1) are "
                                             "normalized with (default ImageNet's 0.485,0.456,0.406). ONNX models calibrated on "
                                             "a folder of photos: the same, default 0 (pixels 0-1 as they are)."),
    image_std: Optional[str] = typer.Option(None, "--image-std", help="--vision-encoder: R,G,B std (default ImageNet's "
                                            "0.229,0.224,0.225). ONNX models calibrated on photos: default 1."),
    max_seq_len: Optional[int] = typer.Option(None, "--max-seq-len", help="LLMs: the context (KV cache + chunk) of every graph (default 512)."),
    context_limit_mb: Optional[float] = typer.Option(None, "--context-limit-mb", help="LLMs: per-context HTP memory limit; above it the decoder is split by layers into parts (default 2048)."),
    host_chunk_mb: Optional[float] = typer.Option(None, "--host-chunk-mb", help="LLMs: float32 weights exported and quantized at a time "
                                                  "on this machine (default 256; one layer is the least); lower it when memory is short. "
                                                  "The HTP still gets one graph per part."),
    calibration_samples: Optional[int] = typer.Option(None, "--calibration-samples", help="LLMs: calibration samples per variant, cut from the calibration text (default 8)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="LLMs: print the plan (parts) and the estimated peak host memory and disk, "
                                 "checked against this machine; loads no weights, writes nothing."),
    rounding: Optional[str] = typer.Option(None, "--rounding", help="LLMs, 4-bit weights: nearest, imatrix, seqmse, gptq or "
                                           "seqmse-gptq (default gptq: scales weighted by the calibration activations, each weight's "
                                           "rounding error compensated on them; nearest needs no calibration text)."),
    max_ppl_ratio: Optional[float] = typer.Option(None, "--max-ppl-ratio", help="LLMs, 4-bit weights: raise the fewest modules to 8-bit "
                                                  "weights until perplexity on held-out text is within this x float (e.g. 1.05); "
                                                  "the overrides chosen are recorded and printed."),
    force: bool = typer.Option(False, "--force", help="Replace an existing output."),
    json_out: bool = typer.Option(False, "--json", help="Print the result as JSON."),
) -> None:
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
    if dry_run:
        from .llm_plan import print_llm_plan
        print_llm_plan(models, json_out, targets=target, precision=precision, calibration=calibration, block_size=block_size,
                       overrides=override, jobs=jobs, variants=variants, max_seq_len=max_seq_len, inputs=inputs,
                       context_limit_mb=context_limit_mb, calibration_samples=calibration_samples, host_chunk_mb=host_chunk_mb,
                       rounding=rounding, max_ppl_ratio=max_ppl_ratio, embedder_precision=embedder_precision,
                       vision_precision=vision_precision, image_size=image_size,
                       vision_encoder=str(vision_encoder) if vision_encoder else None, image_token=image_token,
                       image_mean=image_mean, image_std=image_std)   # the same checks as the compile it plans
        return
    if output is None:
        from ...core.errors import InputError
        raise InputError("compile needs --output / -o: the bundle folder to write", "add -o OUT (or --dry-run to only plan)")
    bundle = _compile(models, output, target, precision, calibration, input_shape, fmt, _vtcm(vtcm_mb, vtcm_size), optimization_level,
                      strict, no_cache, jobs, force, json_out, block_size=block_size, overrides=override, rewrites=rewrite,
                      fallback=fallback, variants=variants, max_seq_len=max_seq_len, context_limit_mb=context_limit_mb,
                      calibration_samples=calibration_samples, input_values=input_value, host_chunk_mb=host_chunk_mb,
                      rounding=rounding, max_ppl_ratio=max_ppl_ratio, inputs=inputs, embedder_precision=embedder_precision,
                      vision_precision=vision_precision, image_size=image_size,
                      vision_encoder=str(vision_encoder) if vision_encoder else None, image_token=image_token,
                      image_mean=image_mean, image_std=image_std, strict_numerics=strict_numerics or None,   # unset unless given: other formats refuse it
                      min_sqnr=min_sqnr or None, max_drop=max_drop, eval_fn=eval_fn, calibration_method=calibration_method)
    if bundle.data.get("kind") == BundleKind.LLM:
        from .llm_summary import llm_summary
        llm_summary(bundle, json_out)
        return
    _summary(bundle, json_out)


@app.command("compile-qnn")
def compile_qnn(
    model: str = typer.Argument(..., help="The ONNX model (or a pipeline .yaml)."),
    output: Optional[str] = typer.Argument(None, help="model_ctx.bin / model.dlc (that file, plus a bundle folder beside it), or a folder."),
    quantize: bool = typer.Option(False, "--quantize", help="Quantize (with --act-bitwidth/--weights-bitwidth, default 8/8); without it: fp16."),
    calibration_data: Optional[str] = typer.Option(None, "--calibration-data", "--calibration", "-c", help=CALIB_HELP),
    act_bitwidth: Optional[int] = typer.Option(None, "--act-bitwidth", help="8 or 16."),
    weights_bitwidth: Optional[int] = typer.Option(None, "--weights-bitwidth", help="4, 8 or 16."),
    precision: Optional[str] = typer.Option(None, "--precision", "-p", help=PRECISION_HELP + " Overrides the bitwidth flags."),
    fmt: Optional[str] = typer.Option(None, "--format", "-f", help=FORMAT_HELP + " compile-qnn: chosen by OUTPUT's suffix "
                                      "(*.bin → context-binary, *.dlc → dlc) when OUTPUT is a file."),
    backend: str = typer.Option("HTP", "--backend", help="QNN backend: HTP (the only one available here)."),
    device: Optional[List[str]] = typer.Option(None, "--device", "--target", "-t", help="SoC: 'Snapdragon 8 Gen 3', SM8650, 8gen3 ... (repeatable)."),
    input_shape: Optional[List[str]] = typer.Option(None, "--input-shape", help="Fix a dynamic input: NAME=1,3,224,224."),
    vtcm_mb: Optional[str] = typer.Option(None, "--vtcm-mb", help=VTCM_MB_HELP),
    vtcm_size: Optional[str] = typer.Option(None, "--vtcm-size", "--vtcm_size", help=VTCM_SIZE_HELP),
    optimization_level: int = typer.Option(3, "--optimization-level", "-O", help=OPTIMIZATION_LEVEL_HELP),
    strict: bool = typer.Option(False, "--strict", help="Refuse if any node falls back to the CPU."),
    no_cache: bool = typer.Option(False, "--no-cache", help="Bypass the compile cache."),
    force: bool = typer.Option(False, "--force", help="Replace existing outputs."),
    json_out: bool = typer.Option(False, "--json", help="Print the result as JSON."),
) -> None:
    """The seeds' spelling of `compile`: `compile-qnn model.onnx model_ctx.bin --quantize
    --calibration-data list.txt --act-bitwidth 8 --weights-bitwidth 8 --format context-binary
    --backend HTP --device "Snapdragon 8 Gen 3"`. Same code as `compile`.

    OUTPUT names the format by its suffix: *.bin → context-binary (the target's QNN context binary),
    *.dlc → dlc (the QNN IR container the QNN EP writes through libQnnIr.so); the file is written
    with its bundle `<name>.bundle/` beside it. A folder OUTPUT is the bundle itself (--format,
    default context-binary); without OUTPUT the folder is named by model, format, precision and target."""
    from ...qnn import check_backend, plan_output, write_artifact
    from ...core.atomic import check_output
    from ...quant import get_precision, precision_from_bitwidths
    check_backend(backend)
    prec = get_precision(precision).name if precision else precision_from_bitwidths(act_bitwidth, weights_bitwidth, quantize).name
    targets = device or ["SM8650"]
    plan = plan_output(model, output, fmt, prec, targets)
    if plan.file is not None:
        check_output(plan.file, force)
    if not json_out:
        err_console.print(f"format [bold]{plan.format}[/] ({plan.why})", highlight=False)
    bundle = _compile([model], plan.bundle, targets, prec, calibration_data, input_shape, plan.format, _vtcm(vtcm_mb, vtcm_size),
                      optimization_level, strict, no_cache, None, force, json_out)
    written = write_artifact(bundle, plan, force)
    _summary(bundle, json_out, {"format_chosen": {"format": plan.format, "why": plan.why},
                                "also_written": [written] if written else []})
