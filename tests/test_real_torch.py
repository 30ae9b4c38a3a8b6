"""The quickest rows of the real PyTorch corpus (bench/real_torch_models.py, `Case.quick`):
audit → compile → verify on the HTP simulator, every node on the HTP, verify's pass mark met.
The whole table is the bench's; this keeps the path under `make test`."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location("real_torch_models",
                                               Path(__file__).resolve().parents[1] / "bench" / "real_torch_models.py")
corpus = importlib.util.module_from_spec(_spec)
sys.modules["real_torch_models"] = corpus     # its dataclasses look their module up
_spec.loader.exec_module(corpus)

QUICK = [(c, p) for c in corpus.CASES for p in c.quick]


def test_the_corpus_is_at_least_ten_real_models_of_several_kinds():
    assert len(corpus.CASES) >= 10 and len({c.name for c in corpus.CASES}) == len(corpus.CASES)
    assert 3 <= len(QUICK) <= 4


@pytest.mark.parametrize("case, precision", QUICK, ids=[f"{c.name}-{p}" for c, p in QUICK])
def test_a_quick_real_model_compiles_fully_on_the_htp_and_verifies(case, precision, tmp_path):
    row = corpus.run_case(case, precision, tmp_path)
    assert row["audit_htp_nodes"] == row["audit_nodes"] > 0, row
    assert row["compiled"] and row["htp_share"] == 1.0, row
    assert row["verified"], row
