"""The LLM bundle's graphs as the ExecuTorch program `qnn_llama_runner` runs (`--executorch-program`).

ExecuTorch's Qualcomm LLM runner (`examples/qualcomm/oss_scripts/llama/runner/`) loads methods
`kv_forward` (one token) and `prefill_forward` (hybrid mode: AR tokens) and the constant method
`get_n_layers`, reads AR and the context length from the mask's shape, and feeds each method
tokens int32 [1, AR], the attention mask [1, 1, AR, CL] (float: 0 attends, -65535 does not),
positions int32 [1, AR], every layer's K cache [1, kv_heads, head_dim, CL-AR], then every V cache
[1, kv_heads, CL-AR, head_dim]; it takes logits first, then each layer's new K, then each new V,
and copies those bytes into its caches as they are (`kv_manager.cpp`). The bundle's graphs already
have that layout, uint16 caches whose input and output share one encoding, and uint16 logits; so
the program is the bundle's own context binaries, each graph renamed to the method that runs it
(the QNN delegate executes the graph named as the method), reordered to the runner's inputs:
no second compile, the same weights and encodings as Genie's and ONNX Runtime's.

The weight-shared program is for the phone; the x86 simulator cannot load shared binaries, so the
check drives the host twin program (the same graphs unshared) the way the runner does and
compares it, step by step, with the bundle's own loop over the same twins.
"""
from __future__ import annotations

import contextlib
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ...contract.manifest import ExecutorchRunnerProgram
from ...core.errors import ModelExportError, ToolchainError, VerificationError, clip
from ...core.numerics import compare
from ...core.targets import get_target
from ...core.vocab import Role
from ...llm.run.tokenizers import load_tokenizer
from ...toolchain.native_io import capture_native_output
from ..executorch_qnn.inspect import read_pte
from ..executorch_qnn.specs import qnn_ready
from ...toolchain.qnn_context import read_context_binary
from ...toolchain.qnn_context.rename import rename_graphs

DECODE_METHOD, PREFILL_METHOD = "kv_forward", "prefill_forward"   # llm/model/pte_methods.py's, without its torch
# the runner's mask values by the mask's ExecuTorch dtype (kv_manager.cpp fill_mask): (open, closed)
MASK_VALUES = {6: (np.float32, (0.0, -65535.0)), 27: (np.uint16, (65535, 0)), 0: (np.uint8, (255, 0))}
CHECK_PROMPT = "The quick brown fox jumps over the lazy dog. Markets rose on Tuesday"
CHECK_NEW_TOKENS = 3      # prefill, then two kv_forward steps: both methods and the cache handed on
# Above this size the compile's check is one kv_forward step: on the x86 simulator a Llama-3.2-1B-shaped
# model's ar32 prefill_forward call takes about 4 minutes and an ar1 call 37 s (bench/results/llm_sizes.json).
FULL_CHECK_MAX_PARAMS = 300_000_000


# qnn_llama_runner's --decoder_model_version by the model's architecture (runner.cpp picks EOS tokens and
# the prompt format by it); a Llama-architecture model by its tokenizer's end-of-turn token.
RUNNER_VERSIONS = {"qwen2": "qwen2_5", "qwen3": "qwen3", "gemma": "gemma", "gemma2": "gemma2", "gemma3": "gemma3",
                   "gemma3_text": "gemma3", "phi3": "phi_4_mini", "smollm3": "smollm3", "granite": "granite",
                   "glm": "glm"}
LLAMA_BY_TOKEN = (("<|eot_id|>", "llama3"), ("<|im_end|>", "smollm2_135m"))
# the end tokens each version adds to the tokenizer's own (runner.cpp, Runner::load)
RUNNER_EOS = {"llama3": ("<|eot_id|>",), "phi_4_mini": ("<|end|>",), "qwen3": ("<|im_end|>",),
              "smollm2_135m": ("<|im_end|>",), "smollm3": ("<|im_end|>",), "gemma": ("<end_of_turn>",),
              "gemma2": ("<end_of_turn>",), "gemma3": ("<end_of_turn>",), "codegen": ("<|endoftext|>",),
              "glm": ("<|user|>",)}
