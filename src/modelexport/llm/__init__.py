"""LLM support, by job: `model/` (the fixed-shape NPU decoder `static_decoder`, input modes, RoPE
positions, residual scale, parts, the vision part), `export/` (the compile's recipe up to the quantized graphs),
`run/` (the generation loop, sampling, tokenizers, text, the pure-torch reference loop `static_runner`,
the runtimes' openers) and `cpu/` (the CPU runtime that generates text on this host).

    import modelexport.llm as llm
    model = llm.load("SmolLM2-135M-Instruct.Q4_1.gguf")       # CPU runtime (ExecuTorch XNNPACK, 8da4w)
    print(model.generate("What is the capital of France?", chat=True, max_new_tokens=32).text)
    for piece in model.stream("Once upon a time", temperature=0.8, seed=1):
        print(piece, end="", flush=True)
    chat = model.chat(); chat.send("Hi!"); chat.send("And in French?")

`load` accepts a GGUF file, a Hugging Face folder, an ExecuTorch LLM `.pte`, or an LLM bundle
(a `modelexport` output folder). Backends are looked up in `LLM_BACKENDS` ("cpu", "htp-sim").
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Callable, Sequence

from ..core.errors import InputError
from ..core.lazy import lazy_attributes
from ..core.registry import Registry

# The generation loop imports torch (seconds). `modelexport.frontends.loaded_llm` is read by the GGUF and
# HF frontends on every compile, which must not pay that: these names load on first use.
_LAZY = {**{n: "run.generate" for n in ("ChatSession", "DecoderSession", "Forward", "GenerationResult",
                                        "GenerationStats", "Generator", "StaticGraphSession", "TokenStream")},
         "GenerationConfig": "run.generation_config", "SamplingConfig": "run.generation_config",
         "Sampler": "run.sampling", "Tokenizer": "run.tokenizers", "check_vocab": "run.tokenizers",
         "load_tokenizer": "run.tokenizers"}


__getattr__ = lazy_attributes(__name__, _LAZY, globals())

__all__ = ["load", "LLM", "LoadOptions", "LLM_BACKENDS", "Generator", "GenerationConfig", "GenerationResult",
           "GenerationStats", "TokenStream", "ChatSession", "DecoderSession", "Forward", "StaticGraphSession",
           "Sampler", "SamplingConfig", "Tokenizer", "load_tokenizer"]


@dataclass
class LoadOptions:
    quant: str = "8da4w"            # CPU program weights: 8da4w | 8da8w | fp32
    max_seq_len: int | None = None  # context of a CPU program built here (None: 2048, or the model's own if smaller)
    gguf_blocks: bool = True        # from a GGUF: keep its blocks as stored where our kernels can (False: re-quantize)
    tokenizer: str | Path | None = None   # override the model's own tokenizer
    threads: int | None = None      # CPU threads (default: all cores)
    use_cache: bool = True
    cache_dir: str | Path | None = None   # where built CPU programs are kept (default: MODELEXPORT_CACHE_DIR)
    progress: Callable[[str], None] | None = None
    lora: str | Path | None = None  # a bundle compiled with --lora: an adapter's name in it, or a PEFT folder (htp-sim, genie)
    lora_scale: float = 1.0         # the adapter's strength (0: the base alone)


@dataclass
class LLM:
    """A model ready to generate: `generate`, `stream`, `chat`."""

    generator: Generator
    backend: str
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def tokenizer(self) -> Tokenizer:
        return self.generator.tokenizer

    @property
    def session(self) -> DecoderSession:
        return self.generator.session

    @property
    def max_seq_len(self) -> int:
        return self.generator.max_seq_len

    def generate(self, prompt: str | Sequence[dict] | Sequence[int], config: GenerationConfig | None = None, *,
                 chat: bool = False, on_text: Callable[[str], None] | None = None, **options: Any) -> GenerationResult:
        """Generate from text (`chat=True` wraps it in the chat template), chat messages or token ids.
        Options: max_new_tokens, temperature, top_k, top_p, repetition_penalty, seed, stop_strings,
        sliding_window, prompt_lookup (draft tokens per step copied from earlier text; greedy) and ngram."""
        return self.generator.generate(prompt, config, chat=chat, on_text=on_text, **_norm(options))

    def stream(self, prompt: str | Sequence[dict] | Sequence[int], config: GenerationConfig | None = None, *,
               chat: bool = False, on_prefill: Callable[[int, int], None] | None = None, **options: Any) -> TokenStream:
        """An iterator of text pieces; `.result` (text, token ids, stats) once it is exhausted.
        `on_prefill(done, total)`: the prompt's progress chunk by chunk (backends whose sessions run chunks)."""
        extra = {"on_prefill": on_prefill} if on_prefill else {}
        return self.generator.stream(prompt, config, chat=chat, **extra, **_norm(options))

    def chat(self, system: str | None = None) -> ChatSession:
        return self.generator.chat(system)


def _norm(options: dict[str, Any]) -> dict[str, Any]:
    if "stop" in options:  # the CLI's name
        stop = options.pop("stop")
        options["stop_strings"] = (stop,) if isinstance(stop, str) else tuple(stop or ())
    return options


# --------------------------------------------------------------------------------------------
# backends: name -> opener(source, options) -> LLM
# The CPU opener is here (llm.run.openers); the simulator's comes with the format that writes LLM bundles.
LLM_BACKENDS: Registry[Callable[[Path, LoadOptions], LLM]] = Registry("LLM backend", plugins="LLM backend")


def load(source: str | Path, *, backend: str = "cpu", **options: Any) -> LLM:
    """Open `source` (GGUF file, HF folder, ExecuTorch `.pte`, or an LLM bundle) on `backend`."""
    unknown = sorted(set(options) - {f.name for f in fields(LoadOptions)})
    if unknown:
        raise InputError(f"modelexport.llm.load: unknown option(s) {', '.join(unknown)}",
                         f"it takes: backend, {', '.join(f.name for f in fields(LoadOptions))}")
    opts = LoadOptions(**options)
    path = Path(source)
    if not path.exists():
        raise InputError(f"{path} does not exist", "give a .gguf file, a Hugging Face folder, a .pte or a bundle folder")
    if opts.lora is not None and backend not in ("htp-sim", "genie"):
        raise InputError(f"--lora applies an adapter to a bundle compiled with --lora on --backend htp-sim or genie, "
                         f"not {backend}", "use --backend htp-sim or --backend genie, or merge the adapter into the "
                         "model (peft's merge_and_unload, save_pretrained) and run that folder")
    if not opts.gguf_blocks and backend != "cpu":
        raise InputError(f"--requantize-gguf applies to the CPU program built from a GGUF, not to --backend {backend}",
                         "leave --requantize-gguf out, or use --backend cpu")
    return LLM_BACKENDS.get(backend)(path, opts)


def attach_tokenizer(session: DecoderSession, tokenizer: Tokenizer, *, backend: str, info: dict[str, Any],
                     extra_eos_ids: Sequence[int] = ()) -> LLM:
    """The common last step of every backend: check the tokenizer fits the model, wrap both."""
    from .run.generate import Generator
    from .run.tokenizers import check_vocab   # deferred: it loads jinja2, tokenizers, sentencepiece (~50 ms); llm is loaded at every CLI start
    if session.vocab_size:
        check_vocab(tokenizer, session.vocab_size, where=f"the model ({info.get('model') or backend})")
    info = {**info, "tokenizer": tokenizer.describe(), "max_seq_len": session.max_seq_len}
    return LLM(Generator(session, tokenizer, backend=backend, extra_eos_ids=extra_eos_ids), backend, info)
