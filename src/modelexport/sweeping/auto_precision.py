"""`compile --precision auto [--min-sqnr DB]`: the cheapest precision plan that meets an accuracy
budget with no node added to the CPU.

Start from 8a8w, then 8a8w with percentile ranges (`--calibration-method percentile`: no cycles
added); the promotions go on from the better of the two. While an output is below its budget on
held-out samples (a quarter of the calibration samples, never calibrated or ranked on), the layers
are ranked once by what taking each out of the quantization gives back (quant/sensitivity.py; where
the QDQ model is right, the node where the simulator departs from it) and promoted in that order,
one rung each (8a8w → 16a8w → 16a16w → an fp16 island), by anchored `--override`s: 1 layer, then
2, 4, ... (a loss spread over a deep network needs many). Whole-model 16a8w, 16a8w with split weights
(`--split-weights`), 16a16w and fp16 are candidates too. When only a whole-model 16a8w passes, its
layers are given back to 8a8w, a run of them from the graph's end or its start, as far as the budget
allows (`give_back.py`: a deep detector's early layers need the bits, its costly late ones mostly do not). Every candidate is compiled, scored on the simulator and costed in simulator cycles
(`profile --level detailed` with the simulator's threads on one host core, the fewest over five
runs: left free, its count moves with the host's load). One with more CPU nodes than plain 8a8w is
refused; of those that pass, the one with the fewest CPU nodes, then the fewest cycles, is chosen (a
CPU node's time is not in the cycles). The chosen candidate is the bundle; the search (every
candidate, its dB, cycles and the flags that reproduce it) is its manifest's `precision_search`.

With `--max-drop D --eval-fn FILE.py:FUNCTION` a candidate must also hold the user's task metric:
FUNCTION(predict) -> float (higher is better) is called with `predict(inputs) -> {output: array}`
running the float model on the CPU once, then each candidate on the simulator; a candidate passes
when float's value minus its value is at most D (and, if --min-sqnr is given too, the dB budget).
"""
from __future__ import annotations

import re
import shutil
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

from ..backends.ort_qnn.compile import media_options
from ..backends.ort_qnn.repair import load_repaired
from ..backends.ort_qnn.self_check import htp_departure, measure
from ..backends.spec import OnnxCompileOptions, PartSpec
from ..contract import open_bundle
from ..contract.bundle import refresh_report, save_manifest
from ..core.atomic import check_output
from ..core.errors import InputError, ModelExportError, ToolchainError, UnsupportedError, VerificationError
from ..frontends.module_paths import onnx_module_path
from ..frontends.onnx_index_inputs import index_limits
from ..profiling.ort_profile import steady_profile
from ..quant import load_calibration
from ..quant.per_layer import per_layer
from ..quant.sensitivity import layer_gains
from . import give_back
from .task_metric import TaskMetric, task_metric

AUTO = "auto"
DEFAULT_BUDGET_DB = 25.0
LADDER = ("8a8w", "16a8w", "16a16w", "fp16")  # one layer's promotions (fp16: an island the HTP runs in float16)
WHOLE = ("16a8w", "16a16w", "fp16")            # whole-model candidates beside the grown plan
MAX_ROUNDS = 6
SENSITIVITY_SAMPLES = 4      # calibration samples the layers are ranked on (never the held-out ones)
MAX_MEASURED = 32            # layers measured by taking each out of the quantization
SENSITIVITY_SECONDS = 180.0  # at most this long
MIN_GAIN_DB = 0.3            # a layer whose removal gives back less is not worth its cycles


