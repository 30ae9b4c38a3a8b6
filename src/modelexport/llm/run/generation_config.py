"""What a generation asks for (length, sampling, stops): plain data, checked when built.

Kept apart from the loop and the sampler, which import torch (seconds), so a command can refuse
a bad flag before it loads anything."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

from ...core.errors import InputError


@dataclass(frozen=True)
class SamplingConfig:
    temperature: float = 0.0           # 0: greedy
    top_k: int = 0                     # 0: off
    top_p: float = 1.0                 # 1: off
    repetition_penalty: float = 1.0    # 1: off; > 1 discourages tokens already in the context
    seed: int | None = None            # None: a fresh random seed (reported in the stats)

    def __post_init__(self):
        if not (0.0 <= self.temperature < float("inf")):
            raise InputError(f"--temperature must be a finite number >= 0, got {self.temperature}", "0 means greedy decoding")
        if self.top_k < 0:
            raise InputError(f"--top-k must be >= 0, got {self.top_k}", "0 turns top-k off")
        if not (0.0 < self.top_p <= 1.0):
            raise InputError(f"--top-p must be in (0, 1], got {self.top_p}", "1 turns top-p off")
        if not (0.0 < self.repetition_penalty < float("inf")):
            raise InputError(f"--repetition-penalty must be > 0, got {self.repetition_penalty}", "1 turns it off")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def to_dict(self) -> dict:
        return asdict(self)


MAX_PROMPT_LOOKUP = 64     # drafts per step: a step feeds 1 + N tokens to one arN graph
MAX_NGRAM = 16


@dataclass
class GenerationConfig:
    max_new_tokens: int = 256
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    stop_strings: tuple[str, ...] = ()
    stop_on_eos: bool = True
    sliding_window: bool = False       # when the context is full: keep the newest half and go on
    attention_sink: int = 0            # with sliding_window: also keep the first N tokens (StreamingLLM's sink)
    prompt_lookup: int = 0             # draft tokens per step copied from earlier text (prompt_lookup.py); 0: off
    ngram: int = 3                     # with prompt_lookup: the longest n-gram matched (then shorter, down to 1)

    def __post_init__(self):
        if self.max_new_tokens < 1:
            raise InputError(f"--max-new-tokens must be at least 1, got {self.max_new_tokens}", "e.g. --max-new-tokens 64")
        self.stop_strings = tuple(s for s in self.stop_strings if s)
        if not 0 <= self.prompt_lookup <= MAX_PROMPT_LOOKUP:
            raise InputError(f"--prompt-lookup must be 0 (off) to {MAX_PROMPT_LOOKUP} draft tokens, got {self.prompt_lookup}",
                             "e.g. --prompt-lookup 4")
        if not 1 <= self.ngram <= MAX_NGRAM:
            raise InputError(f"--ngram must be 1 to {MAX_NGRAM}, got {self.ngram}", "e.g. --ngram 3")
        if self.attention_sink < 0:
            raise InputError(f"--attention-sink must be 0 (off) or more tokens, got {self.attention_sink}",
                             "e.g. --attention-sink 4")
        if self.attention_sink and not self.sliding_window:
            raise InputError("--attention-sink keeps the first tokens when the window slides; --sliding-window is off",
                             "add --sliding-window, or leave --attention-sink out")
        if self.prompt_lookup and not self.sampling.greedy:
            raise InputError(f"--prompt-lookup checks drafts against greedy decoding; --temperature "
                             f"{self.sampling.temperature} samples",
                             "drop --temperature (greedy) to use --prompt-lookup, or drop --prompt-lookup to sample")


def no_prompt_lookup(backend: str) -> InputError:
    """The refusal of --prompt-lookup on a backend whose model calls give only the last token's logits."""
    return InputError(f"--prompt-lookup checks its drafts with the logits of every token of one model call; "
                      f"the {backend} backend gives only the last token's",
                      "run a compiled bundle with --backend htp-sim, or leave --prompt-lookup out")
