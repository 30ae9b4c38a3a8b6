"""A vision encoder the user brings as ONNX (seed 003's FastVLM flow: `compile TEXT_LLM --vision-encoder
enc.onnx --image-token TOKEN`): one image input [1, 3, S, S] → rows [1, N, hidden] (or [N, hidden]) that
replace N image tokens of the text LLM's prompt, in order. The projector is the user's, inside the graph:
its rows must already have the decoder's hidden size.

Read here: the graph's one input and one output, the image size (a static square, or --image-size for a
dynamic one), the rows' count and width (one float run on ONNX Runtime's CPU EP, on a black image), and the
image token's id in the text model's tokenizer. Written here: the graph the bundle keeps as its vision part,
with the names every VLM bundle's vision part has (`pixel_values` → `image_embeds` [1, N, hidden]), so the
runtime, the calibration and Genie read it as any other. Nothing is learned about how the user's model was
trained: the image's normalization is given (--image-mean / --image-std, ImageNet's by default).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..core.errors import InputError
from .vlm_families import VisionFacts

ENCODER_FAMILY = "onnx_encoder"          # manifest llm.vision.family of a bundle built from a user's encoder
ENCODER_LABEL = "vision encoder (ONNX)"
# torchvision's ImageNet normalization: what an ImageNet backbone (MobileNet, ResNet, ViT) was trained on
IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
PIXELS, ROWS = "pixel_values", "image_embeds"   # the vision part's I/O in every VLM bundle
_FIX_EXPORT = ("export the encoder with one image input [1, 3, S, S] (torch.onnx.export with a 1x3xSxS example "
               "and no dynamic axes) and one output of rows [1, N, hidden]")


@dataclass(frozen=True)
class EncoderGraph:
    path: Path
    input_name: str
    output_name: str
    image_size: int
    tokens: int              # N: rows per image = image tokens in the prompt
    hidden: int              # each row's width: the decoder's hidden size


def read_encoder(path: str | Path, image_size: int | None = None) -> EncoderGraph:
    """The encoder's facts, checked; InputError naming what does not fit and how to fix it."""
    import onnx
    p = Path(path)
    if not p.is_file():
        raise InputError(f"--vision-encoder {p}: no such file", "give the path of the vision encoder's .onnx file")
    try:
        model = onnx.load(str(p), load_external_data=False)
    except Exception as e:   # onnx raises DecodeError / ValueError / OSError for a file that is not a model
        raise InputError(f"--vision-encoder {p} is not an ONNX model ({type(e).__name__}: {e})",
                         "give the vision encoder's .onnx file (" + _FIX_EXPORT + ")") from None
    g = model.graph
    weights = {t.name for t in g.initializer}
    inputs = [i for i in g.input if i.name not in weights]
    if len(inputs) != 1 or len(g.output) != 1:
        raise InputError(f"--vision-encoder {p} has {len(inputs)} input(s) ({', '.join(i.name for i in inputs)}) and "
                         f"{len(g.output)} output(s) ({', '.join(o.name for o in g.output)}); the vision part takes one "
                         "image and gives one tensor of rows", _FIX_EXPORT)
    x = inputs[0]
    if x.type.tensor_type.elem_type != onnx.TensorProto.FLOAT:
        raise InputError(f"--vision-encoder {p}: its input {x.name!r} is "
                         f"{onnx.TensorProto.DataType.Name(x.type.tensor_type.elem_type)}, not float32 pixels",
                         "export the float32 encoder (the compile quantizes it)")
    dims = [d.dim_value if d.HasField("dim_value") else None for d in x.type.tensor_type.shape.dim]
    size = _image_size(p, x.name, dims, image_size)
    tokens, hidden = _row_shape(p, size)
    return EncoderGraph(p, x.name, g.output[0].name, size, tokens, hidden)


