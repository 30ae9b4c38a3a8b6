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
