"""Build report.html from a bundle's manifest: target and toolchain, placement, audit, numerics,
sizes and (for LLMs) the decode-speed ceiling per target. Sections are a list of functions;
a section whose data is absent says what is missing instead of drawing an empty plot."""
from __future__ import annotations

import datetime as _dt
import html
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Callable

import jinja2

from ..deployment import deployment
from ..manifest import Manifest
from ...core.targets import all_targets
from ...core.vocab import BundleKind, Role
from . import plots


QDQ_OPS = {"QuantizeLinear", "DequantizeLinear"}


@dataclass
class Section:
    id: str
    title: str
    html: str = ""
    missing: str | None = None


def _kv(rows: list[tuple[str, object]]) -> str:
    body = "".join(f"<tr><td>{html.escape(k)}</td><td>{html.escape(str(v))}</td></tr>" for k, v in rows if v not in (None, "", [], {}))
    return f'<table class="kv">{body}</table>'


def _table(header: list[str], rows: list[list[object]], classes: dict[int, Callable[[object], str]] | None = None) -> str:
    classes = classes or {}
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = ""
    for r in rows:
        cells = "".join(
            f'<td class="{classes[i](v)}">{html.escape(str(v))}</td>' if i in classes else f"<td>{html.escape(str(v))}</td>"
            for i, v in enumerate(r))
        body += f"<tr>{cells}</tr>"
    return f"<table><tr>{head}</tr>{body}</table>"


def _nodes(m: Manifest) -> list[dict]:
    return list(m.placement.get("nodes", []))


def section_overview(m: Manifest, folder: Path) -> Section:
    rows = [("source", m.source.path), ("source sha256", m.source.sha256), ("format", m.format),
            ("kind", m.kind), ("precision", m.precision),
            ("targets", ", ".join(f"{t} (HTP V{m.htp_arch[t]})" if t in m.htp_arch else t for t in m.targets)),
            ("QAIRT build", m.qairt_build),
            ("tool versions", ", ".join(f"{k} {v}" for k, v in m.versions.items())),
            ("calibration", ", ".join(f"{k}: {v}" for k, v in m.calibration.items()))]
    return Section("overview", "Target and toolchain", _kv(rows))


def section_placement(m: Manifest, folder: Path) -> Section:
    nodes = _nodes(m)
    if not nodes:
        return Section("placement", "Placement", missing="No per-node placement is recorded in this bundle "
                       "(run `modelexport audit` on the source model to see it).")
    by_backend = Counter(n["backend"] for n in nodes)
    compute = [n for n in nodes if n["backend"] != "io"]  # graph-boundary (de)quantize is not compute
    chart_nodes = [n for n in compute if n.get("op_type") not in QDQ_OPS]
    by_op: dict[str, dict[str, int]] = {}
    for n in chart_nodes:
        by_op.setdefault(n.get("op_type", "?"), Counter())[n["backend"]] += 1
    total = len(chart_nodes)
    htp = sum(1 for n in chart_nodes if n["backend"] == "HTP")
    pill = "ok" if htp == total else "bad"
    summary = (f'<p><span class="pill {pill}">{htp}/{total} compute nodes on HTP</span> '
               + " · ".join(f"{k}: {v}" for k, v in sorted(by_backend.items())) + "</p>")
    if by_backend.get("io"):
        summary += "<p class=sub>io = graph-boundary (de)quantization, kept on the CPU by design.</p>"
    macs = m.placement.get("macs")
    if macs:
        summary += "<p>Estimated MACs: " + " · ".join(f"{k}: {v:,}" for k, v in macs.items()) + "</p>"
    img = f'<img alt="placement by op type" src="{plots.placement_by_op(by_op)}">' if by_op else ""
    if len(chart_nodes) < len(compute):
        img += "<p class=sub>The chart leaves out QuantizeLinear/DequantizeLinear nodes: QNN folds them into the quantized ops.</p>"
    return Section("placement", "Placement: HTP vs CPU", summary + img)


def _audit_rows(nodes: list[dict]) -> list[list[object]]:
    return [[n.get("name", ""), n.get("module_path") or "", n.get("op_type", ""), n["backend"],
             n.get("reason") or "", n.get("fix") or ""] for n in nodes]


