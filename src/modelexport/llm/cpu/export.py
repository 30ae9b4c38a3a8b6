"""A Hugging Face model of a CPU family (the rows marked `cpu` in `frontends/llm_families.py`) →
an ExecuTorch XNNPACK `.pte` for the CPU runtime.

The program is ExecuTorch's own LLM layout (what `export_llm` builds and its C++ runner
reads): `forward(tokens int64 [1, n], input_pos int64 [1]) -> logits [1, vocab]` of the last
token, with a dynamic n (1 .. max_seq_len-1) and the KV cache as mutable buffers inside the
program, updated in place by `llama::update_cache` and read by `llama::custom_sdpa`; plus the
metadata methods (`get_max_seq_len`, `get_vocab_size`, `get_bos_id`, `get_eos_ids`, ...).

It is built here from Python instead of through `export_llm`, which wants a Meta-format
checkpoint file, Hydra, and for SmolLM2 torchtune plus a hub download:
1. the HF weights are renamed to Meta's names (`hf_layout.py`, per family row: q/k norms,
   fused rows split) and loaded into ExecuTorch's `Transformer`
   (`use_hf_rope=True`, so q/k stay in HF's rotate-half layout and need no un-permuting; the
   RoPE tables are taken from the HF model's own `inv_freq`/`attention_scaling`, so every
   RoPE variant transformers knows comes out as HF computes it; a partial rotary table is padded
   to the head, NoPE layers get an identity RoPE);
2. the SDPA and KV cache modules are swapped for the custom-op versions (as `export_llm`
   does with `use_sdpa_with_kv_cache`); by default (`attention="native"`) each layer then gets
   one fused q|k|v projection and attends with our kernel `modelexport::sdpa`
   (`llm/native/sdpa.cpp`, compiled on first use) instead of `llama::custom_sdpa`: a decode
   step is ~20% shorter at 60 positions and ~40% at 500 (`bench/experiments/cpu_kernels.py --option attention`);
3. weights are quantized (`8da4w`: int8 dynamic activations, symmetric int4 weights in groups
   of 32; `8da8w`: int8 per-channel weights; embeddings 4-bit in groups of 32 through
   ExecuTorch's embedding quantizer), or kept fp32. By default (`linear="auto"`) 8da4w linears
   run on our kernels (`llm/native/linear_q4.cpp`, activations in int8 per block of 32): one
   call for q|k|v with the RMSNorm before it, one for o with the residual add after it, one for
   gate|up with the norm and SwiGLU, one for down with the residual (`fuse_blocks`), so only
   RoPE is left to XNNPACK in a layer (`bench/experiments/cpu_kernels.py --option linear`); otherwise they
   are written with the `quantized_decomposed` ops XNNPACK matches (see `DynamicQuantLinear` for
   why not torchao's affine ops). From a GGUF, with our kernels, every weight the file stores as
   Q4_0, Q4_1, Q4_K, Q5_0, Q5_1, Q5_K or Q8_0 keeps its blocks as stored instead (`gguf_blocks.py`;
   the 5- and 8-bit ones run in `modelexport::linear_q8`, an 8-bit token embedding becomes an
   8-bit lookup), so the program computes what llama.cpp computes from that file; other types
   (Q6_K, F16) are quantized from their dequantized values as from an HF folder. `llm.json`'s
   `weights` records which;
4. RMSNorm and RoPE are written with ops XNNPACK takes at a dynamic sequence length, the KV
   cache's transpose/untranspose pair is removed (ExecuTorch's `RemoveRedundantTransposes`)
   and views with one symbolic dim get an inferred (-1) dim instead: a layer then lowers to one
   XNNPACK partition instead of ~7, which makes both the export and every decode step faster;
5. non-strict `torch.export` → `to_edge_transform_and_lower` with the XNNPACK partitioner →
   `to_executorch`, with `xnnpack_fast_lowering` removing repeated work that does not change
   the result.

The `Transformer` of steps 1, 2 and 4 is built in `transformer.py`; this module quantizes,
exports, lowers and caches it.

Results are cached by content: the weights' sha256 (the GGUF or safetensors bytes), the
options and the library versions.
"""
from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict, dataclass
from importlib.metadata import version
from pathlib import Path
from typing import Any

