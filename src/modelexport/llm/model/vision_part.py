"""A VLM's vision part: vision tower + projector as one graph, pixel_values [1, 3, S, S] in, the image
embeddings [1, tokens_per_image, text hidden] out (the rows that replace the prompt's image tokens).

One fixed square image per call (the size the tower was trained at): the tower's patch mask is all
ones, so the position ids are 0 .. patches-1 and no attention mask is needed; the graph is the HF
model's arithmetic without its variable-resolution bookkeeping (bucketize, masks), which the HTP does
not need and which would not export statically. Built per family by a row of VISION_BUILDERS.
"""
from __future__ import annotations

import warnings
from pathlib import Path

import torch
from torch import nn

from ...core.errors import InputError
from ...frontends.vlm_families import VisionFacts, VLMFamily

PIXEL_VALUES, IMAGE_EMBEDS = "pixel_values", "image_embeds"


def _attr(model: nn.Module, path: str) -> nn.Module:
    for name in path.split("."):
        model = getattr(model, name)
    return model


class Idefics3VisionPart(nn.Module):
    """Idefics3 / SmolVLM: patch conv + learned positions, the encoder, post layernorm, the connector
    (pixel shuffle + projection): `Idefics3Model.get_image_features` for one full image."""

    def __init__(self, tower: nn.Module, projector: nn.Module, config, facts: VisionFacts):
        super().__init__()
        self.tower, self.projector = tower, projector

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        emb = self.tower.embeddings
        x = patchify_linear(pixel_values, emb.patch_embedding)
        x = x + emb.position_embedding.weight[: x.shape[1]].unsqueeze(0)
        for layer in self.tower.encoder.layers:
            x = layer(x, None)
        return self.projector(self.tower.post_layernorm(x))


def patchify_linear(pixel_values: torch.Tensor, conv: nn.Conv2d) -> torch.Tensor:
    """A patch conv (kernel = stride = p, no padding) as patches x weight: [1, 3, S, S] → [1, (S/p)^2, D],
    row-major over the patch grid like conv + flatten. Why: the QNN EP left the Conv's weight
    DequantizeLinear on the CPU (tiny Idefics3 tower, 8a8w and 16a8w); a MatMul's weight stays on the HTP."""
    p = conv.kernel_size[0]
    c, s = pixel_values.shape[1], pixel_values.shape[2]
    g = s // p
    x = pixel_values.reshape(c, g, p, g, p).permute(1, 3, 0, 2, 4).reshape(1, g * g, c * p * p)
    x = x @ conv.weight.reshape(conv.out_channels, c * p * p).t()
    return x + conv.bias if conv.bias is not None else x


class LlavaVisionPart(nn.Module):
    """LLaVA: a CLIP tower (patches + CLS, learned positions, pre-norm) run up to vision_feature_layer
    (hidden_states[k] = after k layers; the layers above it are not in the graph), the CLS row dropped
    under the "default" strategy, then the projector: `LlavaModel.get_image_features` for one image."""

    def __init__(self, tower: nn.Module, projector: nn.Module, config, facts: VisionFacts):
        super().__init__()
        self.vm, self.projector = getattr(tower, "vision_model", tower), projector   # transformers 5 flattened it
        n = len(self.vm.encoder.layers)
        self.upto = int(config.vision_feature_layer) % (n + 1)
        self.drop_cls = config.vision_feature_select_strategy == "default"

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        emb = self.vm.embeddings
        x = patchify_linear(pixel_values, emb.patch_embedding)
        x = torch.cat([emb.class_embedding.reshape(1, 1, -1), x], dim=1) + emb.position_embedding.weight.unsqueeze(0)
        x = self.vm.pre_layrnorm(x)
        for layer in self.vm.encoder.layers[:self.upto]:
            x = layer(x, None)
        return self.projector(x[:, 1:] if self.drop_cls else x)


