"""The generation loop every LLM backend shares: prefill, decode, sample, stop, stream, time.

A backend is a `DecoderSession`: a model together with its KV cache, fed token ids and giving
back the logits of the last one. Two kinds exist:

- `ExecuTorch` programs that keep the cache inside themselves (the CPU runtime, `cpu_runtime`);
- fixed-shape graphs that take the cache as inputs and return only the new entries: any callable
  of the `Forward` protocol below (the eager static decoder, a compiled QNN graph on the HTP
  simulator). `StaticGraphSession` drives those through `static_runner.StaticRunner`, which
  owns the one-time cache allocation, the in-place writes of the new entries, and positions and
  masks across arN prefill chunks and ar1 decode steps.

On top of a session this module does what does not depend on the backend: tokenizing, chunked
prefill within the context, the sampler, stopping on EOS / stop strings / max-new-tokens /
the context's end (or sliding the window when asked), streaming text as it becomes certain,
prompt lookup's drafts checked in one call (`decode_steps`), and llama.cpp-style stats (time to
first token, prefill and decode tokens per second).
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any, Callable, Iterator, Mapping, Protocol, Sequence, runtime_checkable

import torch

from ...core.errors import InputError
from .decode_steps import DraftingSession, LookupSteps, PlainSteps
from .generation_config import GenerationConfig, SamplingConfig, no_prompt_lookup
from .sampling import Sampler
from .tokenizers import Message, Tokenizer

STOP_REASONS = ("eos", "stop_string", "max_new_tokens", "context_full")


# --------------------------------------------------------------------------------------------
@runtime_checkable
class Forward(Protocol):
    """One fixed-shape decoder graph (arN): the inputs and outputs of `static_decoder`.

    `(input_ids int32 [1,N], position_ids int32 [1,N], attention_mask f32 [1,1,N,C],
    *past_keys [1,kv,hd,C-N], *past_values [1,kv,C-N,hd]) -> (logits [1,N,V], *new_keys
    [1,kv,hd,N], *new_values [1,kv,N,hd])`
    """

    def __call__(self, input_ids: torch.Tensor, position_ids: torch.Tensor, attention_mask: torch.Tensor,
                 *caches: torch.Tensor) -> Sequence[torch.Tensor]: ...


@runtime_checkable
class DecoderSession(Protocol):
    """A model plus its KV cache. `position` tokens are in the cache."""

    max_seq_len: int
    vocab_size: int
    position: int

    def reset(self) -> None: ...

    def rewind(self, position: int) -> None:
        """Forget everything from `position` on (entries there are overwritten later)."""

    def feed(self, token_ids: Sequence[int], on_chunk: Callable[[int, int], None] | None = None) -> torch.Tensor:
        """Run `token_ids` at `position` (in as many chunks as the backend needs); the logits
        of the last one, shape [vocab]. `on_chunk(done, total)`: before the first chunk and after each."""


class StaticGraphSession:
    """A `DecoderSession` over `Forward` graphs keyed by N (e.g. {32: ar32, 1: ar1})."""

    def __init__(self, graphs: Mapping[int, Forward], spec, max_seq_len: int, *, vocab_size: int | None = None, **kw):
        from .static_runner import StaticRunner

        self.runner = StaticRunner(dict(graphs), spec, max_seq_len, **kw)
        self.max_seq_len = max_seq_len
        self.vocab_size = vocab_size or getattr(spec, "vocab_size", None) or 0

    @classmethod
    def from_decoder(cls, decoder, n_tokens: Sequence[int] = (1,), **kw) -> "StaticGraphSession":
        """The eager `StaticDecoder` serves every N (pure torch, for checking and tests)."""
        from .static_runner import StaticRunner

        self = cls.__new__(cls)
        self.runner = StaticRunner.from_decoder(decoder, n_tokens, **kw)
        self.max_seq_len = self.runner.max_seq_len
        self.vocab_size = int(decoder.spec.vocab_size) if hasattr(decoder.spec, "vocab_size") else 0
        return self

    @property
    def position(self) -> int:
        return self.runner.past_len

    def reset(self) -> None:
        self.runner.reset()

    def rewind(self, position: int) -> None:
        if not 0 <= position <= self.runner.past_len:
            raise ValueError(f"cannot rewind to {position} from {self.runner.past_len}")
        self.runner.past_len = position  # later slots are masked out and overwritten

    def feed(self, token_ids: Sequence[int], on_chunk: Callable[[int, int], None] | None = None) -> torch.Tensor:
        return self.runner.feed(token_ids, on_chunk)[-1]

    def feed_all(self, token_ids: Sequence[int]) -> torch.Tensor:
        """The logits of every token, [len, vocab] (prompt lookup's check: `decode_steps`)."""
        return self.runner.feed(token_ids)

    def max_feed(self) -> int:
        """The largest graph whose chunk still fits after the cache's contents (0: none)."""
        return max((n for n in self.runner.n_tokens if self.runner.fits(n) is not None), default=0)


# --------------------------------------------------------------------------------------------
@dataclass
class GenerationStats:
    """What llama.cpp prints after a run, in seconds and tokens per second.

    prefill = the prompt's forward passes up to the first token's logits; the first token
    comes out of prefill, so decode counts the `generated_tokens - 1` later forward passes.
    """

    backend: str
    prompt_tokens: int
    prefill_tokens: int                 # prompt tokens actually run (fewer when a chat reuses its cache)
    generated_tokens: int
    time_to_first_token_s: float
    prefill_s: float
    prefill_tokens_per_s: float | None
    decode_s: float
    decode_tokens_per_s: float | None
    sampling_s: float
    total_s: float
    stop_reason: str
    seed: int
    context_shifts: int = 0
    target_steps: int = 0               # model calls after the prompt (one per token without prompt lookup)
    drafted_tokens: int = 0             # prompt lookup's drafts fed to those calls
    accepted_tokens: int = 0            # drafts the model agreed with (and that were emitted)
    tokens_per_step: float | None = None  # tokens those calls gave, per call: 1 + accepted drafts per step

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def summary(self) -> str:
        def rate(x):
            return f"{x:.1f} tok/s" if x else "-"
        reused = f", {self.prompt_tokens - self.prefill_tokens} reused from the cache" if self.prefill_tokens < self.prompt_tokens else ""
        return (f"prefill {self.prefill_tokens} tokens in {self.prefill_s * 1e3:.0f} ms ({rate(self.prefill_tokens_per_s)}"
                f"{reused}) | first token after {self.time_to_first_token_s * 1e3:.0f} ms | "
                f"decode {self.generated_tokens} tokens, {rate(self.decode_tokens_per_s)} | stop: {self.stop_reason}")

    def lookup_summary(self) -> str:
        """The prompt-lookup line: model calls, tokens per call, drafts fed and accepted."""
        per = f"{self.tokens_per_step:.2f}" if self.tokens_per_step else "-"
        return (f"prompt lookup: {self.target_steps} target steps, {per} tokens per step | "
                f"drafted {self.drafted_tokens}, accepted {self.accepted_tokens}")


@dataclass
class GenerationResult:
    text: str
    token_ids: list[int]
    prompt_ids: list[int]
    stats: GenerationStats

    def to_dict(self) -> dict[str, Any]:
        return {"text": self.text, "token_ids": self.token_ids, "prompt_tokens": len(self.prompt_ids),
                "stats": self.stats.to_dict()}


# --------------------------------------------------------------------------------------------
class TokenStream:
    """Iterate for text pieces as they come; `.result` holds the full result once exhausted.

    Breaking out of the loop early is allowed: call `.close()` (or leave a `with` block) and the
    result so far is finalized with stop reason "stopped".
    """

    def __init__(self, gen: Iterator[str], finish: Callable[[], GenerationResult]):
        self._gen = gen
        self._finish = finish
        self.result: GenerationResult | None = None

    def __iter__(self) -> "TokenStream":
        return self

    def __next__(self) -> str:
        try:
            return next(self._gen)
        except StopIteration:
            if self.result is None:
                self.result = self._finish()
            raise

    def close(self) -> GenerationResult:
        if self.result is None:
            self._gen.close()
            self.result = self._finish()
        return self.result

    def __enter__(self) -> "TokenStream":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def text(self) -> str:
        """Consume the stream; the whole text."""
        for _ in self:
            pass
        return self.result.text


class _StopMatcher:
    """Holds back text that might be the start of a stop string until it is known not to be."""

    def __init__(self, stops: Sequence[str]):
        self.stops = tuple(stops)
        self.pending = ""

    def feed(self, piece: str) -> tuple[str, bool]:
        """(text safe to emit now, whether a stop string was hit)."""
        if not self.stops:
            return piece, False
        self.pending += piece
        hits = [(self.pending.find(s), s) for s in self.stops if s in self.pending]
        if hits:
            at = min(i for i, _ in hits)
            out, self.pending = self.pending[:at], ""
            return out, True
        keep = 0
        for s in self.stops:  # the longest tail of pending that is a prefix of a stop string
            for n in range(min(len(s) - 1, len(self.pending)), 0, -1):
                if self.pending.endswith(s[:n]):
                    keep = max(keep, n)
                    break
        out = self.pending[:len(self.pending) - keep]
        self.pending = self.pending[len(self.pending) - keep:]
        return out, False

    def flush(self) -> str:
        out, self.pending = self.pending, ""
        return out


class Generator:
    """Generation over one `DecoderSession` with one tokenizer: `.generate`, `.stream`, `.chat()`."""

    def __init__(self, session: DecoderSession, tokenizer: Tokenizer, *, backend: str = "?",
                 extra_eos_ids: Sequence[int] = ()):
        self.session = session
        self.tokenizer = tokenizer
        self.backend = backend
        self.eos_ids = frozenset([*tokenizer.eos_ids, *extra_eos_ids])
        self.history: list[int] = []      # the token ids now in the session's cache, in order

    @property
    def max_seq_len(self) -> int:
        return self.session.max_seq_len

    # ---------------------------------------------------------------------------------------
    def encode_prompt(self, prompt: str | Sequence[Message], *, chat: bool = False) -> list[int]:
        if isinstance(prompt, str):
            if not prompt.strip():
                raise InputError("the prompt is empty", "pass some text with --prompt")
            if chat:
                return self.tokenizer.encode_chat([{"role": "user", "content": prompt}])
            return self.tokenizer.encode(prompt)
        if not prompt:
            raise InputError("the conversation is empty", "give at least one message")
        return self.tokenizer.encode_chat(prompt)

    def _check_fits(self, prompt_ids: Sequence[int], config: GenerationConfig) -> None:
        n, c = len(prompt_ids), self.max_seq_len
        if n == 0:
            raise InputError("the prompt encodes to no tokens", "pass some text with --prompt")
        if n >= c:
            raise InputError(f"the prompt is {n} tokens but the model's context holds {c} "
                             f"(and at least one more is needed to generate)",
                             "shorten the prompt, or rebuild the model with a larger --max-seq-len")

    def stream(self, prompt: str | Sequence[Message] | Sequence[int], config: GenerationConfig | None = None, *,
               chat: bool = False, reuse_cache: bool = False, on_prefill: Callable[[int, int], None] | None = None,
               **overrides: Any) -> TokenStream:
        """Generate, yielding text pieces as they are decoded. `prompt` is text, chat messages or
        token ids. With `reuse_cache`, the tokens already in the cache that the new prompt starts
        with are not run again (multi-turn chat). `on_prefill(done, total)`: the prompt's tokens run
        so far, before its first chunk and after each (a long prefill on the simulator takes minutes)."""
        config = _config_with(config, overrides)
        if isinstance(prompt, (list, tuple)) and prompt and isinstance(prompt[0], int):
            prompt_ids = [int(t) for t in prompt]
        else:
            prompt_ids = self.encode_prompt(prompt, chat=chat)
        self._check_fits(prompt_ids, config)
        if config.prompt_lookup and not isinstance(self.session, DraftingSession):
            raise no_prompt_lookup(self.backend)
        bad = [t for t in prompt_ids if not 0 <= t < self.session.vocab_size] if self.session.vocab_size else []
        if bad:
            raise InputError(f"token id {bad[0]} is outside the model's vocabulary ({self.session.vocab_size})",
                             "the tokenizer does not belong to this model")
        state: dict[str, Any] = {}
        return TokenStream(self._run(prompt_ids, config, reuse_cache, state, on_prefill),
                           lambda: self._finish(prompt_ids, state))

    def generate(self, prompt: str | Sequence[Message] | Sequence[int], config: GenerationConfig | None = None, *,
                 chat: bool = False, reuse_cache: bool = False, on_text: Callable[[str], None] | None = None,
                 **overrides: Any) -> GenerationResult:
        s = self.stream(prompt, config, chat=chat, reuse_cache=reuse_cache, **overrides)
        for piece in s:
            if on_text:
                on_text(piece)
        return s.result

    def chat(self, system: str | None = None) -> "ChatSession":
        return ChatSession(self, system)

    # ---------------------------------------------------------------------------------------
    def _prefill(self, ids: Sequence[int], reuse_cache: bool,
                 on_prefill: Callable[[int, int], None] | None = None) -> tuple[torch.Tensor, int]:
        """Logits after the prompt, and how many prompt tokens were actually run."""
        s = self.session
        keep = 0
        if reuse_cache and self.history:
            limit = min(len(self.history), len(ids) - 1, s.position)  # the last prompt token always runs
            while keep < limit and self.history[keep] == ids[keep]:
                keep += 1
        if keep:
            s.rewind(keep)
        else:
            s.reset()
        self.history = list(ids[:keep])
        logits = s.feed(ids[keep:], on_prefill) if on_prefill else s.feed(ids[keep:])
        self.history = list(ids)
        return logits, len(ids) - keep

    def _slide(self, sink: int = 0) -> torch.Tensor:
        """The context is full: keep the newest half of the tokens (`history`, ending with the token
        just sampled), after the first `sink` ones (the attention sink: StreamingLLM keeps them, the
        tokens every later one attends to most; llama.cpp's --keep), rebuild the cache from them at
        positions 0.. and return the logits after them."""
        keep = max(1, self.max_seq_len // 2)
        sink = min(sink, keep - 1)
        kept = self.history[:sink] + self.history[len(self.history) - (keep - sink):]
        self.session.reset()
        logits = self.session.feed(kept)
        self.history = list(kept)
        return logits

    def _run(self, prompt_ids: list[int], config: GenerationConfig, reuse_cache: bool, state: dict,
             on_prefill: Callable[[int, int], None] | None = None) -> Iterator[str]:
        sampler = Sampler(config.sampling)
        state.update(sampler_seed=sampler.seed, new=[], text=[], stop=None, shifts=0,
                     sample_s=0.0, prefill_run=0)
        t0 = time.perf_counter()
        state["t0"] = t0
        logits, state["prefill_run"] = self._prefill(prompt_ids, reuse_cache, on_prefill)
        state["t_prefill"] = time.perf_counter()
        context = list(prompt_ids)  # prompt + generated: what the repetition penalty and prompt lookup read
        penalty = config.sampling.repetition_penalty != 1.0
        steps = (LookupSteps(self, sampler, context, penalty, state, draft=config.prompt_lookup, ngram=config.ngram,
                             max_new_tokens=config.max_new_tokens) if config.prompt_lookup
                 else PlainSteps(self, sampler, context, penalty, state))
        decoder = self.tokenizer.stream_decoder(prompt_ids)
        stops = _StopMatcher(config.stop_strings)
        new: list[int] = state["new"]
        tok = steps.start(logits)
        try:
            while True:
                if not new:
                    state["t_first"] = time.perf_counter()
                new.append(tok)
                context.append(tok)
                state["t_last"] = time.perf_counter()
                if config.stop_on_eos and tok in self.eos_ids:
                    state["stop"] = "eos"
                    break
                piece, hit = stops.feed(decoder.push(tok))
                if piece:
                    state["text"].append(piece)
                    yield piece
                if hit:
                    state["stop"] = "stop_string"
                    break
                if len(new) >= config.max_new_tokens:
                    state["stop"] = "max_new_tokens"
                    break
                if steps.position >= self.max_seq_len:
                    if not config.sliding_window:
                        state["stop"] = "context_full"
                        break
                    self.history.append(tok)
                    tok = steps.start(self._slide(config.attention_sink))  # the slid window ends with `tok`
                    state["shifts"] += 1
                    continue
                tok = steps.advance()
        finally:
            steps.finish()   # a stream closed early stops here too
        tail = stops.feed(decoder.flush())[0] + stops.flush() if state["stop"] != "stop_string" else ""
        if tail:
            state["text"].append(tail)
            yield tail

    def _finish(self, prompt_ids: list[int], state: dict) -> GenerationResult:
        now = time.perf_counter()
        t0 = state.get("t0", now)
        t_prefill = state.get("t_prefill", now)
        t_first = state.get("t_first", t_prefill)
        t_last = state.get("t_last", t_first)
        new = state.get("new", [])
        run = state.get("prefill_run", 0)
        prefill_s = t_prefill - t0
        decode_s = max(t_last - t_first, 0.0)
        n_dec = max(len(new) - 1, 0)
        stop = state.get("stop") or "stopped"   # "stopped": the caller left the stream early
        steps = state.get("target_steps", 0)
        stats = GenerationStats(
            backend=self.backend, prompt_tokens=len(prompt_ids), prefill_tokens=run, generated_tokens=len(new),
            time_to_first_token_s=round(t_first - t0, 6), prefill_s=round(prefill_s, 6),
            prefill_tokens_per_s=round(run / prefill_s, 3) if prefill_s > 0 and run else None,
            decode_s=round(decode_s, 6), decode_tokens_per_s=round(n_dec / decode_s, 3) if decode_s > 0 and n_dec else None,
            sampling_s=round(state.get("sample_s", 0.0), 6), total_s=round(now - t0, 6), stop_reason=stop,
            seed=state.get("sampler_seed", 0), context_shifts=state.get("shifts", 0),
            target_steps=steps, drafted_tokens=state.get("drafted_tokens", 0),
            accepted_tokens=state.get("accepted_tokens", 0),
            tokens_per_step=round(state.get("decoded_tokens", 0) / steps, 3) if steps else None)
        return GenerationResult(text="".join(state.get("text", [])), token_ids=list(new), prompt_ids=list(prompt_ids),
                                stats=stats)


def _config_with(config: GenerationConfig | None, overrides: dict[str, Any]) -> GenerationConfig:
    config = config or GenerationConfig()
    if not overrides:
        return config
    samp = {k: overrides.pop(k) for k in list(overrides) if k in SamplingConfig.__dataclass_fields__}
    fields = {**{k: getattr(config, k) for k in GenerationConfig.__dataclass_fields__}, **overrides}
    if samp:
        fields["sampling"] = SamplingConfig(**{**config.sampling.to_dict(), **samp})
    unknown = set(fields) - set(GenerationConfig.__dataclass_fields__)
    if unknown:
        raise TypeError(f"unknown generation options: {sorted(unknown)}")
    if isinstance(fields.get("stop_strings"), str):
        fields["stop_strings"] = (fields["stop_strings"],)
    return GenerationConfig(**fields)


# --------------------------------------------------------------------------------------------
class ChatSession:
    """Multi-turn chat with the model's template. Each turn re-renders the whole conversation
    (as the template defines it) and runs only the tokens the cache does not hold yet."""

    def __init__(self, generator: Generator, system: str | None = None):
        self.gen = generator
        self.messages: list[Message] = [{"role": "system", "content": system}] if system else []
        if not generator.tokenizer.chat_template:
            raise InputError("this model has no chat template", "use generate without --chat")

    def stream(self, user_text: str, config: GenerationConfig | None = None, **overrides: Any) -> TokenStream:
        if not user_text.strip():
            raise InputError("the message is empty")
        msgs = [*self.messages, {"role": "user", "content": user_text}]
        ids = self.gen.tokenizer.encode_chat(msgs)
        room = self.gen.max_seq_len - _reply_room(self.gen.max_seq_len)
        while len(ids) > room:  # forget the oldest turns (never the system message) until it fits
            first = 1 if msgs and msgs[0]["role"] == "system" else 0
            if len(msgs) - first <= 1:
                break  # only the new message is left: let stream() say it is too long
            msgs = msgs[:first] + msgs[first + 2:] if len(msgs) - first > 2 else msgs[:first] + msgs[-1:]
            ids = self.gen.tokenizer.encode_chat(msgs)
        inner = self.gen.stream(ids, config, reuse_cache=True, **overrides)

        def pieces() -> Iterator[str]:
            yield from inner
            self.messages = [*msgs, {"role": "assistant", "content": inner.result.text}]

        return TokenStream(pieces(), lambda: inner.close())

    def reset(self) -> None:
        self.messages = [m for m in self.messages if m["role"] == "system"]

    def send(self, user_text: str, config: GenerationConfig | None = None, **overrides: Any) -> GenerationResult:
        s = self.stream(user_text, config, **overrides)
        for _ in s:
            pass
        return s.result


def _reply_room(max_seq_len: int) -> int:
    """Positions a chat keeps free for the reply when it has to drop old turns."""
    return min(256, max_seq_len // 4)
