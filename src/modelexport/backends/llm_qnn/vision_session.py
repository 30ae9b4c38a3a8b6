"""`generate BUNDLE --image photo.jpg --prompt ...` on a VLM bundle: the image through the bundle's
vision part, its rows put at the prompt's image tokens (manifest `llm.vision`), then the decoder's
own loop (greedy) over the embedder → decoder chain.

Stages as for text (session.STAGES): `htp-sim` runs the compiled parts on the HTP simulator (the
vision part's EPContext model, the decoder's and embedder's host twins), `fake-quant` their QDQ
graphs on ONNX Runtime's CPU EP (what `--backend cpu` means for a compiled bundle here).
`--backend genie`: the vision part on the simulator, then Genie's pipeline (text-encoder and
text-generator nodes on the host twins: genie_pipeline.py) takes the prompt and the rows.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ...contract.bundle import open_bundle
from ...core.errors import InputError
from ...core.vocab import Role
from ...llm.model.image_tiling import IMAGE_TOKEN, expand_prompt, normalize, split_image, tile_grid
from ...llm.model.mrope import RopePositions, rope_index
from ...llm.run.tokenizers import load_tokenizer
from ...llm.run.vision_inputs import image_prompt_ids, load_pixels, open_rgb
from .genie_dialog import sampler_block
from .genie_pipeline import genie_image_tokens

BACKEND_STAGES = {"htp-sim": "htp-sim", "cpu": "fake-quant", "genie": "htp-sim"}   # genie: the vision part's stage


def vision_entry(bundle):
    v = bundle.manifest.llm.vision if bundle.manifest.llm is not None else None
    if v is None:
        raise InputError(f"{bundle.path} has no vision part: --image needs a vision-language bundle",
                         "compile a VLM's Hugging Face folder (modelexport compile SMOLVLM_FOLDER -o BUNDLE), or this "
                         "LLM with your vision encoder (compile MODEL --vision-encoder enc.onnx --image-token TOKEN), "
                         "or leave --image out")
    return v


def vision_runner(bundle, stage: str, target: str | None = None):
    """The bundle's vision part as a callable: pixel_values [1, 3, S, S] → rows [tokens_per_image, hidden]."""
    import onnxruntime as ort
    v = vision_entry(bundle)
    if stage == "htp-sim":
        from .session import _sim_session
        target = target or bundle.manifest.targets[0]
        g = next((g for g in v.graphs if g.target == target and g.epcontext_model), None)
        if g is None:
            raise InputError(f"{bundle.path}'s vision part has no graph for {target}",
                             f"its targets: {', '.join(bundle.manifest.targets)}")
        sess = _sim_session(bundle.file(g.epcontext_model), target)
    else:
        model = v.quantized_model if stage == "fake-quant" and v.quantized_model else v.model
        sess = ort.InferenceSession(str(bundle.file(model)), providers=["CPUExecutionProvider"])
    return lambda x: np.asarray(sess.run(None, {"pixel_values": x})[0], np.float32).reshape(v.tokens_per_image, -1)


def image_rows(bundle, image, stage: str, target: str | None = None) -> tuple[np.ndarray, list[str]]:
    """(rows [tokens_per_image, hidden] float32, notes on how the image was changed) for `image`,
    resized to the vision part's size (a bundle without tiling)."""
    v = vision_entry(bundle)
    x, notes = load_pixels(image, v.image_size, v.mean, v.std, v.rescale_factor)
    return vision_runner(bundle, stage, target)(x), notes


