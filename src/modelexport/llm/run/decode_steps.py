"""Where the generation loop's next token comes from: one model call per token (`PlainSteps`), or
prompt lookup (`LookupSteps`), which drafts tokens by copying earlier text and checks them all in
one call.

Prompt lookup (the "ngram" speculator of vLLM and ONNX Runtime GenAI, `prompt_lookup_num_tokens` in
transformers): before a step, the last `ngram` tokens of prompt + generated text are looked up in
the earlier text (the longest n first, down to 1); the up to N tokens that followed their most
recent earlier occurrence are the draft. The step feeds [current token] + draft to the model in one
call (an arN graph takes up to N tokens at once); the model's greedy choice at each fed position is
compared with the next draft token, the agreeing prefix is kept, plus the model's own token after
it, and the session is rewound so that its cache holds exactly the kept tokens. Every kept token is
the one greedy decoding picks at its position, so the text is that of plain greedy decoding, in
fewer model calls when the text repeats what came before (summaries, edits of given code, answers
quoting a passage).

The loop (`generate.Generator._run`) stays the same for both: `start(logits)` gives the first token
after a prefill, `advance()` the next one, `finish()` is called once it stops on the current token,
and `position` is where the current token goes in the cache. Stopping (EOS, stop strings,
max-new-tokens, the context's end) is decided by the loop token by token, so tokens a step accepted
past the stop are never emitted, and `finish` drops them from the cache.
"""
from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import torch


@runtime_checkable
class DraftingSession(Protocol):
    """A `DecoderSession` that can check drafts: the logits of every token of one call."""

    position: int

    def feed_all(self, token_ids: Sequence[int]) -> torch.Tensor:
        """Run `token_ids` at `position` in one model call; the logits of each, [len, vocab]."""

    def max_feed(self) -> int:
        """The most tokens one model call takes at the current position (0: the context is full)."""


def propose(tokens: Sequence[int], ngram: int, draft: int) -> list[int]:
    """The up to `draft` tokens that followed the most recent earlier occurrence of the last n
    tokens of `tokens`, for n = `ngram` down to 1 (the longest that occurred wins); [] if none did.
    An occurrence so recent that fewer than `draft` tokens follow it (a run repeating itself)
    gives way to the most recent one that has them, if any."""
    size = len(tokens)
    if draft < 1:
        return []
    for n in range(min(ngram, size - 1), 0, -1):
        tail = list(tokens[size - n:])
        last = tail[-1]
        found = -1
        for end in range(size - 2, n - 2, -1):     # end: the last index of an earlier occurrence
            if tokens[end] == last and list(tokens[end - n + 1:end + 1]) == tail:
                found = end
                if size - 1 - end >= draft:
                    break
        if found >= 0:
            return list(tokens[found + 1:found + 1 + draft])
    return []


class PlainSteps:
    """One model call per token: the current token is fed, the sampler picks the next."""

    def __init__(self, generator, sampler, context: list[int], penalty: bool, state: dict[str, Any]):
        self.gen = generator           # its `session` and `history` (the token ids in the cache)
        self.session = generator.session
        self.sampler = sampler
        self.context = context         # prompt + emitted tokens, the current one last
        self.penalty = penalty         # the sampler reads the context (repetition penalty)
        self.state = state
        self.tok = -1
        for k in ("target_steps", "decoded_tokens", "drafted_tokens", "accepted_tokens"):
            state.setdefault(k, 0)

    @property
    def position(self) -> int:
        return self.session.position

    def _sample(self, logits: torch.Tensor, extra: Sequence[int] = ()) -> int:
        ts = time.perf_counter()
        tok = self.sampler(logits, [*self.context, *extra] if self.penalty else ())
        self.state["sample_s"] += time.perf_counter() - ts
        return tok

    def start(self, logits: torch.Tensor) -> int:
        self.tok = self._sample(logits)
        return self.tok

    def advance(self) -> int:
        logits = self.session.feed([self.tok])
        self.gen.history.append(self.tok)
        self.state["target_steps"] += 1
        self.state["decoded_tokens"] += 1
        return self.start(logits)

    def finish(self) -> None:
        pass


class LookupSteps(PlainSteps):
    """Prompt lookup: up to `draft` tokens copied from earlier text, checked in one call."""

    def __init__(self, generator, sampler, context: list[int], penalty: bool, state: dict[str, Any], *,
                 draft: int, ngram: int, max_new_tokens: int):
        super().__init__(generator, sampler, context, penalty, state)
        self.draft = draft
        self.ngram = ngram
        self.max_new_tokens = max_new_tokens
        self.queue: list[int] = []     # kept tokens still to hand out after the current one
        self.ahead = 0                 # cache entries from the current token on (kept drafts not yet emitted)

    @property
    def position(self) -> int:
        return self.session.position - self.ahead

    def start(self, logits: torch.Tensor) -> int:
        self.queue, self.ahead = [], 0
        return super().start(logits)

    def _budget(self) -> int:
        """Drafts worth checking now: within one call, and no more than the tokens still allowed."""
        left = self.max_new_tokens - len(self.state["new"])   # tokens the loop may still emit
        return min(self.draft, self.session.max_feed() - 1, left - 1)

    def advance(self) -> int:
        if self.queue:
            self.tok = self.queue.pop(0)
            self.ahead -= 1
        else:
            drafts = propose(self.context, self.ngram, self._budget())
            if not drafts:
                return super().advance()
            self._check(drafts)
        self.state["decoded_tokens"] += 1
        if self.ahead:                 # the current token is a draft the model agreed with
            self.state["accepted_tokens"] += 1
        return self.tok

    def _check(self, drafts: list[int]) -> None:
        """One call on [current] + drafts; keep the agreeing prefix and the model's token after it."""
        fed = [self.tok, *drafts]
        logits = self.session.feed_all(fed)
        self.state["target_steps"] += 1
        self.state["drafted_tokens"] += len(drafts)
        kept = 0
        while True:
            choice = self._sample(logits[kept], drafts[:kept])
            if kept < len(drafts) and choice == drafts[kept]:
                kept += 1
                continue
            break
        self.session.rewind(self.session.position - (len(drafts) - kept))   # cache: current + kept drafts
        self.gen.history.extend(fed[:1 + kept])
        out = [*drafts[:kept], choice]
        self.tok, self.queue, self.ahead = out[0], out[1:], kept

    def finish(self) -> None:
        """The loop stopped on the current token: the cache keeps what comes before it, as in plain decoding."""
        if self.ahead:
            self.session.rewind(self.session.position - self.ahead)
            del self.gen.history[-self.ahead:]
            self.queue, self.ahead = [], 0
