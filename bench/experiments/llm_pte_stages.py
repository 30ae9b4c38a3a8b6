"""Where the time of `compile --format pte` goes: SmolLM2-135M (the Q4_1 GGUF) cut to its first N
layers, every stage of `backends/llm_pte/compile.py` timed on its own (wall and CPU seconds, RSS):
export + QnnQuantizer prepare / calibrate / convert per method, each lowering (weight-shared and
host twin) split into the QNN export passes, to_edge + partition + QnnBackend preprocess, and
to_executorch, then the numerics check on the twin.
usage: python bench/experiments/llm_pte_stages.py --layers 2 [--layers 4 ...] [--mode before|after] [--samples 8] [--profile STAGE]
Writes bench/results/llm_pte_stages.json (merged per layer count)."""
from __future__ import annotations

import argparse
import json
import os
import resource
import time
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]    # bench/
RESULT = ROOT / "results" / "llm_pte_stages.json"
PROFILE: dict = {}     # {"stage": substring of the stage names to cProfile}
SPLIT_ROPE = {"on": True}   # --rope-one-gather: the RoPE lookup as one gather (before the split)
MATMUL_8BIT = {"kind": None}  # --matmul-8bit sym|asym: attention's MatMuls take their second input at 8 bits


def attention_matmuls_8bit(gm) -> None:
    """A QnnQuantizer custom annotation (tried, not adopted): the second input of attention's two
    MatMuls (keys, values) at 8 bits, as the HTP takes it (bench/experiments/htp_matmul_precision.py); `sym`:
    ExecuTorch's `custom_annotate_matmul_16a8w` spec (uint8 symmetric, min-max), `asym`: uint8 affine."""
    import torch
    from executorch.backends.qualcomm.quantizer.qconfig import get_8a8w_qnn_ptq_config, get_16a8w_qnn_ptq_config
    from executorch.backends.qualcomm.quantizer.rules import Q_ANNOTATION_KEY
    from torchao.quantization.pt2e import MinMaxObserver

    from modelexport.frontends.module_paths import fx_module_path
    spec = (get_16a8w_qnn_ptq_config().weight if MATMUL_8BIT["kind"] == "sym" else
            get_8a8w_qnn_ptq_config(act_observer=MinMaxObserver).input_activation)
    for node in gm.graph.nodes:
        ann = node.meta.get(Q_ANNOTATION_KEY)
        if node.target == torch.ops.aten.matmul.default and ann is not None and \
                (fx_module_path(node) or "").endswith(".self_attn.core"):
            ann.input_qspec_map[node.args[1]] = spec


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


@contextmanager
def timed(rows: dict, name: str):
    prof, profile = None, PROFILE.get("stage")
    if profile and profile in name:
        import cProfile
        prof = cProfile.Profile()
        prof.enable()
    w, c = time.perf_counter(), time.process_time()
    yield
    rows[name] = {"wall_s": round(time.perf_counter() - w, 2), "cpu_s": round(time.process_time() - c, 2),
                  "peak_rss_mb": round(_rss_mb(), 1)}
    if prof is not None:
        import pstats
        prof.disable()
        path = Path("/tmp") / f"llm_pte_stages_{''.join(c if c.isalnum() else '_' for c in name)}.prof.txt"
        with open(path, "w") as f:
            pstats.Stats(prof, stream=f).sort_stats("cumulative").print_stats(60)
            pstats.Stats(prof, stream=f).sort_stats("tottime").print_stats(40)
    print(f"{name}: {rows[name]}", flush=True)


def cut_model(n_layers: int):
    from modelexport.frontends.gguf_file import load_gguf_causal_lm
    from modelexport.zoo.assets import asset_path
    llm = load_gguf_causal_lm(asset_path("smollm2_gguf"))
    model = llm.model
    model.model.layers = model.model.layers[:n_layers]
    model.config.num_hidden_layers = n_layers
    if getattr(model.config, "layer_types", None):
        model.config.layer_types = model.config.layer_types[:n_layers]
    return llm


