"""Choosing the next token from the logits: greedy, temperature, top-k, top-p, repetition penalty.

The order is transformers' (`generate` with its default processors): repetition penalty on the
raw logits, then temperature, then top-k, then top-p, then a draw from the softmax. Temperature
0 means greedy (argmax after the penalty). Draws come from a seeded `torch.Generator`, so the
same seed, prompt and model give the same text.

The sampler runs between two forward passes, so it must not start ATen's OpenMP threads: on a
small CPU they keep spinning and take the cores the next forward's own thread pool (XNNPACK)
needs (see `cpu_runtime`). Greedy picks with numpy; everything else runs with torch limited
to one thread (the work is a few vocab-sized vectors: microseconds either way).
"""
from __future__ import annotations

import random
from contextlib import contextmanager
from typing import Sequence

import torch

from .generation_config import SamplingConfig


def apply_repetition_penalty(logits: torch.Tensor, history: Sequence[int], penalty: float) -> torch.Tensor:
    """transformers' rule: a seen token's logit is divided by `penalty` if positive, multiplied if not."""
    if penalty == 1.0 or not len(history):
        return logits
    idx = torch.as_tensor(sorted(set(int(t) for t in history)), dtype=torch.long)
    seen = logits.index_select(0, idx)
    logits = logits.clone()
    logits.index_copy_(0, idx, torch.where(seen > 0, seen / penalty, seen * penalty))
    return logits


def filter_top_k(logits: torch.Tensor, k: int) -> torch.Tensor:
    """Keep the k largest logits (ties at the k-th value are kept, as in transformers)."""
    if k <= 0 or k >= logits.numel():
        return logits
    kth = torch.topk(logits, k).values[-1]
    return logits.masked_fill(logits < kth, float("-inf"))


def filter_top_p(logits: torch.Tensor, p: float) -> torch.Tensor:
    """Keep the smallest set of most likely tokens whose probabilities add up to at least p."""
    if p >= 1.0:
        return logits
    sorted_logits, order = torch.sort(logits, descending=True)
    probs = torch.softmax(sorted_logits, dim=-1)
    before = torch.cumsum(probs, dim=-1) - probs       # mass strictly above each token
    drop_sorted = before >= p                          # the first token always stays
    drop = torch.zeros_like(drop_sorted).scatter(0, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))


@contextmanager
def torch_single_threaded():
    """torch ops inside run on the calling thread only (ATen's pool stays asleep)."""
    n = torch.get_num_threads()
    if n == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)


def argmax(logits: torch.Tensor) -> int:
    """The first index of the largest logit (NaN counts as largest, as in torch.argmax)."""
    if logits.dtype in (torch.float32, torch.float64, torch.float16) and logits.device.type == "cpu":
        return int(logits.detach().numpy().argmax())   # flat index, as argmax of reshape(-1)
    with torch_single_threaded():
        return int(torch.argmax(logits.detach().reshape(-1)))


class Sampler:
    """`sampler(logits, history) -> token id`; `distribution(...)` gives the probabilities it draws from."""

    def __init__(self, config: SamplingConfig | None = None):
        self.config = config or SamplingConfig()
        self.seed = self.config.seed if self.config.seed is not None else random.SystemRandom().randrange(2**63)
        self.generator = torch.Generator().manual_seed(self.seed)

    def reseed(self, seed: int) -> None:
        self.seed = seed
        self.generator.manual_seed(seed)

    def processed_logits(self, logits: torch.Tensor, history: Sequence[int] = ()) -> torch.Tensor:
        c = self.config
        x = logits.detach().reshape(-1).float()
        x = apply_repetition_penalty(x, history, c.repetition_penalty)
        if c.greedy:
            return x
        x = x / c.temperature
        x = filter_top_k(x, c.top_k)
        return filter_top_p(x, c.top_p)

    def distribution(self, logits: torch.Tensor, history: Sequence[int] = ()) -> torch.Tensor:
        """The probabilities of the next token (one-hot for greedy)."""
        x = self.processed_logits(logits, history)
        if self.config.greedy:
            return torch.nn.functional.one_hot(torch.argmax(x), x.numel()).float()
        return torch.softmax(x, dim=-1)

    def __call__(self, logits: torch.Tensor, history: Sequence[int] = ()) -> int:
        c = self.config
        if c.greedy and (c.repetition_penalty == 1.0 or not len(history)):
            return argmax(logits)
        with torch_single_threaded():
            x = self.processed_logits(logits, history)
            if c.greedy:
                return int(torch.argmax(x))
            return int(torch.multinomial(torch.softmax(x, dim=-1), 1, generator=self.generator))
