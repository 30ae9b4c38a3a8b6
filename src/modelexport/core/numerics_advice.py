"""What verify says beside its numbers: warnings about what the numbers can mean, and the fix
for a failure that fits the precision (calibration and more bits mean nothing for fp16).
Duck-typed over the verify report (backends/ort_qnn/verify.py: GraphCheck, OutputCheck)."""
from __future__ import annotations

from typing import Any

# An output is "nearly constant" when its spread is below this share of its largest value, or when
# every value is below it (a detector's scores on noise): SQNR then divides by a tiny signal and
# measures the compiled graph's noise floor, not the model.
NEAR_CONSTANT = 1e-2


def near_constant(o) -> bool:
    if o.ref_std is None or o.ref_abs_max is None:
        return False
    return o.ref_std <= NEAR_CONSTANT * o.ref_abs_max or o.ref_abs_max < NEAR_CONSTANT


def graph_warnings(g) -> list[str]:
    out = []
    random = "random" in (g.inputs_kind or "")
    for o in g.outputs:
        if getattr(o, "note", None):
            out.append(f"{g.part}:{o.name}: {o.note}")
        if random and near_constant(o):
            out.append(f"{g.part}:{o.name}: the float output is nearly constant on these random inputs (std "
                       f"{o.ref_std:.3g}, max |x| {o.ref_abs_max:.3g}), so its SQNR measures noise, not the model: "
                       "verify on real data with --input FILE (.npy per input, or one .npz)")
        if o.cosine is None:
            out.append(f"{g.part}:{o.name}: a single value: cosine is not defined (n/a); SQNR is its relative error")
    return out


def failure_fix(report, quantized: bool, hint: str | None = None) -> str:
    """The fix for a failed verify: real inputs first when the samples were random, then what
    the precision allows (`quantized`: some failing graph is quantized)."""
    bad = [g for g in report.graphs if not g.passed]
    return numerics_fix(quantized, any("random" in (g.inputs_kind or "") for g in bad), hint)


def numerics_fix(quantized: bool, random_inputs: bool, hint: str | None = None) -> str:
    """What to do about numbers below the pass mark, for verify and compile's own check."""
    parts = []
    if random_inputs:
        parts.append("verify on real inputs (modelexport verify BUNDLE --input FILE): these samples are random")
    if hint:
        parts.append(f"recompile with {hint} (from --per-layer)")
    if quantized:
        parts.append("calibrate on representative data (compile --calibration DIR), use a wider precision "
                     "(--precision 16a8w), find the layer that loses most with verify --per-layer, or set --min-sqnr")
    else:
        parts.append("fp16 has no calibration: check that the float model's values fit fp16 (|x| < 65504; values "
                     "below 6e-5 lose precision) and scale them in the model if not; if the numbers are acceptable "
                     "for this model, verify with a lower pass mark (modelexport verify BUNDLE --min-sqnr DB)")
    return "; ".join(parts)


def numerics_failures(numerics: dict) -> list[str]:
    """`output_0 -77.0 dB < 30` for each output of compile's own check below its pass mark."""
    return [f"{o['name']} {o['sqnr_db'] if o['sqnr_db'] is not None else float('-inf'):.1f} dB < "
            f"{numerics.get('threshold_db', 0):g}" for o in numerics.get("outputs", [])
            if o.get("sqnr_db") is None or o["sqnr_db"] < numerics.get("threshold_db", 0)]


def numerics_line(num: dict[str, Any]) -> str:
    """One line for the user: the outputs' dB against the pass mark, and where and why it falls."""
    if num.get("kind") == "llm":
        return _llm_line(num)
    if num.get("run_error") and num.get("run_error_on") == "cpu":
        return (f"{num.get('part')}@{num.get('target')}: the float model itself fails on these samples on the CPU "
                f"({num['run_error']})")
    if num.get("run_error"):
        return (f"{num.get('part')}@{num.get('target')}: the compiled graph fails to run on the HTP simulator "
                f"({num['run_error']})")
    outs = num.get("outputs", [])
    worst = min(outs, key=lambda o: o["sqnr_db"] if o["sqnr_db"] is not None else float("-inf"), default=None)
    if worst is None:
        return "no outputs to compare"
    head = (f"{num.get('part')}@{num.get('target')}: worst output {worst['name']} {_db(worst['sqnr_db'])} dB "
            f"(pass mark {num.get('threshold_db'):g}, {num.get('samples')} {num.get('inputs')} sample(s)"
            + (f"; {num['samples_left_for_time']} more left out: each takes minutes on the simulator, "
               "`modelexport verify BUNDLE` runs them all" if num.get("samples_left_for_time") else "") + ")")
    if not num.get("passed") and num.get("input_floor_db") is not None:
        return (f"{head}; the float model alone falls to {_db(num['input_floor_db'])} dB when only its inputs are "
                "rounded to float16 (on the CPU, nothing compiled): no compile can pass this mark on these inputs")
    bad = num.get("first_bad_layer")
    if num.get("passed") or not bad:
        return head
    if "error" in bad:
        return f"{head}; {bad['error']}"
    where = f"; first layer below it: {bad['layer']} ({bad['op_type']}, {_db(bad['sqnr_db'])} dB against {bad['measured_against']})"
    return head + where + (f": {bad['cause']}" if bad.get("cause") else "")


