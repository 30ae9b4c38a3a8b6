"""GGUF K-quants as users have them (llama.cpp's Q4_K_M / Q5_K_M: K-quant matrices with Q6_K for
some of them): tiny files written by the test (`gguf_kquants`, checked by `gguf.quants.dequantize`)
loaded by the GGUF frontend, listed by `inspect` without reading the weights, and built into the
CPU program, which keeps Q4_K / Q5_K as stored, holds Q6_K rows as 8-bit, and says what it
re-quantized and what that lost."""
from __future__ import annotations

import sys
from collections import Counter

import numpy as np
import pytest
import torch
from test_native_gguf_blocks import _weight_of, kept_and_requantized_programs

# which GGUF tensor a transformers Linear comes from (q/k rows are permuted on load: compared as sets)
HF_TO_GGUF = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
              "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
              "mlp.down_proj": "ffn_down"}
# llama.cpp's K_M mixes: the layers' matrices in the K-quant, v and down (some layers) and the
# output in Q6_K; the Q5_K_M one also keeps its gate in F16 (a type no kernel of ours holds) and
# its token embedding in Q6_K (as llama.cpp does for tied embeddings of 256-wide models)
MIXES = {"Q4_K_M": "Q4_K", "Q5_K_M": "Q5_K"}
EMBEDDING = {"Q4_K_M": "Q8_0", "Q5_K_M": "Q6_K"}
LAYER_TYPES = {"Q4_K_M": {"attn_v": "Q6_K", "ffn_down": "Q6_K"},
               "Q5_K_M": {"attn_v": "Q6_K", "ffn_down": "Q6_K", "ffn_gate": "F16"}}
# what the CPU program's modules hold, per mix (2 layers): q|k|v fused (K-quant q, k beside Q6_K v:
# all as 8-bit), o, gate, up, down; the Q6_K output; the embedding
PROGRAM = {"Q4_K_M": {"Q4_K+Q6_K as 8-bit": 2, "Q4_K": 6, "Q6_K as 8-bit": 3, "Q8_0 embedding": 1},
           "Q5_K_M": {"Q5_K+Q6_K as 8-bit": 2, "Q5_K": 4, "requantized": 2, "Q6_K as 8-bit": 3,
                      "Q6_K as 8-bit embedding": 1}}


def _mix(path) -> str:
    return path.stem.split("-")[1]


@pytest.fixture(scope="module", params=sorted(MIXES))
def k_gguf(request, tmp_path_factory):
    from test_llm_frontends import write_tiny_gguf
    path = tmp_path_factory.mktemp("kquant") / f"tiny-{request.param}.gguf"
    return write_tiny_gguf(path, matrix_type=MIXES[request.param], embedding_type=EMBEDDING[request.param],
                           output_type="Q6_K",
                           layer_types=LAYER_TYPES[request.param])


@pytest.fixture(scope="module")
def k_model(k_gguf):
    from modelexport.frontends.gguf_file import load_gguf_causal_lm
    return load_gguf_causal_lm(k_gguf).model


def _rows(t) -> Counter:
    return Counter(bytes(np.ascontiguousarray(r, np.float32).tobytes()) for r in np.asarray(t, np.float32))