def _image_size(p: Path, name: str, dims: list, asked: int | None) -> int:
    if len(dims) != 4 or dims[0] not in (1, None) or dims[1] not in (3, None):
        shown = "x".join("?" if d is None else str(d) for d in dims)
        raise InputError(f"--vision-encoder {p}: its input {name!r} is [{shown}], not an RGB image [1, 3, S, S]", _FIX_EXPORT)
    h, w = dims[2], dims[3]
    if h is not None and w is not None:
        if h != w:
            raise InputError(f"--vision-encoder {p}: its input is {h}x{w} pixels; the vision part takes a square image",
                             "export the encoder for a square input (e.g. 1x3x224x224)")
        if asked is not None and asked != h:
            raise InputError(f"--image-size {asked}: the encoder's input is fixed at {h}x{h}",
                             f"leave --image-size out or pass --image-size {h}")
        return int(h)
    if h is not None or w is not None:
        raise InputError(f"--vision-encoder {p}: one side of its input is fixed, the other not", _FIX_EXPORT)
    if asked is None:
        raise InputError(f"--vision-encoder {p}: its input {name!r} has a dynamic image size",
                         "pass --image-size S (the square it is compiled for; the HTP takes static shapes)")
    if asked < 8:
        raise InputError(f"--image-size {asked} is too small for an image", "pass the size the encoder was trained at, e.g. 224")
    return int(asked)


def _row_shape(p: Path, size: int) -> tuple[int, int]:
    """(N, hidden) of the encoder's output, from one float run on a black image (shape inference cannot
    see through every exporter's Reshape / Flatten)."""
    import numpy as np
    import onnxruntime as ort
    try:
        sess = ort.InferenceSession(str(p), providers=["CPUExecutionProvider"])
        y = sess.run(None, {sess.get_inputs()[0].name: np.zeros((1, 3, size, size), np.float32)})[0]
    except Exception as e:   # ONNX Runtime's own errors (invalid graph, shape mismatch) are the user's file
        raise InputError(f"--vision-encoder {p} does not run on ONNX Runtime's CPU EP at {size}x{size} "
                         f"({type(e).__name__}: {str(e).splitlines()[0][:300]})",
                         "check the file with onnxruntime first; " + _FIX_EXPORT) from None
    shape = tuple(int(d) for d in np.shape(y))
    if len(shape) == 3 and shape[0] == 1:
        return shape[1], shape[2]
    if len(shape) == 2 and shape[0] >= 1:
        return shape[0], shape[1]
    raise InputError(f"--vision-encoder {p} gives a tensor of shape {list(shape)}; the vision part gives rows "
                     "[1, N, hidden] (N image tokens, each of the decoder's hidden size)",
                     "end the encoder with its projector and a reshape to [1, N, hidden] (a CNN's [1, C, h, w] "
                     "features: flatten h x w, transpose, then a linear layer to the hidden size)")


def check_rows_fit(enc: EncoderGraph, hidden: int, max_seq_len: int, text_model: str) -> None:
    """The rows' width is the decoder's hidden size, and an image leaves room for text in the context."""
    if enc.hidden != hidden:
        raise InputError(f"--vision-encoder {enc.path} gives rows of {enc.hidden} values; the text model "
                         f"{text_model} has hidden size {hidden}",
                         f"add a projector to the encoder that maps its {enc.hidden} features to {hidden} "
                         "(a linear layer), export it again")
    if enc.tokens > max_seq_len // 2:
        raise InputError(f"one image is {enc.tokens} image tokens; half of --max-seq-len {max_seq_len} is "
                         f"{max_seq_len // 2} (the rest is for text)",
                         f"raise --max-seq-len to at least {2 * enc.tokens}, or pool the encoder's rows")


def image_token_id(tokenizer, token: str, where: str) -> int:
    """The id of `token` (a string the tokenizer gives as exactly one id, or a number) in `tokenizer`."""
    text = str(token).strip()
    if not text:
        raise InputError("--image-token is empty", "pass the token that stands for an image in prompts, "
                         "e.g. a reserved special token of the text model's tokenizer")
    if text.isdigit():
        i = int(text)
        if i >= tokenizer.vocab_size:
            raise InputError(f"--image-token {i} is beyond the tokenizer's {tokenizer.vocab_size} ids ({where})",
                             f"pass an id below {tokenizer.vocab_size}, or the token's text")
        return i
    ids = tokenizer.encode(text, add_special_tokens=False)
    if len(ids) != 1:
        raise InputError(f"--image-token {text!r} is {len(ids)} tokens in {where}'s tokenizer, not one",
                         "pass a token the tokenizer keeps whole (a special or reserved token), or its id")
    return int(ids[0])


