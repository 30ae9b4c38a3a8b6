"""Genie's own dialog on this host: `GenieDialog_create` and `GenieDialog_tokenQuery` (a decoder
taking embeddings: `GenieDialog_embeddingTokenQuery`) of the
`libGenie.so` in the onnxruntime-qnn wheel, run against a bundle's host twins on the x86 HTP
simulator.

The simulator cannot load weight-shared binaries, so the dialog is given the unshared twins built
from the same QDQ graphs (same I/O names, shapes and encodings; Genie's model validation reads
exactly those). What Genie checks when it creates a dialog: every graph's I/O names against its
conventions (`input_ids`, `position_ids`, `attention_mask`, `logits`, the `past_` cache group's
`past_key_<i>_in` / `_out`), the KV encodings (one per cache tensor across all graphs and between a
layer's input and output), the variants' cache lengths (CL - N) and the context size. A query then
runs Genie's own loop: its prefill / decode variant switching, its smart-mask attention mask, its
KV-cache updates and its sampler.

The library calls themselves (a child process per dialog) are in toolchain/genie.py.
"""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any, Callable

from ...core.errors import InputError, VerificationError
from ...toolchain.genie import genie_messages, run_dialog
from .genie import lora_block, lora_files
from ...toolchain.native_io import native_stdout_to_stderr
from ...toolchain.qnn_context import read_context_binary
from ...toolchain.simulator_memory import binary_bytes, fits_on_simulator, simulator_limit_note, variants_that_fit

def host_config(cfg: dict[str, Any], config_dir: Path, twins: list[Path],
                sampler: dict[str, Any] | None = None) -> dict[str, Any]:
    """A Genie config (as written in a bundle, in `config_dir`) pointed at the host twins `twins`
    (one per graph, parts in order) with the tokenizer found from anywhere; `sampler` replaces its
    sampler block."""
    cfg = json.loads(json.dumps(cfg))
    cfg["dialog"]["engine"]["model"]["binary"]["ctx-bins"] = [str(Path(p).resolve()) for p in twins]
    tok = cfg["dialog"]["tokenizer"]
    tok["path"] = str((config_dir / tok["path"]).resolve())
    lut = cfg["dialog"].get("embedding", {})
    if "lut-path" in lut:
        lut["lut-path"] = str((config_dir / lut["lut-path"]).resolve())
    for adapter in cfg["dialog"]["engine"]["model"]["binary"].get("lora", {}).get("adapters", []):
        adapter["path"] = str((config_dir / adapter["path"]).resolve())
    # a phone's settings busy-poll on 3 big cores; here the simulator needs the host's cores
    engine = cfg["dialog"]["engine"]
    engine["n-threads"] = 1
    engine["backend"]["QnnHtp"].update({"poll": False, "cpu-mask": hex((1 << (os.cpu_count() or 1)) - 1)})
    if sampler is not None:
        cfg["dialog"]["sampler"] = {"version": 1, **sampler}
    return cfg


def bundle_config(bundle, target: str, sampler: dict[str, Any] | None = None) -> dict[str, Any]:
    """`host_config` of a sealed bundle's Genie config for `target`."""
    m = bundle.manifest
    entry = m.llm.genie.get(target) if m.llm else None
    if entry is None:
        raise InputError(f"the bundle has no Genie config for {target}",
                         f"use one of its targets: {', '.join(m.llm.genie) if m.llm else 'none (not an LLM bundle)'}")
    twins = sorted(((g.part_index or 1, g.name, g.n_tokens, bundle.file(g.host_twin.context_binary)) for g in m.graphs
                    if g.target == target and g.host_twin is not None
                    and g.n_tokens != m.llm.max_seq_len))   # not the full-context graph: Genie runs arN graphs
    if not twins:
        raise InputError(f"the bundle has no host twins for {target}", "compile the LLM again with this version")
    path = bundle.file(entry.file)
    by_variant: dict[int, list[Path]] = {}
    for t in twins:
        by_variant.setdefault(t[2], []).append(t[3])
    keep = set(variants_that_fit(by_variant))   # Genie prefills and decodes with what it is given
    return host_config(json.loads(path.read_text()), path.parent, [t[3] for t in twins if t[2] in keep], sampler)


def sampler_block(temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0, seed: int | None = None) -> dict:
    """Our sampling flags as Genie's sampler: temperature 0 is greedy (top-k 1: Genie's `greedy`
    flag alone still samples, measured)."""
    if temperature <= 0:
        return {"greedy": True, "top-k": 1, "temp": 1.0, "top-p": 1.0, "seed": int(seed or 0)}
    return {"temp": float(temperature), "top-k": int(top_k) if top_k else 0, "top-p": float(top_p),
            "seed": int(seed or 0)}


