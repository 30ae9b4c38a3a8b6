"""`compile VLM_FOLDER`: a Hugging Face vision-language folder (a row of frontends/vlm_families.py) into
one LLM bundle with a vision part.

The text model goes through the LLM path as it is (`--inputs embeddings` by default: the image rows
enter as embeddings, text through the embedder part; `both` also works), the vision tower + projector
become one ONNX graph compiled by the ONNX path (QDQ, context binary, EPContext model that is also
the simulator's twin), and the two are joined into one bundle whose manifest's `llm.vision` says how
an image becomes rows and where they go.

Vision precision: 16a8w by default. The rows are not requantized on their way in: they become the
decoder's inputs_embeds (its residual stream is fp16 on the HTP), so the vision part's output error is
the error of every image position; a ViT's activations (softmax outputs, GELU, post-norm features)
span ranges that 8-bit activations cut coarsely (tiny tower on two real photos: see
docs/llm_export.md, "Vision-language models"). 8a8w is there for a smaller, faster encoder; fp16 for an
encoder whose weights 8 bits cut too coarsely (the real MobileNetV2 trunk: 20 dB at 16a8w, 43 dB in fp16 on
the simulator, tests/test_vlm_vision_encoder.py).
"""
from __future__ import annotations

import dataclasses
import json
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ...contract.bundle import BundleWriter, open_bundle, save_manifest
from ...contract.manifest import GeniePipelineCheck, ImageTiling, LogitsAgreement, SourceModel, VisionEntry
from ...core.atomic import check_output
from ...core.errors import InputError, ModelExportError
from ...core.file_hash import file_sha256
from ...core.numerics import compare
from ...core.targets import get_target
from ...core.vocab import Role
from ...frontends import vision_encoder_onnx as enc_onnx
from ...frontends.source_hash import source_sha256
from ...frontends.vlm_families import read_vision_facts
from ...frontends.vlm_folder import is_vlm_folder, load_vlm, read_image_tiling, write_text_folder
from ...llm.export.source import check_source
from ...llm.model.input_modes import get_input_mode
from ...llm.run.tokenizers import load_tokenizer
from ...llm.run.vision_inputs import load_pixels
from ...toolchain.htp_options import run_provider_options
from ...toolchain.ort_qnn import SessionPlan, create_session
from ...toolchain.worker_pool import run_jobs
from ...zoo.assets import sample_images
from ..ort_qnn.compile import compile_onnx
from ..spec import CompileOptions, PartSpec, max_seq_len_of
from .genie_pipeline import PIPELINE_FILE, check_pipeline, pipeline_config
from .vlm_calibration import calibration_images, image_blocks, write_image_rows, write_vision_calibration

DEFAULT_VISION_PRECISION = "16a8w"
VISION_PRECISIONS = ("8a8w", "16a8w", "fp16")
VISION_PART = "vision"   # the ONNX part's name: its files land under vision/ in the bundle
# The text decoder is calibrated on the float vision part's rows at image tokens too (calibration.ImageRows).
# Measured at the default 8 samples per variant (docs/llm_export.md, bench/results/vlm_image_calibration.json):
# tiny Idefics3 +3 to +6 dB on the first step's logits vs the float VLM, tiny LLaVA unchanged (+-0.03 dB).
CALIBRATE_IMAGE_POSITIONS = True


@dataclasses.dataclass
class VisionSide:
    """Where a VLM bundle's vision part and text model come from, checked before any weight is read:
    a Hugging Face VLM folder (a row of frontends/vlm_families.py) or the user's own encoder ONNX beside a
    text LLM (frontends/vision_encoder_onnx.py). `build(work)` → (the text model to compile, the float
    vision graph: pixel_values [1, 3, S, S] → image_embeds [1, N, hidden])."""
    family: str                  # manifest llm.vision.family
    label: str
    facts: Any                   # frontends.vlm_families.VisionFacts
    tiling: dict | None
    build: Callable[[Path], tuple[Path, Path]]
    record: Callable[[Any], None]   # writes where the bundle came from into the text compile's manifest
    source: Path | None = None   # a VLM folder (the bundle's source instead of the text folder made from it)


