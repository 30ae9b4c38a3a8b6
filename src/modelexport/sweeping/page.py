"""OUT/report.html of a sweep: what to ship per SoC, every cell per target, the failed cells with
their reasons. Drawn from results.json alone (`modelexport report OUT` redraws it), in the style of
a bundle's report.html; each compiled cell's own report is linked."""
from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

from ..contract.report.html_report import Section, render_page, table

REPORT_NAME = "report.html"


def _num(v: Any, fmt: str = "{:g}") -> str:
    return "-" if v is None else fmt.format(v)


def _ship_section(results: dict[str, Any]) -> Section:
    rows = {(r["target"], r["model"], r["precision"]): r for r in results["cells"]}
    body = []
    for target, models in results["ship"].items():
        for model, precision in models.items():
            r = rows.get((target, model, precision)) if precision else None
            body.append([target, model, precision or "nothing passed", _num(r and r.get("bytes"), "{:,}"),
                         _num(r and r.get("sqnr_db"), "{:.1f}"), _num(r and r.get("htp_share"), "{:.1%}")])
    note = ("<p class=sub>Per target and model: the compiled cell whose numbers pass its precision's mark, "
            "fully on the HTP first, then the fewest device bytes.</p>")
    return Section("ship", "What to ship per SoC", note + table(["target", "model", "precision", "device bytes",
                                                                  "worst SQNR (dB)", "HTP share"], body))


def _target_section(target: str, cells: list[dict[str, Any]]) -> Section:
    body = [[("★ " if r.get("ship") else "") + r["model"], r["precision"], r["status"] + (" (reused)" if r.get("reused") else ""),
             _num(r.get("htp_share"), "{:.1%}"), _num(r.get("sqnr_db"), "{:.1f}"), _num(r.get("threshold_db")),
             r.get("numerics") or "-", _num(r.get("ppl_ratio"), "{:.3f}"), _num(r.get("bytes"), "{:,}"),
             _num(r.get("bytes_per_param"), "{:.3f}"), _num(r.get("decode_ceiling_tok_s"), "{:,.0f}"),
             _num(r.get("compile_s"), "{:.1f}")] for r in cells if r["status"] == "compiled"]
    links = " · ".join(f'<a href="{html.escape(r["bundle"])}/report.html">{html.escape(r["model"] + " " + r["precision"])}</a>'
                       for r in cells if r["status"] == "compiled")
    out = table(["model", "precision", "status", "HTP share", "worst SQNR (dB)", "pass mark", "numerics", "ppl ratio",
                 "device bytes", "bytes/param", "decode ceiling tok/s", "compile s"], body)
    return Section(f"target-{target}", f"{target}: compiled cells", out + (f"<p class=sub>Bundle reports: {links}</p>" if links else ""))


def _failed_section(results: dict[str, Any]) -> Section | None:
    failed = [r for r in results["cells"] if r["status"] == "failed"]
    if not failed:
        return None
    return Section("failed", f"Failed cells ({len(failed)})",
                   table(["target", "model", "precision", "error", "reason", "fix"],
                         [[r["target"], r["model"], r["precision"], r.get("error") or "", r.get("reason") or "",
                           r.get("fix") or ""] for r in failed]))


def build_page(results: dict[str, Any]) -> str:
    s = results["summary"]
    overview = Section("overview", "Sweep", table(["matrix", "cells", "compiled", "failed", "reused", "ran on", "wall s"], [[
        results["matrix"], s["cells"], s["compiled"], s["failed"], s["reused"], results["run"]["executor"],
        results["run"]["wall_s"]]]))
    targets = list(dict.fromkeys(r["target"] for r in results["cells"]))
    sections = [overview, _ship_section(results)]
    sections += [_target_section(t, [r for r in results["cells"] if r["target"] == t]) for t in targets]
    failed = _failed_section(results)
    if failed:
        sections.append(failed)
    return render_page(f"sweep of {Path(results['matrix']).name}", sections)


def write_page(out: Path, results: dict[str, Any] | None = None) -> Path:
    results = results or json.loads((out / "results.json").read_text())
    path = out / REPORT_NAME
    tmp = out / f".{REPORT_NAME}.tmp"
    tmp.write_text(build_page(results), encoding="utf-8")
    tmp.replace(path)
    return path
