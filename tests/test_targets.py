import json

import pytest

from conftest import assert_clean_error
from modelexport.core.errors import TargetError
from modelexport.core.targets import all_targets, get_target, require_feature


@pytest.mark.parametrize("name", ["SM8650", "sm8650", "8gen3", "snapdragon-8-gen-3", "Snapdragon 8 Gen 3", "8 gen 3"])
def test_aliases_resolve(name):
    assert get_target(name).name == "SM8650"


def test_table_matches_executorch_soc_table():
    # The QNN library's own SoC table (via executorch) is the authority for arch, id and VTCM.
    from executorch.backends.qualcomm.serialization.qc_schema import _soc_info_table
    theirs = {info.soc_model.name: info for info in _soc_info_table.values()}
    for soc in all_targets():
        info = theirs[soc.name]
        assert soc.soc_model == info.soc_model.value, soc.name
        assert soc.htp_arch == info.htp_info.htp_arch.value, soc.name
        assert soc.vtcm_mb == info.htp_info.vtcm_size_in_mb, soc.name
    required = {"SM8350", "SM8450", "SM8475", "SM8550", "SM8650", "SM8750", "SM8850", "SC8380XP", "SA8295"}
    assert required <= {s.name for s in all_targets()}


def test_unknown_target_lists_known_ones():
    with pytest.raises(TargetError) as e:
        get_target("SM9999")
    assert "SM8650" in e.value.fix and "SM8450" in e.value.fix


def test_feature_floor_refused_up_front():
    with pytest.raises(TargetError, match="V69"):
        require_feature(get_target("SM8350"), "block_quant_4bit", "16a4w_block")
    require_feature(get_target("SM8450"), "block_quant_4bit", "16a4w_block")
    assert not get_target("SM8450").supports("weight_sharing") and get_target("SM8550").supports("weight_sharing")


def test_targets_cli_json(cli):
    proc = cli("targets", "--json", check=True)
    data = json.loads(proc.stdout)
    names = [t["name"] for t in data["targets"]]
    assert "SM8850" in names and data["feature_floors"]["weight_sharing"] == "V73"
    sm8750 = next(t for t in data["targets"] if t["name"] == "SM8750")
    assert sm8750["htp_arch"] == 79 and sm8750["soc_model"] == 69


def test_targets_cli_unknown(cli):
    assert_clean_error(cli("targets", "snapdragon-9000"), "unknown target", "SM8650")


def test_a_mistyped_option_is_a_usage_error_not_a_traceback(cli):
    proc = cli("targets", "--jsn")
    assert_clean_error(proc, "No such option", "--jsn", "--json")
    assert proc.returncode == 2


def test_version(cli):
    from importlib.metadata import version
    proc = cli("--version")
    assert proc.returncode == 0 and proc.stdout.strip() == f"modelexport {version('modelexport')}"
