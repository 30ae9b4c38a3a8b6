"""Run a compiled graph of a bundle on the HTP simulator (libQnnHtp.so on x86) via its EPContext model."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ...contract import Bundle, GraphSpec, open_bundle
from ...core.errors import InputError, ToolchainError, clip
from ...core.feeds import InputSpec, check_feed, read_input_files
from ...core.targets import get_target
from ...toolchain.htp_options import run_provider_options
from ...toolchain.ort_qnn import EP_NAME, SessionPlan, create_session, node_assignment
from ...toolchain.qairt import find_qairt
from .formats import OUTPUT_FORMATS


_ORT_TYPES = {"tensor(float)": "float32", "tensor(float16)": "float16", "tensor(int64)": "int64", "tensor(int32)": "int32",
              "tensor(uint8)": "uint8", "tensor(int8)": "int8", "tensor(uint16)": "uint16", "tensor(int16)": "int16",
              "tensor(bool)": "bool"}


@dataclass
class CompiledGraph:
    bundle: Bundle
    part: str
    target: str
    epcontext: Path
    graph: GraphSpec
    precision: str


def _version_tuple(build: str) -> tuple[int, ...]:
    nums = [int(x) for x in build.lstrip("v").split(".") if x.isdigit()]
    return tuple(nums[:3])


def check_runtime(bundle: Bundle) -> None:
    """A context binary needs a QNN runtime at least as new as the QAIRT that built it."""
    built = bundle.manifest.qairt_build
    have = find_qairt().build_id
    if built and _version_tuple(built) > _version_tuple(have):
        raise ToolchainError(f"{bundle.path} was built by QAIRT {built}; the QNN runtime here is {have}",
                             "run it with a QAIRT at least as new (QNN_SDK_ROOT), or recompile the bundle here")


def select_graphs(bundle: Bundle, part: str | None = None, target: str | None = None) -> list[CompiledGraph]:
    m = bundle.manifest
    if m.format not in OUTPUT_FORMATS or not OUTPUT_FORMATS[m.format].runs_here:
        raise InputError(f"{bundle.path} holds a {m.format}, which this host cannot run",
                         "compile with --format context-binary to run or verify on the HTP simulator")
    want_target = bundle.check_selection(part, target)
    precision = {pm.name: pm.precision for pm in m.parts}
    out, seen = [], set()
    for g in m.graphs:
        p = g.part
        key = (p, g.target)
        if (part and p != part) or (want_target and g.target != want_target) or key in seen:
            continue
        seen.add(key)
        # LLM bundles: the weight-shared binary cannot run on the x86 simulator (it crashes the
        # process); its unshared twin, compiled from the same QDQ graph, is what runs here
        ctx = g.host_twin.epcontext_model if g.host_twin else g.epcontext_model
        if not ctx:
            raise InputError(f"{bundle.path}: graph {g.name} names no EPContext model", "recompile the bundle")
        out.append(CompiledGraph(bundle, p, g.target, bundle.file(ctx), g, precision.get(p, m.precision or "?")))
    return out


@dataclass
class RunResult:
    part: str
    target: str
    outputs: dict[str, np.ndarray]
    load_seconds: float
    run_seconds: list[float] = field(default_factory=list)
    placement: dict[str, Any] = field(default_factory=dict)

    def summary(self) -> dict:
        return {"part": self.part, "target": self.target, "load_s": round(self.load_seconds, 4),
                "run_s": [round(x, 4) for x in self.run_seconds],
                "outputs": {k: {"shape": list(v.shape), "dtype": str(v.dtype), "min": float(v.min()) if v.size else None,
                                "max": float(v.max()) if v.size else None,
                                **({"argmax": int(v.reshape(-1).argmax())} if v.size else {})}
                            for k, v in self.outputs.items()},
                "placement": self.placement}


class SimulatorSession:
    """One EPContext model loaded on the HTP simulator."""

    def __init__(self, cg: CompiledGraph, perf_profile: str | None = None):
        soc = get_target(cg.target)
        t0 = time.perf_counter()
        try:
            self.session = create_session(cg.epcontext, SessionPlan(provider_options=run_provider_options(soc.soc_model, perf_profile)))
        except Exception as e:
            raise ToolchainError(f"the HTP simulator could not load {cg.epcontext}: {clip(str(e), 1000)}",
                                 "check the bundle with `modelexport inspect`; recompile it if it came from another QAIRT") from None
        self.load_seconds = time.perf_counter() - t0
        placement = node_assignment(self.session)
        self.placement = {ep: len(v) for ep, v in placement.items()}
        if not placement.get(EP_NAME):
            raise ToolchainError("the EPContext node did not land on the QNN EP (it would silently run nothing on the HTP)",
                                 "run `modelexport doctor`")
        self.inputs = {i.name: i for i in self.session.get_inputs()}
        self.cg = cg

    @property
    def input_specs(self) -> list[InputSpec]:
        return [InputSpec(name, tuple(i.shape) if all(isinstance(d, int) for d in i.shape) else None,
                          _ORT_TYPES.get(i.type)) for name, i in self.inputs.items()]

    def check_feed(self, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return check_feed(feed, self.input_specs)

    def random_feed(self, seed: int = 0) -> dict[str, np.ndarray]:
        rng = np.random.default_rng(seed)
        feed = {}
        for name, spec in self.inputs.items():
            if spec.type == "tensor(float)":
                feed[name] = rng.standard_normal(spec.shape).astype(np.float32)
            elif spec.type == "tensor(float16)":
                feed[name] = rng.standard_normal(spec.shape).astype(np.float16)
            else:
                feed[name] = rng.integers(0, 100, spec.shape).astype(np.int64 if "int64" in spec.type else np.int32)
        return feed

    def run(self, feed: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], float]:
        names = [o.name for o in self.session.get_outputs()]
        t0 = time.perf_counter()
        try:
            outs = self.session.run(names, self.check_feed(feed))
        except Exception as e:      # noqa: BLE001 - onnxruntime's own errors (EPFail, Fail) are not RuntimeErrors
            if "QNN graph execute error" not in str(e):
                raise
            raise ToolchainError(f"the HTP simulator stopped while executing {self.cg.part} on these inputs "
                                 "(QNN graph execute error; the library's log line above names the op)",
                                 "most often an index past its table: a Gather's indices from an input (give real "
                                 "inputs: --input FILE, or fix it with --input-value NAME=VALUE at compile) or "
                                 "computed in float16 inside the graph (compile at --precision 16a16w)") from None
        return dict(zip(names, outs)), time.perf_counter() - t0


def given_feed(inputs, session) -> dict[str, np.ndarray]:
    """The user's inputs — --input files, or arrays by name from the Python API — checked against
    the inputs of a session (any with `inputs` and `input_specs`: run, verify and profile, per format)."""
    if isinstance(inputs, np.ndarray):
        names = list(session.inputs)
        if len(names) != 1:
            raise InputError(f"one array was given for a model with {len(names)} inputs ({', '.join(names)})",
                             "pass a dict of arrays by input name: inputs={" + ", ".join(f"'{n}': ..." for n in names) + "}")
        inputs = {names[0]: inputs}
    feed = dict(inputs) if isinstance(inputs, dict) else read_input_files(list(inputs or []), list(session.inputs))
    return check_feed(feed, session.input_specs)


def run_repeated(session, inputs, random: bool, seed: int, repeat: int) -> tuple[dict[str, np.ndarray], list[float]]:
    """`run`'s loop for any session with `inputs`, `random_feed` and `run` (the QNN simulator's
    or an ExecuTorch program's): the feed from files, arrays or random data, run `repeat` times."""
    if inputs is None or (isinstance(inputs, (list, tuple)) and not inputs):
        if not random:
            raise InputError("no inputs given", "pass --input x.npy (or NAME=x.npy), or --random for random data")
        feed = session.random_feed(seed)
    else:
        feed = given_feed(inputs, session)
    outs, times = {}, []
    for _ in range(max(1, repeat)):
        outs, dt = session.run(feed)
        times.append(dt)
    return outs, times


def run_bundle(bundle_path: str | Path, inputs: list[str] | dict[str, np.ndarray] | None = None, random: bool = False,
               part: str | None = None, target: str | None = None, perf_profile: str | None = None,
               repeat: int = 1, seed: int = 0) -> RunResult:
    """Run one compiled graph (the bundle's only one, or the chosen part/target) on the simulator."""
    bundle = open_bundle(bundle_path)
    check_runtime(bundle)
    graphs = select_graphs(bundle, part, target)
    if len(graphs) != 1:
        raise InputError(f"{bundle.path} holds {len(graphs)} compiled graphs: "
                         + ", ".join(f"{g.part}@{g.target}" for g in graphs),
                         "choose one with --part and/or --target")
    sess = SimulatorSession(graphs[0], perf_profile)
    outs, times = run_repeated(sess, inputs, random, seed, repeat)
    return RunResult(graphs[0].part, graphs[0].target, outs, sess.load_seconds, times, sess.placement)