# Graph inputs a Genie dialog does not feed, and why: a dialog it refuses for them ("Could not find I/O
# tensors") is a known limit recorded in dialog_note, not a failed build.
GENIE_UNFED_INPUTS = {
    "rope_position_ids": "the decoder takes M-RoPE positions (rope_position_ids, llm/model/mrope.py), which a Genie dialog "
                         "does not feed: Genie's own M-RoPE option (positional-encoding rope with rope-scaling rope-type "
                         "qwen2vl-mrope, mrope-section, spatial-merge-size) computes the angles itself and feeds graphs "
                         "taking position_ids_cos / position_ids_sin (not built here); run it with --backend htp-sim",
}


def check_dialogs(cfg: dict[str, Any], config_dir: Path, twins: list[tuple[int, Path]],
                  lora: str | None = None) -> dict[str, Any]:
    """The build's Genie check on the host twins (tokens per call, binary; parts in order): one
    dialog over all of them, or, when they exceed what the simulator holds in one process, one
    dialog per variant; `lora`: the adapter applied in it. What that leaves unchecked is said in
    `dialog_note`; so is a refusal for inputs Genie does not feed (GENIE_UNFED_INPUTS)."""
    try:
        return _check_dialogs(cfg, config_dir, twins, lora)
    except VerificationError:
        note = _unfed_inputs_note(twins[0][1]) if twins else None   # the first part takes the positions
        if note is None:
            raise
        return {"dialog_created": False, "dialog_note": note}


def _unfed_inputs_note(twin: Path) -> str | None:
    """Why Genie cannot feed this binary's graphs, when one of their inputs is in GENIE_UNFED_INPUTS."""
    with native_stdout_to_stderr():
        names = {t.name for g in read_context_binary(twin).graphs for t in g.inputs}
    return next((why for name, why in GENIE_UNFED_INPUTS.items() if name in names), None)


def _check_dialogs(cfg: dict[str, Any], config_dir: Path, twins: list[tuple[int, Path]],
                   lora: str | None = None) -> dict[str, Any]:
    every = [p for _, p in twins]
    if fits_on_simulator(every):
        return check_dialog(host_config(cfg, config_dir, every), lora)
    checked, unchecked = [], []
    for n in sorted({n for n, _ in twins}):
        alone = [p for m, p in twins if m == n]
        if fits_on_simulator(alone):
            check_dialog(host_config(cfg, config_dir, alone), lora)
            checked.append(f"ar{n}")
        else:
            unchecked.append(f"ar{n}")
    limit = simulator_limit_note(binary_bytes(every))
    if unchecked:
        return {"dialog_created": False, "dialog_note": f"{limit}; Genie checked {', '.join(checked) or 'no variant'}, "
                f"not {', '.join(unchecked)} (too large alone)"}
    return {"dialog_created": True,
            "dialog_checked_on": f"host twins (x86 HTP simulator), one variant at a time ({', '.join(checked)})",
            "dialog_note": f"{limit}: each variant got its own dialog, so Genie did not see them side by side "
                           "(their KV encodings against each other, its switching between them)"}


def check_dialog(config: dict[str, Any], lora: str | None = None) -> dict[str, Any]:
    """GenieDialog_create with `config` (a `host_config`), and GenieDialog_applyLora of adapter `lora`:
    {"dialog_created": True, ...} or a VerificationError with Genie's reasons."""
    status, stderr = run_dialog(config, {"lora": lora} if lora else {}, timeout=600)
    if status.get("dialog") == 0 and status.get("lora", 0) == 0:
        return {"dialog_created": True, "dialog_checked_on": "host twins (x86 HTP simulator)"
                + (f", adapter {lora!r} applied" if lora else "")}
    if status.get("dialog") == 0:
        raise VerificationError(f"Genie refuses the bundle's LoRA adapter {lora!r} (GenieDialog_applyLora status "
                                f"{status['lora']}): {genie_messages(stderr)}",
                                "this is a bug in the generated adapter files; report it with the bundle's manifest")
    where = "GenieDialogConfig_createFromJson" if "config" in status else "GenieDialog_create"
    raise VerificationError(f"Genie refuses the bundle ({where} status {status.get('config', status.get('dialog'))}): "
                            f"{genie_messages(stderr)}",
                            "this is a bug in the generated graphs or config; report it with the bundle's manifest")


