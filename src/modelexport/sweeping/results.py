"""The results table of a sweep, read from each cell's manifest (never from the worker's memory),
so a cell compiled now, one reused from an earlier run, one run locally and one run on Ray give
the same row. Sorted for the question the table answers: per target, what to ship.

Per cell: status (compiled / failed + its one-line reason), the share of compute nodes on the HTP
(the manifest's per-node placement, counted as report.html counts it), the worst output's SQNR against the float model and its pass mark (the bundle's
numerics: compile's own check, or verify's), the LLM's perplexity ratio (`max_ppl_ratio`'s recipe)
and decode ceiling, the device bytes (contract/deployment.py: what goes to the phone for the
target) and bytes per parameter, and the seconds the compile took.
"""
from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any, Callable

from ..contract.bundle import open_bundle
from ..contract.deployment import deployment
from ..contract.report.html_report import QDQ_OPS
from .cells import Cell

# Quality tiers, best first: the numbers meet the precision's pass mark (SQNR, or the perplexity
# budget), nothing was measured, or they fall below it.
TIER_PASSED, TIER_UNMEASURED, TIER_BELOW = 0, 1, 2
VERDICTS = {TIER_PASSED: "passed", TIER_UNMEASURED: "not measured", TIER_BELOW: "below pass mark"}

CSV_COLUMNS = ("target", "model", "precision", "status", "ship", "reused", "htp_share", "cpu_fallbacks", "sqnr_db",
               "threshold_db", "numerics", "ppl_ratio", "bytes", "parameters", "bytes_per_param",
               "decode_ceiling_tok_s", "compile_s", "cell_s", "reason", "bundle")


def _elements(dims) -> int:
    n = 1
    for d in dims:
        n *= int(d)
    return n


def _graph_parameters(graph) -> int:
    """Initializers and the tensors of Constant nodes (paddle2onnx writes every weight as one:
    RapidOCR's models have no initializer at all), with those of If / Loop bodies."""
    from onnx import AttributeProto
    total = sum(_elements(t.dims) for t in graph.initializer)
    for node in graph.node:
        for a in node.attribute:
            if a.type == AttributeProto.TENSOR and node.op_type == "Constant":
                total += _elements(a.t.dims)
            elif a.type in (AttributeProto.FLOATS, AttributeProto.INTS) and node.op_type == "Constant":
                total += len(a.floats) + len(a.ints)
            elif a.type == AttributeProto.GRAPH:
                total += _graph_parameters(a.g)
            elif a.type == AttributeProto.GRAPHS:
                total += sum(_graph_parameters(g) for g in a.graphs)
    return total


def _onnx_parameters(path: Path) -> int:
    import onnx
    return _graph_parameters(onnx.load(str(path), load_external_data=False).graph)


def _pt2_parameters(path: Path) -> int:
    import torch
    ep = torch.export.load(str(path))
    state = ep.state_dict
    return int(sum(state[name].numel() for name in ep.graph_signature.parameters if name in state))


# source format → the parameters of one part's float model in the bundle (LLM bundles record theirs)
PARAMETER_COUNTERS: dict[str, Callable[[Path], int]] = {"onnx": _onnx_parameters, "pytorch": _pt2_parameters}


def parameters_of(bundle) -> int | None:
    m = bundle.manifest
    if m.parameters:
        return m.parameters
    count = PARAMETER_COUNTERS.get(m.source.format or "")
    if count is None:
        return None
    parts = [p.files.float_model for p in m.parts if p.files.float_model]
    return sum(count(bundle.file(rel)) for rel in parts) if parts else None


def _htp_share(m, target: str) -> tuple[float | None, int | None]:
    """(share of compute nodes on the HTP, compute nodes elsewhere), as report.html's placement section
    counts them: per node, graph-boundary (de)quantization and the Q/DQ ops QNN folds left out. A
    cell's bundle has one part and one target, whose nodes the manifest lists."""
    if m.llm is not None:        # an LLM bundle's context binaries hold HTP graphs only
        return 1.0, 0
    nodes = [n for n in m.placement.get("nodes", []) if n.get("backend") != "io" and n.get("op_type") not in QDQ_OPS]
    if not nodes:
        return None, None
    htp = sum(1 for n in nodes if n.get("backend") == "HTP")
    return round(htp / len(nodes), 4), len(nodes) - htp


def _numerics(m) -> tuple[float | None, float | None]:
    outs = (m.numerics or {}).get("outputs") or []
    values = [o["sqnr_db"] for o in outs if o.get("sqnr_db") is not None]
    return (round(min(values), 2) if values else None), (m.numerics or {}).get("threshold_db")


