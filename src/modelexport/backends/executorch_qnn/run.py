"""Run a `.pte` (bundle or bare file) on this host through executorch.runtime, and verify a
.pte bundle against eager PyTorch.

The QnnBackend of the pip runtime runs the embedded context binary on the HTP simulator
(libQnnHtp.so on x86, through the ABI adapter: ensure_executorch_qnn first), XnnpackBackend and
portable kernels run on the CPU. Numerics are real; timings say nothing about a phone.
The float reference of `verify` is the bundle's own `float.pt2` (the exported float model,
after any rewrites) run eagerly by torch.
"""
from __future__ import annotations

import gc
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ...contract import open_bundle
from ...core.errors import InputError, ToolchainError, clip
from ...core.feeds import InputSpec, check_feed
from ...core.vocab import GraphKind
from ...quant.precision import pass_mark
from ...toolchain.native_io import capture_native_output
from ..ort_qnn.run import RunResult, _version_tuple, run_repeated
from ..ort_qnn.verify import GraphCheck, OutputCheck, VerifyReport, check_output, verify_samples
from .inspect import read_pte
from .specs import qnn_ready


@dataclass
class PteGraph:
    part: str
    target: str | None
    pte: Path
    precision: str
    inputs: list[dict]               # name, shape, dtype (the method's, float32 for a float graph)
    outputs: list[str]
    method: str = "forward"
    bundle: Any = None


def _select(path: str | Path, part: str | None, target: str | None) -> list[PteGraph]:
    p = Path(path)
    if p.is_file():
        info = read_pte(p.read_bytes(), read_binaries=False)
        m = info["methods"][0]
        ins = [{"name": f"input_{i}", **{k: t.get(k) for k in ("shape", "dtype")}} for i, t in enumerate(m["inputs"])]
        return [PteGraph("model", None, p, "?", ins, [f"output_{i}" for i in range(len(m["outputs"]))], m["name"])]
    bundle = open_bundle(p)
    m = bundle.manifest
    want = bundle.check_selection(part, target)
    precisions = {pm.name: pm.precision for pm in m.parts}
    out = []
    for g in m.graphs:
        if g.kind != GraphKind.PTE_METHOD or (part and g.part != part) or (want and g.target != want):
            continue
        out.append(PteGraph(g.part, g.target, bundle.file(g.file), precisions.get(g.part, m.precision),
                            [{"name": t.name, "shape": t.shape, "dtype": t.dtype} for t in g.inputs],
                            [t.name for t in g.outputs], g.name, bundle))
    return out


def check_runtime_build(built: str | None, have: str) -> None:
    if built and _version_tuple(built) > _version_tuple(have):
        raise ToolchainError(f"the .pte's QNN context binary was built by QAIRT {built}; the QNN runtime here is {have}",
                             "run it with a QAIRT at least as new (QNN_SDK_ROOT), or recompile it here")