def tiled_prompt(bundle, tok, images: list, prompt: str, raw: bool, splitting: bool | None = None):
    """Processor-style inputs of a tiling bundle: (prompt ids with every image's markers and image
    tokens, the RGB images, whether they are split, notes). The prompt's `<image>` markers place the images
    (none: all of them first, as SmolVLM's chat template puts the image before the text); the ids are
    checked against the context before any vision run."""
    v = vision_entry(bundle)
    t = v.tiling
    split = t.splitting if splitting is None else (splitting and t.splitting)
    opened = [open_rgb(im) for im in images]
    pics, notes = [p for p, _ in opened], [n for _, ns in opened for n in ns]
    grids = [tile_grid(p.width, p.height, t.longest_edge, t.tile_size, split) for p in pics]
    if IMAGE_TOKEN not in prompt:
        prompt = IMAGE_TOKEN * len(pics) + prompt
    text = prompt if raw or not tok.chat_template else chat_text(tok, prompt)
    ids = tok.encode(expand_prompt(text, grids, t.image_seq_len), add_special_tokens=raw or not tok.chat_template)
    tiles = sum(g.tiles for g in grids)
    if ids.count(v.image_token_id) != tiles * t.image_seq_len:
        raise InputError(f"the tokenizer gives {ids.count(v.image_token_id)} image tokens for {tiles} tiles of "
                         f"{t.image_seq_len}", "the bundle's tokenizer does not match its vision part: compile again")
    seq = bundle.manifest.llm.max_seq_len
    if len(ids) >= seq:
        sizes = ", ".join(f"{p.width}x{p.height} → {g.rows}x{g.cols} tiles + global" for p, g in zip(pics, grids))
        raise InputError(f"the prompt is {len(ids)} tokens with {len(pics)} image(s) in {tiles} tiles of "
                         f"{t.image_seq_len} image tokens ({sizes}); the bundle's context holds {seq}",
                         f"compile with a larger --max-seq-len (at least {len(ids) + 1}), pass a smaller image, "
                         "or add --no-image-splitting (one tile per image)")
    for p, g in zip(pics, grids):
        if g.rows:
            notes.append(f"image of {p.width}x{p.height} split into {g.rows}x{g.cols} tiles of {t.tile_size} "
                         "+ the global image")
        else:
            notes.append(f"image of {p.width}x{p.height} resized to {t.tile_size}x{t.tile_size} (one tile)")
    return ids, pics, split, notes


def chat_text(tok, prompt: str) -> str:
    """The user turn through the chat template, `<image>` markers kept: as a string, or (templates that walk
    content parts, SmolVLM's) as transformers' processors feed it, text and {"type": "image"} parts in order."""
    pieces = prompt.split(IMAGE_TOKEN)
    parts = [p for i, piece in enumerate(pieces)
             for p in ([{"type": "image"}] if i else []) + ([{"type": "text", "text": piece}] if piece else [])]
    for content in (prompt, parts):
        text = tok.render_chat([{"role": "user", "content": content}])
        if text.count(IMAGE_TOKEN) == len(pieces) - 1 and all(p in text for p in pieces):
            return text
    raise InputError("the model's chat template drops the prompt's text or <image> markers",
                     "pass --raw and write the prompt as the model expects it, with one <image> per --image")


def tiled_rows(bundle, pics: list, splitting: bool, stage: str, target: str | None = None) -> np.ndarray:
    """Every image's tiles and global image through the vision part, in prompt order → rows [n, hidden]."""
    v = vision_entry(bundle)
    t = v.tiling
    run = vision_runner(bundle, stage, target)
    rows = []
    for p in pics:
        tiles, _ = split_image(p, t.longest_edge, t.tile_size, t.resample, splitting)
        rows += [run(normalize(tile, v.mean, v.std, v.rescale_factor)) for tile in tiles]
    return np.concatenate(rows)


def image_rope_positions(v, ids: list[int]):
    """The prompt's M-RoPE positions when the vision entry's position rule is "mrope_grid" (llm/model/mrope.py),
    else text positions (what a graph without rope_position_ids ignores)."""
    if v.position_rule != "mrope_grid":
        return RopePositions.text()
    return rope_index(ids, v.image_token_id, tuple(v.grid_thw), v.spatial_merge_size)


