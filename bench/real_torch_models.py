"""Real PyTorch architectures through audit → compile (fp16 and 8a8w, SM8650) → verify.

The data table `CASES` is the one place the corpus is written (tests/test_real_torch.py takes
the quickest rows from it): each row is a builder returning the module and its example inputs,
and the kind of model. The models are real architectures from what is installed: transformers'
model classes built from their own config classes (shrunk: fewer layers, a narrower width,
small images; random weights), ExecuTorch's example models from its wheel (MLPerf Tiny, the
LSTM with nested `(x, (h0, c0))` inputs) and the MobileNetV2 with ImageNet weights from the zoo
(calibrated on the bundled photos). The others calibrate on `random` (noise scaled like the
example inputs): the SQNR measures the toolchain, not a deployment.

Per row and precision: compiled or not, the share of nodes on the HTP, SQNR of the compiled
graph against eager PyTorch (worst output, verify's stored samples), compile time; when a row
fails or falls back, the audit's (or the placement's) nodes with the reason and the fix.

    PYTHONPATH=src .venv/bin/python bench/real_torch_models.py [--only vit,lstm] [--precisions fp16,8a8w]
    → bench/results/real_torch_models.json
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from collections.abc import Callable

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "bench" / "results" / "real_torch_models.json"


@dataclass(frozen=True)
class Case:
    name: str
    kind: str
    build: Callable[[], tuple[Any, tuple]]     # → (module in eval mode, example inputs)
    calibration: Callable[[], Any] | None = None   # None: "random"
    quick: tuple[str, ...] = ()                # precisions tests/test_real_torch.py runs (the quickest rows)


def _seed():
    import torch
    torch.manual_seed(0)
    return torch


def _hf(model_cls: str, config_cls: str, inputs: Callable[[Any], tuple], **config: Any):
    """A transformers model class (`Name` or `module:Name`) from its own config class, shrunk by `config`."""
    def build():
        torch = _seed()
        import importlib

        import transformers
        cfg = getattr(transformers, config_cls)(**config)
        cfg._attn_implementation = "eager"   # plain matmul/softmax attention: what QNN lowers
        module, _, name = model_cls.rpartition(":")
        model = getattr(importlib.import_module(module) if module else transformers, name)(cfg).eval()
        return model, inputs(torch)
    return build


def _image(size: int, channels: int = 3):
    return lambda torch: (torch.randn(1, channels, size, size),)


def _text(seq: int, vocab: int):
    return lambda torch: (torch.randint(0, vocab, (1, seq)), torch.ones(1, seq, dtype=torch.int64))


def _mobilenet_v2():
    torch = _seed()
    from modelexport.zoo.imagenet import preprocess
    from modelexport.zoo.assets import sample_images
    from modelexport.zoo.mobilenet_v2 import mobilenet_v2
    photo = next(iter(sample_images().values()))
    return mobilenet_v2(), (torch.from_numpy(preprocess(photo)),)


def _photos():
    from modelexport.zoo.assets import sample_images
    from modelexport.zoo.imagenet import preprocess
    return [preprocess(p) for p in sample_images().values()]


def _et_example(module: str, cls: str):
    """An ExecuTorch example model (executorch/examples/models), as its EagerModelBase builds it."""
    def build():
        _seed()
        import importlib
        m = getattr(importlib.import_module(f"executorch.examples.models.{module}"), cls)()
        return m.get_eager_model().eval(), tuple(m.get_example_inputs())
    return build


CASES: tuple[Case, ...] = (
    Case("mobilenet_v2", "image classification (ImageNet weights)", _mobilenet_v2, _photos),
    Case("lstm", "sequence (ExecuTorch example, nested (x, (h0, c0)) inputs)", _et_example("lstm.model", "LSTMModel")),
    Case("ds_cnn", "keyword spotting (MLPerf Tiny, audio features)", _et_example("mlperf_tiny.ds_cnn", "DSCNNKWSModel"),
         quick=("fp16",)),
    Case("resnet8", "image classification (MLPerf Tiny)", _et_example("mlperf_tiny.resnet8", "ResNet8Model"),
         quick=("fp16",)),
    Case("deep_autoencoder", "anomaly detection (MLPerf Tiny)",
         _et_example("mlperf_tiny.deep_autoencoder", "DeepAutoEncoderModel"), quick=("fp16",)),
    Case("vit", "vision transformer (ViTForImageClassification)",
         _hf("ViTForImageClassification", "ViTConfig", _image(32), image_size=32, patch_size=8, hidden_size=64,
             num_hidden_layers=2, num_attention_heads=2, intermediate_size=128, num_labels=10)),
    Case("deit", "vision transformer, distilled (DeiTForImageClassificationWithTeacher)",
         _hf("DeiTForImageClassificationWithTeacher", "DeiTConfig", _image(32), image_size=32, patch_size=8,
             hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128, num_labels=10)),
    Case("segformer", "semantic segmentation (SegformerForSemanticSegmentation)",
         _hf("SegformerForSemanticSegmentation", "SegformerConfig", _image(64), num_encoder_blocks=2, depths=[1, 1],
             sr_ratios=[4, 2], hidden_sizes=[16, 32], num_attention_heads=[1, 2], decoder_hidden_size=32,
             patch_sizes=[7, 3], strides=[4, 2], mlp_ratios=[2, 2], num_labels=5)),
    # with transformers' initialisation (random weights) its activations vanish: the outputs peak
    # near 1e-12, so its SQNR is flagged as degenerate (the row still shows it compiles on the HTP)
    Case("mobilevit", "mobile vision transformer backbone (MobileViTModel)",
         _hf("MobileViTModel", "MobileViTConfig", _image(64), image_size=64,
             hidden_sizes=[32, 48, 64], neck_hidden_sizes=[8, 16, 24, 32, 40, 48, 96])),
    Case("yolos", "object detection (YolosForObjectDetection)",
         _hf("YolosForObjectDetection", "YolosConfig", _image(64), image_size=[64, 64], patch_size=16, hidden_size=64,
             num_hidden_layers=2, num_attention_heads=2, intermediate_size=128, num_detection_tokens=10, num_labels=5)),
    Case("wav2vec2", "speech encoder (Wav2Vec2Model, raw audio)",
         _hf("Wav2Vec2Model", "Wav2Vec2Config", lambda torch: (torch.randn(1, 4000),), hidden_size=64,
             num_hidden_layers=2, num_attention_heads=2, intermediate_size=128, conv_dim=(32, 32, 32, 32, 32, 32, 32),
             num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4)),
    Case("whisper_encoder", "speech encoder (WhisperEncoder, log-mel input)",
         _hf("transformers.models.whisper.modeling_whisper:WhisperEncoder", "WhisperConfig", lambda torch: (torch.randn(1, 80, 200),), d_model=64,
             encoder_layers=2, encoder_attention_heads=2, encoder_ffn_dim=128, max_source_positions=100)),
    Case("bert", "text classification (BertForSequenceClassification)",
         _hf("BertForSequenceClassification", "BertConfig", _text(32, 1000), vocab_size=1000, hidden_size=64,
             num_hidden_layers=2, num_attention_heads=2, intermediate_size=128, num_labels=3)),
    Case("distilbert", "text classification (DistilBertForSequenceClassification)",
         _hf("DistilBertForSequenceClassification", "DistilBertConfig", _text(32, 1000), vocab_size=1000, dim=64,
             n_layers=2, n_heads=2, hidden_dim=128, num_labels=3)),
    Case("resnet", "image classification (ResNetForImageClassification)",
         _hf("ResNetForImageClassification", "ResNetConfig", _image(64), embedding_size=16, hidden_sizes=[16, 32, 64, 128],
             depths=[1, 1, 1, 1], num_labels=10)),
    Case("convnext", "image classification (ConvNextForImageClassification)",
         _hf("ConvNextForImageClassification", "ConvNextConfig", _image(64), hidden_sizes=[16, 32, 64, 128],
             depths=[1, 1, 1, 1], num_labels=10)),
)


def _worst_sqnr(report) -> float | None:
    vals = [o.sqnr_db for g in report.graphs for o in g.outputs]
    return round(min(vals), 2) if vals else None


def _off_htp(rows: list[dict]) -> list[dict]:
    return [{k: r.get(k) for k in ("name", "op_type", "module_path", "runtime", "reason", "fix")}
            for r in rows if r.get("backend") != "HTP"][:8]


def _audit(row: dict, model, example, target: str, precision: str) -> None:
    import modelexport
    from modelexport.core.errors import ModelExportError
    t0 = time.perf_counter()
    try:
        rep = modelexport.audit(model, example, target=target, precision=precision)
    except ModelExportError as e:
        row.update(audit_error=e.problem, audit_fix=e.fix)
        return
    off = [n for n in rep.nodes if n.backend != "HTP"]
    row.update(audit_htp_nodes=len(rep.nodes) - len(off), audit_nodes=len(rep.nodes),
               audit_s=round(time.perf_counter() - t0, 1))
    if off:
        row["audit"] = [{"name": n.name, "op": n.op_type, "module_path": n.module_path, "reason": n.reason,
                         "fix": n.fix} for n in off[:8]]


def run_case(case: Case, precision: str, out_dir: Path, target: str = "SM8650", audit_first: bool = True) -> dict:
    """audit → compile → verify one row at one precision; what is off the HTP keeps its reason and fix.
    `audit_first=False` (the bench's default, to fit its time) audits only a row that fails or falls back:
    compile's placement comes from the same partitioner, so a clean row's audit says nothing new."""
    import modelexport
    from modelexport.core.errors import ModelExportError
    model, example = case.build()
    calib = case.calibration() if case.calibration else "random"
    row: dict[str, Any] = {"case": case.name, "kind": case.kind, "precision": precision, "target": target}
    if audit_first:
        _audit(row, model, example, target, precision)
    t0 = time.perf_counter()
    try:
        bundle = modelexport.compile(model, example, output=out_dir / f"{case.name}_{precision}", target=target,
                                     precision=precision, calibration=calib if precision != "fp16" else None,
                                     force=True, use_cache=False)
    except ModelExportError as e:
        row.update(compiled=False, error=e.problem, fix=e.fix, compile_s=round(time.perf_counter() - t0, 1))
        if not audit_first:
            _audit(row, model, example, target, precision)
        return row
    row["compile_s"] = round(time.perf_counter() - t0, 1)
    m = bundle.manifest
    summary = m.placement.get("summary") or {}
    row.update(compiled=True, htp_share=summary.get("htp_share"), nodes=summary.get("nodes"),
               inputs=[i.name for i in m.parts[0].inputs], compile_numerics_passed=m.numerics.get("passed"))
    fallbacks = _off_htp(m.placement.get("nodes") or [])
    if fallbacks:
        row["off_htp"] = fallbacks
        if not audit_first:
            _audit(row, model, example, target, precision)
    rep = modelexport.verify(bundle.path)
    row.update(sqnr_db=_worst_sqnr(rep), verified=rep.passed, verify_samples=rep.graphs[0].samples)
    peak = _reference_peak(model, example)
    if peak < 1e-6:   # any graph matches an all-zero output: an infinite SQNR that says nothing
        row["degenerate_reference"] = f"the float outputs peak at {peak:.1e} on the example input"
    return row


def _reference_peak(model, example) -> float:
    import torch
    with torch.no_grad():
        out = model(*example)
    return max((float(t.abs().max()) for t in torch.utils._pytree.tree_leaves(out) if isinstance(t, torch.Tensor)),
               default=0.0)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="", help="comma-separated case names")
    ap.add_argument("--precisions", default="fp16,8a8w")
    ap.add_argument("--out", default=str(OUT))
    ap.add_argument("--audit-all", action="store_true", help="audit every row first, not only those that fail or fall back")
    args = ap.parse_args(argv)
    import torch
    torch.set_num_threads(2)
    names = [n for n in args.only.split(",") if n]
    cases = [c for c in CASES if not names or c.name in names]
    precisions = [p for p in args.precisions.split(",") if p]
    out = Path(args.out)
    # --only re-runs some rows and keeps the others of an earlier run
    rows: list[dict] = [r for r in json.loads(out.read_text())["rows"] if r["case"] not in names] \
        if names and out.is_file() else []
    with tempfile.TemporaryDirectory(prefix="real_torch_") as tmp:
        for case in cases:
            for prec in precisions:
                try:
                    row = run_case(case, prec, Path(tmp), audit_first=args.audit_all)
                except Exception as e:  # a bug of ours or of a library: recorded, the table goes on
                    row = {"case": case.name, "kind": case.kind, "precision": prec, "compiled": False,
                           "traceback": f"{type(e).__name__}: {' '.join(str(e).split())[:400]}"}
                rows.append(row)
                print(json.dumps({k: row.get(k) for k in ("case", "precision", "compiled", "htp_share", "sqnr_db",
                                                           "verified", "compile_s", "error", "traceback")}), flush=True)
                _write(out, rows, precisions)
    return 0


def _write(out: Path, rows: list[dict], precisions: list[str]) -> None:
    import executorch
    import torch
    import transformers
    order = {c.name: i for i, c in enumerate(CASES)}
    rows = sorted(rows, key=lambda r: (order.get(r["case"], len(order)), r["precision"] != "fp16"))
    done = {(r["case"], r["precision"]) for r in rows}
    summary = {p: {"cases": sum(1 for r in rows if r["precision"] == p),
                   "compiled": sum(1 for r in rows if r["precision"] == p and r.get("compiled")),
                   "fully_on_htp": sum(1 for r in rows if r["precision"] == p and r.get("htp_share") == 1.0),
                   "verified": sum(1 for r in rows if r["precision"] == p and r.get("verified"))} for p in precisions}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"host": platform.node(), "python": sys.version.split()[0], "torch": torch.__version__,
                               "executorch": getattr(executorch, "__version__", "?"),
                               "transformers": transformers.__version__, "target": "SM8650",
                               "runs": len(done), "summary": summary, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    sys.exit(main())
