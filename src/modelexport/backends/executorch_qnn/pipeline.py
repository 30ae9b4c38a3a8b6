"""The steps audit and compile share for a PyTorch model, up to the graph that gets lowered:

load → torch.export (non-strict; errors name the module) → opt-in rewrites → (quantized
precisions) QnnQuantizer: prepare_pt2e, calibration, convert_pt2e.
"""
from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...core.cache import Cache
from ...core.errors import CalibrationError, InputError, UnsupportedError
from ...frontends.torch_export import TorchIO, export_program, input_specs
from ...frontends.torch_frontend import load_torch
from ...frontends.torch_module import LoadedModule, flatten_loaded
from ...passes import apply_rewrites, get_pass
from ...quant.calibration import CalibrationSet, load_calibration
from ...quant.precision import Precision, check_block_size, get_precision
from ...core.targets import SoC, get_target
from ...quant.pt2e_qnn import DEFAULT_BLOCK_SIZE, QuantPlan, parse_overrides, quantize
from .lower import LowerInputs, mutated_buffers

RANDOM_SAMPLES = 8
# The quantized program (QnnQuantizer's convert_pt2e output) as a cache entry: keyed without the
# target, since the quantizer's annotation reads nothing of the SoC (quantized_key says when it does).
QUANTIZED_NAMESPACE = "pt2e-quantized"
QUANTIZED_FILE = "quantized.pt2"


@dataclass(frozen=True)
class PrepareOptions:
    """How the graph is built beyond model, target, precision and calibration (compile's and audit's keywords)."""
    overrides: list[str] | None = None       # 'REGEX=PRECISION' per-module precisions
    block_size: int | None = None            # 16a4w_block: input channels per scale
    rewrites: list[str] | None = None        # opt-in rewrite passes (modelexport.passes)
    dynamic_shapes: Any = None               # torch.export dynamic_shapes


@dataclass
class Prepared:
    loaded: LoadedModule
    soc: SoC
    plan: QuantPlan
    inputs: list[TorchIO]
    exported: Any                      # float ExportedProgram after rewrites (verify's reference)
    graph: Any                         # the GraphModule to lower: quantized, or float for fp16
    calibration: CalibrationSet | None
    verify_inputs: CalibrationSet
    rewrites: list[dict] = field(default_factory=list)
    dynamic_shapes: Any = None
    timings: dict[str, float] = field(default_factory=dict)
    quantize_hit: bool | None = None   # the quantized program came from the cache (None: not quantized here)

    @property
    def precision(self) -> Precision:
        return self.plan.precision

    def lowerable(self, cache: Cache | None = None, key: str | None = None):
        """The graph to lower: quantized (prepare_pt2e → calibration → convert_pt2e) once, or float.
        With a cache and the quantization's key (`quantized_key`), the quantized program is a cache
        entry every target of this model and precision shares, in this process or another."""
        if self.graph is None:
            t0 = time.perf_counter()
            if self.precision.quantized and cache is not None and key is not None:
                self.graph, self.quantize_hit = self._cached_quantized(cache, key)
            elif self.precision.quantized:
                self.graph, self.quantize_hit = self._quantized(), False
            else:
                gm = self.reference()
                fold_batch_norms(gm)
                self.graph = gm
            if self.precision.quantized:
                self.timings["quantize_s"] = round(time.perf_counter() - t0, 3)
        return self.graph

    def _quantized(self):
        import torch
        gm = self.reference()
        samples = [as_args(s, self.inputs) for s in self.calibration.samples]
        with torch.no_grad():
            gm = quantize(gm, self.plan, self.soc, samples)
            self._reset_mutable_buffers(gm)
        return gm

    def _cached_quantized(self, cache: Cache, key: str):
        """The quantized program as a cache entry (a .pt2 and what the plan learnt while annotating).
        A miss lowers the program it just stored, as a hit does: the graph lowered is the same either way."""
        import torch

        def build(tmp):
            gm = self._quantized()
            ep = torch.export.export(gm, tuple(self.example_inputs()), strict=False)
            torch.export.save(ep, str(tmp / QUANTIZED_FILE))
            return {"plan": self.plan.learnt(), "calibration": self.calibration.digest()}

        entry, hit = cache.get_or_create(QUANTIZED_NAMESPACE, key, build)
        self.plan.restore_learnt(Cache.meta(entry)["plan"])
        return torch.export.load(str(entry / QUANTIZED_FILE)).module(), hit

    @property
    def mutable_buffers(self) -> list[str]:
        """Buffers the forward writes (a state, a KV cache)."""
        return mutated_buffers(self.exported)

    def reference(self):
        """The float module to run eagerly. A module with a state gets its own copy: running
        it advances the state, and the .pte and float.pt2 must both start from the initial one."""
        return copy.deepcopy(self.exported).module() if self.mutable_buffers else self.exported.module()

    def _reset_mutable_buffers(self, gm) -> None:
        """Calibration ran the forward and advanced the state: put the initial values back."""
        initial = self.exported.state_dict
        for name in self.mutable_buffers:
            try:
                gm.get_buffer(name).copy_(initial[name])
            except (AttributeError, KeyError) as e:
                raise UnsupportedError(f"the mutable buffer {name!r} could not be reset after calibration ({e})",
                                       "compile at fp16, or make the state an input and output of forward") from None

    def example_inputs(self) -> tuple:
        return tuple(self.loaded.example_inputs)

    def lower_inputs(self, soc: SoC | None = None) -> LowerInputs:
        """What `lower` takes for this model, for `soc` (default: its first target)."""
        return LowerInputs(self.example_inputs(), self.soc if soc is None else soc, use_fp16=not self.precision.quantized,
                           dynamic_shapes=self.dynamic_shapes, linear_to_conv2d=self.plan.uses_block)