ALWAYS_EOS = ("<|eot_id|>", "<|eot|>", "<|end_of_text|>")


def runner_version(architecture: str, tokenizer) -> str:
    if architecture in RUNNER_VERSIONS:
        return RUNNER_VERSIONS[architecture]
    return next((v for token, v in LLAMA_BY_TOKEN if tokenizer.token_to_id(token) is not None), "llama2")


def runner_eos(version: str, tokenizer) -> list[int]:
    """The ids qnn_llama_runner stops on for `version`: the tokenizer's EOS and the version's end tokens."""
    ids = [*tokenizer.eos_ids]
    for token in (*ALWAYS_EOS, *RUNNER_EOS.get(version, ())):
        i = tokenizer.token_to_id(token)
        if i is not None:
            ids.append(i)
    return sorted(set(ids))


def runner_command(pte: str, version: str, max_seq_len: int) -> str:
    return (f"qnn_llama_runner --model_path {pte.rsplit('/', 1)[-1]} --tokenizer_path tokenizer.json "
            f"--decoder_model_version {version} --eval_mode 1 --seq_len {max_seq_len} --prompt \"...\"")


def runner_inputs(n_layers: int) -> tuple[str, ...]:
    """The graphs' tensors in the order the runner passes them (names: llm/model/graph_io.py)."""
    return ("input_ids", "attention_mask", "position_ids", *(f"past_key_{i}_in" for i in range(n_layers)),
            *(f"past_value_{i}_in" for i in range(n_layers)))


def runner_outputs(n_layers: int) -> tuple[str, ...]:
    return ("logits", *(f"past_key_{i}_out" for i in range(n_layers)), *(f"past_value_{i}_out" for i in range(n_layers)))


def method_graphs(manifest, target: str) -> dict[str, list]:
    """{method: the target's graphs it chains, by part}: ar1 decodes, the largest arN prefills."""
    graphs = [g for g in manifest.graphs if g.target == target and g.n_tokens
              and (g.context_len or manifest.llm.max_seq_len) == manifest.llm.max_seq_len]
    ns = sorted({g.n_tokens for g in graphs if g.n_tokens != manifest.llm.max_seq_len})
    want = {DECODE_METHOD: 1} | ({PREFILL_METHOD: ns[-1]} if len(ns) > 1 else {})
    if ns[0] != 1:
        raise VerificationError("the bundle has no ar1 graph for kv_forward", "compile with --variants ar1,arN")
    return {m: sorted((g for g in graphs if g.n_tokens == n), key=lambda g: g.part_index) for m, n in want.items()}


def method_plans(bundle, target: str, twin: bool, scratch: Path):
    """{method: MethodPlan} over the bundle's binaries (the shared ones, or the host twins), each renamed
    into `scratch` (read again when the program takes it: a 1B model's binaries are held once)."""
    from ..executorch_qnn.from_binaries import BinaryCall, Io, MethodPlan   # deferred: torch, executorch
    by_method = method_graphs(bundle.manifest, target)
    n_layers = bundle.manifest.llm.spec.n_layers
    renamed = _renamed_binaries(bundle, by_method, twin, scratch)
    plans = {}
    for method, graphs in by_method.items():
        calls = []
        for g in graphs:
            blob = renamed[_source(g, twin)]
            info = next(i for i in read_context_binary(blob).graphs if i.name == method)
            io = lambda ts: tuple(Io(t.name, t.dtype, tuple(t.shape)) for t in ts)   # noqa: E731
            calls.append(BinaryCall(blob, io(info.inputs), io(info.outputs)))
        plans[method] = MethodPlan(runner_inputs(n_layers), runner_outputs(n_layers), tuple(calls))
    return plans


def _source(g, twin: bool) -> str:
    return g.host_twin.context_binary if twin else g.file


