"""What an LLM `.pte` holds besides its graphs: the method names and the constant methods
ExecuTorch's LLM runners read.

Method names are ExecuTorch's Qualcomm LLM flow's (`examples/qualcomm/oss_scripts/llama`,
`DECODER_GRAPH_NAMES`): `kv_forward` decodes one token, `prefill_forward` reads N. The constant
methods are the names its `static_llama.get_metadata` writes (and `retrieve_info_from_pte`,
the Qualcomm runner, reads), plus `get_eos_ids` of ExecuTorch's generic LLM runner.
"""
from __future__ import annotations

from .static_decoder import DecoderSpec

DECODE_METHOD = "kv_forward"
PREFILL_METHOD = "prefill_forward"
KV_IO_FLOAT = 32     # get_kv_io_bit_width: 32 = the caches cross the method boundary as float32


def method_name(n_tokens: int) -> str:
    return DECODE_METHOD if n_tokens == 1 else PREFILL_METHOD


def n_tokens_of(method: str, variants: list[int]) -> int:
    return 1 if method == DECODE_METHOD else max(variants)


def constant_methods(spec: DecoderSpec, max_seq_len: int, prefill_len: int, bos_id: int | None, add_bos: bool,
                     eos_ids: list[int]) -> dict[str, int | bool | list[int]]:
    """{method name: value}: each becomes a method of the program returning the value."""
    eos = list(eos_ids) or [0]
    return {
        "get_ar_len": prefill_len, "get_max_seq_len": max_seq_len, "get_max_context_len": max_seq_len,
        "get_vocab_size": spec.vocab_size, "get_n_layers": spec.n_layers, "get_n_kv_heads": spec.n_kv_heads,
        "get_head_dim": spec.head_dim, "get_dim": spec.hidden_size, "get_max_batch_size": 1,
        "get_use_kv_cache": True, "use_kv_cache": True, "get_kv_io_bit_width": KV_IO_FLOAT,
        "get_bos_id": bos_id if bos_id is not None else -1, "get_n_bos": 1 if add_bos and bos_id is not None else 0,
        "get_eos_id": eos[0], "get_eos_ids": eos, "get_n_eos": 1,
    }


def check_program(info: dict, methods: list[str]) -> dict:
    """A `.pte` read back (`executorch_qnn.inspect.read_pte`): every decoder method calls a QnnBackend
    delegate and no CPU kernel, all of them one context binary holding every method's graph."""
    from ...core.errors import VerificationError
    by_name = {m["name"]: m for m in info["methods"]}
    for name in methods:
        m = by_name.get(name)
        if m is None or m["delegate_calls"].get("QnnBackend", 0) < 1 or m["kernel_calls"]:
            raise VerificationError(f"the .pte's method {name} is missing, calls no QnnBackend delegate or runs ops "
                                    "on the CPU", "report this: every op of the decoder should be on the HTP")
    binaries = {e["segment"]: e for e in info["delegates"] if e.get("qnn")}
    graphs = {g["name"]: (g.get("htp") or {}) for e in binaries.values() for g in e["qnn"]["context_binary"]["graphs"]}
    if len(binaries) != 1 or set(graphs) != set(methods):
        raise VerificationError(f"the .pte holds {len(binaries)} QNN context binaries with graphs {sorted(graphs)}, "
                                f"expected one holding {sorted(methods)}", "report this: the methods were not compiled together")
    entry = next(iter(binaries.values()))
    return {"size": info["size"], "binary": entry["qnn"]["context_binary"], "graphs": graphs,
            "binary_bytes": entry["size"], "methods": [m["name"] for m in info["methods"]]}


def check_tied(encodings: dict[str, dict[str, list[float]]], n_layers: int) -> dict[str, list[float]]:
    """{method: {I/O: [scale, zp]}} → one encoding per layer's key and value cache: input = output, every method."""
    from ...core.errors import VerificationError
    from .static_decoder import new_key, new_value, past_key, past_value
    out: dict[str, list[float]] = {}
    for i in range(n_layers):
        for names in ((past_key(i), new_key(i)), (past_value(i), new_value(i))):
            seen = {tuple(e[n]) for e in encodings.values() for n in names if n in e}
            if len(seen) != 1:
                raise VerificationError(f"the KV cache {names[0]} carries {len(seen)} encodings across its input, "
                                        f"output and methods ({sorted(seen)}), not one", "report this: the KV encodings must be tied")
            out[names[0]] = out[names[1]] = list(seen.pop())
    return out


def pte_records(rel: str, twin_rel: str, info: dict, twin_info: dict, size: int, twin_size: int,
                decoder_methods: dict[str, int], consts: dict, kv: dict, numerics: dict, fake_quant: dict[str, str]):
    """(WeightSharing, PteLlmProgram) of one target's program and twin, both read back (check_program)."""
    from ...contract.manifest import PteLlmProgram, WeightSharing
    from ...core.errors import VerificationError
    shared = sorted({g.get("shared_weights_size") or 0 for g in info["graphs"].values()})
    once = len(shared) == 1 and shared[0] > 0
    if not once:
        raise VerificationError(f"the .pte's context binary does not share its weights (shared sizes {shared})",
                                "report this: QNN did not share the weights")
    ws = WeightSharing(
        file=rel, graphs=sorted(info["graphs"]), shared_weights_bytes=shared,
        const_bytes={g: h.get("const_size") for g, h in info["graphs"].items()}, bytes=info["binary_bytes"],
        unshared_twins_bytes=twin_info["binary_bytes"], saved_bytes=twin_info["binary_bytes"] - info["binary_bytes"],
        weights_stored_once=once,
        note="the .pte's embedded context binary read back through libQnnSystem, against the host twin's (the same "
             "graphs compiled without sharing: the x86 simulator cannot load shared ones)")
    prog = PteLlmProgram(file=rel, host_twin=twin_rel, methods=info["methods"], decoder_methods=decoder_methods,
                         metadata=consts, bytes=size, host_twin_bytes=twin_size, kv_encodings=kv, numerics=numerics,
                         fake_quant=fake_quant)
    return ws, prog


def method_graphs(io: dict, info: dict, rel: str, target: str, htp_arch: int | None, n_layers: int) -> list:
    """One manifest GraphSpec per decoder method of a target's program; `io`: {method: (names in, example, names out)}."""
    from ...contract import GraphSpec, TensorSpec
    from ...core.vocab import GraphKind
    out = []
    for method, (names_in, ex, names_out) in io.items():
        h = info["graphs"][method]
        out.append(GraphSpec(
            name=method, file=rel, kind=GraphKind.PTE_METHOD, target=target, htp_arch=htp_arch,
            inputs=[TensorSpec(name=n, shape=list(v.shape), dtype=str(v.dtype).removeprefix("torch."))
                    for n, v in zip(names_in, ex)],
            outputs=[TensorSpec(name=o, shape=[], dtype="float32") for o in names_out],
            part=method, n_tokens=int(ex[0].shape[1]), part_index=1, n_parts=1, layers=[0, n_layers],
            qnn_graph_name=method, shared=True, const_bytes=h.get("const_size"),
            shared_weights_bytes=h.get("shared_weights_size")))
    return out