def run(n_layers: int, n_samples: int, variants: list[int], seq: int, profile: str | None, lower_mode: str) -> dict:
    import torch

    from modelexport.backends.executorch_qnn.specs import qnn_ready
    from modelexport.backends.llm_pte import compile as pc
    from modelexport.backends.llm_qnn.calibration import calibration_samples
    from modelexport.core.targets import get_target
    from modelexport.llm.model.pte_methods import constant_methods, method_name
    from modelexport.llm.model.static_decoder import StaticDecoderConfig, build_static_decoder, split_rope_lookups
    from modelexport.llm.run.text import read_text, tokenize
    from modelexport.llm.run.tokenizers import from_transformers
    from modelexport.quant import llm_pt2e
    from modelexport.quant.llm_pt2e import llm_quant_plan
    rows: dict = {}
    soc = get_target("SM8650")
    with timed(rows, "load"):
        llm = cut_model(n_layers)
        tok = from_transformers(llm.tokenizer, chat_template=llm.chat_template, eos_ids=llm.eos_token_ids())
        qnn_ready()
    plan = llm_quant_plan("16a4w_block", None, None)
    text = read_text(None)
    kv: dict = {}
    with timed(rows, "calibration (float decoder)"):
        samples = calibration_samples(llm.model, tokenize(tok, text.text, seq * (n_samples + 2)), variants, seq,
                                      n_samples, kv)
    decs = {method_name(n): build_static_decoder(llm.model, StaticDecoderConfig(n, seq)) for n in variants}
    if SPLIT_ROPE["on"]:
        for d in decs.values():
            split_rope_lookups(d, llm_pt2e.MAX_ROPE_GATHER)
    # quantize_methods, stage by stage
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    from modelexport.quant.pt2e_qnn import build_quantizer
    graphs, inputs = {}, {}
    for m, dec in decs.items():
        names_in, names_out = dec.input_names(), dec.output_names()
        inputs[m] = dec.example_inputs()
        with timed(rows, f"{m} export"):
            ep = torch.export.export(dec, inputs[m], strict=True)
        with timed(rows, f"{m} prepare"):
            quantizer = build_quantizer(plan, soc)
            if MATMUL_8BIT["kind"]:
                quantizer.add_custom_quant_annotations((attention_matmuls_8bit,))
            prepared = prepare_pt2e(ep.module(), quantizer)
        calib = [tuple(torch.from_numpy(s[k]) for k in names_in) for s in samples[dec.cfg.n_tokens]]
        with timed(rows, f"{m} calibrate ({len(calib)} samples)"), torch.no_grad():
            for s in calib:
                prepared(*s)
        llm_pt2e.tie_kv_ranges(prepared, dec.spec.n_layers, kv, names_in, names_out)
        with timed(rows, f"{m} convert"):
            graphs[m] = convert_pt2e(prepared)
    spec = decs[method_name(1)].spec
    consts = constant_methods(spec, seq, max(variants), tok.bos_id, bool(tok.add_bos), list(tok.eos_ids))
    programs = {}
    if lower_mode == "before":      # each program lowered on its own, start to end (the code before the fix)
        for shared in (True, False):
            label = "shared" if shared else "twin"
            with timed(rows, f"lower {label} (all)"):
                programs[label] = lower_detailed(graphs, inputs, soc, shared, consts, plan.uses_block, rows, label)
            rows[f"lower {label} (all)"]["bytes"] = len(programs[label])
    else:                           # backends/llm_pte/compile.py as it is: one to_edge, two partition + preprocess
        if lower_mode == "after-keep-provenance":
            pc._drop_provenance = lambda gm: None
        if lower_mode == "after-no-edge-cuts":     # strict re-export, provenance dropped once (the code before)
            pc.EDGE_CUTS["on"] = False
        steps: dict = {}
        with timed(rows, "lower both (all)"):
            programs = pc.lower_methods(graphs, inputs, soc, consts, plan.uses_block, steps)
        rows["lower both (all)"].update({"steps_wall_s": steps, "bytes": {k: len(v) for k, v in programs.items()}})
    from modelexport.llm.model.pte_methods import pte_records
    info = {k: pc.read_program(v, list(graphs)) for k, v in programs.items()}   # both methods, one binary each
    ws, _ = pte_records("a.pte", "b.pte", info["shared"], info["twin"], len(programs["shared"]),
                        len(programs["twin"]), {}, consts, {}, {}, {})       # raises unless the weights are shared
    sizes = {"pte_bytes": {k: len(v) for k, v in programs.items()}, "shared_weights_bytes": ws.shared_weights_bytes,
             "binary_bytes": ws.bytes, "twin_binary_bytes": ws.unshared_twins_bytes}
    with timed(rows, "numerics (twin on the simulator, fake-quant, float)"):
        from modelexport.backends.llm_pte.session import load_program
        decoders = {m: (d, samples[d.cfg.n_tokens][0]) for m, d in decs.items()}
        numerics = pc._numerics(load_program(programs["twin"]), graphs, decoders)
    return {"n_layers": n_layers, "samples": n_samples, "lower_mode": lower_mode, "stages": rows, "sizes": sizes,
            "numerics": {m: {k: round(v.sqnr_db, 2) for k, v in d.items()} for m, d in numerics.items()},
            "load_avg_at_end": os.getloadavg()}