def _renamed_binaries(bundle, by_method: dict[str, list], twin: bool, scratch: Path) -> dict[str, Path]:
    """{binary file: a copy in `scratch` with each graph renamed to its method}."""
    names: dict[str, dict[str, str]] = {}
    for method, graphs in by_method.items():
        for g in graphs:
            old = g.host_twin.qnn_graph_name if twin else g.qnn_graph_name
            names.setdefault(_source(g, twin), {})[old] = method
    out = {}
    for i, (rel, ren) in enumerate(names.items()):
        out[rel] = scratch / f"{i}_{Path(rel).name}"
        out[rel].write_bytes(rename_graphs(bundle.file(rel).read_bytes(), ren))
    return out


def program_constants(manifest) -> dict:
    from ...llm.model.pte_methods import constant_methods   # deferred: torch (the static decoder's module)
    llm = manifest.llm
    spec = _decoder_spec(llm)
    prefill = max(n for n in llm.variants if n != llm.max_seq_len)
    consts = constant_methods(spec, llm.max_seq_len, prefill, llm.bos_id, llm.bos_id is not None, llm.eos_ids)
    return consts | {"get_kv_io_bit_width": 16}


def _decoder_spec(llm):
    from ...llm.model.graph_io import DecoderSpec   # deferred: torch
    s = llm.spec
    return DecoderSpec(s.n_layers, s.n_heads, s.n_kv_heads, s.head_dim, s.hidden_size, s.vocab_size, llm.max_seq_len)


def write_programs(bundle, target: str, place: Callable[[str, Role], Path], tokenizer: Path,
                   replay=None) -> ExecutorchRunnerProgram:
    """`<target>/executorch/<name>.pte` (weight-shared, the phone's) and its host twin, checked.
    `bundle`: the bundle's manifest and files (`.manifest`, `.file(rel)`); `place(rel, role)`: where to write;
    `replay`: the compile check's run on the target's twins (self_check.WindowRun), replayed by the check."""
    from ..executorch_qnn.from_binaries import build_program   # deferred: torch, executorch
    t0 = time.perf_counter()
    _check_masks(bundle.manifest, target)
    soc, consts = get_target(target), program_constants(bundle.manifest)
    rel = f"{target}/executorch/{bundle.manifest.llm.architecture}_{bundle.manifest.precision}.pte"
    twin_rel = f"{target}/host/executorch_twin.pte"
    sizes, paths = {}, {}
    with _quiet("building the ExecuTorch program"), tempfile.TemporaryDirectory(prefix="modelexport-pte-") as scratch:
        for path, twin in ((rel, False), (twin_rel, True)):
            paths[path] = place(path, Role.HOST_PTE if twin else Role.PTE)
            sizes[path] = build_program(method_plans(bundle, target, twin, Path(scratch)), soc, paths[path], consts)
    binaries = _check_shared(read_pte(paths[rel].read_bytes()), bundle.manifest.llm.n_parts)
    build_s = time.perf_counter() - t0
    tok = load_tokenizer(tokenizer)
    version = runner_version(bundle.manifest.llm.architecture, tok)
    eos = runner_eos(version, tok)
    with _quiet("running the ExecuTorch program's host twin"):
        check = RunnerCheck.run(bundle, paths[twin_rel], target, tok, eos, replay)
    return ExecutorchRunnerProgram(
        file=rel, host_twin=twin_rel, methods=sorted(program_methods(paths[twin_rel])), metadata=consts,
        bytes=sizes[rel], host_twin_bytes=sizes[twin_rel], binaries_stored=len(binaries),
        binary_bytes=sum(e["size"] for e in binaries), build_s=round(build_s, 2), decoder_model_version=version,
        eos_ids=eos, command=runner_command(rel, version, bundle.manifest.llm.max_seq_len), check=check.record())


