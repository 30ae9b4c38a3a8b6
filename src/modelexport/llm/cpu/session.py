"""The CPU runtime: an ExecuTorch XNNPACK `.pte` (KV cache inside the program) as a `DecoderSession`.

The program is run through ExecuTorch's Python bindings, one `forward(tokens, input_pos)` call
per prefill chunk or decode step; everything around it (sampling, stopping, streaming, stats)
is the shared loop in `generate`, the same for every backend and with every sampling option.

Why not ExecuTorch's C++ runner (`TextLLMRunner`) for the loop: `bench/llm_cpu_decode.py`
runs both on the same program. On SmolLM2-135M 8da4w, 2 cores, a decode step here is the C++
forward call (~7-9 ms; the bindings add ~0.16 ms of it) plus ~0.15 ms of Python (sampling
included); in the benchmark the runner decoded 4-16% faster on the same program (more than
these figures explain; not found why). Its interface does not fit the shared loop: a text prompt only (no
token ids, so no chat cache reuse or our chat templates), it always stops at EOS, samples with
temperature only (no top-k/top-p/repetition penalty/seed) and has no stop strings or sliding
window. A greedy/temperature-only fast path through it is possible but would give a second,
differently-tokenized code path for a few percent; measure with the bench before adding it.

No multi-threaded ATen work between two forward calls: the bindings' default
`clone_outputs=True` copies the [1, vocab] logits with ATen, whose OpenMP pool runs the copy on
2 threads; those threads then spin on the cores XNNPACK's own pool needs for the next forward.
Back-to-back steps measured 32 ms with the clone vs 19-22 ms without on SmolLM2 (2 busy
cores); with the Python of the generation loop between steps the pool mostly sleeps again and
the difference is within noise, but nothing is gained by risking it. So `forward` runs with
`clone_outputs=False`, the logits are copied by numpy (single-threaded memcpy) and the sampler
avoids ATen's pool too (`sampling.Sampler`).

The KV cache lives in the program's mutable buffers and is written by `llama::update_cache`
at `input_pos`; `llama::custom_sdpa` attends over positions 0..input_pos+n-1 only, so
rewinding is just moving `position` back: stale entries beyond it are never read and are
overwritten by the next tokens.
"""
from __future__ import annotations

import importlib.util
import mmap
import os
import threading
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from ...core.errors import InputError, ToolchainError
from ...toolchain.library_notes import THREADPOOL_NOTES, quiet_native_notes
from .et_runtime import runtime
from .kernels import OPERATOR_NAMESPACE, load_native_kernels

_OPS_LOCK = threading.Lock()
_OPS_LOADED = False


def load_llm_ops() -> None:
    """Register the kernels an LLM `.pte` calls outside XNNPACK (custom SDPA, KV-cache update,
    quantized embedding). Without this the program fails with `Missing operator llama::...`."""
    global _OPS_LOADED
    with _OPS_LOCK:
        if _OPS_LOADED:
            return
        # The kernels live in two shared libraries that register themselves when loaded. Loading
        # them directly is what `executorch.extension.llm.custom_ops.custom_ops` and
        # `executorch.kernels.quantized` do at import, minus the export-time Python (which pulls
        # in torch._inductor: seconds of start-up a generate call does not need).

        import torch
        for package, pattern in (("executorch.extension.llm.custom_ops", "*custom_ops_aot_lib.*"),
                                 ("executorch.kernels.quantized", "*quantized_ops_aot_lib.*")):
            spec = importlib.util.find_spec(package)
            libs = sorted(p for d in (spec.submodule_search_locations or []) for p in Path(d).glob(pattern)) if spec else []
            if not libs:
                raise ToolchainError(f"ExecuTorch's LLM kernels are missing ({pattern} in {package})",
                                     "reinstall the pinned executorch wheel (make setup)")
            torch.ops.load_library(str(libs[0]))
        _OPS_LOADED = True


def load_native_kernels_if_possible() -> ToolchainError | None:
    """Our kernels (`native/`), which the programs we build call. A program from elsewhere needs
    none of them, so a missing compiler is only reported if the program then fails to load."""
    try:
        load_native_kernels()
    except ToolchainError as e:
        return e
    return None


