"""ExecuTorch's QnnQuantizer driven by modelexport's precision names.

Every precision of quant.precision's table is offered, block-wise 4-bit `16a4w_block` included
(weights int4 in blocks of `block_size` input channels, each with its own scale; needs HTP V69+).
`fp16` means no quantizer and the HTP's float16 mode.

Per-module overrides (`--override 'REGEX=PRECISION'`) use the quantizer's submodule mechanism
(`set_submodule_qconfig_list`): a node takes the first override whose regex matches one of the
module paths in its `nn_module_stack` (as ExecuTorch's QuantRecipe.add_regex matches), otherwise
the default. Block sizes are given per node (`set_block_size_map`) to every conv/linear whose
config is 16a4w_block.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..core.errors import InputError
from ..core.targets import SoC, require_feature
from ..frontends.module_paths import fx_module_paths
from ..toolchain.executorch_env.chipset import chipset
from ..toolchain.library_notes import quiet_python_notes
from ..toolchain.native_io import capture_native_output
from .override_spec import Override, parse_override_specs
from .precision import Precision

# the quantized precisions → ExecuTorch's QuantDtype member
QUANT_DTYPE = {"8a8w": "use_8a8w", "16a8w": "use_16a8w", "16a16w": "use_16a16w", "16a4w": "use_16a4w",
               "16a4w_block": "use_16a4w_block"}
DEFAULT_BLOCK_SIZE = 64
# What the quantizer does beyond the plan (part of the compile cache key: change it when this file's recipe changes).
RECIPE = "qnn-quantizer/per-channel-conv-linear/minmax-observer/block-linear-as-conv2d/fp16-fold-bn/int-ops-float/v4"


def parse_overrides(specs: list[str] | None, default: Precision) -> list[Override]:
    def check(spec: str, p: Precision) -> None:
        if not p.quantized:
            raise InputError(f"--override {spec!r}: a {p.name} override inside a quantized graph is not offered",
                             f"use a quantized precision ({', '.join(QUANT_DTYPE)}), or compile the whole model as fp16")
        if not default.quantized:
            raise InputError(f"--override {spec!r} needs a quantized --precision (the model is compiled as {default.name})",
                             "give --precision 8a8w/16a8w/... and override the modules that need another one")
    return parse_override_specs(specs, "layers\\.0\\.mlp=16a8w", check)


@dataclass
class QuantPlan:
    precision: Precision
    overrides: list[Override] = field(default_factory=list)
    block_size: int = DEFAULT_BLOCK_SIZE
    matched: dict[str, int] = field(default_factory=dict)    # override pattern → nodes it matched
    block_quantized_nodes: int = 0

    def precision_of(self, node) -> Precision:
        paths = fx_module_paths(node)
        for o in self.overrides:
            if o.matches(*paths):
                return o.precision
        return self.precision

    @property
    def uses_block(self) -> bool:
        return any(p.block_wise for p in (self.precision, *(o.precision for o in self.overrides)))

    def check_target(self, soc: SoC) -> None:
        for p in {self.precision, *(o.precision for o in self.overrides)}:
            if p.feature:
                require_feature(soc, p.feature, f"precision {p.name}")

    def key(self) -> dict:
        """What shapes the quantization (for the cache key): no per-run counts."""
        return {"precision": self.precision.name, "overrides": [(o.pattern, o.precision.name) for o in self.overrides],
                "block_size": self.block_size if self.uses_block else None}

    def learnt(self) -> dict:
        """What annotating the graph filled in (stored with a cached quantized program)."""
        return {"matched": dict(self.matched), "block_quantized_nodes": self.block_quantized_nodes}

    def restore_learnt(self, learnt: dict) -> None:
        self.matched = dict(learnt.get("matched", {}))
        self.block_quantized_nodes = int(learnt.get("block_quantized_nodes", 0))

    def describe(self) -> dict:
        d: dict[str, Any] = {"precision": self.precision.name}
        if self.overrides:
            d["overrides"] = [{"regex": o.pattern, "precision": o.precision.name, "nodes": self.matched.get(o.pattern, 0)}
                              for o in self.overrides]
        if self.uses_block:
            d["block_size"] = self.block_size
            d["block_quantized_nodes"] = self.block_quantized_nodes
        return d


def _module_qconfig(p: Precision):
    """Per-channel conv/linear weights; activation ranges by MinMaxObserver (the true min/max over
    every calibration sample: the moving average ExecuTorch defaults to under-ranges a short
    calibration set, as its own LLM recipes note by choosing MinMaxObserver)."""
    from executorch.backends.qualcomm.quantizer.quantizer import ModuleQConfig, QuantDtype
    from torchao.quantization.pt2e import MinMaxObserver
    return ModuleQConfig(getattr(QuantDtype, QUANT_DTYPE[p.name]), is_conv_per_channel=True, is_linear_per_channel=True,
                         act_observer=MinMaxObserver)


def _in_channels(node) -> int | None:
    """The input channels of a conv2d / linear weight (O, I, ...), the axis blocks are cut along."""
    import torch
    if node.target in (torch.ops.aten.conv2d.default, torch.ops.aten.linear.default):
        w = node.args[1].meta.get("val")
        return int(w.shape[1]) if w is not None else None
    return None


def _block_shape(node, block_size: int) -> tuple | None:
    """(1, block, 1, 1) for conv2d weights (O, I, kh, kw); (1, block) for linear (O, I)."""
    import torch
    ch = _in_channels(node)
    if ch is None or ch % block_size:
        return None
    return (1, block_size, 1, 1) if node.target == torch.ops.aten.conv2d.default else (1, block_size)


def _check_blocks(blocks: dict, channels: list[int], block_size: int) -> None:
    """Block-wise weights asked for, layers that could take them, and none does: the block size
    divides none of their input channels (it would compile with zero block-quantized layers)."""
    if channels and not blocks:
        shown = ", ".join(str(c) for c in sorted(set(channels))[:8])
        raise InputError(f"--block-size {block_size} divides the input channels of none of the {len(channels)} "
                         f"conv/linear layers (their input channels: {shown}), so no weight would be block-quantized",
                         "choose a --block-size that divides them (a multiple of 16, e.g. 32), or use --precision 16a4w")


def _integer_out(node) -> bool:
    import torch
    vals = node.meta.get("val")
    vals = vals if isinstance(vals, (tuple, list)) else [vals]
    ts = [v for v in vals if isinstance(v, torch.Tensor)]
    return bool(ts) and all(not v.dtype.is_floating_point for v in ts)


def build_quantizer(plan: QuantPlan, soc: SoC):
    """A QnnQuantizer with the plan's default and overrides. The per-node parts (block sizes, which
    nodes each override matched) are worked out at annotation time, on the graph the quantizer's
    own transforms produced, so node names are the ones it looks up."""
    from executorch.backends.qualcomm.quantizer.quantizer import QnnQuantizer

    class PlannedQuantizer(QnnQuantizer):
        def annotate(self, model):
            plan.matched.clear()
            blocks, channels = {}, []
            for node in model.graph.nodes:
                if node.op != "call_function":
                    continue
                paths = fx_module_paths(node)
                hit = next((o for o in plan.overrides if o.matches(*paths)), None)
                if hit is not None:
                    plan.matched[hit.pattern] = plan.matched.get(hit.pattern, 0) + 1
                if (hit.precision if hit else plan.precision).block_wise and _in_channels(node) is not None:
                    channels.append(_in_channels(node))
                    shape = _block_shape(node, plan.block_size)
                    if shape:
                        blocks[node.name] = shape
            _check_blocks(blocks, channels, plan.block_size)
            self.set_block_size_map(blocks)
            plan.block_quantized_nodes = len(blocks)
            # integer index arithmetic (a split of position ids) is never quantized
            self.add_discard_nodes([n.name for n in model.graph.nodes if n.op == "call_function" and _integer_out(n)])
            return super().annotate(model)

    with quiet_python_notes():      # the wheel has no QNN SDK op-info table: toolchain.library_notes
        quantizer = PlannedQuantizer(soc_model=chipset(soc))
    quantizer.default_quant_config = _module_qconfig(plan.precision)
    if plan.overrides:
        def predicate_for(o: Override):
            return lambda node: o.matches(*fx_module_paths(node))
        quantizer.set_submodule_qconfig_list([(predicate_for(o), _module_qconfig(o.precision)) for o in plan.overrides])
    return quantizer


def soc_scope(soc: SoC) -> str | None:
    """What of the SoC a quantized program depends on (part of its cache key). QnnQuantizer reads
    the SoC in `validate` only (the LPBQ / 16a16w HTP-arch floors, the backend's per-op constraints),
    and only for the ops the QNN SDK's op-info table lists. Without that table (this wheel:
    ExecuTorch falls back to its no-op op info) nothing: the program is the same for every target
    (None). With it, the SoC's name: a constraint could refuse a node on one SoC only, so the
    program is not shared across SoCs."""
    from executorch.backends.qualcomm.quantizer.backend_opinfo_adapter import get_backend_opinfo
    from executorch.backends.qualcomm.serialization.qc_schema import QnnExecuTorchBackendType

    with quiet_python_notes():
        ops = get_backend_opinfo(str(QnnExecuTorchBackendType.kHtpBackend), chipset(soc)).get_all_supported_ops()
    return soc.name if ops else None


def quantize(gm, plan: QuantPlan, soc: SoC, samples: list[tuple]) -> Any:
    """prepare_pt2e → run every calibration sample → convert_pt2e."""
    import torch
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
    quantizer = build_quantizer(plan, soc)
    with capture_native_output():        # the quantizer prints ("No quant config ...") to stdout
        prepared = prepare_pt2e(gm, quantizer)
    with torch.no_grad():
        for s in samples:
            prepared(*s)
    with capture_native_output():
        return convert_pt2e(prepared)