def _check_masks(manifest, target: str) -> None:
    """A quantized mask input must read the runner's integers right: its largest value as 0 (attend),
    0 as a large negative (kv_manager.cpp writes 65535 / 0, or 255 / 0 at 8 bits)."""
    for graphs in method_graphs(manifest, target).values():
        for g in graphs:
            enc = next((t.encoding for t in g.inputs if t.name == "attention_mask"), None)
            if enc is not None and (enc.zero_point != 2 ** enc.bits - 1 or enc.scale * enc.zero_point < 100):
                raise VerificationError(f"{g.name}'s attention mask is encoded with scale {enc.scale:g}, zero point "
                                        f"{enc.zero_point}: qnn_llama_runner's {2 ** enc.bits - 1} (attend) and 0 "
                                        "(masked) would not read as 0 and a large negative",
                                        "report this: the mask's range should be [mask value, 0]")


@contextlib.contextmanager
def _quiet(doing: str):
    """ExecuTorch's and QNN's native chatter kept off the user's terminal; their words kept for an error."""
    with capture_native_output() as log:
        try:
            yield
        except ModelExportError:
            raise
        except Exception as e:
            tail = "\n".join(line for line in log[-20:] if line.strip())
            raise ToolchainError(f"{doing} failed: {clip(str(e), 400)}" + (f"\n{tail}" if tail else ""),
                                 "report this with the bundle's manifest.json") from None


def _check_shared(info: dict, n_parts: int) -> list[dict]:
    """The phone's program read back: one context binary per part, each holding a graph per decoder method
    over one copy of the weights."""
    binaries = list({e["segment"]: e for e in info["delegates"] if e.get("qnn")}.values())
    decoders = {m["name"] for m in info["methods"] if m["delegate_calls"].get("QnnBackend")}
    for e in binaries:
        graphs = e["qnn"]["context_binary"]["graphs"]
        names = {g["name"] for g in graphs}
        shared = {(g.get("htp") or {}).get("shared_weights_size") for g in graphs}
        if names != decoders or len(shared) != 1 or not shared.pop():
            raise VerificationError(f"a context binary of the program holds graphs {sorted(names)} (shared weights "
                                    f"{sorted(map(str, shared))}), expected {sorted(decoders)} over one copy",
                                    "report this: the program does not hold the bundle's shared binaries")
    if len(binaries) != n_parts:
        raise VerificationError(f"the program holds {len(binaries)} context binaries for {n_parts} parts",
                                "report this: each part's binary should be stored once")
    return binaries


def program_methods(pte: Path) -> list[str]:
    return [m["name"] for m in read_pte(pte.read_bytes(), read_binaries=False)["methods"]]


# ---------------------------------------------------------------------------------------------
# the runner's loop, in Python, on the host twin