def folder_side(spec, opts, sizing: dict) -> VisionSide:
    from ...llm.model.vision_part import VisionPart, export_vision_part
    folder = Path(spec.model)
    family, facts = read_vision_facts(folder, **sizing)  # the table first: no weight read for a folder it refuses
    tiling = read_image_tiling(folder, family, facts)

    def build(work: Path) -> tuple[Path, Path]:
        model, fam, f = load_vlm(folder, **sizing)
        text_folder = write_text_folder(model, fam, folder, work / "text")
        return text_folder, export_vision_part(VisionPart(model, fam, f), work / "vision" / "vision.onnx")

    def record(m) -> None:
        m.source = m.source.model_copy(update={
            "path": str(folder.resolve()), "sha256": source_sha256(folder),
            "description": f"{family.label} ({facts.text_model_type} text model, {m.source.description})"})
    return VisionSide(family.model_type, family.label, facts, tiling, build, record, source=folder)


def encoder_side(spec, opts, sizing: dict) -> VisionSide:
    if is_vlm_folder(spec.model):
        raise InputError(f"--vision-encoder: {spec.model} is a vision-language folder, its vision part is its own",
                         "leave --vision-encoder out, or give a text-only LLM (GGUF or HF folder) with it")
    if opts.image_token is None:
        raise InputError("--vision-encoder needs --image-token: the token whose places in the prompt the image's "
                         "rows take", "add --image-token TOKEN (a special or reserved token of the text model's "
                         "tokenizer, or its id)")
    enc = enc_onnx.read_encoder(opts.vision_encoder, opts.image_size)
    text = check_source(spec.model, sizing["max_seq_len"])       # the text model's shape: no weight read
    enc_onnx.check_rows_fit(enc, int(text.shape["hidden_size"]), sizing["max_seq_len"], str(spec.model))
    token = enc_onnx.image_token_id(load_tokenizer(spec.model), opts.image_token, str(spec.model))
    mean = enc_onnx.parse_triple(opts.image_mean, "--image-mean", enc_onnx.IMAGENET_MEAN)
    std = enc_onnx.parse_triple(opts.image_std, "--image-std", enc_onnx.IMAGENET_STD)
    facts = enc_onnx.encoder_facts(enc, token, mean, std, text.architecture)

    def record(m) -> None:   # the text model stays the bundle's source; the encoder is recorded beside it
        m.llm.vision.encoder = SourceModel(path=str(enc.path.resolve()), format="onnx", sha256=file_sha256(enc.path),
                                           description=f"{enc.tokens} rows of {enc.hidden} per "
                                                       f"{enc.image_size}x{enc.image_size} image")
        m.source = m.source.model_copy(update={"description": f"{m.source.description} + {enc_onnx.ENCODER_LABEL} "
                                                              f"{enc.path.name}"})
    return VisionSide(enc_onnx.ENCODER_FAMILY, enc_onnx.ENCODER_LABEL, facts, None,
                      lambda work: (Path(spec.model), enc_onnx.write_vision_graph(enc, work / "vision" / "vision.onnx")),
                      record)