AUDIT_HEADER = ["node", "module", "op", "runs on", "reason", "fix"]


def section_audit(m: Manifest, folder: Path) -> Section:
    nodes = _nodes(m)
    if not nodes:
        return Section("audit", "Audit", missing="No audit table is recorded in this bundle.")
    off = [n for n in nodes if n["backend"] not in ("HTP", "io")]
    on = [n for n in nodes if n["backend"] == "HTP" and n.get("op_type") not in QDQ_OPS]
    out = (_table(AUDIT_HEADER, _audit_rows(off)) if off
           else '<p><span class="pill ok">no CPU fallbacks</span></p>')
    out += (f"<details><summary>{len(on)} compute nodes on HTP</summary>"
            f"{_table(AUDIT_HEADER[:4], [r[:4] for r in _audit_rows(on)])}</details>")
    return Section("audit", "Audit (CPU fallbacks first)", out)


def _cos(c) -> str:
    """A cosine, or why there is none: one value has cosine ±1 whatever its error."""
    return "n/a (1 value)" if c is None else f"{c:.5f}"


def section_numerics(m: Manifest, folder: Path) -> Section:
    num = m.numerics or {}
    outs = num.get("outputs") or []
    if not outs:
        return Section("numerics", "Numerics", missing="No numerics are recorded for this bundle: run "
                       "`modelexport verify BUNDLE` (and `--per-layer`) to compare it with the float model.")
    thr = num.get("threshold_db")
    rows = [[o["name"], _db(o["sqnr_db"]), _cos(o.get('cosine')), f"{o.get('max_abs_error', float('nan')):.4g}"]
            for o in outs]
    out = _table(["output", "SQNR (dB)", "cosine", "max abs error"], rows)
    drawn = [o for o in outs if o["sqnr_db"] is not None]          # -inf (nothing matches) is in the table only
    out += f'<img alt="SQNR per output" src="{plots.bars([o["name"] for o in drawn], [o["sqnr_db"] for o in drawn], "SQNR per output", "dB", thr)}">'
    layers = num.get("per_layer") or []
    if layers:
        lthr = num.get("per_layer_threshold_db")
        out += f'<img alt="SQNR per layer" src="{plots.line([layer["name"] for layer in layers], [layer["sqnr_db"] for layer in layers], "SQNR per layer", "dB", lthr)}">'
        if num.get("first_bad_layer"):
            out += f"<p>First layer below the threshold: <code>{html.escape(num['first_bad_layer'])}</code></p>"
    else:
        out += '<div class="missing">Per-layer SQNR not computed (run <code>modelexport verify --per-layer</code>).</div>'
    return Section("numerics", "Numerics vs the float model", out)


def section_deployment(m: Manifest, folder: Path) -> Section | None:
    d = deployment(m)
    if not d.runtimes:
        return None
    rows = [[r.target, r.runtime, f"{r.model_bytes:,}", r.bytes_per_parameter if r.bytes_per_parameter else "-",
             f"{r.extra_bytes:,}", ", ".join(r.files), r.needs] for r in d.runtimes]
    out = _table(["target", "runtime", "model bytes", "bytes/param", "config + tokenizer bytes", "files", "needs on the phone"], rows)
    if d.parts:
        out += _table(["graph", "layers", "memory estimate MB", "limit MB", "within"],
                      [[p.graph, f"{p.layers[0]}-{p.layers[1] - 1}" if p.layers else "-",
                        "-" if p.estimate_mb is None else f"{p.estimate_mb:.1f}",
                        "-" if p.limit_mb is None else f"{p.limit_mb:g}", {None: "-", True: "yes", False: "NO"}[p.within]]
                       for p in d.parts])
    if d.placement:
        out += f"<p>Placement: {html.escape(d.placement)}</p>"
    out += (f"<p class=sub>{len(d.host_only_files)} files ({d.host_only_bytes:,} bytes: host twins, QDQ graphs, this "
            "report) stay on the build machine; they are left out of the bytes per parameter.</p>")
    return Section("deployment", "On the phone: files per runtime", out)