@dataclass
class RunnerCheck:
    tokens: list[int]
    reference_tokens: list[int]
    steps: int
    worst_sqnr_db: float
    seconds: float
    scope: str

    def record(self) -> dict:
        return {"prompt": CHECK_PROMPT, "scope": self.scope, "tokens": self.tokens, "reference_tokens": self.reference_tokens,
                "same_tokens": self.tokens == self.reference_tokens, "steps": self.steps,
                "worst_logits_sqnr_db": round(self.worst_sqnr_db, 1), "seconds": round(self.seconds, 2),
                "how": "the host twin program through ExecuTorch's runtime, driven as qnn_llama_runner drives it "
                       "(its method order, mask values and raw uint16 caches), against the bundle's loop over the "
                       "same graphs (ONNX Runtime)"}

    @classmethod
    def run(cls, bundle, twin_pte: Path, target: str, tokenizer, eos: list[int], replay=None) -> RunnerCheck:
        """The twin program driven as the runner drives it. `replay`: the compile check's WindowRun on the
        same twins (self_check.py): its calls again, compared with its logits, no second ONNX Runtime run."""
        t0 = time.perf_counter()
        loop = RunnerLoop(twin_pte)
        full = (bundle.manifest.parameters or 0) <= FULL_CHECK_MAX_PARAMS
        if replay is not None and loop.can_replay(replay):
            return cls._replayed(bundle, loop, replay, target, full, t0)
        ids = tokenizer.encode(CHECK_PROMPT)[:bundle.manifest.llm.max_seq_len // 2]
        ids, n_new = (ids, CHECK_NEW_TOKENS) if full else (ids[:1], 1)
        scope = (f"hybrid mode: prefill_forward over {len(ids)} prompt tokens, kv_forward per new token" if full else
                 f"one kv_forward step (above {FULL_CHECK_MAX_PARAMS // 10**6} M parameters the simulator takes "
                 "minutes per call; bench/llm_runner_check.py runs a whole dialog)")
        ours = loop.generate(ids, n_new, eos, prefill=full)
        ref = _reference(bundle, target, ids, n_new, eos, prefill=full)
        return cls._judged(bundle, target, ours, ref.logits, ours.tokens, ref.tokens, scope, t0)

    @classmethod
    def _replayed(cls, bundle, loop: RunnerLoop, run, target: str, full: bool, t0: float) -> RunnerCheck:
        """The compile check's calls through the program: its prefill call then a kv_forward per token after
        it; above FULL_CHECK_MAX_PARAMS only the kv_forward steps, on the caches its prefill call left."""
        n = run.first_call_tokens
        rows = [run.logits[i:i + 1] for i in range(n, len(run.ids))]
        if full:
            ours, rows = loop.replay(run.ids, n), [run.logits[:n], *rows]
            scope = (f"the compile check's calls again: prefill_forward over {n} held-out tokens, then kv_forward "
                     f"on the {len(run.ids) - n} after, teacher-forced; logits against the check's")
        else:
            ours = loop.replay(run.ids, n, _raw_caches(bundle.manifest, target, run))
            scope = (f"kv_forward on the {len(run.ids) - n} token(s) after the compile check's prefill call, on the "
                     f"caches that call left (above {FULL_CHECK_MAX_PARAMS // 10**6} M parameters a prefill call "
                     "takes minutes on the simulator); logits against the check's")
        tokens = [int(t) for o in ours.logits for t in o.argmax(-1)]
        return cls._judged(bundle, target, ours, rows, tokens, [int(t) for r in rows for t in r.argmax(-1)], scope, t0)

    @classmethod
    def _judged(cls, bundle, target: str, ours: Trace, ref_logits: list, tokens: list[int], ref_tokens: list[int],
                scope: str, t0: float) -> RunnerCheck:
        scale = _logits_encodings(bundle.manifest, target)
        worst = min(compare(r, (o.astype(np.float64) - scale[m][1]) * scale[m][0])["sqnr_db"]
                    for r, o, m in zip(ref_logits, ours.logits, ours.methods))
        check = cls(tokens, ref_tokens, len(ours.logits), worst, time.perf_counter() - t0, scope)
        if check.tokens != check.reference_tokens:
            raise VerificationError(f"ExecuTorch's runtime on the program gave tokens {check.tokens}, the bundle's "
                                    f"graphs {check.reference_tokens}", "report this: the program does not run the "
                                    "bundle's graphs as they are")
        return check


@dataclass
class Trace:
    tokens: list[int]
    logits: list[np.ndarray]      # per call: the logits of its valid rows (as the graph gives them)
    methods: list[str] = field(default_factory=list)   # per call


class RunnerLoop:
    """qnn_llama_runner's hybrid loop over a program, reading everything from the program itself."""

    def __init__(self, pte: Path):
        import torch  # noqa: F401  (torch before ExecuTorch's Qualcomm modules: their op registrations crash otherwise)
        qnn_ready()
        from executorch.runtime import Runtime   # deferred: after qnn_ready()
        self.program = Runtime.get().load_program(str(pte))
        self.n_layers = int(self.program.load_method("get_n_layers").execute([])[0])
        # loaded when first called: each holds its binaries on the simulator (a 1B model's: 0.7 GB, 5-10 s)
        self.methods = [m for m in (PREFILL_METHOD, DECODE_METHOD) if m in self.program.method_names]
        self._loaded: dict[str, object] = {}
        meta = self.program.metadata(DECODE_METHOD)
        self.context_len = meta.input_tensor_meta(1).sizes()[3]
        k_meta = meta.input_tensor_meta(3)
        self.k_shape = tuple(k_meta.sizes()[:3])
        self.cache_dtype = np.uint16 if k_meta.nbytes() == 2 * int(np.prod(k_meta.sizes())) else np.uint8
        self.ar = {m: self.program.metadata(m).input_tensor_meta(1).sizes()[2] for m in self.methods}
        self.mask = {m: MASK_VALUES[self.program.metadata(m).input_tensor_meta(1).dtype()] for m in self.methods}
        for m in self.methods:
            _check_unplanned(m, self.program.metadata(m))

    def generate(self, ids: list[int], n_new: int, eos: list[int] = (), prefill: bool = True) -> Trace:
        """Greedy: prefill_forward over the prompt in chunks of its AR, then kv_forward per token, until
        `n_new` tokens or one of `eos`."""
        ks, vs = self.empty_caches()
        trace, past = Trace([], []), 0
        prefill = self.first_method if prefill else DECODE_METHOD
        for i in range(0, len(ids), self.ar[prefill]):
            rows = self._step(prefill, ids[i:i + self.ar[prefill]], past, ks, vs, trace)
            past += rows
        while len(trace.tokens) < n_new:
            tok = int(np.argmax(trace.logits[-1][-1]))
            trace.tokens.append(tok)
            if len(trace.tokens) < n_new and tok not in eos and past < self.context_len:
                past += self._step(DECODE_METHOD, [tok], past, ks, vs, trace)
            else:
                break
        return trace

    def empty_caches(self) -> tuple[list[np.ndarray], list[np.ndarray]]:
        store = self.context_len - min(self.ar.values())
        ks = [np.zeros((*self.k_shape, store), self.cache_dtype) for _ in range(self.n_layers)]
        vs = [np.zeros((self.k_shape[0], self.k_shape[1], store, self.k_shape[2]), self.cache_dtype)
              for _ in range(self.n_layers)]
        return ks, vs

    @property
    def first_method(self) -> str:
        """What takes a prompt: prefill_forward in hybrid mode, else kv_forward."""
        return PREFILL_METHOD if PREFILL_METHOD in self.methods else DECODE_METHOD

    def can_replay(self, run) -> bool:
        """Whether the program's methods make the calls `run` (a self_check.WindowRun) made: its first on
        the prefill graph (or the decode one, without prefill), the rest one token each, at the program's
        context length, its caches in the program's layout."""
        want = [f"ar{self.ar[self.first_method]}_cl{self.context_len}"]
        want += [f"ar{self.ar[DECODE_METHOD]}_cl{self.context_len}"] * (len(run.calls) - 1)
        ks, _ = self.empty_caches()
        return run.calls == want and [k.shape for k in ks] == [k.shape for k in run.k_after_first]

    def replay(self, ids: list[int], first: int, caches: tuple | None = None) -> Trace:
        """ids[:first] in one prefill call from empty caches (or, given the raw caches that call left, not
        run), then kv_forward on each token after it, teacher-forced."""
        trace = Trace([], [])
        if caches is None:
            ks, vs = self.empty_caches()
            self._step(self.first_method, ids[:first], 0, ks, vs, trace)
        else:
            ks, vs = caches
        for past, tok in enumerate(ids[first:], start=first):
            self._step(DECODE_METHOD, [tok], past, ks, vs, trace)
        return trace

    def _step(self, method: str, chunk: list[int], past: int, ks: list, vs: list, trace: Trace) -> int:
        import torch
        ar, n, cl = self.ar[method], len(chunk), self.context_len
        cache = cl - ar
        toks = np.zeros((1, ar), np.int32)
        toks[0, :n] = chunk
        dtype, (opened, closed) = self.mask[method]
        mask = np.full((1, 1, ar, cl), closed, dtype)
        mask[..., :past] = opened
        mask[0, 0, :, cache:] = np.where(np.tril(np.ones((ar, ar), bool)), opened, closed)
        pos = np.minimum(np.arange(past, past + ar, dtype=np.int32), cl - 1)[None]
        args = [toks, mask, pos, *(k[..., :cache] for k in ks), *(v[:, :, :cache] for v in vs)]
        if method not in self._loaded:
            self._loaded[method] = self.program.load_method(method)
        outs = self._loaded[method].execute([torch.from_numpy(np.ascontiguousarray(a)) for a in args])
        outs = [o.numpy() for o in outs]
        trace.logits.append(outs[0][0, :n])
        trace.methods.append(method)
        room = min(n, ks[0].shape[-1] - past)
        for i in range(self.n_layers):
            ks[i][..., past:past + room] = outs[1 + i][..., :room]
            vs[i][:, :, past:past + room] = outs[1 + self.n_layers + i][:, :, :room]
        return n


def _check_unplanned(method: str, meta) -> None:
    """qnn_llama_runner binds its own buffers to every input and output (`set_outputs`): ExecuTorch refuses
    that for a memory-planned one ("Output 0 is memory planned ... Cannot override")."""
    planned = [f"input {i}" for i in range(meta.num_inputs()) if meta.input_tensor_meta(i).is_memory_planned()]
    planned += [f"output {i}" for i in range(meta.num_outputs()) if meta.output_tensor_meta(i).is_memory_planned()]
    if planned:
        raise VerificationError(f"the program's {method} has memory-planned IO ({', '.join(planned[:4])}): "
                                "qnn_llama_runner cannot bind its buffers to them", "report this: the program was "
                                "built with graph IO planned")


def _raw_caches(manifest, target: str, run) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """The float caches the check's first call left, as the kv_forward method's raw integers (each layer's
    input encoding: they were dequantized from it, so this gives the same integers back)."""
    enc = {t.name: t.encoding for g in method_graphs(manifest, target)[DECODE_METHOD] for t in g.inputs if t.encoding}

    def raw(x: np.ndarray, name: str) -> np.ndarray:
        e = enc[name]
        top = 2 ** e.bits - 1
        return np.clip(np.round(x / e.scale) + e.zero_point, 0, top).astype(np.uint16 if e.bits > 8 else np.uint8)
    return ([raw(k, f"past_key_{i}_in") for i, k in enumerate(run.k_after_first)],
            [raw(v, f"past_value_{i}_in") for i, v in enumerate(run.v_after_first)])


def _logits_encodings(manifest, target: str) -> dict[str, tuple[float, int]]:
    """{method: (scale, zero point) of its logits}: the output of its last part."""
    out = {}
    for method, graphs in method_graphs(manifest, target).items():
        enc = next(t.encoding for t in graphs[-1].outputs if t.name == "logits")
        out[method] = (enc.scale, enc.zero_point)
    return out


def _reference(bundle, target: str, ids: list[int], n_new: int, eos: list[int] = (), prefill: bool = True) -> Trace:
    """The bundle's own loop over the host twins (ONNX Runtime), on the runner's schedule."""
    from .session import open_forwards   # deferred: onnxruntime
    from ...llm.run.static_runner import StaticRunner   # deferred: torch
    methods = method_graphs(bundle.manifest, target)
    n = methods[PREFILL_METHOD][0].n_tokens if prefill and PREFILL_METHOD in methods else 1
    graphs, spec, seq = open_forwards(bundle, "htp-sim", target=target, variants=sorted({1, n}))
    runner = StaticRunner(graphs, spec, seq)
    trace = Trace([], [])
    for i in range(0, len(ids), n):
        trace.logits.append(runner.run_chunk(ids[i:i + n], n).numpy())
    while len(trace.tokens) < n_new:
        trace.tokens.append(int(np.argmax(trace.logits[-1][-1])))
        if len(trace.tokens) == n_new or trace.tokens[-1] in eos or runner.past_len >= seq:
            break
        trace.logits.append(runner.run_chunk([trace.tokens[-1]], 1).numpy())
    return trace
