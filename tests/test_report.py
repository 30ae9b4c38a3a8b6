"""report.html: self-contained, honest about missing data, and rendered by a real browser."""
import base64
import xml.etree.ElementTree as ET
import re
import shutil
import subprocess

import pytest

from modelexport.contract import BundleWriter, open_bundle
from modelexport.contract.bundle import refresh_report
from modelexport.contract.manifest import DecoderShape, LlmSection
from modelexport.core.vocab import BundleKind


def _bundle(tmp_path, placement=None, numerics=None, kind=BundleKind.MODEL, llm=None, parameters=None):
    with BundleWriter(tmp_path / "b") as w:
        w.path("g.bin").write_bytes(b"x" * 1000)
        w.manifest.kind = kind
        w.manifest.targets = ["SM8650"]
        w.manifest.htp_arch = {"SM8650": 75}
        w.manifest.placement = placement or {}
        w.manifest.numerics = numerics or {}
        w.manifest.llm = llm
        w.manifest.parameters = parameters
    return open_bundle(tmp_path / "b")


def _llm(weight_bytes_per_token: int) -> LlmSection:
    shape = DecoderShape(n_layers=30, n_heads=9, n_kv_heads=3, head_dim=64, hidden_size=576, vocab_size=49152,
                         max_seq_len=512)
    return LlmSection(architecture="llama", spec=shape, variants=[32, 1], max_seq_len=512, n_parts=1,
                      weight_bytes_per_token=weight_bytes_per_token, device_bytes=weight_bytes_per_token,
                      rope_theta=100000.0)


NODES = [{"name": "conv0", "op_type": "Conv", "backend": "HTP"},
         {"name": "det0", "op_type": "Det", "backend": "CPU", "reason": "Operators of type 'Det' are not supported",
          "fix": "no HTP equivalent; compute it before the model"}]


def test_report_without_numerics_says_what_is_missing(tmp_path):
    b = _bundle(tmp_path)
    html = (b.path / "report.html").read_text()
    assert "No numerics are recorded" in html and "modelexport verify" in html
    assert "No per-node placement" in html and "<img" not in html  # no empty plots
    assert "http://" not in html and "https://" not in html  # needs no network


def test_report_with_placement_and_numerics_embeds_plots(tmp_path):
    b = _bundle(tmp_path, placement={"nodes": NODES},
                numerics={"outputs": [{"name": "logits", "sqnr_db": 31.2, "cosine": 0.999, "max_abs_error": 0.1}],
                          "threshold_db": 20,
                          "per_layer": [{"name": f"layers.{i}", "sqnr_db": 40 - 3 * i} for i in range(8)],
                          "per_layer_threshold_db": 25, "first_bad_layer": "layers.5"},
                kind=BundleKind.LLM, llm=_llm(70_000_000), parameters=134_515_008)
    html = (b.path / "report.html").read_text()
    assert "1/2 compute nodes on HTP" in html and "Det" in html and "layers.5" in html
    imgs = [ET.fromstring(base64.b64decode(i)) for i in re.findall(r'src="data:image/svg\+xml;base64,([^"]+)"', html)]
    assert len(imgs) == 3 and all(i.tag.endswith("svg") for i in imgs)
    placement, outputs, layers = imgs
    ns = "{http://www.w3.org/2000/svg}"
    assert len(placement.findall(f"{ns}rect")) >= 1 + 2 * 2      # background + HTP/CPU segment per op type
    dots = layers.findall(f"{ns}circle")
    assert len(dots) == 8 and sum(d.get("fill") == "#c62828" for d in dots) == 2   # 22 and 19 dB < 25
    # the ceiling: SM8650 76.8 GB/s / 70 MB per token ≈ 1,097 tok/s
    assert "1,097" in html


def test_report_cli_rebuilds_and_keeps_integrity(tmp_path, cli_here):
    b = _bundle(tmp_path)
    b.manifest.numerics = {"outputs": [{"name": "y", "sqnr_db": 25.0, "cosine": 0.99, "max_abs_error": 0.2}]}
    refresh_report(b)
    assert "SQNR per output" in (b.path / "report.html").read_text()
    open_bundle(b.path)  # manifest updated with the new report's hash
    proc = cli_here("report", str(b.path), "-o", str(tmp_path / "r.html"))
    assert proc.returncode == 0 and (tmp_path / "r.html").stat().st_size > 1000
    proc = cli_here("report", str(b.path), "-o", str(tmp_path / "r.html"))
    assert proc.returncode != 0 and "--force" in proc.stderr


def _chromium():
    return shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.skipif(not _chromium(), reason="chromium not installed (make test installs it)")
def test_report_renders_in_headless_chromium(tmp_path):
    b = _bundle(tmp_path, placement={"nodes": NODES},
                numerics={"outputs": [{"name": "y", "sqnr_db": 30.0, "cosine": 0.99, "max_abs_error": 0.2}]})
    shot = tmp_path / "shot.png"
    proc = subprocess.run([_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                           "--disable-background-networking", "--disable-component-update", "--disable-sync",
                           f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1200,1600",
                           f"--screenshot={shot}", (b.path / "report.html").as_uri()],
                          capture_output=True, text=True, timeout=120)
    assert shot.exists(), proc.stderr[-2000:]
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000  # a page with plots, not a blank one
    keep = __import__("os").environ.get("MODELEXPORT_KEEP_SCREENSHOT")
    if keep:
        shutil.copyfile(shot, keep)


def test_an_exact_output_of_inf_db_plots():
    """minilm_l3's exact outputs (inf dB) made the report's SQNR plot raise OverflowError."""
    from modelexport.contract.report.plots import bars
    svg = bars(["ids", "logits", "nan"], [float("inf"), 12.0, float("nan")], "SQNR per output", "dB", 35.0)
    assert svg.startswith("data:image/svg+xml;base64,")


def test_a_search_or_per_layer_plot_with_an_exact_candidate_draws():
    """tashkeel's auto search: a candidate at inf dB made the scatter's ticks raise OverflowError."""
    from modelexport.contract.report.plots import line, scatter
    assert scatter([(1e6, float("inf")), (2e6, 30.0)], ["a", "b"], "t", "cycles", "dB", 25.0, 0).startswith("data:")
    assert line(["x", "y"], [float("inf"), 20.0], "t", "dB", 25.0).startswith("data:")
