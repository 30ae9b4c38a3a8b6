"""What an LLM frontend hands on: a float32 HF causal LM, its tokenizer and where it came from."""
from __future__ import annotations

import functools
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from ..core.errors import InputError
from .llm_families import SUPPORTED_ARCHITECTURES


@contextmanager
def without_hf_progress_bars() -> Iterator[None]:
    """transformers' own tqdm bars (one per GGUF tensor, per weight file) are off while a frontend
    loads: the command reports the stage itself, and a piped log would get a line per update."""
    import transformers.modeling_gguf_pytorch_utils as gguf_utils   # its tqdm ignores the switch below
    from transformers.utils import logging as hf_logging
    was, bar = hf_logging.is_progress_bar_enabled(), gguf_utils.tqdm
    hf_logging.disable_progress_bar()
    gguf_utils.tqdm = functools.partial(bar, disable=True)
    try:
        yield
    finally:
        gguf_utils.tqdm = bar
        if was:
            hf_logging.enable_progress_bar()


@dataclass
class LoadedLLM:
    model: Any            # transformers PreTrainedModel (LlamaForCausalLM, Qwen2ForCausalLM, ...), eval, float32
    tokenizer: Any        # transformers tokenizer
    config: Any           # model.config
    source: Path          # the GGUF file or the HF folder
    source_format: str    # "gguf" or "hf"
    architecture: str     # a model_type of llm_families.FAMILIES: "llama", "qwen2", ...
    chat_template: str | None = None
    gguf_info: Any = None  # GgufInfo when loaded from a GGUF
    load_seconds: float | None = None
    kind: str = "llm"

    @property
    def name(self) -> str:
        return self.source.stem if self.source.suffix else self.source.name

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True) -> list[int]:
        """Token ids of `messages` rendered with the model's chat template."""
        if not self.chat_template:
            raise InputError(f"{self.source} has no chat template", "pass plain text instead of chat messages")
        out = self.tokenizer.apply_chat_template(messages, chat_template=self.chat_template,
                                                 add_generation_prompt=add_generation_prompt, tokenize=True)
        if isinstance(out, dict) or hasattr(out, "keys"):  # transformers 5 may return a BatchEncoding
            out = out["input_ids"]
        return list(out)

    def eos_token_ids(self) -> list[int]:
        ids: set[int] = set()
        for src in (getattr(self.config, "eos_token_id", None),
                    getattr(getattr(self.model, "generation_config", None), "eos_token_id", None),
                    getattr(self.tokenizer, "eos_token_id", None)):
            if isinstance(src, int):
                ids.add(src)
            elif isinstance(src, (list, tuple)):
                ids.update(int(i) for i in src)
        return sorted(ids)


def check_architecture(arch: str | None, where: str,
                       supported: tuple[str, ...] = SUPPORTED_ARCHITECTURES) -> str:
    """`arch` if it is in `supported` (HF model types, or a GGUF's names for them), else an
    InputError naming what is supported."""
    if arch not in supported:
        raise InputError(f"{where}: architecture {arch!r} is not supported",
                         f"supported architectures: {', '.join(supported)} "
                         "(the rows of frontends/llm_families.py; SmolLM/SmolLM2 are llama)")
    return arch