def prompt_embeddings(bundle, ids: list[int], out: Path) -> Path:
    """The prompt's rows of the bundle's Genie table (the embedder part's outputs, float32) into
    `out`, the buffer GenieDialog_embeddingTokenQuery takes. A VLM would put its image features here."""
    import numpy as np
    part = bundle.manifest.llm.embedder
    if part is None or part.genie_lut is None:
        raise InputError(f"{bundle.path} takes embeddings but has no Genie table (embedder/genie_lut.bin)",
                         "compile the LLM again with this version, or use --backend htp-sim")
    hidden = bundle.manifest.llm.spec.hidden_size
    table = np.memmap(bundle.file(part.genie_lut), np.float32, mode="r").reshape(-1, hidden)
    bad = [i for i in ids if not 0 <= i < len(table)]
    if bad:
        raise InputError(f"token ids {bad[:5]} are outside the embedding table's {len(table)} rows",
                         "use the bundle's own tokenizer")
    np.ascontiguousarray(table[ids], np.float32).tofile(out)
    return out


def genie_tokens(bundle, target: str, prompt_ids: list[int], max_new_tokens: int, sampler: dict,  # noqa: PLR0913
                 on_tokens: Callable[[list[int]], None] | None = None,
                 lora: dict[str, Any] | None = None) -> tuple[list[int], str]:
    """Run Genie's dialog on `prompt_ids`: (generated ids, stop reason). Genie prepends the
    config's BOS itself, so the host config's BOS is cleared and `prompt_ids` go in as they are.
    A bundle taking embeddings gets them through GenieDialog_embeddingTokenQuery: the prompt's rows
    of the Genie table, and each generated token looked up there by Genie. `lora` ({input name:
    float32 array}): an adapter's inputs, written as Genie's files and applied before the query."""
    cfg = bundle_config(bundle, target, sampler)
    cfg["dialog"]["context"]["bos-token"] = -1
    out: list[int] = []

    def on_event(e: dict) -> None:
        if e["event"] == "tokens":
            out.extend(e["ids"])
            if on_tokens:
                on_tokens(e["ids"])
    with tempfile.TemporaryDirectory(prefix="modelexport-genie-") as d:
        job = {"tokens": [int(t) for t in prompt_ids], "max_new_tokens": int(max_new_tokens)}
        if bundle.manifest.llm.inputs == "embeddings":   # the embedding query, the prompt looked up as Genie would
            job = {"embeddings": str(prompt_embeddings(bundle, prompt_ids, Path(d) / "prompt.f32")),
                   "max_new_tokens": int(max_new_tokens)}
        if lora is not None:
            job["lora"] = _run_adapter(cfg, lora, Path(d) / "lora")
        status, stderr = run_dialog(cfg, job, timeout=3600, on_event=on_event)
    if status.get("dialog") != 0 or status.get("lora", 0) != 0:
        raise VerificationError(f"Genie refuses the bundle{' or its adapter' if lora else ''}: {genie_messages(stderr)}",
                                "compile the LLM again with this version")
    stop = "length" if len(out) >= max_new_tokens else ("eos" if status.get("query") == 0 else
                                                         f"genie status {status.get('query')}")
    return out, stop


def genie_turns(bundle, target: str, turns: list[tuple[list[int], int]], sampler: dict) -> list[list[int]]:
    """One Genie dialog over several turns of (prompt ids, max new tokens), `GenieDialog_reset` between
    them: each turn's generated ids (a reset must leave nothing of the turn before)."""
    cfg = bundle_config(bundle, target, sampler)
    cfg["dialog"]["context"]["bos-token"] = -1
    out: list[list[int]] = [[] for _ in turns]
    failed: list[dict] = []

    def on_event(e: dict) -> None:
        if e["event"] == "tokens":
            out[e.get("turn", 0)].extend(e["ids"])
        elif e["event"] in ("reset", "dialog") and e["status"] != 0:
            failed.append(e)
    first, *later = [{"tokens": [int(t) for t in ids], "max_new_tokens": int(n)} for ids, n in turns]
    _, stderr = run_dialog(cfg, {**first, "then": later}, timeout=3600, on_event=on_event)
    if failed:
        raise VerificationError(f"Genie's dialog failed ({failed[0]}): {genie_messages(stderr)}",
                                "compile the LLM again with this version")
    return out


def _run_adapter(cfg: dict[str, Any], arrays: dict, folder: Path) -> str:
    """The adapter `arrays` as Genie's files in `folder`, the config's only adapter ("run"): its name."""
    folder.mkdir()
    for file, arr in lora_files(arrays):
        arr.tofile(folder / file)
    cfg["dialog"]["engine"]["model"]["binary"]["lora"] = lora_block([("run", str(folder))])
    return "run"
