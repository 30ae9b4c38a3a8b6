"""`generate BUNDLE --backend genie`: the text comes from Genie's own dialog loop (its variant
switching, attention mask, KV-cache updates and sampler) running the bundle's host twins on the
x86 HTP simulator. Our tokenizer encodes the prompt (chat template included) and decodes what
Genie returns; the token ids go to `GenieDialog_tokenQuery` as they are (a bundle taking embeddings:
their rows of the bundle's Genie table go to `GenieDialog_embeddingTokenQuery`).

Greedy Genie gives the same tokens as `--backend htp-sim` (our loop over the same binaries):
tests/test_llm_genie.py checks it token for token.
"""
from __future__ import annotations

import queue
import threading
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ...core.arguments import finite
from ...core.errors import InputError, UnsupportedError
from ...llm.export.lora_source import adapter_arrays
from ...llm import LLM, LLM_BACKENDS, LoadOptions
from ...llm.run.generate import GenerationConfig, GenerationResult, GenerationStats, TokenStream, _config_with
from ...llm.run.tokenizers import StreamDecoder
from .genie_dialog import genie_tokens, sampler_block
from .session import bundle_lora_slots, bundle_tokenizer, find_adapter, open_compiled_bundle


# Genie picks every token inside its own dialog, so our drafts cannot be checked there; its own
# speculative dialogs, tried on this host's libGenie (QAIRT 2.51) with a tiny bundle's twins (ar1 + ar8):
GENIE_NO_PROMPT_LOOKUP = (
    "--backend genie runs Genie's own dialog, which picks every token inside libGenie.so, so prompt lookup's drafts "
    "cannot be checked there; Genie's own lookahead dialog (\"lade\") does not run correctly on this host: with "
    "ngram 3 its graph call fails (QNN error 1100), with ngram 2 it ignores the token limit and runs to the "
    "context's end")


class GenieGenerator:
    """The `Generator` surface (`generate`, `stream`, `encode_prompt`) over Genie's dialog."""

    session = None

    def __init__(self, bundle, tokenizer, target: str, lora: dict | None = None):
        self.bundle = bundle
        self.tokenizer = tokenizer
        self.target = target
        self.max_seq_len = bundle.manifest.llm.max_seq_len
        self.lora = lora        # an adapter's LoRA inputs (float32), applied in each dialog

    def encode_prompt(self, prompt, *, chat: bool = False) -> list[int]:
        if isinstance(prompt, str):
            if not prompt.strip():
                raise InputError("the prompt is empty", "pass some text with --prompt")
            return (self.tokenizer.encode_chat([{"role": "user", "content": prompt}]) if chat
                    else self.tokenizer.encode(prompt))
        if not prompt:
            raise InputError("the conversation is empty", "give at least one message")
        return self.tokenizer.encode_chat(prompt)

    def stream(self, prompt, config: GenerationConfig | None = None, *, chat: bool = False, **overrides: Any) -> TokenStream:
        config = _config_with(config, overrides)
        s = config.sampling
        if s.repetition_penalty != 1.0 or config.stop_strings or config.sliding_window:
            raise UnsupportedError("--backend genie takes the sampling flags Genie has (temperature, top-k, top-p, "
                                   "seed); not --repetition-penalty, --stop or --sliding-window",
                                   "leave those out, or use --backend htp-sim (the same binaries, our loop)")
        if config.prompt_lookup:
            raise UnsupportedError(GENIE_NO_PROMPT_LOOKUP, "use --backend htp-sim for --prompt-lookup (the same binaries, our loop)")
        ids = [int(t) for t in prompt] if isinstance(prompt, (list, tuple)) and prompt and isinstance(prompt[0], int) \
            else self.encode_prompt(prompt, chat=chat)
        if not ids or len(ids) >= self.max_seq_len:
            raise InputError(f"the prompt is {len(ids)} tokens; the bundle's context holds {self.max_seq_len}",
                             "shorten the prompt, or compile with a larger --max-seq-len")
        state: dict[str, Any] = {"ids": [], "t0": time.perf_counter()}
        return TokenStream(self._run(ids, config, state), lambda: self._finish(ids, config, state))

    def generate(self, prompt, config: GenerationConfig | None = None, *, chat: bool = False,
                 on_text=None, **overrides: Any) -> GenerationResult:
        stream = self.stream(prompt, config, chat=chat, **overrides)
        for piece in stream:
            if on_text:
                on_text(piece)
        return stream.result

    def chat(self, system: str | None = None):
        raise UnsupportedError("--backend genie runs one prompt per dialog here",
                               "use --backend htp-sim for --chat (the same binaries, our loop)")

    def _run(self, prompt_ids: list[int], config: GenerationConfig, state: dict):
        """Genie's dialog in a thread (its child process streams token ids); text pieces as they come."""
        s = config.sampling
        sampler = sampler_block(s.temperature, s.top_k, s.top_p, s.seed)
        pieces: queue.Queue = queue.Queue()
        decoder = StreamDecoder(self.tokenizer, prompt_ids)
        eos = set(self.tokenizer.eos_ids)

        def work() -> None:
            try:
                _, stop = genie_tokens(self.bundle, self.target, prompt_ids, config.max_new_tokens, sampler,
                                       on_tokens=lambda ids: pieces.put(("ids", ids)), lora=self.lora)
                pieces.put(("done", stop))
            except BaseException as e:   # handed to the consumer, raised there
                pieces.put(("error", e))

        threading.Thread(target=work, daemon=True).start()
        while True:
            kind, value = pieces.get()
            if kind == "error":
                raise value
            if kind == "done":
                state["stop"] = value
                return
            for t in value:
                state.setdefault("first", time.perf_counter())
                state["ids"].append(t)
                if t in eos:
                    continue
                piece = decoder.push(t)
                if piece:
                    yield piece

    def _finish(self, prompt_ids: list[int], config: GenerationConfig, state: dict) -> GenerationResult:
        ids = state["ids"]
        end = time.perf_counter()
        first = state.get("first", end)
        stop = state.get("stop", "stopped")
        if ids and ids[-1] in set(self.tokenizer.eos_ids):
            stop = "eos"
        decode_s = end - first
        stats = GenerationStats(
            backend="genie", prompt_tokens=len(prompt_ids), prefill_tokens=len(prompt_ids), generated_tokens=len(ids),
            time_to_first_token_s=round(first - state["t0"], 6), prefill_s=round(first - state["t0"], 6),
            prefill_tokens_per_s=None, decode_s=round(decode_s, 6),
            decode_tokens_per_s=round((len(ids) - 1) / decode_s, 3) if len(ids) > 1 and decode_s > 0 else None,
            sampling_s=0.0, total_s=round(end - state["t0"], 6), stop_reason=stop,
            seed=int(config.sampling.seed or 0))
        text = self.tokenizer.decode([t for t in ids if t not in set(self.tokenizer.eos_ids)], skip_special_tokens=True)
        return GenerationResult(text=text, token_ids=list(ids), prompt_ids=list(prompt_ids), stats=stats)


