"""compile's options are declared once (core/compile_flags.py): the CLI's parameters, the API's names,
the fixes' flags; precision and target are parsed once into their tables' values."""
import inspect
import pickle
from dataclasses import fields

from conftest import run_cli

from modelexport import api
from modelexport.backends.spec import OPTION_OWNERS, CompileOptions, OnnxCompileOptions
from modelexport.core.compile_flags import COMPILE_FLAGS, PANELS
from modelexport.core.spellings import FLAGS
from modelexport.core.targets import SoC, get_target
from modelexport.quant.precision import PRECISIONS, Precision, get_precision


def test_every_row_is_an_api_name():
    keywords = set(inspect.signature(api.compile).parameters)
    options = {f.name for t in (CompileOptions, OnnxCompileOptions, *OPTION_OWNERS) for f in fields(t)}
    assert [f.name for f in COMPILE_FLAGS if not f.cli and f.name not in keywords | options] == []
    assert len({f.name for f in COMPILE_FLAGS}) == len(COMPILE_FLAGS)
    assert {f.panel for f in COMPILE_FLAGS} == set(PANELS)


def test_a_fix_names_the_rows_flags():
    assert {"input_shapes": "--input-shape", "input_values": "--input-value", "overrides": "--override",
            "targets": "--target", "output_format": "--format", "rewrites": "--rewrite"}.items() <= FLAGS.items()


def test_compile_help_lists_its_options_by_model_kind():
    out = run_cli("compile", "--help", env={"COLUMNS": "200"}).stdout
    at = [out.find(f"─ {panel} ") for panel in PANELS]
    assert -1 not in at and at == sorted(at), out
    assert out.find("--rewrite") > out.find("─ PyTorch models ") and out.find("--variants") > out.find("─ LLMs ")


def test_precision_and_target_are_their_tables_values_and_their_names():
    p = get_precision("w8a16")
    assert isinstance(p, Precision) and p == "16a8w" and p is PRECISIONS["16a8w"] and f"{p}" == "16a8w"
    assert get_precision(p) is p and {"16a8w": 1}[p] == 1 and repr(p) == "'16a8w'"
    q = pickle.loads(pickle.dumps(p))
    assert q == p and q.min_sqnr_db == p.min_sqnr_db and q.activation_bits == 16
    soc = get_target("8gen3")
    assert isinstance(soc, SoC) and soc == "SM8650" and get_target(soc) is soc and soc.htp_arch == 75
    assert pickle.loads(pickle.dumps(soc)).vtcm_mb == soc.vtcm_mb and soc.to_dict()["name"] == "SM8650"