def fold_batch_norms(gm) -> None:
    """fp16: fold each inference BatchNorm into the convolution before it (torchao's pt2e fold, the
    one prepare_pt2e applies for the quantized precisions). Measured: ExecuTorch's QNN fp16 path
    otherwise keeps BatchNorm as its own HTP op, and MobileNetV2 came out at 2.5 dB SQNR; folded,
    47 dB. Mathematically the same model; the float reference of verify stays the unfolded one."""
    from torchao.quantization.pt2e.utils import _fuse_conv_bn_
    _fuse_conv_bn_(gm)
    gm.graph.eliminate_dead_code()
    gm.recompile()


def _random_set(loaded: LoadedModule, inputs: list[TorchIO], n: int) -> CalibrationSet:
    """Normal noise scaled like each float example input; integer inputs keep the example's values
    (indices and token ids must stay in range)."""
    rng = np.random.default_rng(0)
    samples = []
    for i in range(n):
        s = {}
        for io, x in zip(inputs, loaded.example_inputs):
            arr = x.detach().cpu().numpy()
            if np.issubdtype(arr.dtype, np.floating) and i > 0:
                std = float(arr.std()) or 1.0
                s[io.name] = (rng.standard_normal(arr.shape) * std + float(arr.mean())).astype(arr.dtype)
            else:
                s[io.name] = arr.copy()
        samples.append(s)
    cs = CalibrationSet(samples, "random", "random", representative=False)
    cs.notes.append("sample 0 is the example input; integer inputs are the example's in every sample")
    return cs


def calibration_set(spec: Any, loaded: LoadedModule, inputs: list[TorchIO], n_random: int = RANDOM_SAMPLES) -> CalibrationSet:
    if spec is None:
        raise CalibrationError("a quantized precision needs calibration data and none was given",
                               "pass --calibration DIR (.npy/.npz per sample), a .npz, an input list .txt, or `random` "
                               "(quick, but the manifest will say the ranges are not representative)")
    if isinstance(spec, str) and spec.strip().lower() == "random":
        return _random_set(loaded, inputs, n_random)
    return load_calibration(spec, inputs)


def as_args(sample: dict[str, np.ndarray], inputs: list[TorchIO]) -> tuple:
    import torch
    return tuple(torch.from_numpy(np.ascontiguousarray(sample[io.name])) for io in inputs)


def example_set(loaded: LoadedModule, inputs: list[TorchIO]) -> CalibrationSet:
    s = {io.name: x.detach().cpu().numpy() for io, x in zip(inputs, loaded.example_inputs)}
    return CalibrationSet([s], "example-inputs", "the module's example inputs")


def prepare(model: Any, example_inputs: Any = None, target: str = "SM8650", precision: str = "8a8w",
            calibration: Any = None, options: PrepareOptions = PrepareOptions()) -> Prepared:
    """Everything that can be wrong with the inputs is found before any heavy step."""
    soc = get_target(target)
    prec = get_precision(precision)
    check_block_size(options.block_size)
    plan = QuantPlan(prec, parse_overrides(options.overrides, prec),
                     DEFAULT_BLOCK_SIZE if options.block_size is None else options.block_size)
    if options.block_size is not None and not plan.uses_block:
        raise InputError(f"--block-size {options.block_size} applies to block-wise weights only, "
                         f"and {prec.name} has none",
                         "add --precision 16a4w_block (or an --override to it), or leave --block-size out")
    plan.check_target(soc)
    for name in options.rewrites or []:
        get_pass(name)  # unknown names fail here, before export
    t0 = time.perf_counter()
    loaded = model if isinstance(model, LoadedModule) else load_torch(model, example_inputs)
    if isinstance(model, LoadedModule) and example_inputs is not None:
        loaded.example_inputs = tuple(example_inputs) if isinstance(example_inputs, (tuple, list)) else (example_inputs,)
        loaded = flatten_loaded(loaded)
    inputs = input_specs(loaded.module, loaded.example_inputs, loaded.input_names)
    calib = calibration_set(calibration, loaded, inputs) if prec.quantized else None
    if prec.quantized:
        verify = calib
    elif calibration is not None and not (isinstance(calibration, str) and calibration.lower() == "random"):
        verify = calibration_set(calibration, loaded, inputs)
    else:
        verify = example_set(loaded, inputs)
    timings = {"load_s": round(time.perf_counter() - t0, 3)}
    t0 = time.perf_counter()
    exported = loaded.exported if (loaded.exported is not None and options.dynamic_shapes is None) else \
        export_program(loaded.module, loaded.example_inputs, loaded.source, options.dynamic_shapes)
    if options.rewrites:
        gm = exported.module()
        done = apply_rewrites(gm, options.rewrites)
        # the float reference (verify) is the rewritten model: it is what the user asked to compile
        exported = export_program(gm, loaded.example_inputs, loaded.source, options.dynamic_shapes)
    else:
        done = []
    timings["export_s"] = round(time.perf_counter() - t0, 3)
    return Prepared(loaded, soc, plan, inputs, exported, None, calib, verify, done, options.dynamic_shapes, timings)
