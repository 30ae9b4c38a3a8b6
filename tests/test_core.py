"""Fast unit tests of the ground everything stands on: the registry, error classes and exit codes,
the typed compile options and the Python API's handling of wrong arguments."""
import pytest

import modelexport
from modelexport.backends.spec import CompileOptions, LlmCompileOptions, TorchCompileOptions, build_options
from modelexport.core.errors import (InputError, IntegrityError, ModelExportError, StrictFallbackError,
                                     UnsupportedError, VerificationError)
from modelexport.core.registry import Registry


def test_registry_lists_sorted_refuses_twice_and_names_the_choices():
    r = Registry("colour")
    r.register("red")(1)
    r.register("blue")(2)
    assert r.names() == ["blue", "red"] and "red" in r and list(r) == [("blue", 2), ("red", 1)]
    with pytest.raises(ValueError, match="registered twice"):
        r.register("red")(3)
    with pytest.raises(InputError, match="unknown colour 'green'") as e:
        r.get("green")
    assert "blue, red" in e.value.fix


def test_strict_fallback_and_not_supported_have_their_own_exit_codes():
    codes = {cls: cls("x").exit_code for cls in (InputError, StrictFallbackError, IntegrityError, VerificationError,
                                                  UnsupportedError)}
    assert codes[StrictFallbackError] == 3 and codes[UnsupportedError] == 6
    assert len(set(codes.values())) == len(codes)
    assert all(issubclass(c, ModelExportError) for c in codes)


def test_typed_options_per_format():
    assert type(build_options(CompileOptions, {"vtcm_mb": 4, "variants": None, "rewrites": []})) is CompileOptions
    t = build_options(TorchCompileOptions, {"block_size": 32, "rewrites": ("causal-mask",)})
    assert t.block_size == 32 and t.rewrites == ["causal-mask"] and t.output_format == "pte"
    assert build_options(LlmCompileOptions, {"variants": "ar1,ar32"}).variants == "ar1,ar32"
    with pytest.raises(InputError, match="--variants / --max-seq-len apply to LLMs") as e:
        build_options(CompileOptions, {"variants": "ar1", "max_seq_len": 256})
    assert e.value.fix == "leave them out for this model"
    with pytest.raises(InputError, match="--rewrites applies to PyTorch models"):
        build_options(LlmCompileOptions, {"rewrites": ["causal-mask"]})
    with pytest.raises(InputError, match="unknown option.*colour"):
        build_options(CompileOptions, {"colour": "red"})


def test_public_api_turns_wrong_arguments_into_input_errors(tmp_path):
    with pytest.raises(InputError, match="modelexport.run: .*unexpected keyword.*colour") as e:
        modelexport.run(tmp_path, colour="red")
    assert "bundle" in e.value.fix
    with pytest.raises(InputError, match="modelexport.inspect"):
        modelexport.inspect()
    with pytest.raises(InputError, match="unknown option.*colour"):
        modelexport.compile(str(tmp_path / "m.onnx"), output=tmp_path / "out", colour="red", use_cache=False)


def test_llm_load_names_an_unknown_option(tmp_path):
    import modelexport.llm as llm
    with pytest.raises(InputError, match="unknown option.*colour") as e:
        llm.load(tmp_path, colour="red")
    assert "max_seq_len" in e.value.fix


def test_a_mapped_bf16_checkpoint_is_page_cache_beside_the_peak():
    """A bf16 HF folder's weights stay mapped from its files (page cache the kernel can drop): the
    estimate counts one module lifted to float32 instead of the whole model (Llama-3.1-8B's shape:
    30.9 GB at the load counting the weights, 17.5 GB with them mapped)."""
    from types import SimpleNamespace

    from modelexport.llm.export.memory import DEFAULT_CONTEXT_LIMIT_MB, host_chunk_mb, plan_parts
    from modelexport.llm.job_estimate import GB, PARENT_BASE, estimate_job, n_params_of
    cfg = SimpleNamespace(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                          num_key_value_heads=8, head_dim=128, vocab_size=128256, tie_word_embeddings=False)
    parts, _ = plan_parts(cfg, [32, 1], 512, 4, 16, DEFAULT_CONTEXT_LIMIT_MB, 8, 8)
    kw = dict(chunk_bytes=host_chunk_mb(DEFAULT_CONTEXT_LIMIT_MB) * 2**20)
    owned = estimate_job(cfg, parts, [32, 1], 2, 4, True, **kw)
    mapped = estimate_job(cfg, parts, [32, 1], 2, 4, True, mapped=True, **kw)
    assert owned.mapped_bytes == 0 and mapped.mapped_bytes == 2 * n_params_of(cfg)
    assert mapped.phases["load"] == int(PARENT_BASE) and owned.phases["load"] > 30 * GB
    assert mapped.peak_bytes < 20 * GB < owned.peak_bytes
    assert mapped.phases["compile"] == owned.phases["compile"]      # the workers hold no model either way
    assert mapped.to_dict()["mapped_gb"] == round(mapped.mapped_bytes / GB, 2)
