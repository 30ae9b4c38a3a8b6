"""`modelexport generate`: text from an LLM on this host, streamed as it comes."""
from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Optional

import typer

from ... import llm
from ...core.arguments import at_least, one_of
from ...core.errors import InputError, Interrupted
from ...llm.cpu import QUANT_MODES
from ...llm.run.generation_config import no_prompt_lookup
from ...toolchain.library_loggers import quiet_library_loggers
from ..app import app, console, emit_json, err_console, progress


@app.command()
def generate(
    model: Path = typer.Argument(..., help="A GGUF file, a Hugging Face folder, an ExecuTorch LLM .pte, or an LLM bundle."),
    prompt: str | None = typer.Option(None, "--prompt", "-p", help="What you ask. Wrapped in the model's chat template when it has one (as llama.cpp and Ollama do); --raw to complete it as plain text."),
    raw: bool = typer.Option(False, "--raw", help="Complete the prompt as plain text, without the model's chat template (base models, perplexity-style continuations)."),
    chat: bool = typer.Option(False, "--chat", help="A conversation: after --prompt, more messages from stdin, one per line ('/reset', '/exit')."),
    system: str | None = typer.Option(None, "--system", help="System message for --chat."),
    backend: str = typer.Option("cpu", "--backend", help="cpu (ExecuTorch XNNPACK, the fast default), htp-sim (a compiled bundle on the HTP simulator, our loop) or genie (the bundle run by Genie's own dialog, libGenie.so, on the simulator)."),
    max_new_tokens: int = typer.Option(256, "--max-new-tokens", "-n", help="Stop after this many new tokens."),
    temperature: float = typer.Option(0.0, "--temperature", help="0 = greedy."),
    top_k: int = typer.Option(0, "--top-k", help="Sample from the k most likely tokens (0 = off)."),
    top_p: float = typer.Option(1.0, "--top-p", help="Sample from the smallest set holding this much probability (1 = off)."),
    repetition_penalty: float = typer.Option(1.0, "--repetition-penalty", help="> 1 discourages repeating tokens already in the context."),
    seed: int | None = typer.Option(None, "--seed", help="Seed for sampling (same seed, same text); default: a fresh random seed, printed in the stats."),
    stop: list[str] = typer.Option([], "--stop", help="Stop when this text appears (repeatable)."),
    sliding_window: bool = typer.Option(False, "--sliding-window", help="When the context is full, keep the newest half and go on instead of stopping."),
    attention_sink: int = typer.Option(0, "--attention-sink", help="With --sliding-window: also keep the first N tokens "
                                       "(the system prompt's start: the attention sink every later token attends to; "
                                       "llama.cpp's --keep) when the window slides."),
    prompt_lookup: int = typer.Option(0, "--prompt-lookup", help="Speculative decoding by prompt lookup: each step drafts up to N tokens, "
                                      "those that followed the last --ngram tokens where they last occurred in the prompt or the answer, "
                                      "and checks them in one model call. The same text as greedy decoding, in fewer model calls when the "
                                      "answer repeats earlier text (summaries, code edits, quotes). Greedy only; --backend htp-sim; 0 = off."),
    ngram: int = typer.Option(3, "--ngram", help="With --prompt-lookup: the longest n-gram looked up (then shorter ones, down to 1)."),
    lora: str | None = typer.Option(None, "--lora", help="A bundle compiled with --lora: the adapter to apply, by its name "
                                    "(its folder's name at compile) or a PEFT adapter folder of the same modules and at most "
                                    "the rank the bundle was built for; no recompile. --backend htp-sim."),
    lora_scale: float = typer.Option(1.0, "--lora-scale", help="With --lora: the adapter's strength (1 = as trained, 0 = the base alone)."),
    quant: str = typer.Option("8da4w", "--quant", help="Weights of the CPU program built from a GGUF/HF model: 8da4w, 8da8w or fp32."),
    max_seq_len: int | None = typer.Option(None, "--max-seq-len", help="Context of the CPU program built from a GGUF/HF model "
                                              "(default 2048, or the model's own context if smaller)."),
    requantize_gguf: bool = typer.Option(False, "--requantize-gguf", help="Re-quantize a GGUF's Q4_0/Q4_1/Q8_0 weights to our own 4-bit instead of keeping its blocks as stored (the default, which computes what llama.cpp computes from the file)."),
    tokenizer: Path | None = typer.Option(None, "--tokenizer", help="Use this tokenizer (tokenizer.json, SentencePiece .model or .gguf) instead of the model's."),
    threads: int | None = typer.Option(None, "--threads", help="CPU threads (default: all cores)."),
    no_cache: bool = typer.Option(False, "--no-cache", help="Rebuild the CPU program instead of reusing the cached one."),
    json_out: bool = typer.Option(False, "--json", help="Print the text and stats as JSON (no streaming)."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Print only the generated text (no stats)."),
    image: list[Path] | None = typer.Option(None, "--image", help="A vision-language bundle (compiled from a SmolVLM / Idefics3 folder): "
                                         "the image the prompt asks about (split into tiles or resized, and normalized, as the bundle's manifest says); "
                                         "repeat it for several images (placed at the prompt's <image> markers in order, or all first); "
                                         "greedy, --backend htp-sim, cpu (the bundle's QDQ graphs) or genie (Genie's pipeline)."),
    no_image_splitting: bool = typer.Option(False, "--no-image-splitting", help="With --image on a SmolVLM bundle that splits "
                                            "images into tiles: one tile (the whole image resized) per image, fewer prompt tokens."),
) -> None:
    """Generate text: tokenizer, prefill, decode with a KV cache, sampling, stop conditions.

    Tokens stream as they come; at the end the stats llama.cpp prints: time to first token,
    prefill and decode tokens per second. A GGUF or HF model is first built into an ExecuTorch
    XNNPACK program (4-bit weights by default), cached by its content, so that happens once."""
    quiet_library_loggers()   # import-time chatter of libraries that has nothing to do with the user's run

    if raw and chat:
        raise InputError("--raw and --chat cannot go together (a conversation always uses the chat template)",
                         "drop --raw for a conversation, or drop --chat for one plain completion")
    if not chat and (prompt is None or not prompt.strip()):
        raise InputError("the prompt is empty" if prompt is not None else "no prompt given",
                         "pass --prompt TEXT, or --chat for a conversation")
    if prompt is not None and not prompt.strip():
        raise InputError("the prompt is empty", "pass some text with --prompt")
    _check_numbers(max_seq_len, threads, quant)
    if image and prompt_lookup:
        raise InputError("--prompt-lookup is not offered with --image", "drop --prompt-lookup")
    if image:
        return _generate_with_image(model, image, prompt, backend, max_new_tokens, raw, chat, json_out, quiet,
                                    False if no_image_splitting else None)
    if no_image_splitting:
        raise InputError("--no-image-splitting is for --image", "pass --image PHOTO, or drop --no-image-splitting")
    options = dict(max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
                   repetition_penalty=repetition_penalty, seed=seed, stop_strings=tuple(stop),
                   sliding_window=sliding_window, attention_sink=attention_sink, prompt_lookup=prompt_lookup, ngram=ngram)
    llm.GenerationConfig(**{k: options[k] for k in ("max_new_tokens", "stop_strings", "sliding_window", "attention_sink",
                                                    "prompt_lookup", "ngram")},
                         sampling=llm.SamplingConfig(temperature=temperature, top_k=top_k, top_p=top_p,
                                                     repetition_penalty=repetition_penalty, seed=seed))  # validate early
    if prompt_lookup and backend == "cpu":   # said before the CPU program is built (minutes the first time)
        raise no_prompt_lookup("cpu (ExecuTorch XNNPACK)")
    with progress("loading the model", enabled=not json_out and sys.stderr.isatty()) as bar:
        def stage(name: str) -> None:
            bar.update(description=f"building the CPU program (once per model): {name}")
        model_ = llm.load(model, backend=backend, quant=quant, max_seq_len=max_seq_len, gguf_blocks=not requantize_gguf,
                          tokenizer=tokenizer, lora=lora, lora_scale=lora_scale,
                          threads=threads, use_cache=not no_cache, progress=stage)
    info = model_.info
    if not json_out and not quiet:
        built = info.get("export") or {}
        program = ""
        if built:
            how = "cached" if info.get("cache_hit") else f"built in {built.get('export_seconds', '?')} s"
            weights = (built.get("weights") or {}).get("layout")
            program = f" ({info.get('quant')}{', ' + weights if weights else ''}, {how})"
        err_console.print(f"[dim]{backend}: {info.get('model')}{program}, context {model_.max_seq_len}, "
                          f"tokenizer {info['tokenizer']['kind']} {info['tokenizer']['vocab_size']:,}[/]",
                          highlight=False, soft_wrap=True)

    if not chat:
        templated = prompt_mode(model_, raw)
        if not json_out and not quiet:
            err_console.print(f"[dim]{PROMPT_MODE_NOTES[templated]}[/]", highlight=False, soft_wrap=True)
        with _PrefillProgress(backend, enabled=not json_out and sys.stderr.isatty()) as on_prefill:
            result = _run_one(model_, prompt, options, chat=templated, json_out=json_out, quiet=quiet, on_prefill=on_prefill)
        if not quiet and not json_out:
            _say_why_empty(result, templated, bool(model_.tokenizer.chat_template))
        if json_out:
            emit_json({**result.to_dict(), "chat_template": templated, "model": info})
        return

    session = model_.chat(system)
    turns = []
    # the first message from --prompt, then one per line from stdin (a prompt when it is a terminal)
    for text in _more_messages([prompt] if prompt is not None else [], sys.stdin.isatty()):
        if text == "/exit":
            break
        if text == "/reset":
            session.reset()
            continue
        if not text.strip():
            continue
        with _PrefillProgress(backend, enabled=not json_out and sys.stderr.isatty()) as on_prefill:
            stream = session.stream(text, **options, **({"on_prefill": on_prefill} if on_prefill else {}))
            result = _consume(stream, json_out=json_out, quiet=quiet, lookup=bool(prompt_lookup))
        turns.append({"user": text, **result.to_dict()})
    if json_out:
        emit_json({"turns": turns, "model": info})


def _generate_with_image(model, images: list[Path], prompt: str, backend: str, max_new_tokens: int, raw: bool, chat: bool,
                         json_out: bool, quiet: bool, image_splitting: bool | None) -> None:
    from ...backends.llm_qnn.vision_session import generate_with_image
    from ...llm.run.openers import source_kind  # deferred: it loads llm.run.tokenizers (jinja2, tokenizers, sentencepiece: ~50 ms) on every CLI start
    if chat:
        raise InputError("--image answers one prompt; --chat is not offered with it", "drop --chat")
    if source_kind(Path(model)) != "bundle":
        raise InputError(f"--image needs a compiled vision-language bundle; {model} is not a bundle",
                         "compile a VLM folder first (modelexport compile SMOLVLM_FOLDER -o BUNDLE), or this LLM with "
                         "your vision encoder (modelexport compile MODEL --vision-encoder enc.onnx --image-token TOKEN -o BUNDLE)")
    with _PrefillProgress(backend, enabled=not json_out and sys.stderr.isatty()) as on_prefill:
        res = generate_with_image(Path(model), list(images), prompt, backend=backend, max_new_tokens=max_new_tokens,
                                  raw=raw, image_splitting=image_splitting, on_prefill=on_prefill)
    if json_out:
        emit_json({k: v for k, v in res.items() if k != "first_logits"})
        return
    if not quiet:
        for note in res["notes"]:
            err_console.print(f"[dim]note: {note}[/]", highlight=False, soft_wrap=True)
    console.print(res["text"], highlight=False, markup=False, soft_wrap=True)


PROMPT_MODE_NOTES = {
    True: "prompt wrapped in the model's chat template (--raw for a plain completion)",
    False: "plain completion, no chat template",
}


def prompt_mode(model_, raw: bool) -> bool:
    """Whether a single prompt goes through the chat template: yes when the model has one, unless --raw."""
    return not raw and bool(model_.tokenizer.chat_template)


def _say_why_empty(result, templated: bool, has_template: bool) -> None:
    """An empty answer is the model's own end-of-sequence; say so and what else to try."""
    if result.text.strip() or result.stats.stop_reason != "eos":
        return
    if templated:
        hint = "try --raw to let it continue the text instead"
    elif has_template:
        hint = "this model has a chat template: drop --raw to ask it as a question"
    else:
        hint = "give a longer prompt for it to continue, or sample with --temperature 0.7"
    err_console.print(f"[yellow]the model ended its answer at once[/] (end-of-sequence after "
                      f"{result.stats.generated_tokens} token(s)): {hint}", highlight=False, soft_wrap=True)


def _check_numbers(max_seq_len: int | None, threads: int | None, quant: str) -> None:
    """Before the model is opened (minutes for a first build): the flags that cannot work."""
    at_least("--max-seq-len", max_seq_len, 2, "2048")
    at_least("--threads", threads, 1, "2")
    one_of("--quant", quant, QUANT_MODES)


def _more_messages(first: list[str], interactive: bool):
    yield from first
    while True:
        try:
            if interactive:
                line = console.input("[bold cyan]>>> [/]")
            else:
                line = sys.stdin.readline()
                if not line:
                    return
                line = line.rstrip("\n")
        except EOFError:
            return
        yield line


def _run_one(model_, prompt, options, *, chat, json_out, quiet, on_prefill=None):
    return _consume(model_.stream(prompt, chat=chat, on_prefill=on_prefill, **options), json_out=json_out, quiet=quiet,
                    lookup=bool(options["prompt_lookup"]))


# Backends whose prefill can take minutes (the simulator runs each chunk's graph): "prefill 32/480 tokens"
# while it runs; on a log a line at the start, at most one per PREFILL_LINE_S after, and one at the end.
PREFILL_PROGRESS_BACKENDS = frozenset({"htp-sim"})
PREFILL_LINE_S = 10.0


class _PrefillProgress:
    """The prompt's progress through the graphs, chunk by chunk (Generator.stream's `on_prefill`): a bar on
    a terminal, throttled stage lines on a log (cli.app.progress), gone before the first token prints."""

    def __init__(self, backend: str, enabled: bool):
        self.on = backend in PREFILL_PROGRESS_BACKENDS
        self.enabled = enabled
        self._cm = self._bar = None
        self._shown = 0.0

    def __enter__(self):
        return self if self.on else None

    def __call__(self, done: int, total: int) -> None:
        now = time.perf_counter()
        text = f"prefill {done}/{total} tokens"
        if self._bar is None:
            if done >= total:
                return
            self._cm = progress(text, enabled=self.enabled, total=total)
            self._bar, self._shown = self._cm.__enter__(), now
        elif done >= total or err_console.is_terminal or now - self._shown >= PREFILL_LINE_S:
            self._bar.update(description=text, completed=done)
            self._shown = now
        if done >= total:
            self.__exit__(None, None, None)

    def __exit__(self, *exc) -> None:
        cm, self._cm, self._bar = self._cm, None, None
        if cm is not None:
            cm.__exit__(None, None, None)


def _consume(stream, *, json_out: bool, quiet: bool, lookup: bool = False):
    if json_out:
        stream.text()
        return stream.result
    try:
        for piece in stream:
            console.out(piece, end="", highlight=False)
            console.file.flush()
    except (KeyboardInterrupt, Interrupted):   # Ctrl-C stops the generation, not the verb
        stream.close()
    result = stream.result or stream.close()
    console.out("")
    if not quiet:
        s = result.stats
        err_console.print(f"[dim]{s.summary()}[/]", highlight=False, soft_wrap=True)
        if lookup:
            err_console.print(f"[dim]{s.lookup_summary()}[/]", highlight=False, soft_wrap=True)
        if s.stop_reason == "context_full":
            err_console.print("[yellow]the context is full[/]: pass --sliding-window to go on, "
                              "or rebuild with a larger --max-seq-len", highlight=False)
    return result