@LLM_BACKENDS.register("genie")
def open_genie(path: Path, opts: LoadOptions) -> LLM:
    bundle = open_compiled_bundle(path, "genie")
    targets: Sequence[str] = list(bundle.manifest.llm.genie) if bundle.manifest.llm else []
    if not targets:
        raise InputError(f"bundle {path} has no Genie config", "compile the LLM again with this version")
    check = bundle.manifest.llm.genie[targets[0]]
    if bundle.manifest.llm.inputs == "both":
        raise UnsupportedError(f"Genie cannot run {path.name}: {check.dialog_note or 'its decoder takes input_ids and inputs_embeds'}",
                               "use --backend htp-sim (the same binaries, our loop), or compile with --inputs embeddings")
    vision = bundle.manifest.llm.vision
    if vision is not None and vision.position_rule != "text":    # M-RoPE graphs: genie_dialog.GENIE_UNFED_INPUTS
        raise UnsupportedError(f"Genie cannot run {path.name}: {check.dialog_note or 'its decoder takes M-RoPE positions'}",
                               "use --backend htp-sim (the same binaries, our loop)")
    if bundle.manifest.llm.n_parts > 1 and not check.dialog_created:
        # bundles split into parts before their graphs were named in part order and their boundary
        # tensors alike on both sides of a cut: Genie would run them out of order or not at all
        raise UnsupportedError(f"Genie cannot run {path.name}: its decoder is split into {bundle.manifest.llm.n_parts} "
                               f"parts whose graphs Genie cannot chain ({check.dialog_note or 'no Genie dialog was created at build time'})",
                               "compile the LLM again with this version, or use --backend htp-sim (the same binaries, our loop)")
    tokenizer = bundle_tokenizer(bundle, path, opts)
    gen = GenieGenerator(bundle, tokenizer, targets[0], _genie_lora(bundle, opts))
    info = {"source": str(path), "source_kind": "bundle", "model": path.name, "target": targets[0],
            "tokenizer": tokenizer.describe(), "max_seq_len": gen.max_seq_len,
            "runtime": "libGenie.so (onnxruntime-qnn wheel) on the host twins, x86 HTP simulator"}
    return LLM(gen, "genie", info)   # type: ignore[arg-type]   # the Generator surface, Genie's loop


def _genie_lora(bundle, opts: LoadOptions) -> dict | None:
    """--lora: the adapter's inputs at --lora-scale, as Genie's float32 files take them (None: the base)."""
    if opts.lora is None:
        return None
    slots = bundle_lora_slots(bundle)
    if slots is None:
        raise InputError(f"bundle {bundle.path} takes no LoRA adapter: it was compiled without --lora",
                         "compile the base again with --lora ADAPTER_DIR, or leave --lora out")
    finite("--lora-scale", opts.lora_scale, "1.0")
    return adapter_arrays(find_adapter(bundle, opts.lora, slots), slots, opts.lora_scale, dtype=np.float32)