@dataclass
class Candidate:
    precision: str
    overrides: list[str]
    path: Path
    method: str = "minmax"               # how activation ranges are set (quant/onnx_qdq.RANGE_METHODS)
    split: bool = False                  # --split-weights (quant/weight_split.py)
    outputs: list[dict] = field(default_factory=list)
    passed: bool = False
    cycles: float | None = None
    cpu_nodes: int = 0
    refused: str | None = None
    metric: float | None = None          # the user's task metric on the simulator (--eval-fn)
    drop: float | None = None            # float's metric minus this one
    node_cycles: dict[str, int] = field(default_factory=dict, repr=False)   # QNN op → cycles (not recorded)

    @property
    def worst_db(self) -> float:
        return min((o["sqnr_db"] if o["sqnr_db"] is not None else float("-inf") for o in self.outputs), default=float("-inf"))

    def flags(self) -> str:
        method = [f"--calibration-method {self.method}"] if self.method != "minmax" else []
        split = ["--split-weights"] if self.split else []
        return " ".join([f"--precision {self.precision}", *method, *split, *(f"--override '{o}'" for o in self.overrides)])

    def to_dict(self) -> dict[str, Any]:
        return {"precision": self.precision, "overrides": self.overrides, "calibration_method": self.method,
                "split_weights": self.split,
                "flags": self.flags(), "passed": self.passed,
                "worst_sqnr_db": None if self.worst_db == float("-inf") else round(self.worst_db, 2),
                "outputs": self.outputs, "cycles": self.cycles, "cpu_nodes": self.cpu_nodes, "refused": self.refused,
                **({"metric": self.metric, "drop": self.drop} if self.metric is not None else {})}


def parse_budget(spec: Any) -> dict[str, float]:
    """--min-sqnr DB, or NAME=DB per output (repeatable) → {output or '*': dB}."""
    items = spec if isinstance(spec, (list, tuple)) else ([] if spec is None else [spec])
    out: dict[str, float] = {"*": DEFAULT_BUDGET_DB}
    for item in items:
        name, sep, value = str(item).rpartition("=")
        try:
            db = float(value)
        except ValueError:
            raise InputError(f"--min-sqnr {item!r} is not a number of dB", "write --min-sqnr 25, or NAME=30 for one output") from None
        out[name if sep else "*"] = db
    return out


def search_precision(parts: list[PartSpec], out: str | Path, opts: OnnxCompileOptions, force: bool,
                     compile_fn: Callable[..., Any], progress: Callable[[str, float, float], None] | None = None):
    """Compile every candidate into a scratch folder beside `out`, keep the chosen one as `out`."""
    say = progress or (lambda msg, done, total: None)
    out = Path(out)
    check_output(out, force)
    if len(parts) != 1:
        raise UnsupportedError("--precision auto searches one model at a time", "compile each model with --precision auto on its own")
    if opts.overrides:
        raise InputError("--precision auto chooses the overrides itself", "leave --override out, or give a precision")
    if opts.calibration_method != "minmax":
        raise InputError("--precision auto tries both calibration methods itself",
                         "leave --calibration-method out, or give a precision")
    if opts.split_weights:
        raise InputError("--precision auto tries --split-weights itself", "leave --split-weights out, or give a precision")
    spec, budget = parts[0], parse_budget(opts.min_sqnr)
    metric = task_metric(opts)
    if metric is not None and opts.min_sqnr is None:
        budget = {"*": float("-inf")}          # the task metric alone decides; the dB are still recorded
    calib, held_out = _split_samples(spec, opts)
    scratch = out.parent / f".{out.name}.auto"
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    t0 = time.perf_counter()
    try:
        cands = _search(spec, calib, held_out, budget, opts, compile_fn, scratch, say, metric)
        _recost(cands, say)
        chosen = _choose(cands)
        if not (chosen.path / "manifest.json").is_file():
            raise UnsupportedError(f"--precision auto: no candidate compiles ({'; '.join(c.flags() + ': ' + str(c.refused) for c in cands)[:600]})",
                                   "compile with one precision to see its error and fix, e.g. --precision 8a8w")
        _keep(chosen, cands, out, force, budget, len(held_out), time.perf_counter() - t0, metric)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    bundle = open_bundle(out)
    if not chosen.passed:
        reach = f"{chosen.worst_db:.1f} dB" + (f", a drop of {chosen.drop:.4g}" if chosen.drop is not None else "")
        raise VerificationError(
            f"--precision auto: no candidate meets {_budget_text(budget, metric)} on {len(held_out)} held-out sample(s); "
            f"the best, {chosen.flags()}, reaches {reach} (kept in {out})",
            "calibrate on more representative data, lower the budget (--min-sqnr), or compile with the flags above "
            "and look at `modelexport verify BUNDLE --per-layer`")
    return bundle