def calls_native_kernels(pte: Path) -> bool:
    """Whether the program names one of our operators (the plan stores operator names as text)."""
    with open(pte, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        return m.find(OPERATOR_NAMESPACE.encode() + b"::") >= 0


def set_threads(n: int | None) -> int:
    """Threads of ExecuTorch's CPU thread pool (XNNPACK); None keeps the default (all cores).
    The pool is sized here, the first time, so its x86 chatter is filtered (THREADPOOL_NOTES)."""
    pl = runtime()
    with quiet_native_notes(THREADPOOL_NOTES):
        if n:
            pl._unsafe_reset_threadpool(int(n))
        return int(pl._threadpool_get_thread_count())


class ExecuTorchSession:
    """`DecoderSession` over an ExecuTorch LLM program (`forward(tokens [1,n], input_pos [1])`)."""

    def __init__(self, pte: str | Path, *, prefill_chunk: int | None = None, threads: int | None = None):
        pte = Path(pte)
        if not pte.is_file():
            raise InputError(f"ExecuTorch program not found: {pte}")
        load_llm_ops()
        native_error = load_native_kernels_if_possible()
        if native_error is not None and calls_native_kernels(pte):
            raise native_error    # else the program would fail at its first call, not here

        pl = runtime()
        try:
            self.module = pl._load_for_executorch(str(pte))
        except RuntimeError as e:
            raise InputError(f"{pte} is not a loadable ExecuTorch program ({e})") from None
        set_threads(threads)
        names = set(self.module.method_names())
        if "forward" not in names or "get_max_seq_len" not in names:
            raise InputError(f"{pte} is not an ExecuTorch LLM program (no forward/get_max_seq_len methods)",
                             "build it with `modelexport generate MODEL.gguf` or ExecuTorch's export_llm")
        self.path = pte
        self.meta = {n[4:] if n.startswith("get_") else n: self._const(n) for n in names if n != "forward"}
        self.max_seq_len = int(self.meta.get("max_context_len") or self.meta["max_seq_len"])
        self.vocab_size = int(self.meta.get("vocab_size") or 0)
        if not self.meta.get("use_kv_cache", True):
            raise InputError(f"{pte} has no KV cache; the CPU runtime needs one (export with use_kv_cache)")
        tokens_info = self.module.method_meta("forward").input_tensor_meta(0)
        self.max_chunk = int(tokens_info.sizes()[1])   # the dynamic dimension's upper bound
        self.prefill_chunk = min(prefill_chunk or self.max_chunk, self.max_chunk)
        self.position = 0
        self._pos = torch.zeros(1, dtype=torch.long)
        self._tok1 = torch.zeros(1, 1, dtype=torch.long)
        self._pos_np, self._tok1_np = self._pos.numpy(), self._tok1.numpy()

    def _const(self, name: str) -> Any:
        v = self.module.run_method(name, ())
        if isinstance(v, (list, tuple)):
            v = [x.item() if isinstance(x, torch.Tensor) else x for x in v]
            return v[0] if name != "get_eos_ids" and len(v) == 1 else v
        return v

    @property
    def eos_ids(self) -> list[int]:
        e = self.meta.get("eos_ids")
        return [int(i) for i in (e if isinstance(e, list) else [e])] if e is not None else []

    def reset(self) -> None:
        self.position = 0

    def rewind(self, position: int) -> None:
        if not 0 <= position <= self.position:
            raise ValueError(f"cannot rewind to {position} from {self.position}")
        self.position = position

    def _forward(self, ids: Sequence[int]) -> torch.Tensor:
        """Run `ids` at `position`; the last token's logits as a view of the program's output
        buffer, valid until the next call (no ATen copy: see the module docstring)."""
        if len(ids) == 1:   # written through numpy views: torch's __setitem__ costs ~20-50 us
            self._tok1_np[0, 0] = ids[0]
            tokens = self._tok1
        else:
            tokens = torch.tensor([list(ids)], dtype=torch.long)
        self._pos_np[0] = self.position
        out = self.module.run_method("forward", (tokens, self._pos), False)
        self.position += len(ids)
        return out[0]

    def feed(self, token_ids: Sequence[int], on_chunk: Callable[[int, int], None] | None = None) -> torch.Tensor:
        ids = list(token_ids)
        if not ids:
            raise InputError("nothing to feed: the token list is empty")
        if self.position + len(ids) > self.max_seq_len:
            raise InputError(f"{len(ids)} tokens do not fit after {self.position} of {self.max_seq_len} positions",
                             "use a shorter prompt, or rebuild with a larger --max-seq-len")
        logits = None
        if on_chunk is not None:
            on_chunk(0, len(ids))
        for i in range(0, len(ids), self.prefill_chunk):
            logits = self._forward(ids[i:i + self.prefill_chunk])
            if on_chunk is not None:
                on_chunk(min(i + self.prefill_chunk, len(ids)), len(ids))
        # a copy of our own (the output buffer is reused by the next call), made by numpy:
        # a single-threaded memcpy, where torch's clone would wake ATen's OpenMP pool
        return torch.from_numpy(logits.numpy().reshape(-1).copy())


def default_threads() -> int | None:
    v = os.environ.get("MODELEXPORT_THREADS")
    return int(v) if v else None