RECENT_OPSET = 17     # the QNN EP's op builders follow the recent opsets; older forms are where they slip
MILD_DB = 10.0        # an fp16 departure this close to the pass mark is rounding, not a different computation


TOP1_NOTE = 0.5      # an LLM whose compiled logits keep float's top-1 token less often than this: said, even above the mark
# an LLM's next precision up when quantization loses the logits (its 4-bit weights first)
LLM_WIDER = {"16a4w_block": "16a8w", "16a4w": "16a8w", "8a8w": "16a8w", "16a8w": "16a16w"}


# compiled vs QDQ within this many dB of QDQ vs float: the compile's departure is as large as quantization's
BOTH_SIDES_DB = 3.0


def _llm_line(num: dict[str, Any]) -> str:
    """An LLM bundle's check (backends/llm_qnn/self_check.py): its logits against float, and which side
    loses them when they fall below the mark."""
    if num.get("run_error"):
        return (f"{num.get('part')}@{num.get('target')}: the compiled graphs fail to run on the HTP simulator "
                f"({num['run_error']})")
    o, mark = num["outputs"][0], num.get("threshold_db")
    head = (f"{num.get('part')}@{num.get('target')}: logits {_db(o['sqnr_db'])} dB against float, the same top-1 token "
            f"on {o['argmax_agreement']:.0%} of {num.get('samples')} {num.get('inputs')}s (pass mark {mark:g} dB; "
            f"graphs {', '.join(num.get('calls', []))})")
    fq = num.get("fake_quant")
    if num.get("passed") and o.get("argmax_agreement", 1.0) < TOP1_NOTE:
        return (f"{head}; the float model's next token is kept on fewer than half of them: generated text will "
                "often differ from the float model's (eval BUNDLE measures perplexity)")
    if num.get("passed") or fq is None:
        return head
    apart = num.get("compiled_vs_fake_quant_db")
    if fq.get("sqnr_db") is None or fq["sqnr_db"] < mark:
        if apart is not None and fq.get("sqnr_db") is not None and apart < fq["sqnr_db"] + BOTH_SIDES_DB:
            return (f"{head}; the quantized (QDQ) graphs on the CPU are at {_db(fq['sqnr_db'])} dB and the compiled "
                    f"graphs depart from them nearly as far ({_db(apart)} dB apart): quantization and the compile both lose it")
        return (f"{head}; the quantized (QDQ) graphs on the CPU are at {_db(fq.get('sqnr_db'))} dB too: quantization "
                "loses it, not the compile")
    return (f"{head}; the quantized (QDQ) graphs on the CPU are at {_db(fq['sqnr_db'])} dB: the compiled graphs depart "
            f"from them ({_db(num.get('compiled_vs_fake_quant_db'))} dB apart)")


def _llm_fix(num: dict[str, Any]) -> str:
    if num.get("run_error"):
        return ("check the quantized graphs alone with modelexport eval BUNDLE --stages float,fake-quant, and report "
                "the simulator's error with the manifest")
    fq = num.get("fake_quant") or {}
    if fq and fq.get("sqnr_db") is not None and fq["sqnr_db"] >= num.get("threshold_db", 0):
        return ("the compiled graphs compute something other than their quantized model: measure it on more text "
                "with modelexport eval BUNDLE --stages fake-quant,htp-sim, and report it with the manifest")
    wider = LLM_WIDER.get(str(num.get("precision")))
    return ((f"compile at a wider precision (--precision {wider}), " if wider else "")
            + "let compile raise the modules that lose most (--max-ppl-ratio 1.05, with 4-bit weights), or find the module "
              "where the logits fall with modelexport verify BUNDLE --per-layer and give it --override 'MODULE=16a8w'")


