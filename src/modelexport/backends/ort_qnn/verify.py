"""Verify: the float model on ONNX Runtime's CPU EP vs the compiled graph on the HTP simulator.

Inputs are the bundle's stored verify inputs (calibration samples) unless the user gives some.
Per output: SQNR (dB, over all samples), cosine similarity, max abs error, and for class-score
shaped outputs the arg-max agreement. Passes when every output's SQNR reaches the threshold:
the precision's default (quant.precision) or the user's `min_sqnr`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ...contract import open_bundle
from ...contract.bundle import refresh_report, save_manifest
from ...core.errors import InputError
from ...quant.precision import PRECISIONS, pass_mark
from ...core.numerics import argmax_agreement, compare
from ...core.numerics_advice import failure_fix, graph_warnings
from .decisions import FLIP_SIZE, MAX_FLIP_SHARE, decision_ops
from .run import SimulatorSession, check_runtime, given_feed, select_graphs


@dataclass
class OutputCheck:
    name: str
    sqnr_db: float
    cosine: float | None             # None for a single value (a scalar output on one sample)
    max_abs_error: float
    argmax_agreement: float | None
    passed: bool
    ref_std: float | None = None     # spread of the float output: near 0, SQNR measures noise
    ref_abs_max: float | None = None
    note: str | None = None          # what could not be compared (outputs whose shape follows the input)
    flipped: int | None = None       # values that took the other branch of a decision (decisions.py), left out


def check_output(name: str, refs: list, gots: list, threshold: float, decided_by: list[str] | None = None
                 ) -> OutputCheck:
    """One output's numbers over all samples (float reference vs compiled). Where a sample's float and
    compiled shapes differ (an output whose length follows the input's values, a static graph's
    fixed one), their common leading part is compared, and the note says so. An output the model
    decides (`decided_by`: its ops from decisions.decision_ops) that fails only on a few values that
    took the other branch is scored on the others, and the note says how many (decisions.py)."""
    pairs = [_common(np.asarray(r), np.asarray(g)) for r, g in zip(refs, gots)]
    cropped = [p for p in pairs if p[2]]
    note = None
    if cropped:
        _, _, (rs, gs) = cropped[0]
        note = (f"{len(cropped)} of {len(pairs)} sample(s) compared on their common part only: the float model "
                f"gives shape {rs}, the compiled graph {gs} (this output's shape follows the input)")
    pairs = [(r, g) for r, g, _ in pairs if r is not None]
    if not pairs:
        return OutputCheck(name, float("-inf"), None, float("inf"), None, False, None, None,
                           (note or "") + "; the shapes have different ranks: nothing could be compared")
    if len({r.shape for r, _ in pairs}) == 1:
        r, g = np.stack([r for r, _ in pairs]), np.stack([g for _, g in pairs])
    else:
        r, g = np.concatenate([r.ravel() for r, _ in pairs]), np.concatenate([g.ravel() for _, g in pairs])
    c = compare(r, g)
    flipped = None
    if decided_by and c["sqnr_db"] < threshold:
        mask = flips(r, g)
        if mask is not None:
            flipped, kept = int(mask.sum()), compare(r[~mask], g[~mask])
            note = "; ".join(filter(None, [note, _flip_note(flipped, r.size, decided_by, c["sqnr_db"])]))
            c = kept
    agree = argmax_agreement(r, g, pairs[0][0].shape)
    return OutputCheck(name, float(c["sqnr_db"]), c["cosine"], float(c["max_abs_error"]), agree,
                       bool(c["sqnr_db"] >= threshold), float(np.std(r)) if r.size else None, c["ref_abs_max"], note,
                       flipped)


def decided_outputs(float_path) -> dict[str, list[str]]:
    """decisions.decision_ops of the float model at `float_path`."""
    import onnx
    return decision_ops(onnx.load(str(float_path), load_external_data=False))


def flips(r: np.ndarray, g: np.ndarray) -> np.ndarray | None:
    """The values of `g` off by more than FLIP_SIZE of the output's largest magnitude, when they are
    at most MAX_FLIP_SHARE of all; None when there are none or too many to be ties."""
    scale = float(np.max(np.abs(r))) if r.size else 0.0
    if not np.isfinite(scale) or scale == 0.0:
        return None
    mask = ~(np.abs(g.astype(np.float64) - r) <= FLIP_SIZE * scale)       # NaN counts as off
    k = int(mask.sum())
    return mask if 0 < k <= MAX_FLIP_SHARE * r.size else None


def _flip_note(k: int, n: int, ops: list[str], all_db: float) -> str:
    return (f"{k} of {n} values ({100 * k / n:.3f}%) took the other branch of a decision the model makes on its own "
            f"values ({', '.join(ops)}): ties the compiled precision breaks the other way; scored on the other values "
            f"(all values: {all_db:.1f} dB)")


def _common(r: np.ndarray, g: np.ndarray):
    """(r, g, None) when the shapes agree; else both cut to their common leading part and the two
    shapes; (None, None, shapes) when the ranks differ."""
    if r.shape == g.shape:
        return r, g, None
    shapes = (list(r.shape), list(g.shape))
    if r.ndim != g.ndim:
        return None, None, shapes
    cut = tuple(slice(0, min(a, b)) for a, b in zip(r.shape, g.shape))
    return r[cut], g[cut], shapes


@dataclass
class GraphCheck:
    part: str
    target: str
    precision: str
    threshold_db: float
    samples: int
    inputs_kind: str
    outputs: list[OutputCheck] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return all(o.passed for o in self.outputs)

    @property
    def warnings(self) -> list[str]:
        return graph_warnings(self)


@dataclass
class VerifyReport:
    bundle: str
    graphs: list[GraphCheck]

    @property
    def passed(self) -> bool:
        return all(g.passed for g in self.graphs)

    @property
    def warnings(self) -> list[str]:
        return [w for g in self.graphs for w in g.warnings]

    def failure_fix(self, hint: str | None = None) -> str:
        """The fix for a failed verify, fitting the failing graphs' precision."""
        quantized = any(PRECISIONS[g.precision].quantized for g in self.graphs
                        if not g.passed and g.precision in PRECISIONS)
        return failure_fix(self, quantized, hint)

    def to_dict(self) -> dict[str, Any]:
        def clean(v):
            return None if isinstance(v, float) and not np.isfinite(v) and v < 0 else (
                "inf" if isinstance(v, float) and np.isinf(v) else v)
        return {"bundle": self.bundle, "passed": self.passed, "warnings": self.warnings, "graphs": [
            {"part": g.part, "target": g.target, "precision": g.precision, "threshold_sqnr_db": g.threshold_db,
             "samples": g.samples, "inputs": g.inputs_kind, "passed": g.passed,
             "outputs": [{k: clean(v) for k, v in o.__dict__.items()} for o in g.outputs]} for g in self.graphs]}


