"""The options of `compile`, one row each, declared once: the Python API's keyword (`modelexport.compile`,
the fields of backends.spec's options types, a sweep matrix's `options:` keys), the CLI's flags,
their help and the `--help` panel they are listed under (by model kind).

The CLI builds `compile`'s parameters from these rows (cli/commands/compile.py) and hands what was
given to the API under the same names; core.spellings renders a fix's setting with the rows' flags.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .formats import FORMATS

# --help panels, in the order `compile --help` lists them
MODEL_AND_TARGET = "Model and target"
QUANTIZATION = "Quantization"
COMPILING = "Compile"
ONNX = "ONNX models"
PYTORCH = "PyTorch models"
LLMS = "LLMs"
VLMS = "VLMs"
OUTPUT = "Output"
PANELS = (MODEL_AND_TARGET, QUANTIZATION, COMPILING, ONNX, PYTORCH, LLMS, VLMS, OUTPUT)

FORMAT_HELP = "; ".join(row.help for row in FORMATS if row.help) + ". Default: the model kind's own."
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


@dataclass(frozen=True)
class CompileFlag:
    name: str                      # the API's keyword; a CLI-only flag (cli=True) is named as the CLI reads it
    flags: tuple[str, ...]         # the CLI's spellings, the first the one a fix names
    type: Any                      # what the CLI parses it as
    default: Any
    help: str
    panel: str
    cli: bool = False              # the CLI's own (--vtcm-size, --no-cache, --dry-run, --json): not an API keyword
    plan: bool = False             # `compile --dry-run` of an LLM plans with it


COMPILE_FLAGS: tuple[CompileFlag, ...] = (
    CompileFlag("target", ("--target", "-t"), list[str] | None, None, "SoC(s) to compile for; repeat or comma-separate for several (`-t SM8650,SM8750`, compiled concurrently). Default: a pipeline's `targets:`, else SM8650.", MODEL_AND_TARGET, plan=True),
    CompileFlag("output_format", ("--format", "-f"), str | None, None, FORMAT_HELP, MODEL_AND_TARGET),
    CompileFlag("input_shapes", ("--input-shape",), list[str] | None, None, "Fix a dynamic input: NAME=1,3,224,224 (repeatable).", MODEL_AND_TARGET),
    CompileFlag("precision", ("--precision", "-p"), str | None, None, PRECISION_HELP + " LLMs: 16a4w_block (default: 4-bit weights in blocks of --block-size 32), 16a4w, 16a8w, 16a16w, 8a8w.", QUANTIZATION, plan=True),
    CompileFlag("calibration", ("--calibration", "-c"), str | None, None, CALIB_HELP + " LLMs: a plain-text file (default: lee_background.cor).", QUANTIZATION, plan=True),
    CompileFlag("overrides", ("--override",), list[str] | None, None, OVERRIDE_HELP, QUANTIZATION, plan=True),
    CompileFlag("block_size", ("--block-size",), int | None, None, "16a4w_block: input channels per weight scale (default 64; 32 for LLMs).", QUANTIZATION, plan=True),
    CompileFlag("vtcm_mb", ("--vtcm-mb",), str | None, None, VTCM_MB_HELP, COMPILING),
    CompileFlag("vtcm_size", ("--vtcm-size", "--vtcm_size"), str | None, None, VTCM_SIZE_HELP, COMPILING, cli=True),
    CompileFlag("optimization_level", ("--optimization-level", "-O"), int, 3, OPTIMIZATION_LEVEL_HELP, COMPILING),
    CompileFlag("strict", ("--strict",), bool, False, "Refuse (exit 3, nothing written) if any node falls back to the CPU.", COMPILING),
    CompileFlag("strict_numerics", ("--strict-numerics",), bool, False, "Refuse (exit 7, nothing written) if compile's own "
                "check of the compiled graph against the float model is below the precision's pass mark "
                "(otherwise a warning). LLMs: the logits on held-out calibration text.", COMPILING),
    CompileFlag("no_cache", ("--no-cache",), bool, False, "Do not reuse or fill the compile cache (MODELEXPORT_CACHE_DIR).", COMPILING, cli=True),
    CompileFlag("jobs", ("--jobs", "-j"), int | None, None, "Parallel compile processes (default: the number of cores).", COMPILING, plan=True),
    CompileFlag("input_values", ("--input-value",), list[str] | None, None, "ONNX: fix an input to a constant, NAME=VALUE "
                "(folds If on it, e.g. sr=16000; recorded in the manifest; repeatable).", ONNX),
    CompileFlag("min_sqnr", ("--min-sqnr",), list[str] | None, None, "The pass mark of compile's own check in dB (default "
                "per precision; LLMs: of the logits). ONNX models with --precision auto: the budget every output "
                "must meet (default 25), or NAME=DB for one output (repeatable).", ONNX),
    CompileFlag("max_drop", ("--max-drop",), float | None, None, "ONNX models, --precision auto: the most the task metric "
                "of --eval-fn may fall below the float model's (e.g. 0.01 of top-1 accuracy).", ONNX),
    CompileFlag("eval_fn", ("--eval-fn",), str | None, None, "ONNX models, --precision auto: FILE.py:FUNCTION, called as "
                "FUNCTION(predict) -> float (higher is better) where predict({input: array}) "
                "returns {output: array}; it runs your evaluation data through the model.", ONNX),
    CompileFlag("calibration_method", ("--calibration-method",), str | None, None, "ONNX models, quantized: how activation "
                "ranges are set from the calibration data: minmax (default: every value "
                "fits) or percentile (each range clipped to the 99.99th percentile of its "
                "values: more steps for the bulk of them at 8 bits). --precision auto tries both.", ONNX),
    CompileFlag("split_weights", ("--split-weights",), bool, False, "ONNX models at 8a8w or 16a8w: each Conv/MatMul/Gemm "
                "weight as two 8-bit halves (the weight on the int8 grid, then what it missed, on a 255 times finer "
                "one): about the precision of 16-bit weights, for a second Conv/MatMul per layer. For a deep network whose "
                "8-bit weight error adds up; --precision auto tries it.", ONNX),
    CompileFlag("rewrites", ("--rewrite",), list[str] | None, None, REWRITE_HELP, PYTORCH),
    CompileFlag("fallback", ("--fallback",), str | None, None, "PyTorch models: where nodes the HTP refuses run: xnnpack (default) or portable.", PYTORCH),
    CompileFlag("variants", ("--variants", "--variant"), list[str] | None, None, "LLMs: the arN decoder graphs sharing one copy of the weights, e.g. ar1,ar32 (default); repeatable (--variant ar1 --variant ar32 is the same); `full` adds the full-context graph: N = --max-seq-len, no KV cache.", LLMS, plan=True),
    CompileFlag("max_seq_len", ("--max-seq-len",), int | None, None, "LLMs: the context (KV cache + chunk) of every graph (default 512).", LLMS, plan=True),
    CompileFlag("context_lengths", ("--context-lengths",), str | None, None, "LLMs: graphs for several context lengths over "
                "one copy of the weights, shortest first, e.g. 512,1024,2048 (the longest is the context: "
                "--max-seq-len may be left out). A dialog runs on the shortest length its position fits and moves "
                "to a longer one as it grows, with the same KV cache.", LLMS, plan=True),
    CompileFlag("context_limit_mb", ("--context-limit-mb",), float | None, None, "LLMs: per-context HTP memory limit; above it the decoder is split by layers into parts (default 2048).", LLMS, plan=True),
    CompileFlag("host_chunk_mb", ("--host-chunk-mb",), float | None, None, "LLMs: float32 weights exported and quantized at a time "
                "on this machine (default 256; one layer is the least); lower it when memory is short. "
                "The HTP still gets one graph per part.", LLMS, plan=True),
    CompileFlag("calibration_samples", ("--calibration-samples",), int | None, None, "LLMs: calibration samples per variant, cut from the calibration text (default 8).", LLMS, plan=True),
    CompileFlag("rounding", ("--rounding",), str | None, None, "LLMs, 4-bit weights: nearest, imatrix, seqmse, gptq or "
                "seqmse-gptq (default gptq: scales weighted by the calibration activations, each weight's "
                "rounding error compensated on them; nearest needs no calibration text).", LLMS, plan=True),
    CompileFlag("max_ppl_ratio", ("--max-ppl-ratio",), float | None, None, "LLMs, 4-bit weights: raise the fewest modules to 8-bit "
                "weights until perplexity on held-out text is within this x float (e.g. 1.05); "
                "the overrides chosen are recorded and printed.", LLMS, plan=True),
    CompileFlag("inputs", ("--inputs",), str | None, None, "LLMs: the decoder's first input: tokens (default: input_ids), "
                "embeddings (inputs_embeds [1, N, hidden]; the bundle gets an embedder part that looks "
                "text up) or both (ids looked up + inputs_embeds added; an id >= vocab_size looks nothing up).", LLMS, plan=True),
    CompileFlag("positions", ("--positions",), str | None, None, "LLMs: how the graphs take positions: ids (default: "
                "position_ids, each graph gathers its RoPE rows) or cos-sin (position_ids_cos / _sin [1, 1, N, rotary_dim/2], "
                "as AI Hub's and GenieX's graphs take them; Genie computes them; not for qnn_llama_runner's program).",
                LLMS, plan=True),
    CompileFlag("geniex", ("--geniex",), bool, False, "LLMs, --positions cos-sin: also write OUT/<target>/geniex/, the "
                "folder Qualcomm's GenieX loads (the binaries with their graphs renamed, metadata.json, config, tokenizer).",
                LLMS),
    CompileFlag("embedder_precision", ("--embedder-precision",), str | None, None, "LLMs, --inputs embeddings: the "
                "embedder's table: fp16 (default) or 8bit (one scale per table).", LLMS, plan=True),
    CompileFlag("executorch_program", ("--executorch-program",), bool, False, "LLMs (context binaries): also write, per "
                "target, the ExecuTorch program qnn_llama_runner runs (kv_forward + prefill_forward over the bundle's own "
                "weight-shared binaries), checked by driving its host twin as that runner does. Same as --format pte.", LLMS),
    CompileFlag("lora", ("--lora",), list[str] | None, None, "LLMs (Hugging Face folders): a PEFT LoRA adapter folder "
                "(adapter_config.json + adapter_model.safetensors); repeatable. The base is compiled once with the "
                "adapters' A and B as graph inputs; `generate --lora NAME` applies one at run time, another adapter "
                "of the same modules and at most the largest rank given needs no recompile.", LLMS, plan=True),
    CompileFlag("dry_run", ("--dry-run",), bool, False, "LLMs: print the plan (parts) and the estimated peak host memory and disk, "
                "checked against this machine; loads no weights, writes nothing.", LLMS, cli=True),
    CompileFlag("vision_precision", ("--vision-precision",), str | None, None, "Vision-language models: "
                "the vision part's precision: 16a8w (default), 8a8w (smaller) or fp16 "
                "(an encoder that 8-bit weights hurt, e.g. a CNN trunk).", VLMS, plan=True),
    CompileFlag("image_size", ("--image-size",), int | None, None, "Vision-language folders: the square (pixels) the vision "
                "part is built for. Qwen2-VL: a multiple of 28 within the preprocessor's min/max_pixels "
                "(Qwen2.5-VL: of 112, whole attention windows); "
                "default the largest whose image tokens take at most half of --max-seq-len. "
                "Idefics3 / LLaVA: fixed by vision_config.image_size. "
                "--vision-encoder: the square a dynamic-size encoder is compiled for.", VLMS, plan=True),
    CompileFlag("vision_encoder", ("--vision-encoder",), Path | None, None, "LLMs: your own vision encoder as ONNX "
                "(one image [1, 3, S, S] in, rows [1, N, hidden] out, its projector "
                "inside, hidden = the text model's) makes a vision-language bundle with "
                "the text model: generate --image puts the N rows at the prompt's "
                "--image-token places. Needs --image-token.", VLMS, plan=True),
    CompileFlag("image_token", ("--image-token",), str | None, None, "--vision-encoder: the token (a special or "
                "reserved token of the tokenizer, or its id) whose places in the prompt "
                "the image's rows take; N of them are put before the text.", VLMS, plan=True),
    CompileFlag("image_mean", ("--image-mean",), str | None, None, "--vision-encoder: R,G,B mean the pixels (0-1) are "
                "normalized with (default ImageNet's 0.485,0.456,0.406). ONNX models calibrated on "
                "a folder of photos: the same, default 0 (pixels 0-1 as they are).", VLMS, plan=True),
    CompileFlag("image_std", ("--image-std",), str | None, None, "--vision-encoder: R,G,B std (default ImageNet's "
                "0.229,0.224,0.225), or one number for every channel. ONNX models calibrated on photos: default 1 "
                "(0.00392157 gives a model trained on 0-255 pixels its range).", VLMS, plan=True),
    CompileFlag("image_bgr", ("--image-bgr",), bool, False, "ONNX models calibrated on a folder of photos: give the "
                "model B, G, R channels (models trained on OpenCV-read images: PaddleOCR, Caffe, many detectors); "
                "--image-mean / --image-std are then in B, G, R order too.", ONNX),
    CompileFlag("output", ("--output", "-o"), Path | None, None, "The bundle folder to write (required unless --dry-run).", OUTPUT),
    CompileFlag("force", ("--force",), bool, False, "Replace an existing output.", OUTPUT),
    CompileFlag("json_out", ("--json",), bool, False, "Print the result as JSON.", OUTPUT, cli=True),
)
FLAG_OF: dict[str, CompileFlag] = {f.name: f for f in COMPILE_FLAGS}