def numerics_fix_for(num: dict[str, Any], quantized: bool) -> str:
    """The fix that fits what the localisation found."""
    if num.get("kind") == "llm":
        return _llm_fix(num)
    bad = num.get("first_bad_layer") or {}
    random = "random" in str(num.get("inputs", ""))
    if num.get("run_error") and num.get("run_error_on") == "cpu":
        return ("give the model inputs it accepts, most often ids inside the table they index: "
                + ("these samples are random: compile with real inputs (--calibration DIR), or fix such inputs "
                   "with --input-value NAME=VALUE" if random else "check the samples' index-like inputs against "
                   "the tables they index"))
    if num.get("run_error"):
        return ("the HTP stops on an input the CPU takes, most often an index past its table (a float input cast "
                "to an index takes any value when random): "
                + ("these samples are random: compile with real inputs (--calibration DIR), or fix such inputs "
                   "with --input-value NAME=VALUE" if random else "check the samples' index-like inputs against "
                   "the tables they index"))
    if num.get("input_floor_db") is not None:
        return ("check on inputs the model really runs on (compile --calibration DIR, verify BUNDLE --input FILE)"
                + (": these samples are random" if random else "") + "; if it is as sensitive on those, no NPU "
                "precision holds it (the HTP takes float16 inputs at best): accept the lower mark (verify --min-sqnr "
                "DB) or run the model on the CPU")
    if bad.get("htp_departure") and quantized:
        return (f"the HTP computes {bad.get('op_type')} at {bad.get('node')} differently from ONNX Runtime on the CPU "
                "(the same graph matches the float model there): compile at --precision fp16, which does not quantize it")
    mark = num.get("threshold_db")
    if bad.get("htp_departure") and mark is not None and (bad.get("sqnr_db") or float("-inf")) >= mark - MILD_DB:
        return (f"the HTP's float16 arithmetic falls just below the mark at {bad.get('node')} "
                f"({_db(bad.get('sqnr_db'))} dB against the same graph on the CPU), a rounding loss rather than a "
                "different computation: "
                + ("these samples are random, verify on real inputs (modelexport verify BUNDLE --input FILE); "
                   if random else "")
                + "if the outputs serve their purpose, verify with a lower pass mark (modelexport verify BUNDLE "
                  "--min-sqnr DB)")
    if bad.get("htp_departure"):
        old = bad.get("opset") is not None and bad["opset"] < RECENT_OPSET
        return (f"the HTP computes {bad.get('op_type')} at {bad.get('node')} differently from ONNX Runtime on the CPU "
                "(the same fp16 graph matches the float model there): "
                + (f"the model is at opset {bad['opset']}: convert it (onnx.version_converter.convert_version(model, "
                   f"{RECENT_OPSET})) or re-export it at opset {RECENT_OPSET} or later, and compile again; if it still "
                   "departs, " if old else "")
                + "run that node on the CPU: split the model at its input with onnx.utils.extract_model and compile "
                  "the part before it")
    if quantized:
        return numerics_fix(True, random, bad.get("suggested_override"))
    cause = bad.get("cause") or ""
    if "past float16's largest" in cause:
        return ("compile at --precision 16a16w (calibrated 16-bit activations carry this range), or scale the values "
                f"down in the model before {bad.get('layer')}")
    if "below float16's smallest" in cause and random and bad.get("op_type") == "Log":
        return ("compile with real inputs (--calibration DIR): from their ranges an fp16 compile scales the power "
                f"that {bad.get('layer')} reads into float16's range (the log-power-scale repair); random samples say "
                "nothing of those ranges")
    if "below float16's smallest" in cause:
        return (f"the values feeding {bad.get('layer')} span more than float16 holds, and no 8- or 16-bit integer "
                "precision holds them either (16a16w measured lower still on a log-power front end): run the layers "
                "up to it on the CPU and compile the rest, split at its output with onnx.utils.extract_model(MODEL, "
                f"'rest.onnx', [{bad.get('tensor') or 'ITS_OUTPUT'!r}, *THE_MODEL_INPUTS], OUTPUTS)")
    return numerics_fix(False, random)


def _db(v) -> str:
    return "-inf" if v is None or v == float("-inf") else ("inf" if v == float("inf") else f"{v:.1f}")