class Qwen2VLVisionPart(nn.Module):
    """Qwen2-VL: `Qwen2VLModel.get_image_features` for one image of the fixed size (grid_thw a constant).

    transformers' processor repeats an image over the Conv3d's 2 frames (temporal_patch_size): that conv is
    the 2-D conv with the frames' weights summed, written as patches x weight (patchify_linear). Its
    patches come in 2 x 2 merge blocks (block row, block column, row in block, column in block): the
    row-major patch rows are put in that order by a reshape and a transpose, so the merger's view of 4
    consecutive rows is one block. The 2-D RoPE angles depend only on the grid: constants. One image is one
    attention segment (cu_seqlens [0, N]), so each block's attention is plain full attention."""

    def __init__(self, tower: nn.Module, projector: nn.Module, config, facts: VisionFacts):
        super().__init__()
        from transformers.vision_utils import get_vision_position_ids
        self.tower, self.projector = tower, projector
        proj = tower.patch_embed.proj                                    # Conv3d [D, C, T, p, p], no bias
        self.patch = nn.Conv2d(proj.in_channels, proj.out_channels, proj.kernel_size[1:], proj.stride[1:], bias=False)
        self.patch.weight = nn.Parameter(proj.weight.detach().sum(dim=2), requires_grad=False)
        self.merge = int(tower.spatial_merge_size)
        self.grid = int(facts.grid_thw[1])                               # patches per side (a square image)
        grid = torch.tensor([facts.grid_thw])
        positions = get_vision_position_ids(grid, self.merge)
        cos, sin = tower.rotary_pos_emb(torch.zeros(()), positions)     # [N, head_dim] each
        self.register_buffer("cos", cos[:, None, :].float(), persistent=False)   # [N, 1, head_dim]: over heads
        self.register_buffer("sin", sin[:, None, :].float(), persistent=False)

    def _rope(self, x: torch.Tensor) -> torch.Tensor:      # x [N, heads, head_dim]
        return _rotate(x, self.cos, self.sin)

    def _block(self, blk: nn.Module, x: torch.Tensor) -> torch.Tensor:
        attn, n = blk.attn, x.shape[0]
        q, k, v = attn.qkv(blk.norm1(x)).reshape(n, 3, attn.num_heads, -1).permute(1, 0, 2, 3).unbind(0)
        q, k, v = self._rope(q).transpose(0, 1), self._rope(k).transpose(0, 1), v.transpose(0, 1)   # [H, N, hd]
        probs = torch.softmax(torch.matmul(q, k.transpose(1, 2)) * attn.scaling, dim=-1)
        x = x + attn.proj(torch.matmul(probs, v).transpose(0, 1).reshape(n, -1))
        return x + blk.mlp(blk.norm2(x))

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        x = patchify_linear(pixel_values, self.patch)[0]                        # [g*g, D], patch rows row-major
        g, m, d = self.grid, self.merge, self.patch.out_channels
        x = x.reshape(g // m, m, g // m, m, d).transpose(1, 2).reshape(g * g, d)   # in merge blocks
        for blk in self.tower.blocks:
            x = self._block(blk, x)
        return self.projector(x).unsqueeze(0)                                   # [1, g*g / m^2, hidden]


class Qwen25VLVisionPart(Qwen2VLVisionPart):
    """Qwen2.5-VL: `Qwen2_5_VLModel.get_image_features` for one image of the fixed size.

    Qwen2-VL's patches, merge blocks and 2-D RoPE; the blocks' RMSNorms and gated MLPs are their own modules,
    called as they are. transformers reorders the merge blocks window by window (get_vision_window_index), runs
    every block on that order (window blocks attend within each window, fullatt_block_indexes to all rows) and
    puts the merger's rows back with the inverse order. For the one grid both orders are constants (one
    Gather each); the image is whole windows (vlm_families.IMAGE_SIZE_RULES), so every window has the same
    length L and a window block is attention batched over [windows, heads, L, L]: no mask (an additive
    mask's -inf would stretch the 16-bit range of the scores it is added to), and the full blocks are the
    same code with one window of all rows."""

    def __init__(self, tower: nn.Module, projector: nn.Module, config, facts: VisionFacts):
        super().__init__(tower, projector, config, facts)
        from transformers.vision_utils import get_vision_window_index

        g, m = self.grid, self.merge
        window_index, cu = get_vision_window_index(torch.tensor([facts.grid_thw]), m, int(tower.window_size),
                                                   int(tower.patch_size))
        lengths = sorted(set((cu[1:] - cu[:-1]).tolist()))
        if len(lengths) != 1:
            window = int(tower.window_size)
            raise InputError(f"an image of {facts.image_size} pixels is not whole attention windows of {window} pixels "
                             f"(windows of {lengths} patches)", f"use an image size that is a multiple of {window}")
        self.windows, self.full_blocks = len(cu) - 1, set(int(i) for i in tower.fullatt_block_indexes)
        # row-major patch ids of each merge block (block row, block column; row, column inside), in window order
        blocks = torch.arange(g * g).reshape(g // m, m, g // m, m).transpose(1, 2).reshape(-1, m * m)
        self.register_buffer("order", blocks[window_index].reshape(-1), persistent=False)
        self.register_buffer("reverse", torch.argsort(window_index), persistent=False)   # merged rows back in place
        n, units = g * g, window_index.numel()
        for name in ("cos", "sin"):   # the parent's [N, 1, head_dim] in merge-block order → window order, per layout
            table = getattr(self, name).reshape(units, m * m, -1)[window_index].reshape(n, -1)
            self.register_buffer(f"{name}_windows", table.reshape(self.windows, 1, n // self.windows, -1), persistent=False)
            self.register_buffer(f"{name}_all", table.reshape(1, 1, n, -1), persistent=False)

    def _attention(self, attn: nn.Module, x: torch.Tensor, windows: int) -> torch.Tensor:
        """Attention within `windows` equal runs of rows (1: all rows): x [N, D] → [N, D]."""
        n = x.shape[0]
        q, k, v = attn.qkv(x).reshape(windows, n // windows, 3, attn.num_heads, -1).permute(2, 0, 3, 1, 4).unbind(0)
        cos, sin = (self.cos_all, self.sin_all) if windows == 1 else (self.cos_windows, self.sin_windows)
        q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)                                # [W, H, L, hd]
        probs = torch.softmax(torch.matmul(q, k.transpose(-1, -2)) * attn.scaling, dim=-1)
        return attn.proj(torch.matmul(probs, v).transpose(1, 2).reshape(n, -1))

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        x = patchify_linear(pixel_values, self.patch)[0][self.order]              # [g*g, D] in window order
        for i, blk in enumerate(self.tower.blocks):
            x = x + self._attention(blk.attn, blk.norm1(x), 1 if i in self.full_blocks else self.windows)
            x = x + blk.mlp(blk.norm2(x))
        return self.projector(x)[self.reverse].unsqueeze(0)                      # [1, g*g / m^2, hidden]


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE on the last dim (rotate_half form)."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * sin


VISION_BUILDERS = {"idefics3": Idefics3VisionPart, "llava": LlavaVisionPart, "qwen2_vl": Qwen2VLVisionPart,
                   "qwen2_5_vl": Qwen25VLVisionPart}


class VisionPart(nn.Module):
    """The family's vision graph with the export's names and example input."""

    def __init__(self, model: nn.Module, family: VLMFamily, facts: VisionFacts):
        super().__init__()
        self.facts = facts
        self.inner = VISION_BUILDERS[family.model_type](_attr(model, family.vision_tower), _attr(model, family.projector),
                                                        model.config, facts)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return self.inner(pixel_values)

    def example_inputs(self) -> tuple[torch.Tensor]:
        s = self.facts.image_size
        return (torch.zeros(1, 3, s, s),)

    @staticmethod
    def input_names() -> list[str]:
        return [PIXEL_VALUES]

    @staticmethod
    def output_names() -> list[str]:
        return [IMAGE_EMBEDS]


def export_vision_part(part: VisionPart, out_path: Path) -> Path:
    """The vision part as a float ONNX graph (weights inside), static shapes."""
    import onnx
    out_path.parent.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(part.eval(), part.example_inputs(), str(out_path), input_names=part.input_names(),
                          output_names=part.output_names(), opset_version=17, dynamo=False)
    model = onnx.load(str(out_path))
    model.graph.name = "vision"
    onnx.save(model, str(out_path))
    return out_path