def bundle_row(cell: Cell, folder: Path) -> dict[str, Any]:
    """The measured columns of a complete cell."""
    b = open_bundle(folder, verify=False)
    m = b.manifest
    share, fallbacks = _htp_share(m, cell.target)
    sqnr, threshold = _numerics(m)
    recipe = m.llm.quality_recipe if m.llm else None
    ppl_ratio = round(recipe.ratio, 4) if recipe else None
    # every measure the bundle has must pass: compile's own check (an LLM's: its logits) and an LLM's quality budget
    verdicts = ([sqnr >= threshold] if sqnr is not None and threshold is not None else []) \
        + ([ppl_ratio <= recipe.max_ppl_ratio] if ppl_ratio is not None else [])
    tier = TIER_UNMEASURED if not verdicts else TIER_PASSED if all(verdicts) else TIER_BELOW
    dep = deployment(m)
    runtime = next((r for r in dep.runtimes if r.target == cell.target), None)
    size = runtime.model_bytes if runtime else sum(f.size for f in m.files)
    params = parameters_of(b)
    return {"htp_share": share, "cpu_fallbacks": fallbacks, "sqnr_db": sqnr, "threshold_db": threshold,
            "ppl_ratio": ppl_ratio, "numerics": VERDICTS[tier], "tier": tier, "bytes": size,
            "runtime": runtime.runtime if runtime else None, "parameters": params,
            "bytes_per_param": round(size / params, 4) if params else None,
            "decode_ceiling_tok_s": dep.decode_ceiling_tok_s.get(cell.target),
            "compile_s": m.timings.total_s, "qairt_build": m.qairt_build}


def cell_row(cell: Cell, out: Path, outcome: dict[str, Any] | None, reused: bool) -> dict[str, Any]:
    row: dict[str, Any] = {"target": cell.target, "model": cell.model.name, "precision": cell.precision.name,
                           "kind": cell.model.kind, "reused": reused,
                           "bundle": cell.folder(out).relative_to(out).as_posix(),
                           "cell_s": (outcome or {}).get("cell_s")}
    if outcome is not None and outcome.get("status") == "failed":
        return row | {"status": "failed", "bundle": None, "tier": None, "ship": False,
                      **{k: outcome.get(k) for k in ("reason", "fix", "error", "exit_code", "traceback") if outcome.get(k)}}
    row |= {"status": "compiled", **bundle_row(cell, cell.folder(out)), "ship": False}
    if outcome and outcome.get("numerics_note"):
        row["numerics_note"] = outcome["numerics_note"]
    return row


def sort_rows(rows: list[dict[str, Any]], cells: list[Cell]) -> list[dict[str, Any]]:
    """Per target (matrix order): per model, its compiled cells by quality tier, then HTP share,
    then device bytes, then SQNR; failed cells last. The first compiled cell of each (target, model)
    whose numbers pass is marked `ship`: the smallest artifact that keeps accuracy on that SoC."""
    targets = list(dict.fromkeys(c.target for c in cells))
    models = list(dict.fromkeys(c.model.name for c in cells))

    def key(r):
        failed = r["status"] != "compiled"
        return (targets.index(r["target"]), failed, models.index(r["model"]),
                r.get("tier") if not failed else 0, -(r.get("htp_share") or 0.0), r.get("bytes") or 0,
                -(r.get("sqnr_db") if r.get("sqnr_db") is not None else -1e9), r["precision"])
    out = sorted(rows, key=key)
    seen = set()
    for r in out:
        if r["status"] == "compiled" and r["tier"] == TIER_PASSED and (r["target"], r["model"]) not in seen:
            r["ship"] = True
            seen.add((r["target"], r["model"]))
    return out


def ship_table(rows: list[dict[str, Any]]) -> dict[str, dict[str, str | None]]:
    """target → model → the precision to ship (None: no cell of that model passed on that target)."""
    out: dict[str, dict[str, str | None]] = {}
    for r in rows:
        out.setdefault(r["target"], {}).setdefault(r["model"], None)
        if r.get("ship"):
            out[r["target"]][r["model"]] = r["precision"]
    return out


def to_csv(rows: list[dict[str, Any]]) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=CSV_COLUMNS, extrasaction="ignore", lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow({k: ("" if r.get(k) is None else r.get(k)) for k in CSV_COLUMNS})
    return buf.getvalue()


def write_results(out: Path, results: dict[str, Any]) -> None:
    """results.json and results.csv, each written whole and renamed into place."""
    for name, text in (("results.json", json.dumps(results, indent=2, default=str) + "\n"),
                       ("results.csv", to_csv(results["cells"]))):
        tmp = out / f".{name}.tmp"
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(out / name)