from ...core.cache import Cache, cache_key
from ...core.errors import InputError, ToolchainError, UnsupportedError
from ...core.file_hash import file_sha256
from ...frontends.gguf_file import check_gguf_header, check_gguf_tensors, load_gguf_causal_lm, read_gguf_info
from ...frontends.hf_folder import check_hf_files, load_hf_folder, read_hf_config
from ..run.tokenizers import from_transformers
from . import QUANT_MODES
from .fast_lowering import fast_lowering, to_edge_one_decomposition
from .gguf_blocks import GgufBlocks
from .hf_layout import check_cpu_config, require_cpu_family
from .kernels.linear_q4_op import Q4Linear, fuse_blocks, fuse_input_norms, fuse_swiglu
from .transformer import build_transformer, views_with_one_inferred_dim

EXPORT_FORMAT_VERSION = 13  # bump when the program layout, quantization or passes change
ATTENTION_KERNELS = ("native", "executorch")
LINEAR_KERNELS = ("auto", "native", "xnnpack")
PTE_NAME = "model.pte"
META_NAME = "llm.json"


@dataclass(frozen=True)
class CpuExportOptions:
    quant: str = "8da4w"                 # 8da4w | 8da8w | fp32
    group_size: int = 32                 # weights per scale for 8da4w (0 = per channel)
    embedding_bits: int | None | str = "auto"   # 4 | 8 | None (fp32) | "auto": 4 when quantized, fp32 for fp32
    embedding_group_size: int = 32
    max_seq_len: int = 2048              # positions in the KV cache (the context)
    prefill_chunk: int = 0               # tokens per call: 0 = any number (dynamic shape); 1 = a
                                         # static one-token program (prompt fed token by token)
    fast_lowering: bool = True           # skip lowering work that provably changes nothing
    attention: str = "native"            # native: our AVX2 kernel (llm/native/sdpa.cpp) | executorch:
                                         # llama::custom_sdpa (see bench/experiments/cpu_kernels.py --option attention)
    linear: str = "auto"                 # native: our 4-bit kernel (llm/native/linear_q4.cpp) | xnnpack |
                                         # auto: native for 8da4w in groups of 32, else xnnpack
    gguf_blocks: bool = True             # from a GGUF, with the native kernel: keep its blocks as stored
                                         # where our kernels compute them (gguf_layouts.LAYOUTS); False
                                         # re-quantizes them like float weights
                                         # (SmolLM2 Q4_1: perplexity 43 instead of llama.cpp's 31)

    def __post_init__(self):
        if self.quant not in QUANT_MODES:
            raise InputError(f"unknown CPU quantization {self.quant!r}", f"choose one of: {', '.join(QUANT_MODES)}")
        if self.embedding_bits == "auto":   # frozen dataclass: resolve through object.__setattr__
            object.__setattr__(self, "embedding_bits", None if self.quant == "fp32" else 4)
        if self.embedding_bits not in (None, 4, 8):
            raise InputError(f"embedding bits must be 4, 8 or none, got {self.embedding_bits}")
        if self.prefill_chunk not in (0, 1):
            raise InputError(f"prefill chunk must be 0 (dynamic) or 1, got {self.prefill_chunk}")
        if self.attention not in ATTENTION_KERNELS:
            raise InputError(f"unknown attention kernel {self.attention!r}", f"choose one of: {', '.join(ATTENTION_KERNELS)}")
        if self.linear not in LINEAR_KERNELS:
            raise InputError(f"unknown linear kernel {self.linear!r}", f"choose one of: {', '.join(LINEAR_KERNELS)}")
        native_fits = self.quant == "8da4w" and self.group_size == 32
        if self.linear == "auto":
            object.__setattr__(self, "linear", "native" if native_fits else "xnnpack")
        elif self.linear == "native" and not native_fits:
            raise InputError("the native linear kernel runs 8da4w weights in groups of 32 only",
                             "use quant 8da4w with group size 32, or linear='xnnpack'")
        if self.max_seq_len < 8:
            raise InputError(f"--max-seq-len must be at least 8, got {self.max_seq_len}")

    def key(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("fast_lowering")   # same program either way (checked by a test)
        return d


# --------------------------------------------------------------------------------------------
# Weights (step 3)


def _quantized_linear_class():
    import torch
    import torch.ao.quantization.fx._decomposed  # noqa: F401  (registers quantized_decomposed::)

    qd = torch.ops.quantized_decomposed
    _register_group_dequant_meta()

    class DynamicQuantLinear(torch.nn.Module):
        """int8 dynamic per-token activations × int4 (group-wise) or int8 (per-channel) weights.

        Written with ExecuTorch's `quantized_decomposed` ops, the pattern XNNPACK lowers to its
        qd8-f32-qb4w / qc8w GEMMs. (torchao's `Int8DynamicActivationIntxWeightConfig` lowers to the
        same kernels, but its `torchao::*_affine` ops decompose into ~20 ATen ops every time a
        pass re-traces the graph with fake tensors: 4-5x more export time for the same program.)
        """

        def __init__(self, weight_q, scales, bias, bits: int, group_size: int):
            super().__init__()
            self.register_buffer("weight", weight_q)               # int8 values in [-2^(b-1), 2^(b-1)-1]
            self.register_buffer("scales", scales)                 # fp32 [N, K/group] (group) or [N] (channel)
            self.register_buffer("zeros", torch.zeros_like(scales, dtype=torch.int8))
            self.bias = None if bias is None else torch.nn.Parameter(bias, requires_grad=False)
            self.qmin, self.qmax = -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
            self.group_size = group_size                            # 0: per channel
            self.in_features, self.out_features = weight_q.shape[1], weight_q.shape[0]

        def forward(self, x):
            s, zp = qd.choose_qparams_per_token_asymmetric(x, torch.int8)
            xq = qd.quantize_per_token(x, s, zp, -128, 127, torch.int8)
            xdq = qd.dequantize_per_token(xq, s, zp, -128, 127, torch.int8, torch.float32)
            if self.group_size:
                w = qd.dequantize_per_channel_group(self.weight, self.scales, self.zeros, self.qmin, self.qmax,
                                                    torch.int8, self.group_size, torch.float32)
            else:
                w = qd.dequantize_per_channel(self.weight, self.scales, self.zeros, 0, self.qmin, self.qmax,
                                              torch.int8)
            return torch.nn.functional.linear(xdq, w, self.bias)

    return DynamicQuantLinear


_META_LIB = None


def _register_group_dequant_meta() -> None:
    """torch defines `quantized_decomposed::dequantize_per_channel_group` without a Meta kernel, so
    every fake-tensor re-trace runs its whole body; its output is just the input's shape."""
    global _META_LIB
    if _META_LIB is not None:
        return
    import torch
    lib = torch.library.Library("quantized_decomposed", "IMPL")

    def meta(w_int8, scales, zero_points, quant_min, quant_max, dtype, group_size=128, output_dtype=torch.float32):
        return torch.empty_like(w_int8, dtype=output_dtype)
    try:
        lib.impl("dequantize_per_channel_group", meta, "Meta")
    except RuntimeError:  # a later torch registers its own: use that
        pass
    _META_LIB = lib


# Candidate scales per group, as fractions of the widest one that fits: clipping the extremes
# a little often lowers the group's squared error (measured on SmolLM2's Q4_1 weights re-quantized
# to 4 bits: perplexity 50.2 with min/max scales, 46.4 with this search; bench/llm_cpu_decode.json).
CLIP_CANDIDATES = (1.0, 0.97, 0.94, 0.91, 0.88, 0.85, 0.82, 0.79)


def quantize_weight(w, bits: int, group_size: int):
    """Symmetric (zero point 0) quantization of a [N, K] weight, per group of `group_size` input
    channels, or per output channel when group_size is 0.

    The grid is used in full (-8..7 for 4 bits: a group whose extreme is negative gets the step
    max|w|/8, not /7), and each group takes the candidate scale with the least squared error
    (torchao's min/max scale max|w|/7.5 is one of them, so no group does worse than with it).
    Group scales are compared as bf16, the precision XNNPACK stores them in."""
    import torch

    n, k = w.shape
    g = group_size or k
    qmin, qmax = -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
    wg = w.detach().float().reshape(n, k // g, g)
    eps = torch.finfo(torch.float32).eps
    widest = torch.maximum(wg.amax(dim=-1, keepdim=True) / qmax, wg.amin(dim=-1, keepdim=True) / qmin).clamp(min=eps)
    minmax = wg.abs().amax(dim=-1, keepdim=True) / ((qmax - qmin) / 2)   # torchao's symmetric scale
    best_scale, best_err = None, None
    for scale in [minmax] + [widest * c for c in CLIP_CANDIDATES]:
        scale = scale.clamp(min=eps)
        if group_size:
            scale = scale.to(torch.bfloat16).float().clamp(min=eps)
        err = ((torch.clamp(torch.round(wg / scale), qmin, qmax) * scale - wg) ** 2).sum(dim=-1, keepdim=True)
        if best_scale is None:
            best_scale, best_err = scale, err
        else:
            better = err < best_err
            best_scale, best_err = torch.where(better, scale, best_scale), torch.where(better, err, best_err)
    q = torch.clamp(torch.round(wg / best_scale), qmin, qmax).to(torch.int8).reshape(n, k)
    scale = best_scale.reshape(n, k // g)
    return q, (scale if group_size else scale.reshape(n))


def _dequantized(q, scale, group: int):
    """The weight `quantize_weight` stands for: values times their group's scale, as stored (bf16)."""
    import torch
    n, k = q.shape
    s = scale.to(torch.bfloat16).float()
    return (q.float().reshape(n, k // group, group) * s.reshape(n, k // group, 1)).reshape(n, k)


def quantize_model(model, opts: CpuExportOptions, blocks=None):
    """Quantize `model`'s embedding and linears as `opts` says. With `blocks` (a GGUF's
    `GgufBlocks`) and the native kernel, each weight held in GGUF layouts our kernels compute
    (`gguf_layouts.LAYOUTS`) keeps its stored blocks, and so does an 8-bit token embedding; the others
    are quantized from their float values as for an HF folder."""
    import torch

    plan = getattr(model, "kernel_plan", {})    # which fusions took (llm.json's `kernels`)
    plan.update(linear=opts.linear if opts.quant != "fp32" else "xnnpack (fp32)", fused_mlps=0, fused_blocks=0,
                fused_input_norms=0)
    with torch.no_grad():
        native_blocks = blocks if opts.linear == "native" else None
        if opts.embedding_bits and native_blocks is not None:
            stored = native_blocks.embedding(model.tok_embeddings)
            if stored is not None:
                model.tok_embeddings = stored
        if opts.embedding_bits and isinstance(model.tok_embeddings, torch.nn.Embedding):
            # ExecuTorch's own embedding quantizer: the lookup becomes one
            # quantized_decomposed::embedding_{4bit,byte} kernel instead of dequantizing the table
            from executorch.examples.models.llama.source_transformation.quantize import EmbeddingQuantHandler
            model = EmbeddingQuantHandler(model, bitwidth=opts.embedding_bits,
                                          group_size=opts.embedding_group_size or None,
                                          packed=opts.embedding_bits == 4, quantize_with_hqq=False).quantized_model()
        if opts.quant in ("8da4w", "8da8w"):
            bits = 4 if opts.quant == "8da4w" else 8
            group = opts.group_size if bits == 4 else 0
            if opts.linear == "native":

                made: dict[int, Any] = {}     # fuse_swiglu asks for gate and up, then swap may ask again

                def make(linear):
                    if id(linear) not in made:
                        made[id(linear)] = make_once(linear)
                    return made[id(linear)]

                def make_once(linear):
                    stored = native_blocks.linear(linear) if native_blocks is not None else None
                    if stored is not None:
                        return stored
                    q, scale = quantize_weight(linear.weight, bits, group)
                    if native_blocks is not None:
                        native_blocks.requantized(linear.weight, _dequantized(q, scale, group))
                    return Q4Linear(q, scale, None if linear.bias is None else linear.bias.detach().float())

                plan["fused_mlps"] = fuse_swiglu(model, make)
            else:
                cls = _quantized_linear_class()

                def make(linear):
                    q, scale = quantize_weight(linear.weight, bits, group)
                    return cls(q, scale, None if linear.bias is None else linear.bias.detach().float(), bits, group)

            def swap(parent):
                for name, child in list(parent.named_children()):
                    if isinstance(child, torch.nn.Linear) and (not group or child.in_features % group == 0):
                        setattr(parent, name, make(child))
                    else:
                        swap(child)
            swap(model)
            if opts.linear == "native":
                plan["fused_blocks"] = fuse_blocks(model)
                plan["fused_input_norms"] = fuse_input_norms(model)   # sandwich blocks (Gemma)
    return model


# --------------------------------------------------------------------------------------------
def export_pte(hf_model, out_dir: Path, opts: CpuExportOptions, *, bos_id: int | None, eos_ids: list[int],
               progress=None, gguf: Path | None = None) -> dict[str, Any]:
    """Build `out_dir/model.pte`; returns metadata with the time of each stage. `gguf`: the file
    `hf_model` was loaded from, whose blocks the program keeps where it can (`opts.gguf_blocks`);
    the metadata's `weights` says what it holds."""
    import torch
    from executorch.extension.llm.custom_ops import custom_ops  # noqa: F401  (registers llama:: ops)

    times: dict[str, Any] = {}
    t = time.perf_counter()

    def stage(name: str, next_step: str | None = None) -> None:
        nonlocal t
        now = time.perf_counter()
        times[name] = round(now - t, 2)
        t = now
        if progress and next_step:
            progress(next_step)

    if progress:
        progress("building the graph")
    model, args = build_transformer(hf_model, opts.max_seq_len, opts.attention)
    stage("build", f"quantizing ({opts.quant})")
    kernels = model.kernel_plan     # filled in by quantize_model too
    blocks = None
    if gguf is not None and opts.gguf_blocks and opts.linear == "native":
        blocks = GgufBlocks(gguf)
    model = quantize_model(model, opts, blocks)
    weights = _weights_record(opts, blocks)
    stage("quantize", "torch.export")
    pos = torch.tensor([0], dtype=torch.long)
    if opts.prefill_chunk == 0:
        tokens = torch.tensor([[2, 3, 4]], dtype=torch.long)
        dyn = ({1: torch.export.Dim("token_dim", max=opts.max_seq_len - 1)}, {"input_pos": {0: 1}})
    else:  # static shapes: no re-planning of XNNPACK's runtime per call; on SmolLM2 (8da4w, 2 cores) a
        # decode step measured the same as with the dynamic program, within this host's noise
        tokens = torch.arange(2, 2 + opts.prefill_chunk, dtype=torch.long).unsqueeze(0)
        dyn = None
    # non-strict: traces with fake tensors in Python instead of through TorchDynamo (same graph, faster)
    with torch.nn.attention.sdpa_kernel([torch.nn.attention.SDPBackend.MATH]), torch.no_grad():
        ep = torch.export.export(model, (tokens, {"input_pos": pos}), dynamic_shapes=dyn, strict=False)
    # the KV cache comes back transposed and SDPA transposes it again: without this pass XNNPACK
    # copies the whole cache twice per layer and token (what export_llm's canonical pass removes)
    from executorch.extension.llm.export.export_passes import RemoveRedundantTransposes
    RemoveRedundantTransposes()(ep.graph_module)
    times["views_rewritten"] = views_with_one_inferred_dim(ep)
    stage("torch_export", "lowering to XNNPACK")
    metadata = {"get_max_seq_len": opts.max_seq_len, "get_max_context_len": opts.max_seq_len,
                "get_vocab_size": int(args.vocab_size), "use_kv_cache": True, "use_sdpa_with_kv_cache": True,
                "enable_dynamic_shape": opts.prefill_chunk == 0, "get_n_layers": int(args.n_layers)}
    if bos_id is not None:
        metadata["get_bos_id"] = int(bos_id)
    if eos_ids:
        metadata["get_eos_ids"] = [int(i) for i in eos_ids]
    program, lower_times = lower_to_xnnpack(ep, metadata, fast=opts.fast_lowering)
    times.update(lower_times)
    t = time.perf_counter()
    pte = out_dir / PTE_NAME
    with open(pte, "wb") as f:
        program.write_to_file(f)
    stage("write")
    return {"pte": PTE_NAME, "bytes": pte.stat().st_size, "times_s": times, "n_layers": int(args.n_layers),
            "vocab_size": int(args.vocab_size), "max_seq_len": opts.max_seq_len, "weights": weights, "kernels": kernels}


def _weights_record(opts: CpuExportOptions, blocks) -> dict[str, Any]:
    """How the program holds its weights (llm.json's `weights`, shown by `inspect`)."""
    if opts.quant == "fp32":
        return {"layout": "fp32"}
    own = f"{opts.quant}, groups of {opts.group_size}" if opts.quant == "8da4w" else opts.quant
    if blocks is None:
        return {"layout": f"quantized from float ({own})"}
    summary = blocks.summary()
    requantized = summary["kept_as_stored"].get("requantized", 0)
    nearest = sum(n for label, n in summary["kept_as_stored"].items() if "as 8-bit" in label)
    notes = []
    if requantized:
        notes.append(f"{requantized} re-quantized to {own}, weight SQNR "
                     f"{summary['requantized_weight_sqnr_db']['all']} dB")
    if nearest:
        notes.append(f"{nearest} holding Q6_K rows as 8-bit, weight SQNR {summary['nearest_8bit_weight_sqnr_db']['all']} dB")
    return {"layout": "GGUF blocks as stored" + (f" ({'; '.join(notes)})" if notes else ""), **summary}


def lower_to_xnnpack(ep, metadata: dict, *, fast: bool = True):
    """ExportedProgram → ExecuTorch program with everything XNNPACK takes delegated."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import EdgeCompileConfig, ExecutorchBackendConfig, to_edge_transform_and_lower
    from executorch.exir.passes import MemoryPlanningPass
    from executorch.exir.passes.sym_shape_eval_pass import ConstraintBasedSymShapeEvalPass

    times: dict[str, Any] = {}
    t = time.perf_counter()
    config = EdgeCompileConfig(_check_ir_validity=False, _skip_dim_order=True)
    with fast_lowering(enabled=fast) as stats:
        edge = to_edge_one_decomposition(ep, XnnpackPartitioner(), config, metadata) if fast else None
        if edge is None:
            edge = to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()], compile_config=config,
                                               constant_methods=metadata)
        times["to_edge_and_lower"] = round(time.perf_counter() - t, 2)
        if stats is not None:
            times["xnnpack_partitions"] = stats.to_dict()
        t = time.perf_counter()
        program = edge.to_executorch(ExecutorchBackendConfig(
            extract_delegate_segments=True, do_quant_fusion_and_const_prop=True,
            memory_planning_pass=MemoryPlanningPass(alloc_graph_input=False),
            sym_shape_eval_pass=ConstraintBasedSymShapeEvalPass()))
        times["to_executorch"] = round(time.perf_counter() - t, 2)
    return program, times


# --------------------------------------------------------------------------------------------
def weights_digest(source: Path) -> str:
    """sha256 of the weights the program is built from (the GGUF, or the HF folder's safetensors)."""

    source = Path(source)
    if source.is_file():
        return file_sha256(source)
    files = sorted(source.glob("*.safetensors")) + [p for p in (source / "config.json",) if p.is_file()]
    if not files:
        raise InputError(f"{source} has no weights (*.safetensors) to build from")
    h = hashlib.sha256()
    for f in files:
        h.update(f.name.encode() + b"\0" + file_sha256(f).encode())
    return h.hexdigest()


def cache_key_for(source_digest: str, opts: CpuExportOptions) -> str:
    return cache_key("xnnpack-llm", EXPORT_FORMAT_VERSION, source_digest, opts.key(),
                     {p: version(p) for p in ("executorch", "torch", "torchao", "transformers")})


def build_cached(source: Path, opts: CpuExportOptions, *, load_llm=None, progress=None,
                 use_cache: bool = True, cache_dir: Path | None = None) -> tuple[Path, dict[str, Any], bool]:
    """The cache entry holding `model.pte` + `tokenizer.json` + `llm.json` for `source`; built on a miss.

    `load_llm()` returns the `LoadedLLM` (called only on a miss: loading a GGUF dequantizes it)."""

    digest = weights_digest(source)
    key = cache_key_for(digest, opts)
    cache = Cache(Path(cache_dir) if cache_dir else None, enabled=use_cache)

    def build(tmp: Path) -> dict:
        t0 = time.perf_counter()
        if not load_llm:
            _check_source_family(source, opts.max_seq_len)
        if progress:
            progress("loading the weights")
        llm = load_llm() if load_llm else _load_source(source)
        t_load = time.perf_counter() - t0
        tok = from_transformers(llm.tokenizer, chat_template=llm.chat_template, eos_ids=llm.eos_token_ids(),
                                source=str(source))
        tok.save(tmp)
        try:
            meta = export_pte(llm.model, tmp, opts, bos_id=tok.bos_id, eos_ids=sorted(set(tok.eos_ids)),
                              progress=progress, gguf=Path(source) if Path(source).is_file() else None)
        except (ToolchainError, InputError, UnsupportedError):
            raise
        meta["times_s"] = {"load": round(t_load, 2), **meta["times_s"]}
        meta.update(source=str(source), source_sha256=digest, options=asdict(opts), architecture=llm.architecture,
                    export_seconds=round(time.perf_counter() - t0, 2), tokenizer="tokenizer.json",
                    format_version=EXPORT_FORMAT_VERSION)
        (tmp / META_NAME).write_text(json.dumps(meta, indent=1))
        return meta

    entry, hit = cache.get_or_create("xnnpack-llm", key, build)
    return entry, json.loads((entry / META_NAME).read_text()), hit


def _load_source(source: Path):
    if source.is_file():
        return load_gguf_causal_lm(source)
    return load_hf_folder(source)


def _check_source_family(source: Path, max_seq_len: int) -> None:
    """Refuse what the CPU export cannot build from the config / GGUF header, before loading weights."""
    if source.is_file():
        info = read_gguf_info(source)
        family = check_gguf_header(info, max_seq_len)
        require_cpu_family(family, info.architecture)
        check_gguf_tensors(info)
    else:
        check_cpu_config(read_hf_config(source), max_seq_len)
        check_hf_files(source)
