"""The LLM families modelexport builds, as one table of data (as gguf-py keeps its architectures).

The frontends accept what a row names, the NPU static decoder (`llm/static_decoder.py`) and the
CPU export (`llm/cpu/export.py`) look up the facts they branch on: a new family starts as a row
here. It lives in `frontends/` because that is the lowest part that needs it; `llm/` and
`backends/` import it from here.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LLMFamily:
    model_type: str                      # HF config.model_type; also LoadedLLM.architecture
    label: str                           # the family's name in messages
    gguf_architectures: tuple[str, ...]  # GGUF general.architecture values transformers loads as this family
    npu: bool                            # the static decoder rebuilds it for the HTP
    cpu: bool                            # the CPU export builds it for XNNPACK
    qkv_bias: bool = False               # q/k/v always carry a bias, whatever config.attention_bias says
    attention_bias_on_o_proj: bool = False  # config.attention_bias biases o_proj too (the CPU export cannot)
    sliding_window_always: bool = False  # config.sliding_window applies whenever set (no per-layer switch)


FAMILIES: tuple[LLMFamily, ...] = (
    # SmolLM/SmolLM2 are llama.
    LLMFamily("llama", "Llama", ("llama",), npu=True, cpu=True, attention_bias_on_o_proj=True),
    # llama.cpp files Mistral under "llama"; transformers then builds MistralForCausalLM (same shape).
    LLMFamily("mistral", "Mistral", ("mistral", "llama"), npu=True, cpu=True, sliding_window_always=True),
    LLMFamily("qwen2", "Qwen2", ("qwen2",), npu=True, cpu=True, qkv_bias=True),
)

BY_MODEL_TYPE: dict[str, LLMFamily] = {f.model_type: f for f in FAMILIES}

# What the frontends load: every family some backend builds. GGUF names come from the same rows.
SUPPORTED_ARCHITECTURES: tuple[str, ...] = tuple(f.model_type for f in FAMILIES if f.npu or f.cpu)
SUPPORTED_GGUF_ARCHITECTURES: tuple[str, ...] = tuple(dict.fromkeys(
    a for f in FAMILIES if f.npu or f.cpu for a in f.gguf_architectures))