def compile_vlm(spec, out: Path, opts, force: bool, say: Callable[[str, float, float], None], compile_text: Callable) -> Any:
    """The VLM bundle at `out` → the opened Bundle: from a VLM folder, or from a text LLM with
    `opts.vision_encoder`. `compile_text(spec, out, opts, force, progress)` is the LLM compile."""

    # the context the default image size leaves room in; handed to the text compile so both agree
    sizing = dict(image_size=opts.image_size, max_seq_len=max_seq_len_of(opts.max_seq_len))
    side = (encoder_side if opts.vision_encoder is not None else folder_side)(spec, opts, sizing)
    facts, tiling = side.facts, side.tiling
    mode = get_input_mode(opts.inputs or "embeddings")
    if not mode.takes_embeddings:
        raise InputError(f"--inputs {mode.name}: a vision-language model's image rows enter the decoder as embeddings",
                         "leave --inputs out (a VLM compiles with --inputs embeddings) or use --inputs both")
    if facts.position_rule != "text" and {"full", "bert"} & set(re.findall(r"[a-z0-9]+", str(opts.variants or "").lower())):
        # the full-context graph's calibration windows are built with position_ids (compile.FULL_CONTEXT_NAMES)
        raise InputError(f"--variants full: a full-context graph with {side.label}'s M-RoPE positions is not built",
                         "leave full out of --variants (e.g. --variants ar1,ar32)")
    vprec = (opts.vision_precision or DEFAULT_VISION_PRECISION).strip().lower()
    if vprec not in VISION_PRECISIONS:
        raise InputError(f"--vision-precision {opts.vision_precision!r} is not offered",
                         f"choose one of: {', '.join(VISION_PRECISIONS)} (default {DEFAULT_VISION_PRECISION})")
    check_output(out, force)
    work = Path(tempfile.mkdtemp(prefix=".vlm-", dir=out.parent if out.parent.is_dir() else None))
    try:
        say(f"loading the {side.label}" + (" folder" if side.source else ""), 0, 4)
        text_model, vision_onnx = side.build(work)
        photos = calibration_images(facts, tiling)   # as the runtime shows them: tiles + global views, or resized
        calib, calib_what = write_vision_calibration(photos, work / "vision_calibration.npz")
        rows = None
        if CALIBRATE_IMAGE_POSITIONS:
            blocks = image_blocks(photos, facts, tiling, load_tokenizer(text_model), sizing["max_seq_len"])
            rows = write_image_rows(vision_onnx, photos, blocks, facts, work / "image_rows.npz")
        text_opts = dataclasses.replace(opts, inputs=mode.name, vision_precision=None, image_size=None,
                                        max_seq_len=sizing["max_seq_len"], vision_encoder=None, image_token=None,
                                        image_mean=None, image_std=None,
                                        image_calibration=str(rows) if rows else None)
        compile_text(dataclasses.replace(spec, model=str(text_model)), work / "text_bundle", text_opts, True, say)
        say("compiling the vision part", 3, 4)
        vision_bundle = _compile_vision(vision_onnx, calib, vprec, opts, work / "vision_bundle")
        text_bundle = open_bundle(work / "text_bundle")
        m = text_bundle.manifest
        m.llm.vision = _vision_entry(vision_bundle, side.family, facts, vprec, calib_what, tiling)
        if rows:
            m.llm.vision.decoder_image_calibration = (
                f"the float vision part's rows of the {calib_what} at image tokens after the first token "
                f"(the prompt's image block as the runtime writes it{', at M-RoPE grid positions' if facts.position_rule == 'mrope_grid' else ''}), "
                "in every other window of the text")
        m.placement[VISION_PART] = _placement(vision_bundle)
        side.record(m)
        m.options = {**m.options, "inputs": mode.name, "vision_precision": vprec}
        with BundleWriter(out, force, manifest=m) as w:
            for f in m.files:
                if f.role != Role.REPORT:
                    w.add_file(text_bundle.path / f.path, f.path, role=f.role)
            for f in vision_bundle.manifest.files:
                if f.path.startswith(f"{VISION_PART}/"):
                    w.add_file(vision_bundle.path / f.path, f.path, role=f.role)
            pipelines = _write_pipelines(w, text_bundle, m)
        bundle = open_bundle(out)
        say("checking the vision part on the simulator", 3.8, 4)
        _check_vision(bundle, vision_onnx)
        if pipelines:
            say("building the Genie pipeline on the host twins", 3.9, 4)
            _check_pipelines(bundle, pipelines)
        return bundle
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _write_pipelines(w, text_bundle, m) -> dict[str, str]:
    """Each target's `genie_pipeline.json` beside its Genie dialog config (embeddings-in decoders
    only: Genie's text-generator takes the accumulated rows as inputs_embeds) → {target: file}."""
    out = {}
    for target, entry in m.llm.genie.items():
        if m.llm.inputs != "embeddings" or not entry.dialog_created:
            continue
        folder = str(Path(entry.file).parent)
        rel = PIPELINE_FILE if folder == "." else f"{folder}/{PIPELINE_FILE}"
        bins = [g.file for g in m.llm.vision.graphs if g.target == target]
        up = "../" * (0 if folder == "." else len(Path(folder).parts))   # paths relative to the folder Genie runs in
        cfg = pipeline_config(json.loads((text_bundle.path / entry.file).read_text()), [up + b for b in bins],
                              m.llm.spec.hidden_size, m.llm.vision.image_size)
        w.path(rel, role=Role.GENIE_CONFIG).write_text(json.dumps(cfg, indent=2))
        out[target] = rel
    return out