def _split_samples(spec: PartSpec, opts) -> tuple[list[dict], list[dict]]:
    """(calibration samples, held-out samples): the last quarter of the samples is held out."""
    loaded = load_repaired(spec.model, spec.input_shapes, spec.input_values, quantized=True)
    if spec.calibration is None:
        raise InputError("--precision auto needs calibration data to measure candidates on",
                         "pass --calibration DIR|list.txt|file.npz with real inputs, or --calibration random")
    samples = load_calibration(spec.calibration, loaded.inputs, max(opts.random_samples, 8), index_limits(loaded.model),
                               media_options(opts)).samples
    if len(samples) < 2:
        return samples, samples
    k = max(2 if len(samples) >= 4 else 1, len(samples) // 4)
    return samples[:-k], samples[-k:]


def _search(spec, calib, held_out, budget, opts, compile_fn, scratch, say, metric=None) -> list[Candidate]:
    """Grow a plan from 8a8w: the layers ranked once by what taking each out of the quantization gives
    back, round r promotes the next 2**r of them one rung (a layer that made its candidate fail to
    compile is left where it was); then the whole-model candidates."""
    levels: dict[str, str] = {}                  # layer (module path or node name) → its promoted precision
    stuck: set[str] = set()
    thr = min(budget.values()) if min(budget.values()) > float("-inf") else DEFAULT_BUDGET_DB
    run = (spec, calib, held_out, budget, opts, compile_fn, scratch, say, metric)
    base = _candidate(*run, "8a8w", [], 0)
    cands, cur = [base], base
    if not base.passed and not base.refused:     # ranges clipped to the bulk of the values: no cycles added
        pct = _candidate(*run, "8a8w", [], 1, "percentile")
        _refuse_new_cpu(pct, base)
        cands.append(pct)
        cur = pct if not pct.refused and pct.worst_db > base.worst_db else base
    rank: Ranking | None = None
    for r in range(MAX_ROUNDS):
        if cur.passed or cur.refused:
            break
        if rank is None:                         # measured once, on the plan the promotions start from
            say("ranking the layers by what more bits give back", len(cands), len(cands) + 1)
            rank = _ranked_layers(cur, calib[:SENSITIVITY_SAMPLES], thr)
        layers = _next_layers(rank.order, levels, stuck, 2 ** r)
        if not layers:
            break
        before = dict(levels)
        for name in layers:
            rank.promote(levels, name)
        nxt = _candidate(*run, "8a8w", override_flags(levels), len(cands), cur.method)
        _refuse_new_cpu(nxt, base)
        cands.append(nxt)
        if nxt.refused:                          # go on from the last candidate that compiled, without these layers
            levels, stuck = before, stuck | set(layers)
        else:
            cur = nxt
    for p, split in _whole(rank, cur.passed):
        if split and cands[-1].passed:           # split weights cost cycles the unsplit candidate did not need
            continue
        if p == "16a16w" and any(c.passed and c.precision == "16a8w" and not (c.split or c.overrides) for c in cands):
            continue                             # 16-bit weights cost more cycles than 8-bit ones at the same activations
        c = _candidate(*run, p, [], len(cands), split=split)
        _refuse_new_cpu(c, base)
        cands.append(c)
    return cands + _give_back(cands, run, calib[:SENSITIVITY_SAMPLES], thr)


def _give_back(cands: list[Candidate], run: tuple, samples: list[dict], thr: float) -> list[Candidate]:
    """From the cheapest whole-model 16a8w candidate that passes, when nothing within the cycles' noise
    of plain 8a8w does: a run of its layers back to 8a8w (sweeping/give_back.py), then half of that
    run, ..., until one passes or GIVE_BACK_TRIES are spent."""
    base = cands[0]
    whole = [c for c in cands if c.passed and c.precision == "16a8w" and not c.overrides and c.cycles and c.node_cycles]
    if not whole or not base.cycles or any(c.passed and c.cycles and c.cycles <= base.cycles * (1 + CYCLES_NOISE) for c in cands):
        return []
    w = min(whole, key=lambda c: c.cycles)
    run[7]("measuring what giving layers' bits back costs", len(cands), len(cands) + 1)
    chosen = give_back.layers_to_give_back(w.path, w.node_cycles, base.node_cycles, samples, thr)
    out: list[Candidate] = []
    while chosen and len(out) < give_back.GIVE_BACK_TRIES:
        c = _candidate(*run, w.precision, override_flags(dict.fromkeys(chosen.layers, "8a8w")), len(cands) + len(out), split=w.split)
        _refuse_new_cpu(c, base)
        out.append(c)
        if c.passed:
            break
        chosen = chosen.half()
    return out


def _whole(rank: Ranking | None, plan_passed: bool) -> list[tuple[str, bool]]:
    """The whole-model candidates: WHOLE, 16a8w with split weights after plain 16a8w and before 16a16w
    (the HTP's own 16-bit weights lose precision split 8-bit ones keep), and 8a8w with split weights
    when the plan did not pass and the ranking found layers whose weights lose more than their
    activations. A split candidate is compiled only when the one before it did not pass."""
    split = [("8a8w", True)] if not plan_passed and rank is not None and rank.weighty else []
    return [*split, (WHOLE[0], False), (WHOLE[0], True), *((p, False) for p in WHOLE[1:])]


@dataclass
class Ranking:
    """The layers worth promoting, best first; those whose weights lose more than their activations;
    each layer's readers (the layers reading its outputs)."""
    order: list[str] = field(default_factory=list)
    weighty: set[str] = field(default_factory=set)
    readers: dict[str, set[str]] = field(default_factory=dict)

    def promote(self, levels: dict[str, str], name: str) -> None:
        """One rung up, and its readers to 16-bit activations at least: what a layer gave back was
        measured with its outputs read unquantized, and a reader left at 8 bits would quantize them again
        (outlier_channels: its scale at 16a16w alone, 0.0 dB; with the Conv reading it at 16a8w, it passes)."""
        levels[name] = _next_rung(levels.get(name, LADDER[0]), name in self.weighty)
        for r in self.readers.get(name, ()):
            if r != name and levels.get(r, LADDER[0]) == LADDER[0]:
                levels[r] = LADDER[1]


def _next_rung(now: str, weighty: bool) -> str:
    """One rung up; a layer whose weights lose more than its activations goes from 8a8w straight to
    16-bit weights (16a16w): 16-bit activations alone would not give it back."""
    if weighty and now == LADDER[0]:
        return "16a16w"
    return LADDER[LADDER.index(now) + 1]


def override_flags(levels: dict[str, str]) -> list[str]:
    """{layer: precision} → one anchored `--override` per precision: `^(a|b)$=16a8w`."""
    by_prec: dict[str, list[str]] = {}
    for name, prec in levels.items():
        by_prec.setdefault(prec, []).append(re.escape(name))
    return [f"^({'|'.join(names)})$={prec}" if len(names) > 1 else f"^{names[0]}$={prec}"
            for prec, names in sorted(by_prec.items(), key=lambda kv: LADDER.index(kv[0]))]


def _candidate(spec, calib, held_out, budget, opts, compile_fn, scratch, say, metric, precision, overrides, i,
               method: str = "minmax", split: bool = False) -> Candidate:
    c = Candidate(precision, overrides, scratch / f"c{i}", method, split)
    say(f"candidate {i + 1}: {c.flags()}", i, i + 1)
    part = replace(spec, precision=precision, calibration=calib)
    try:
        b = compile_fn([part], c.path, replace(opts, overrides=list(overrides), self_check=False, min_sqnr=None,
                                                          calibration_method=method, split_weights=split), True, None)
    except ModelExportError as e:             # this candidate does not compile: said in the table, the search goes on
        c.refused = f"does not compile: {e.problem[:200]}"
        return c
    pl = next(iter(b.manifest.placement[b.manifest.parts[0].name].values()))
    c.cpu_nodes = len(pl["cpu_fallbacks"])
    c.outputs, c.passed = _score(b, held_out, budget)
    if metric is not None:
        metric.score(c, b)
    try:
        c.cycles, c.node_cycles = steady_profile(b.path, runs=CANDIDATE_RUNS)
    except ToolchainError as e:               # not costed: ranked after every candidate that is
        say(f"candidate {i + 1}: cycles not measured: {e.problem[:160]}", i, i + 1)
    task = f", metric {c.metric:.4g} (drop {c.drop:.4g})" if c.metric is not None else ""
    say(f"candidate {i + 1}: worst {c.worst_db:.1f} dB{task}, {c.cycles or 0:,.0f} cycles", i + 1, i + 1)
    return c


def _score(bundle, samples: list[dict], budget: dict[str, float]) -> tuple[list[dict], bool]:
    graph = bundle.manifest.graphs[0]
    pm = bundle.manifest.parts[0]
    checks = measure(bundle.file(pm.files.float_model), bundle.file(graph.epcontext_model), graph.target, samples,
                     lambda name: budget.get(name, budget["*"]))
    rows = [{"name": c.name, "sqnr_db": c.sqnr_db if c.sqnr_db > float("-inf") else None, "budget_db": budget.get(c.name, budget["*"]),
             "passed": c.passed} for c in checks]
    return rows, all(c.passed for c in checks)


def _ranked_layers(c: Candidate, samples, threshold: float) -> Ranking:
    """Among the layers losing the most dB against the layers feeding them (float vs QDQ on the CPU
    EP, quant/per_layer.py), the ones whose removal from the quantization, weights included, gives the
    outputs back at least MIN_GAIN_DB (quant/sensitivity.py), by that gain; where nothing measurably
    gains, those losses by size. Where the QDQ model is right all the way, the node where the
    simulator departs from it. Only names an --override can match (a layer's module path or node name
    in the quantized model)."""
    b = open_bundle(c.path)
    pm = b.manifest.parts[0]
    if not pm.files.quantized_model:
        return Ranking()
    import onnx
    fpath, qpath = b.file(pm.files.float_model), b.file(pm.files.quantized_model)
    qdq = onnx.load(str(qpath), load_external_data=False)
    nodes: dict[str, list[str]] = {}
    for node in qdq.graph.node:
        for n in {node.name, onnx_module_path(node)} - {None, ""}:
            nodes.setdefault(n, []).append(node.name)
    readers = _readers(qdq)
    try:
        rep = per_layer(fpath, qpath, samples, threshold, c.precision, pm.name)
    except Exception:          # a graph the CPU EP cannot run layer by layer: the whole-model candidates remain
        return Ranking()
    if rep.first_bad_layer is not None:
        lossy = [x.name for x in sorted(rep.layers, key=lambda x: -x.drop_db) if x.drop_db > 0 and x.name in nodes]
        try:
            full = layer_gains(fpath, qpath, samples, lossy[:MAX_MEASURED], lambda name: nodes[name], SENSITIVITY_SECONDS, True)
            acts = layer_gains(fpath, qpath, samples, list(full), lambda name: nodes[name], SENSITIVITY_SECONDS)
        except Exception:
            return Ranking(lossy, set(), readers)
        helpful = sorted((n for n, g in full.items() if g >= MIN_GAIN_DB), key=lambda n: -full[n])
        return Ranking(helpful or lossy, {n for n in helpful if full[n] - acts.get(n, 0.0) > acts.get(n, 0.0)}, readers)
    work = {"qdq": qpath, "float": fpath}
    popts = b.manifest.options["provider_options"][b.manifest.targets[0]]
    try:
        found = htp_departure(_PartView(pm.name, work), samples[:1], threshold, popts)
    except Exception:
        return Ranking()
    return Ranking([found["node"]] if found and found["node"] in nodes else [], set(), readers)


def _readers(qdq) -> dict[str, set[str]]:
    """{layer: the layers whose nodes read its nodes' outputs (through their Q/DQ pairs)}, a layer
    named as per_layer names it (module path, else node name)."""
    layer_of = {n.name: onnx_module_path(n) or n.name for n in qdq.graph.node}
    producer = {t: n for n in qdq.graph.node for t in n.output}

    def source(t: str):              # the non-Q/DQ node behind a tensor
        n = producer.get(t)
        while n is not None and n.op_type in ("QuantizeLinear", "DequantizeLinear"):
            n = producer.get(n.input[0])
        return n
    out: dict[str, set[str]] = {}
    for node in qdq.graph.node:
        if node.op_type in ("QuantizeLinear", "DequantizeLinear"):
            continue
        for t in node.input:
            src = source(t) if t else None
            if src is not None:
                out.setdefault(layer_of[src.name], set()).add(layer_of[node.name])
    return out


def _next_layers(order: list[str], levels: dict[str, str], stuck: set[str], k: int) -> list[str]:
    """The next k layers of `order` to promote one rung: the lower rungs first (the next rung of one
    layer, 16a16w convolutions or an fp16 island, costs more cycles than 16 bits for another)."""
    rung = lambda name: LADDER.index(levels.get(name, LADDER[0]))  # noqa: E731
    free = [n for n in order if n not in stuck and levels.get(n) != LADDER[-1]]
    return sorted(free, key=lambda n: (rung(n), order.index(n)))[:k]


@dataclass
class _PartView:
    name: str
    work: dict


def _refuse_new_cpu(c: Candidate, base: Candidate) -> None:
    if not c.refused and c.cpu_nodes > base.cpu_nodes:
        c.refused = f"{c.cpu_nodes - base.cpu_nodes} more node(s) on the CPU than 8a8w"
        c.passed = False


RECOST_ROUNDS = 2
CANDIDATE_RUNS = 2          # a candidate's first costing; the ones that pass are measured again (_recost)


def _recost(cands: list[Candidate], say) -> None:
    """The candidates that pass and plain 8a8w (the yardstick) measured again, in turn, each keeping its
    fewest cycles: the host can slow the simulator's count for many seconds at a time (one 8a8w graph
    read 1.26 M cycles for a minute, then 2.0 M), and measured in turn every candidate meets the same
    spells."""
    todo = [c for i, c in enumerate(cands) if c.cycles is not None and (i == 0 or c.passed)]
    if len(todo) < 2:
        return
    for r in range(RECOST_ROUNDS):
        say(f"measuring the cycles again, round {r + 1} of {RECOST_ROUNDS}", r, RECOST_ROUNDS)
        for c in todo:
            try:
                c.cycles = min(c.cycles, steady_profile(c.path, runs=2)[0] or c.cycles)
            except ToolchainError:
                pass


CYCLES_NOISE = 0.2      # one graph's steady_cycles still differ up to 1.4x between processes (bench/results/sim_cycles_noise.json)


def _choose(cands: list[Candidate]) -> Candidate:
    """The fewest nodes on the CPU (their time is not in the simulator's cycles), then the first in search
    order (the cheapest precision, the fewest overrides) among those within the cycles' noise of the
    fewest cycles."""
    ok = [c for c in cands if c.passed]
    if not ok:
        return max((c for c in cands if not c.refused), key=lambda c: c.worst_db, default=cands[0])
    fewest_cpu = min(c.cpu_nodes for c in ok)
    ok = [c for c in ok if c.cpu_nodes == fewest_cpu]
    costed = [c.cycles for c in ok if c.cycles is not None]
    if not costed:
        return ok[0]
    return next(c for c in ok if c.cycles is not None and c.cycles <= min(costed) * (1 + CYCLES_NOISE))


def _keep(chosen: Candidate, cands: list[Candidate], out: Path, force: bool, budget, held: int, seconds: float,
          metric: TaskMetric | None = None) -> None:
    tmp = out.parent / f".{out.name}.auto-chosen"
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(chosen.path, tmp)
    old = out.parent / f".{out.name}.auto-replaced"
    if out.exists():                  # check_output allowed it (--force): moved aside, then removed
        out.replace(old)
    tmp.replace(out)
    shutil.rmtree(old, ignore_errors=True)
    b = open_bundle(out)
    base_cycles = cands[0].cycles
    b.manifest.precision_search = {
        "budget_db": {k: v for k, v in budget.items() if v > float("-inf")}, "held_out_samples": held, "seconds": round(seconds, 1),
        **({"metric": {"function": metric.name, "max_drop": metric.max_drop, "float": metric.float_value}} if metric else {}),
        "chosen": cands.index(chosen), "flags": chosen.flags(), "passed": chosen.passed,
        "cycles_vs_8a8w": round(chosen.cycles / base_cycles, 3) if chosen.cycles and base_cycles else None,
        "candidates": [c.to_dict() for c in cands]}
    b.manifest.numerics = {"outputs": [{"name": o["name"], "sqnr_db": o["sqnr_db"]} for o in chosen.outputs],
                           "threshold_db": max(min(budget.values()), -999.0), "samples": held, "inputs": "held-out calibration",
                           "passed": chosen.passed, "part": b.manifest.parts[0].name, "target": b.manifest.targets[0],
                           "reference": "float ONNX on the CPU EP", "runtime": "the HTP simulator (libQnnHtp.so)"}
    save_manifest(b)
    refresh_report(b)


def _budget_text(budget: dict[str, float], metric: TaskMetric | None = None) -> str:
    parts = [f"--min-sqnr {', '.join(f'{v:g}' if k == '*' else f'{k}={v:g}' for k, v in budget.items() if v > float('-inf'))}"]
    if metric is not None:
        parts = [p for p in parts if p != "--min-sqnr "] + [f"--max-drop {metric.max_drop:g} of {metric.name}"]
    return " and ".join(parts)
