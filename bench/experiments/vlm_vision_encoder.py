"""A new user's VLM from their own vision encoder at full size: the real SmolLM2-135M GGUF (all 30 layers,
the compile's defaults: 16a4w_block, ar1 + ar32, C = 512, SM8650) with the real ImageNet MobileNetV2 trunk
as the encoder (49 rows through a seeded random projector to 576; `zoo.mobilenet_v2.MobileNetRows`), run
as the CLI runs, cold cache. Then the same with `--vision-precision fp16` (the text part cached), `verify`
of the vision part, and `generate --image` on the CPU (QDQ) and on the simulator (1 token).

    .venv/bin/python bench/experiments/vlm_vision_encoder.py     # → bench/results/vlm_vision_encoder.json (quiet host)
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # bench/: the sibling cli_measure.py
from cli_measure import measured_cli  # noqa: E402

OUT = Path(__file__).resolve().parents[1] / "results" / "vlm_vision_encoder.json"


def main() -> None:
    import torch

    from modelexport.zoo.assets import asset_path, sample_images
    from modelexport.zoo.mobilenet_v2 import MobileNetRows
    gguf, photo = asset_path("smollm2_gguf"), sample_images()["coffee"]
    with tempfile.TemporaryDirectory(prefix="mx-bench-vlm-") as tmp:
        tmp = Path(tmp)
        enc = tmp / "mobilenet_rows.onnx"
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")
            torch.onnx.export(MobileNetRows(576).eval(), (torch.zeros(1, 3, 224, 224),), str(enc), input_names=["image"],
                              output_names=["rows"], opset_version=17, dynamo=False)
        env = {**os.environ, "MODELEXPORT_CACHE_DIR": str(tmp / "cache")}
        load = os.getloadavg()[0]
        res: dict = {"model": gguf.name, "encoder": "MobileNetV2 trunk (ImageNet) + seeded linear 1280->576, 49 rows",
                     "load_at_start": load}
        for prec in ("16a8w", "fp16"):
            out = tmp / f"bundle_{prec}"
            m = measured_cli(["compile", str(gguf), "--vision-encoder", str(enc), "--image-token", "<file_sep>",
                              "--vision-precision", prec, "-o", str(out), "--json"], env)
            manifest = json.loads((out / "manifest.json").read_text())
            v = manifest["llm"]["vision"]
            ver = json.loads(measured_cli(["verify", str(out), "--json"], env)["stdout"])
            gens = {}
            for backend, n in (("cpu", 12), ("htp-sim", 1)):
                t = time.perf_counter()
                g = measured_cli(["generate", str(out), "--image", str(photo), "-p", "What is in the image?",
                                  "--backend", backend, "--max-new-tokens", str(n), "--json"], env)
                gens[backend] = {"wall_s": round(time.perf_counter() - t, 1), "text": json.loads(g["stdout"])["text"]}
            res[prec] = {"compile_wall_s": round(m["wall_s"], 1), "compile_cpu_s": round(m["cpu_s"], 1),
                         "peak_rss_mb": round(m["peak_rss_mb"]), "peak_child_rss_mb": round(m["peak_child_rss_mb"]),
                         "vision_htp_nodes": manifest["placement"]["vision"]["SM8650"]["htp_nodes"],
                         "vision_cpu_nodes": manifest["placement"]["vision"]["SM8650"]["cpu_nodes"],
                         "vision_check_db": v["check"]["SM8650"]["sqnr_db"],
                         "verify_db": round(ver["graphs"][0]["outputs"][0]["sqnr_db"], 2),
                         "verify_samples": ver["graphs"][0]["samples"], "generate": gens,
                         "genie_pipeline": manifest["llm"]["genie"]["SM8650"].get("pipeline")}
            print(prec, json.dumps(res[prec])[:600], flush=True)
        res["load_at_end"] = os.getloadavg()[0]
    OUT.write_text(json.dumps(res, indent=2))
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