def test_the_loaded_model_holds_the_files_dequantized_values(k_gguf, k_model):
    """Every Linear of the model the GGUF frontend loads is, row for row, `gguf.quants.dequantize`
    of the file's tensor (as a set of rows: q/k are permuted for HF's RoPE)."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    from modelexport.frontends.gguf_file import read_gguf_matrices
    mats = read_gguf_matrices(k_gguf)

    def file_values(name):
        kind, data = mats[name]
        return dequantize(np.asarray(data), GGMLQuantizationType[kind])

    mix = _mix(k_gguf)
    assert {kind for kind, _ in mats.values()} == {MIXES[mix], *LAYER_TYPES[mix].values(), EMBEDDING[mix]}
    checked = 0
    for i, layer in enumerate(k_model.model.layers):
        for hf, short in HF_TO_GGUF.items():
            weight = layer.get_submodule(hf).weight.detach()
            assert _rows(weight) == _rows(file_values(f"blk.{i}.{short}.weight")), (i, hf)
            checked += 1
    assert _rows(k_model.lm_head.weight.detach()) == _rows(file_values("output.weight"))
    assert torch.equal(k_model.model.embed_tokens.weight.detach(), torch.from_numpy(file_values("token_embd.weight")))
    assert checked == 14


def test_inspect_lists_the_k_quants_without_dequantizing(k_gguf):
    """`inspect FILE.gguf` names every type with its count and reads only the header: no
    dequantizing function of gguf.quants runs (traced, not patched; the reader's shape arithmetic
    from that module may)."""
    from modelexport.inspection import inspect_path

    called = []

    def trace(frame, event, arg):
        if event == "call" and frame.f_globals.get("__name__") == "gguf.quants":
            called.append(frame.f_code.co_name)

    sys.setprofile(trace)
    try:
        d = inspect_path(k_gguf)
    finally:
        sys.setprofile(None)
    assert not [name for name in called if "dequantize" in name or name.endswith("_blocks")], called
    want = Counter({"F32": 5, EMBEDDING[_mix(k_gguf)]: 1}) + Counter({"Q6_K": 1})   # norms, embedding, output
    for short in HF_TO_GGUF.values():
        want[LAYER_TYPES[_mix(k_gguf)].get(short, MIXES[_mix(k_gguf)])] += 2
    assert d["quant_types"] == dict(want), d["quant_types"]


def _quantized_like_the_program(gguf, model):
    """The CPU program's model before torch.export: ExecuTorch's Transformer with the GGUF's blocks
    kept where our kernels compute them, the rest re-quantized; and the record llm.json gets."""
    from modelexport.llm.cpu.export import (
        CpuExportOptions,
        _weights_record,
        quantize_model,
    )
    from modelexport.llm.cpu.transformer import build_transformer
    from modelexport.llm.cpu.gguf_blocks import GgufBlocks

    opts = CpuExportOptions(max_seq_len=32)
    transformer, _ = build_transformer(model, opts.max_seq_len, opts.attention)
    blocks = GgufBlocks(gguf)
    return quantize_model(transformer, opts, blocks), _weights_record(opts, blocks)


def test_the_cpu_program_keeps_the_k_quants_and_states_the_loss_of_the_rest(k_gguf, k_model):
    """Q4_K (4-bit kernel, float32 scales) and Q5_K (8-bit kernel with mins) kept as stored; the
    fused q|k|v (its v in Q6_K) held by the 8-bit kernel, its K-quant rows exact and its Q6_K rows
    re-quantized to 8 bits, as the Q6_K down and output are; an F16 gate re-quantized to 4 bits.
    llm.json's record counts each and states what the re-quantized ones lost (weight SQNR against
    the file's values); the kept modules compute exactly the file's values."""
    from modelexport.llm.cpu.kernels.linear_q4_op import Q4GateUp, Q4Linear, Q8Linear

    mix = _mix(k_gguf)
    model, record = _quantized_like_the_program(k_gguf, k_model)
    assert record["kept_as_stored"] == PROGRAM[mix], record
    nearest = record["nearest_8bit_weight_sqnr_db"]
    assert 35 < nearest["worst"] <= nearest["all"] < 60, nearest          # Q6_K → 8 bits: a small loss
    held = sum(n for label, n in PROGRAM[mix].items() if "as 8-bit" in label)
    assert f"{held} holding Q6_K rows as 8-bit, weight SQNR {nearest['all']} dB" in record["layout"], record["layout"]
    if "requantized" in PROGRAM[mix]:
        loss = record["requantized_weight_sqnr_db"]
        assert 10 < loss["worst"] <= loss["all"] < 30, loss
        assert f"2 re-quantized to 8da4w, groups of 32, weight SQNR {loss['all']} dB" in record["layout"]
    else:
        assert "requantized_weight_sqnr_db" not in record
    assert model.tok_embeddings.weight.dtype == torch.int8         # an 8-bit lookup: Q8_0, or Q6_K as 8-bit
    o = model.layers[0].attention.wo
    assert isinstance(model.layers[0].attention.wqkv, Q8Linear)
    if mix == "Q4_K_M":
        assert isinstance(o, Q4Linear) and o.scales.dtype == torch.float32 and o.mins is not None
        assert isinstance(model.layers[0].feed_forward.gate_up, Q4GateUp)
    else:
        assert isinstance(o, Q8Linear) and o.scales.dtype == torch.float32 and o.mins is not None
    hf = k_model.model.layers[0].self_attn
    assert torch.equal(_weight_of(o), hf.o_proj.weight.detach())     # read back from the module's buffers
    wq = hf.q_proj.weight.detach()                      # the fused weight's q rows: exact
    assert torch.equal(_weight_of(model.layers[0].attention.wqkv)[:wq.shape[0]], wq)
    # a block whose projections are all ours takes its norms and residual adds into them (one
    # XNNPACK partition per layer), 8-bit ones included
    assert (model.layers[0].attention.wqkv.norm_weight is not None) == (mix == "Q4_K_M")


@pytest.mark.heavy
def test_k_quant_program_follows_the_dequantized_model(k_gguf, k_model, tmp_path):
    """The real CPU program of a Q4_K_M / Q5_K_M-like file: llm.json says what it kept and what the
    rest lost; its logits follow the dequantized float model through prefill and decode, closer
    than the program that re-quantizes everything."""
    weights, sqnr = kept_and_requantized_programs(k_gguf, k_model, tmp_path)
    assert weights["kept_as_stored"] == PROGRAM[_mix(k_gguf)], weights
    assert "nearest_8bit_weight_sqnr_db" in weights
    print("logit SQNR vs the dequantized model (dB):", sqnr)
    # measured: Q4_K_M 31.7 dB kept vs 9.7 re-quantized; Q5_K_M 20.0 (its F16 gate re-quantized) vs 9.4
    assert sqnr[True] > sqnr[False] + 8, sqnr