def parse_triple(value, flag: str, default: tuple[float, float, float]) -> tuple[float, float, float]:
    """--image-mean / --image-std: "R,G,B", or one number for every channel (a grayscale model), or a
    sequence of numbers → three floats."""
    if value is None:
        return default
    parts = value.replace(" ", ",").split(",") if isinstance(value, str) else list(value)
    try:
        out = tuple(float(v) for v in parts if str(v).strip())
    except ValueError:
        out = ()
    out = out * 3 if len(out) == 1 else out
    if len(out) != 3 or (flag == "--image-std" and min(out) <= 0):
        raise InputError(f"{flag} {value!r}: three numbers R,G,B, or one for every channel, are wanted"
                         + (" (all above 0)" if flag == "--image-std" else ""),
                         f"e.g. {flag} {','.join(str(v) for v in default)} (the default here)")
    return out  # type: ignore[return-value]


def encoder_facts(enc: EncoderGraph, image_token: int, mean, std, text_model_type: str) -> VisionFacts:
    """The vision facts every VLM bundle records, for a user's encoder: one image resized to its square,
    rescaled by 1/255 and normalized, its rows at the prompt's image tokens (text positions)."""
    return VisionFacts(family=ENCODER_FAMILY, image_size=enc.image_size, patch_size=enc.image_size,
                       tokens_per_image=enc.tokens, image_token_id=image_token, mean=tuple(mean), std=tuple(std),
                       rescale_factor=1 / 255, placement="replace_in_order", text_model_type=text_model_type,
                       text_hidden_size=enc.hidden)


def write_vision_graph(enc: EncoderGraph, dest: Path) -> Path:
    """The user's graph as the bundle's vision part: input `pixel_values` [1, 3, S, S] (a dynamic size
    fixed), output `image_embeds` [1, N, hidden] (a Reshape added after [N, hidden]). Weights as external
    data beside it when the graph is large."""
    import numpy as np
    import onnx
    from onnx import helper, numpy_helper
    model = onnx.load(str(enc.path))   # with its external data
    g = model.graph
    renames = {enc.input_name: PIXELS}
    raw_out = enc.output_name if enc.output_name != ROWS else f"{ROWS}_rows"
    for node in g.node:
        node.input[:] = [renames.get(n, n) for n in node.input]
        node.output[:] = [raw_out if n == enc.output_name else n for n in node.output]
        node.input[:] = [raw_out if n == enc.output_name else n for n in node.input]
    x = next(i for i in g.input if i.name == enc.input_name)
    x.name = PIXELS
    for d, v in zip(x.type.tensor_type.shape.dim, (1, 3, enc.image_size, enc.image_size)):
        d.Clear()
        d.dim_value = v
    shape = numpy_helper.from_array(np.array([1, enc.tokens, enc.hidden], np.int64), f"{ROWS}_shape")
    g.initializer.append(shape)
    g.node.append(helper.make_node("Reshape", [raw_out, shape.name], [ROWS], name=f"{ROWS}_reshape"))
    del g.output[:]
    g.output.append(helper.make_tensor_value_info(ROWS, onnx.TensorProto.FLOAT, [1, enc.tokens, enc.hidden]))
    kept = [v for v in g.value_info if v.name != raw_out]
    del g.value_info[:]
    g.value_info.extend(kept)
    dest.parent.mkdir(parents=True, exist_ok=True)
    big = model.ByteSize() > 1_500_000_000
    onnx.save_model(model, str(dest), save_as_external_data=big, location=dest.name + ".data" if big else None)
    return dest
