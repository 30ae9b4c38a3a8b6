"""Fast checks of the one precision table, the one `--override` parser and the module-path readers."""
from __future__ import annotations

from types import SimpleNamespace as NS

import pytest

from modelexport.core.errors import InputError
from modelexport.frontends.module_paths import fx_module_path, fx_module_paths, llm_module_path, onnx_module_path
from modelexport.quant.precision import ONNX_PRECISIONS, PRECISIONS, get_precision, precision_from_bitwidths
from modelexport.quant.override_spec import Override, parse_override_specs


def _refused(fn) -> InputError:
    with pytest.raises(InputError) as e:
        fn()
    return e.value


def test_one_table_holds_the_block_wise_precision_and_its_spellings():
    block = PRECISIONS["16a4w_block"]
    assert [p.name for p in PRECISIONS.values() if p.block_wise] == ["16a4w_block"]
    assert (block.activation_type, block.weight_type, block.feature) == ("QUInt16", "QInt4", "block_quant_4bit")
    for spelling in ("16a4w_block", "16A4W-BLOCK", "lpbq", "w4a16_block", "16a4wblock"):
        assert get_precision(spelling) is block, spelling
    assert get_precision("W8A16").name == "16a8w" and get_precision(" int8 ").name == "8a8w"
    e = _refused(lambda: get_precision("fp32"))
    assert e.problem == "unknown precision 'fp32'"
    assert e.fix == "choose one of: fp16, 8a8w, 16a8w, 16a16w, 16a4w, 16a4w_block"


def test_the_onnx_path_refuses_block_wise_as_before():
    assert "16a4w_block" not in ONNX_PRECISIONS and "16a4w" in ONNX_PRECISIONS
    assert get_precision("w4a16", ONNX_PRECISIONS).name == "16a4w"
    e = _refused(lambda: get_precision("lpbq", ONNX_PRECISIONS))
    assert (e.problem, e.fix) == ("unknown precision 'lpbq'", "choose one of: fp16, 8a8w, 16a8w, 16a16w, 16a4w")
    assert precision_from_bitwidths(16, 4, True).name == "16a4w"
    fix = _refused(lambda: precision_from_bitwidths(16, 2, True)).fix
    assert fix.count("--act-bitwidth 16 --weights-bitwidth 4") == 1


def test_override_parser():
    seen = []
    out = parse_override_specs([r"layers\.0=lpbq", "a=b=16a8w"], "x=16a8w", lambda spec, p: seen.append((spec, p.name)))
    assert out == [Override(r"layers\.0", PRECISIONS["16a4w_block"]), Override("a=b", PRECISIONS["16a8w"])]
    assert seen == [(r"layers\.0=lpbq", "16a4w_block"), ("a=b=16a8w", "16a8w")]
    assert out[0].matches(None, "", "model.layers.0.mlp") and not out[0].matches("layers.1", None)
    ok = lambda spec, p: None  # noqa: E731
    assert _refused(lambda: parse_override_specs(["fc"], "x=16a8w", ok)).fix == "e.g. --override 'x=16a8w'"
    assert "not a regular expression" in _refused(lambda: parse_override_specs(["fc(=8a8w"], "x", ok)).problem
    e = _refused(lambda: parse_override_specs(["fc=16a4w_block"], "x", ok, ONNX_PRECISIONS))
    assert e.problem == "unknown precision '16a4w_block'"


def test_every_path_parses_into_the_one_override_type_with_its_own_checks():
    from modelexport.quant import llm_graphs, pt2e_qnn
    from modelexport.quant.onnx_overrides import parse_onnx_overrides
    q8 = PRECISIONS["8a8w"]
    et = pt2e_qnn.parse_overrides(["fc=lpbq"], q8)
    assert et == [Override("fc", PRECISIONS["16a4w_block"])]
    assert pt2e_qnn.QuantPlan(q8, et, 16).key()["block_size"] == 16
    assert pt2e_qnn.QuantPlan(q8, [], 16).key()["block_size"] is None
    assert parse_onnx_overrides(["fc=16a8w"], q8) == [Override("fc", PRECISIONS["16a8w"])]
    assert "unknown precision" in _refused(lambda: parse_onnx_overrides(["fc=lpbq"], q8)).problem
    assert parse_onnx_overrides(["fc=fp16"], q8) == [Override("fc", PRECISIONS["fp16"])]     # an fp16 island
    assert "needs a quantized --precision" in _refused(lambda: parse_onnx_overrides(["fc=16a8w"], PRECISIONS["fp16"])).problem
    assert "a fp16 override" in _refused(lambda: pt2e_qnn.parse_overrides(["fc=fp16"], q8)).problem
    llm = llm_graphs.parse_overrides(["lm_head=16a8w"], "16a4w")
    assert llm == [Override("lm_head", PRECISIONS["16a8w"])]
    assert _refused(lambda: llm_graphs.parse_overrides(["lm_head=8a8w"], "16a4w")).fix == "use one of: 16a4w, 16a8w, 16a16w"


def test_module_path_readers_say_what_they_read():
    fx = NS(meta={"nn_module_stack": {"a": ("layers.3", object), "b": ("layers.3.mlp.act", object)}})
    assert fx_module_paths(fx) == ["layers.3", "layers.3.mlp.act"] and fx_module_path(fx) == "layers.3.mlp.act"
    assert fx_module_path(NS(meta={})) is None and fx_module_paths(NS(meta={})) == []
    assert llm_module_path("/decoder/layers.0/mlp/down_proj/MatMul") == "model.layers.0.mlp.down_proj"
    assert llm_module_path("/lm_head/MatMul") == "lm_head"
    assert onnx_module_path(NS(name="/features/features.3/conv/conv.0/conv.0.0/Conv", metadata_props=[])) == "features.3.conv.0.0"
    meta = [NS(key="pkg.torch.onnx.name_scopes", value="['head', 'det']")]
    assert onnx_module_path(NS(name="Det_3", metadata_props=meta)) == "head.det"


def test_llm_per_layer_logits_threshold_reads_the_block_wise_entry():
    # a 16a4w_block LLM bundle's `verify --per-layer` without --min-sqnr used to fail: the ONNX-only
    # table did not know the name
    from modelexport.backends.llm_qnn.per_layer import _logits_report
    last = NS(name="lm_head", sqnr_db=10.0, cosine=0.9, max_abs_error=1.0)
    rep = _logits_report(NS(path="b"), NS(layers=[last], part="ar4", precision="16a4w_block", samples=2), None)
    assert rep.graphs[0].threshold_db == PRECISIONS["16a4w_block"].min_sqnr_db