def _check_pipelines(bundle, pipelines: dict[str, str]) -> None:
    """libGenie builds each target's pipeline on the host twins (genie_pipeline.check_pipeline): a
    refused text path fails the compile; recorded in llm.genie[target].pipeline."""
    for target, rel in pipelines.items():
        bundle.manifest.llm.genie[target].pipeline = GeniePipelineCheck(file=rel, **check_pipeline(bundle, target, rel))
    save_manifest(bundle)


def _compile_vision(onnx_path: Path, calib: Path, precision: str, opts, dest: Path):
    copts = CompileOptions(targets=list(opts.targets or ["SM8650"]), vtcm_mb=opts.vtcm_mb, use_cache=opts.use_cache,
                           **({"optimization_level": opts.optimization_level} if opts.optimization_level is not None else {}))
    return compile_onnx([PartSpec(model=str(onnx_path), name=VISION_PART, precision=precision, calibration=str(calib))],
                        dest, copts, force=True)


def _placement(vision_bundle) -> dict:
    """The ONNX path's placement record in the LLM bundle's shape ({target: htp_nodes, cpu_nodes})."""
    out = {}
    for target, p in vision_bundle.manifest.placement[VISION_PART].items():
        out[target] = {"htp_nodes": p["htp_nodes"], "cpu_nodes": [n["name"] for n in p.get("cpu_fallbacks", [])],
                       "cpu_io_quantization": p.get("cpu_io_quantization", 0)}
    return out


def _vision_entry(vision_bundle, family: str, facts, precision: str, calib_what: str, tiling: dict | None):
    vm = vision_bundle.manifest
    files = {f.path for f in vm.files}
    qdq = f"{VISION_PART}/model.qdq.onnx"
    return VisionEntry(family=family, graphs=[g for g in vm.graphs], model=f"{VISION_PART}/model.onnx",
                       quantized_model=qdq if qdq in files else None, precision=precision,
                       image_size=facts.image_size, mean=list(facts.mean), std=list(facts.std),
                       rescale_factor=facts.rescale_factor, image_token_id=facts.image_token_id,
                       tokens_per_image=facts.tokens_per_image, placement=facts.placement, calibration=calib_what,
                       position_rule=facts.position_rule, spatial_merge_size=facts.spatial_merge_size,
                       grid_thw=list(facts.grid_thw) if facts.position_rule == "mrope_grid" else None,
                       image_wrap_ids=list(facts.image_wrap_ids),
                       tiling=ImageTiling(**tiling) if tiling else None)


def _check_vision(bundle, float_onnx: Path) -> None:
    """Each target's compiled vision part on the simulator against the float graph, on a real photo
    (in a child: it loads the simulator); recorded in llm.vision.check."""
    v = bundle.manifest.llm.vision
    jobs = [(vision_check, {"epcontext": str(bundle.file(g.epcontext_model)), "float": str(bundle.file(v.model)),
                            "target": g.target, "image": str(next(iter(sample_images().values()))),
                            "facts": [v.image_size, v.mean, v.std, v.rescale_factor]})
            for g in v.graphs if g.epcontext_model]
    for (_, job), r in zip(jobs, run_jobs("the vision check", jobs, 1)):
        if isinstance(r, ModelExportError):
            raise r
        v.check[job["target"]] = LogitsAgreement(sqnr_db=r["sqnr_db"], max_abs_error=r["max_abs_error"], samples=1)
    save_manifest(bundle)


def vision_check(job: dict) -> dict:
    """Worker: the vision part's simulator session vs its float graph on one real photo → SQNR, max abs error."""
    import onnxruntime as ort

    size, mean, std, rescale = job["facts"]
    x, _ = load_pixels(job["image"], size, mean, std, rescale)
    ref = ort.InferenceSession(job["float"], providers=["CPUExecutionProvider"]).run(None, {"pixel_values": x})[0]
    sim = create_session(job["epcontext"], SessionPlan(provider_options=run_provider_options(get_target(job["target"]).soc_model, None)))
    got = sim.run(None, {"pixel_values": x})[0]
    c = compare(ref, got)
    return {"sqnr_db": round(float(c["sqnr_db"]), 2), "max_abs_error": float(np.abs(ref - got).max())}