def stored_samples(bundle, part: str) -> list[dict[str, np.ndarray]]:
    pm = bundle.manifest.part(part)
    rel = pm.files.verify_inputs if pm else None
    return read_samples(bundle.file(rel)) if rel else []


def read_samples(npz: Path) -> list[dict[str, np.ndarray]]:
    """A verify-inputs file (`NAME__I` arrays) → one {input name: array} per sample, in order."""
    samples: dict[int, dict[str, np.ndarray]] = {}
    with np.load(npz, allow_pickle=False) as z:
        for key in z.files:
            name, _, idx = key.rpartition("__")
            samples.setdefault(int(idx), {})[name] = z[key]
    return [samples[i] for i in sorted(samples)]


def verify_samples(bundle, part: str, session, inputs) -> tuple[list[dict[str, np.ndarray]], str]:
    """The samples `verify` compares on, and how they were chosen: the user's files, else the
    inputs stored at compile time, else one random feed."""
    if isinstance(inputs, dict) and inputs:       # the Python API: one sample, name → array
        return [{k: np.asarray(v) for k, v in inputs.items()}], "given"
    if inputs:
        return [given_feed(inputs, session)], "given"
    samples = stored_samples(bundle, part)
    if not samples:
        return [session.random_feed()], "random"
    cal = bundle.manifest.calibration.get(part, {}).get("verify_inputs", {})
    return samples, f"stored {cal.get('kind', '?')}" + ("" if cal.get("representative", True) else " (random, not representative)")


def record_numerics(bundle_path: str | Path, report: VerifyReport) -> None:
    """Keep the first graph's per-output numbers in the manifest so report.html can plot them."""
    if not report.graphs:
        return
    bundle = open_bundle(bundle_path)
    g = report.graphs[0]
    num = dict(bundle.manifest.numerics or {})
    num.update({"outputs": [{"name": o.name, "sqnr_db": min(o.sqnr_db, 200.0), "cosine": o.cosine,
                             "max_abs_error": o.max_abs_error} for o in g.outputs],
                "threshold_db": g.threshold_db, "part": g.part, "target": g.target, "samples": g.samples,
                "inputs": g.inputs_kind})
    bundle.manifest.numerics = num
    save_manifest(bundle)
    refresh_report(bundle)


def verify_bundle(bundle_path: str | Path, inputs: list[str] | None = None, part: str | None = None,
                  target: str | None = None, min_sqnr: float | None = None, max_samples: int | None = None,
                  record: bool = True) -> VerifyReport:
    import onnxruntime as ort
    bundle = open_bundle(bundle_path)
    check_runtime(bundle)
    graphs = select_graphs(bundle, part, target)
    if not graphs:
        raise InputError(f"{bundle.path} has no compiled graph to verify", "compile with --format context-binary")
    report = VerifyReport(str(bundle.path), [])
    float_sessions: dict[str, Any] = {}
    for cg in graphs:
        sim = SimulatorSession(cg)
        samples, kind = verify_samples(bundle, cg.part, sim, inputs)
        if max_samples:
            samples = samples[:max_samples]
        if cg.part not in float_sessions:
            pm = bundle.manifest.part(cg.part)
            float_rel = pm.files.float_model if pm else None
            if not float_rel:
                raise InputError(f"{bundle.path} keeps no float model for {cg.part}", "recompile the bundle with this modelexport")
            float_sessions[cg.part] = (ort.InferenceSession(str(bundle.file(float_rel)), providers=["CPUExecutionProvider"]),
                                       decided_outputs(bundle.file(float_rel)))
        ref_sess, decided = float_sessions[cg.part]
        names = [o.name for o in ref_sess.get_outputs()]
        refs = {n: [] for n in names}
        gots = {n: [] for n in names}
        for s in samples:
            ref = dict(zip(names, ref_sess.run(names, s)))
            got, _ = sim.run(s)
            for n in names:
                refs[n].append(ref[n])
                gots[n].append(got[n].astype(np.float32))
        prec = cg.precision
        threshold = pass_mark(min_sqnr, prec)
        gc = GraphCheck(cg.part, cg.target, prec, threshold, len(samples), kind)
        gc.outputs = [check_output(n, refs[n], gots[n], threshold, decided.get(n)) for n in names]
        report.graphs.append(gc)
    if record:
        record_numerics(bundle_path, report)
    return report
