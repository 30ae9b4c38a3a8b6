"""The embedder part of `compile LLM --inputs embeddings` on the real SmolLM2-135M-Instruct (Q4_1
GGUF): each precision of EMBEDDER_PRECISIONS exported for ar1 + ar32 (context 512), compiled for
SM8650 into one weight-shared binary (the table once) and an unshared twin per graph, the ar32 twin
run on the x86 HTP simulator on real text (lee_background.cor) against the float lookup.

Writes bench/results/llm_embedder.json: per precision the device binary's bytes, the twins' bytes,
the simulator's SQNR and max abs error against float, and the same on the ONNX graph on the CPU
(what the quantization alone does). The host load is recorded (timings are not the point here).
"""
from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]    # bench/
RESULT = ROOT / "results" / "llm_embedder.json"
VARIANTS = [32, 1]
SEQ = 512


def main() -> None:
    import numpy as np
    import onnxruntime as ort

    from modelexport.backends.llm_qnn.compile import _embedder_jobs
    from modelexport.backends.llm_qnn.embedder import EMBEDDER_PRECISIONS, build_embedders, embedder_check
    from modelexport.core.cache import Cache
    from modelexport.core.numerics import compare
    from modelexport.core.targets import get_target
    from modelexport.frontends import find_frontend
    from modelexport.llm.run.text import read_text, tokenize
    from modelexport.llm.run.tokenizers import from_transformers
    from modelexport.toolchain.htp_options import compile_provider_options
    from modelexport.toolchain.qairt import find_qairt
    from modelexport.toolchain.worker_pool import raise_first_error, run_jobs
    from modelexport.zoo.assets import asset_path

    load = [os.getloadavg()[0]]
    gguf = asset_path("smollm2_gguf")
    llm = find_frontend(str(gguf)).load(str(gguf))
    text = read_text(None)
    ids = tokenize(from_transformers(llm.tokenizer), text.text, 4096)
    soc = get_target("SM8650")
    popts = compile_provider_options(soc, None, 3)
    qairt = find_qairt()
    out = {"model": str(gguf), "target": soc.name, "variants": [f"ar{n}" for n in VARIANTS], "max_seq_len": SEQ,
           "text": text.path.name, "table": list(llm.model.model.embed_tokens.weight.shape), "precisions": {}}
    with tempfile.TemporaryDirectory(prefix="mx-embedder-") as tmp:
        cache = Cache(Path(tmp) / "cache", enabled=True)
        for name in EMBEDDER_PRECISIONS:
            entry = Path(tmp) / name
            t0 = time.perf_counter()
            rec = build_embedders(llm.model, VARIANTS, SEQ, ids, name, entry / "embedder", entry / "float", str(text.path))
            export_s = time.perf_counter() - t0
            jobs = _embedder_jobs(rec, entry, soc, popts, qairt, cache)
            t0 = time.perf_counter()
            results = raise_first_error(run_jobs("the embedder compile", jobs, 2))
            compile_s = time.perf_counter() - t0
            shared = next(r for (_, j), r in zip(jobs, results) if j["kind"] == "shared")
            twins = {j["graph"]: r for (_, j), r in zip(jobs, results) if j["kind"] == "twin"}
            big = f"embed_ar{max(VARIANTS)}_cl{SEQ}"
            twin = twins[big]
            [check] = raise_first_error(run_jobs("the embedder check", [(embedder_check, {
                "check": str(entry / rec["check"]), "soc_model": soc.soc_model,
                "epcontext": str(Path(twin["entry"]) / twin["meta"]["files"]["epcontext"])})], 1))
            data = np.load(entry / rec["check"])
            so = ort.SessionOptions()
            so.log_severity_level = 3
            cpu = ort.InferenceSession(str(entry / "embedder" / f"{big}.onnx"), so,
                                       providers=["CPUExecutionProvider"]).run(None, {"input_ids": data["ids"]})[0]
            c = compare(data["ref"], cpu)
            out["precisions"][name] = {
                "what": EMBEDDER_PRECISIONS[name].what,
                "device_binary_bytes": (Path(shared["entry"]) / shared["meta"]["context_binary"]).stat().st_size,
                "twin_bytes": {g: (Path(r["entry"]) / r["meta"]["files"]["context_binary"]).stat().st_size
                               for g, r in twins.items()},
                "simulator_vs_float": check,
                "onnx_on_cpu_vs_float": {"sqnr_db": _db(c["sqnr_db"]),
                                         "max_abs_error": float(np.abs(data["ref"] - cpu).max())},
                "export_s": round(export_s, 1), "compile_s": round(compile_s, 1)}
            load.append(os.getloadavg()[0])
            print(name, json.dumps(out["precisions"][name]), flush=True)
    out["load_1min"] = load
    RESULT.write_text(json.dumps(out, indent=1))
    print(f"wrote {RESULT}")


def _db(x: float) -> float | str:
    """dB for JSON: an exact match (no error at all) is "exact", not Infinity."""
    import math
    return round(float(x), 2) if math.isfinite(x) else "exact"


if __name__ == "__main__":
    main()