class PteSession:
    """One method of a .pte loaded through executorch.runtime."""

    def __init__(self, g: PteGraph):
        state = qnn_ready()
        if g.bundle is not None:
            check_runtime_build(g.bundle.manifest.qairt_build, state.qairt_build)
        from executorch.runtime import Runtime
        t0 = time.perf_counter()
        try:
            with capture_native_output() as log:
                self.program = Runtime.get().load_program(g.pte)
                self.method = self.program.load_method(g.method)
        except Exception as e:
            tail = " | ".join(line for line in log[-6:]) if "log" in locals() else ""
            raise ToolchainError(f"executorch.runtime could not load {g.pte} ({g.method}): {clip(str(e), 1000)}"
                                 + (f" — log: {clip(tail, 1000)}" if tail else ""),
                                 "check it with `modelexport inspect`; recompile it with this modelexport") from None
        if self.method is None:
            raise InputError(f"{g.pte} has no method {g.method!r}", "inspect it for its method names")
        self.load_seconds = time.perf_counter() - t0
        self.g = g
        self.inputs = {i["name"]: i for i in g.inputs}

    def __enter__(self) -> "PteSession":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Free the program now, with the QNN backend's "Destroy Qnn context/device/backend" INFO
        lines captured rather than printed at interpreter exit."""
        with capture_native_output():
            self.method = self.program = None
            gc.collect()

    @property
    def input_specs(self) -> list[InputSpec]:
        return [InputSpec(n, tuple(i["shape"]) if i.get("shape") is not None else None, i.get("dtype"))
                for n, i in self.inputs.items()]

    def check_feed(self, feed: dict[str, np.ndarray]) -> list:
        import torch
        arrays = check_feed(feed, self.input_specs, "method")
        return [torch.from_numpy(np.ascontiguousarray(a)) for a in arrays.values()]

    def random_feed(self, seed: int = 0) -> dict[str, np.ndarray]:
        rng = np.random.default_rng(seed)
        feed = {}
        for name, spec in self.inputs.items():
            dt = np.dtype(spec.get("dtype") or "float32")
            shape = spec["shape"]
            feed[name] = rng.standard_normal(shape).astype(dt) if dt.kind == "f" else rng.integers(0, 8, shape).astype(dt)
        return feed

    def run(self, feed: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], float]:
        args = self.check_feed(feed)
        t0 = time.perf_counter()
        with capture_native_output():
            outs = self.method.execute(args)
        dt = time.perf_counter() - t0
        names = self.g.outputs or [f"output_{i}" for i in range(len(outs))]
        return {n: o.detach().numpy() if hasattr(o, "detach") else np.asarray(o) for n, o in zip(names, outs)}, dt


def _one(graphs: list[PteGraph], path) -> PteGraph:
    if not graphs:
        raise InputError(f"{path} holds no .pte method to run", "compile a PyTorch model with --format pte")
    if len(graphs) != 1:
        raise InputError(f"{path} holds {len(graphs)} compiled methods: " + ", ".join(f"{g.part}@{g.target}" for g in graphs),
                         "choose one with --part and/or --target")
    return graphs[0]


def run_pte(path: str | Path, inputs=None, random: bool = False, part: str | None = None, target: str | None = None,
            perf_profile: str | None = None, repeat: int = 1, seed: int = 0) -> RunResult:
    g = _one(_select(path, part, target), path)
    with PteSession(g) as sess:
        outs, times = run_repeated(sess, inputs, random, seed, repeat)
    placement = {}
    if g.bundle is not None:
        placement = (g.bundle.manifest.placement.get("summary") or {}).get("by_runtime", {})
    return RunResult(g.part, g.target or "-", outs, sess.load_seconds, times, placement)


def float_reference(bundle, part: str):
    import torch
    pm = bundle.manifest.part(part)
    rel = pm.files.float_model if pm else None
    if not rel:
        raise InputError(f"{bundle.path} keeps no float model for {part}", "recompile the bundle with this modelexport")
    return torch.export.load(bundle.file(rel)).module()


def compare_outputs(refs: dict[str, list], gots: dict[str, list], threshold: float) -> list[OutputCheck]:
    return [check_output(n, refs[n], gots[n], threshold) for n in refs]


def eager_outputs(module, sample: dict[str, np.ndarray], names_in: list[str], names_out: list[str]) -> dict[str, np.ndarray]:
    import torch
    with torch.no_grad():
        out = module(*[torch.from_numpy(np.ascontiguousarray(sample[n])) for n in names_in])
    # nested outputs (an LSTM's (y, (h, c)), a HF ModelOutput) in the order the .pte returns them
    outs = [o for o in torch.utils._pytree.tree_leaves(out) if isinstance(o, torch.Tensor)]
    return {n: o.detach().numpy() for n, o in zip(names_out, outs)}


def verify_pte(path: str | Path, inputs=None, part: str | None = None, target: str | None = None,
               min_sqnr: float | None = None, max_samples: int | None = None) -> VerifyReport:
    if Path(path).is_file():
        raise InputError(f"{path} is a bare .pte: it carries no float model to compare against",
                         "verify the bundle folder that `modelexport compile -o` wrote")
    graphs = _select(path, part, target)
    if not graphs:
        raise InputError(f"{path} holds no .pte method to verify", "compile a PyTorch model with --format pte")
    report = VerifyReport(str(graphs[0].bundle.path), [])
    for g in graphs:
        with PteSession(g) as sess:
            names_in = [i["name"] for i in g.inputs]
            samples, kind = verify_samples(g.bundle, g.part, sess, inputs)
            if max_samples:
                samples = samples[:max_samples]
            ref_mod = float_reference(g.bundle, g.part)   # per graph: a module with a state starts afresh
            refs = {n: [] for n in g.outputs}
            gots = {n: [] for n in g.outputs}
            for s in samples:
                ref = eager_outputs(ref_mod, s, names_in, g.outputs)
                got, _ = sess.run(s)
                for n in g.outputs:
                    refs[n].append(ref[n])
                    gots[n].append(got[n].astype(np.float32))
        threshold = pass_mark(min_sqnr, g.precision)
        gc = GraphCheck(g.part, g.target or "-", g.precision, threshold, len(samples), kind)
        gc.outputs = compare_outputs(refs, gots, threshold)
        report.graphs.append(gc)
    return report