def section_sizes(m: Manifest, folder: Path) -> Section:
    rows = [[f.path, str(f.role), f"{f.size:,}"] for f in m.files if f.role != Role.REPORT]
    total = sum(f.size for f in m.files if f.role != Role.REPORT)
    text = f"<p>All files: {total:,} bytes"
    d = deployment(m)
    if d.host_only_bytes:
        text += f", of which {d.host_only_bytes:,} stay on the build machine (see “On the phone” for device sizes)"
    text += "</p>"
    return Section("sizes", "Sizes", text + _table(["file", "role", "bytes"], rows))


def _db(v) -> str:
    return "-inf" if v is None else f"{v:.2f}"


def section_precision_search(m: Manifest, folder: Path) -> Section | None:
    """--precision auto: each candidate's worst output against its simulator cycles."""
    s = m.precision_search or {}
    cands = s.get("candidates") or []
    if not cands:
        return None
    budget = min((s.get("budget_db") or {"*": 0}).values())
    shown = [(i, c) for i, c in enumerate(cands) if c.get("cycles") and c.get("worst_sqnr_db") is not None]
    out = f"<p>Chosen: <code>{html.escape(s.get('flags', ''))}</code> on {s.get('held_out_samples')} held-out sample(s).</p>"
    if shown:
        chosen = next((k for k, (i, _) in enumerate(shown) if i == s.get("chosen")), None)
        src = plots.scatter([(c["cycles"], c["worst_sqnr_db"]) for _, c in shown], [c["flags"] for _, c in shown],
                            "Worst output against simulator cycles, per candidate", "simulator cycles", "dB", budget, chosen)
        out += f'<img alt="dB against cycles per candidate" src="{src}">'
    out += _table(["#", "flags", "worst dB", "cycles", "CPU nodes", ""],
                  [[i + 1, c["flags"], _db(c.get("worst_sqnr_db")), f"{c['cycles']:,.0f}" if c.get("cycles") else "-",
                    c.get("cpu_nodes", 0), "chosen" if i == s.get("chosen") else (c.get("refused") or ("pass" if c["passed"] else "below"))]
                   for i, c in enumerate(cands)])
    return Section("precision-search", "Precision search (--precision auto)", out)


def section_llm_ceiling(m: Manifest, folder: Path) -> Section | None:
    if m.kind != BundleKind.LLM:
        return None
    wbytes = m.llm.weight_bytes_per_token if m.llm else None
    if not wbytes:
        return Section("ceiling", "Decode-speed ceiling", missing="Weight bytes per token are not recorded.")
    rows = [[s.name, s.marketing_name, f"{s.dram_gbps:g}", f"{s.dram_gbps * 1e9 / wbytes:,.0f}"]
            for s in all_targets() if s.dram_gbps]
    note = (f"<p>Every weight byte is read once per decoded token: tok/s ≤ DRAM bandwidth / {wbytes:,} bytes. "
            "A physical upper bound, not a prediction.</p>")
    return Section("ceiling", "Decode-speed ceiling per target", note + _table(["target", "name", "DRAM GB/s", "max tok/s"], rows))


SECTIONS: list[Callable[[Manifest, Path], Section | None]] = [
    section_overview, section_deployment, section_placement, section_audit, section_numerics, section_precision_search,
    section_sizes, section_llm_ceiling,
]

_env = jinja2.Environment(loader=jinja2.FileSystemLoader(Path(__file__).parent), autoescape=True)


def render_page(title: str, sections: list[Section]) -> str:
    """One self-contained page in the report's style (a bundle's, or a sweep's: sweeping/page.py)."""
    return _env.get_template("report.html.j2").render(
        title=title, sections=sections, generated=_dt.datetime.now().isoformat(timespec="seconds"))


table = _table   # other pages draw their tables the same way


def build_report(manifest: Manifest, folder: Path) -> str:
    sections = [s for fn in SECTIONS if (s := fn(manifest, folder)) is not None]
    title = Path(manifest.source.path or folder.name).name + (f" → {', '.join(manifest.targets)}" if manifest.targets else "")
    return render_page(title, sections)


def write_report(folder: Path, manifest: Manifest, name: str = "report.html") -> Path:
    out = Path(folder) / name
    tmp = out.with_suffix(".html.tmp")
    tmp.write_text(build_report(manifest, Path(folder)), encoding="utf-8")
    tmp.replace(out)
    return out