def generate_with_image(path: Path, image, prompt: str, backend: str = "htp-sim", max_new_tokens: int = 32,
                        raw: bool = False, image_splitting: bool | None = None, on_prefill=None) -> dict:
    """Greedy generation from an image (or a list of them, in prompt order) and a prompt → {"text",
    "token_ids", "prompt_ids", "notes", "first_logits" (the logits after the prompt), "stage"}.
    `image_splitting=False` turns a tiling bundle's splitting off (one tile per image); `on_prefill(done, total)`:
    the prompt's progress through the decoder, chunk by chunk."""
    import torch

    from ...llm.run.static_runner import StaticRunner
    from .session import open_forwards
    stage = BACKEND_STAGES.get(backend)
    if stage is None:
        raise InputError(f"--image runs on --backend {', '.join(BACKEND_STAGES)}, not {backend}",
                         "use --backend htp-sim (the simulator), --backend cpu (the bundle's QDQ graphs on the CPU) "
                         "or --backend genie (Genie's pipeline)")
    bundle = open_bundle(path)
    v = vision_entry(bundle)
    tok_file = next((bundle.file(f.path) for f in bundle.manifest.files if f.role == Role.TOKENIZER), None)
    if tok_file is None:
        raise InputError(f"bundle {path} carries no tokenizer", "compile the VLM folder again (its tokenizer is copied)")
    tok = load_tokenizer(tok_file)
    images = list(image) if isinstance(image, (list, tuple)) else [image]
    if v.tiling is not None:
        ids, pics, split, notes = tiled_prompt(bundle, tok, images, prompt, raw, image_splitting)
        rows = tiled_rows(bundle, pics, split, stage)
    else:
        if len(images) != 1:
            raise InputError(f"{path} was compiled without image splitting markers: it takes one --image, not "
                             f"{len(images)}", "pass one --image, or compile the VLM folder again with its "
                             "original tokenizer (it has the <fake_token_around_image> markers)")
        text_ids = list(tok.encode(prompt)) if raw or not tok.chat_template else list(
            tok.encode_chat([{"role": "user", "content": prompt}], add_generation_prompt=True))
        ids = image_prompt_ids(text_ids, v.image_token_id, v.tokens_per_image, tuple(v.image_wrap_ids))
        seq = bundle.manifest.llm.max_seq_len
        if len(ids) >= seq:   # before the vision run: the image's tokens are part of the prompt
            raise InputError(f"the prompt is {len(ids)} tokens with the image's {v.tokens_per_image}; the bundle's "
                             f"context holds {seq}", f"shorten the prompt by at least {len(ids) - seq + 1} tokens, or compile "
                             "with a larger --max-seq-len")
        rows, notes = image_rows(bundle, images[0], stage)
    if backend == "genie":
        if v.position_rule != "text":
            raise InputError(f"--backend genie: this {v.family} bundle's decoder takes M-RoPE positions "
                             "(rope_position_ids), which Genie does not feed (its qwen2vl-mrope option feeds graphs "
                             "taking position_ids_cos / _sin: not built)", "use --backend htp-sim or --backend cpu")
        llm = bundle.manifest.llm
        # measured: Genie's pipeline refuses ("Context Size was exceeded") a prompt longer than the context
        # minus its largest arN plus one, however few tokens are asked for (128 - 32 + 1 = 97 here)
        longest = llm.max_seq_len - max(n for n in llm.variants if n < llm.max_seq_len) + 1
        if len(ids) > longest:
            raise InputError(f"the prompt is {len(ids)} tokens with the image; Genie's pipeline takes at most "
                             f"{longest} on this bundle (context {llm.max_seq_len} less its largest arN, plus one)",
                             f"shorten the prompt by {len(ids) - longest} tokens, use --backend htp-sim (the same "
                             "binaries, our loop), or compile with a larger --max-seq-len")
        # the context's end stops our loop; Genie counts it as an error ("Context Size was exceeded")
        room = bundle.manifest.llm.max_seq_len - len(ids)
        out, _ = genie_image_tokens(bundle, bundle.manifest.targets[0], tok, ids, rows, min(max_new_tokens, room),
                                    sampler_block())
        return {"text": tok.decode(out), "token_ids": out, "prompt_ids": ids, "notes": notes, "first_logits": None,
                "stage": "genie"}
    graphs, spec, seq = open_forwards(bundle, stage)
    where = [i for i, t in enumerate(ids) if t == v.image_token_id]
    rope = image_rope_positions(v, ids)
    for f in graphs.values():
        f.image_rows = dict(zip(where, rows))
        f.no_token_id = bundle.manifest.llm.no_token_id
        f.rope_positions = rope
    runner = StaticRunner(graphs, spec, seq)
    first = runner.prefill(ids, on_prefill)
    out = [int(torch.argmax(first))]
    eos = set(tok.eos_ids)
    while len(out) < max_new_tokens and out[-1] not in eos and runner.past_len < seq:
        out.append(int(torch.argmax(runner.decode_step(out[-1]))))
    return {"text": tok.decode(out), "token_ids": out, "prompt_ids": ids, "notes": notes,
            "first_logits": first.numpy(), "stage": stage}