def lower_detailed(graphs, inputs, soc, shared, consts, block_wise, rows, label) -> bytes:
    """to_edge_transform_and_lower_to_qnn, unrolled to time its parts (same calls, same order)."""
    import torch
    from executorch.backends.qualcomm._passes.qnn_pass_manager import (
        get_qnn_pass_manager_cls,
    )
    from executorch.backends.qualcomm.partition.qnn_partitioner import QnnPartitioner
    from executorch.backends.qualcomm.serialization.qc_schema_serialize import (
        flatbuffer_to_option,
    )
    from executorch.backends.qualcomm.utils.qnn_manager_lifecycle import (
        QnnManagerContext,
    )
    from executorch.backends.qualcomm.utils.utils import qnn_edge_config
    from executorch.exir import ExecutorchBackendConfig, to_edge_transform_and_lower

    from modelexport.backends.executorch_qnn.lower import SEGMENT_ALIGNMENT
    from modelexport.backends.executorch_qnn.specs import compile_specs
    specs = compile_specs(soc, use_fp16=False, weight_sharing=shared)
    backend_type = flatbuffer_to_option(specs[0].value).backend_options.backend_type
    aten, passes = {}, {}
    with timed(rows, f"lower {label}: export + QNN export passes"):
        for m, gm in graphs.items():
            ep = torch.export.export(gm, inputs[m], strict=True)
            pm = get_qnn_pass_manager_cls(backend_type)()
            aten[m] = pm.transform_for_export_pipeline(ep)
            passes[m] = pm.get_to_edge_transform_passes(ep, compiler_specs=specs, convert_linear_to_conv2d=block_wise)
    with timed(rows, f"lower {label}: to_edge + partition + QnnBackend preprocess"), \
            QnnManagerContext(dict.fromkeys(graphs, specs)):
        edge = to_edge_transform_and_lower(aten, transform_passes=passes,
                                           partitioner={m: [QnnPartitioner(specs)] for m in graphs},
                                           constant_methods=consts, compile_config=qnn_edge_config())
    with timed(rows, f"lower {label}: to_executorch"):
        program = edge.to_executorch(ExecutorchBackendConfig(extract_delegate_segments=True,
                                                             segment_alignment=SEGMENT_ALIGNMENT))
        data = program.buffer
    return data


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, action="append", required=True)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--prefill", type=int, default=32)
    ap.add_argument("--profile", default=None, help="cProfile the stages whose name contains this")
    ap.add_argument("--mode", default="after", choices=("before", "after", "after-keep-provenance", "after-no-edge-cuts"))
    ap.add_argument("--tag", default="")
    ap.add_argument("--rope-one-gather", action="store_true", help="one RoPE-table gather per method (before the split)")
    ap.add_argument("--matmul-8bit", choices=("sym", "asym"), default=None,
                    help="attention's MatMuls with their second input at 8 bits (default: 16x16, as compile does)")
    a = ap.parse_args()
    PROFILE["stage"] = a.profile
    SPLIT_ROPE["on"] = not a.rope_one_gather
    MATMUL_8BIT["kind"] = a.matmul_8bit
    for n in a.layers:
        r = run(n, a.samples, [1, a.prefill], a.seq, a.profile, a.mode)
        r["host"] = {"cpus": os.cpu_count(), "load_avg_at_end": [round(x, 2) for x in os.getloadavg()]}
        r["attention_matmuls"] = f"second input 8-bit ({a.matmul_8bit})" if a.matmul_8bit else "16x16"
        results = json.loads(RESULT.read_text()) if RESULT.is_file() else {}    # read late: runs may overlap
        results[f"{n}_layers_{a.mode}{('_' + a.tag) if a.tag else ''}"] = r
        RESULT.parent.mkdir(exist_ok=True)
        RESULT.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
