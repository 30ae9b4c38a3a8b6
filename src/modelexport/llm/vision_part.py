"""A VLM's vision part: vision tower + projector as one graph, pixel_values [1, 3, S, S] in, the image
embeddings [1, tokens_per_image, text hidden] out (the rows that replace the prompt's image tokens).

One fixed square image per call (the size the tower was trained at): the tower's patch mask is all
ones, so the position ids are 0 .. patches-1 and no attention mask is needed; the graph is the HF
model's arithmetic without its variable-resolution bookkeeping (bucketize, masks), which the HTP does
not need and which would not export statically. Built per family by a row of VISION_BUILDERS.
"""
from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from ..frontends.vlm_families import VisionFacts, VLMFamily

PIXEL_VALUES, IMAGE_EMBEDS = "pixel_values", "image_embeds"


def _attr(model: nn.Module, path: str) -> nn.Module:
    for name in path.split("."):
        model = getattr(model, name)
    return model


class Idefics3VisionPart(nn.Module):
    """Idefics3 / SmolVLM: patch conv + learned positions, the encoder, post layernorm, the connector
    (pixel shuffle + projection): `Idefics3Model.get_image_features` for one full image."""

    def __init__(self, tower: nn.Module, projector: nn.Module, config):
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

    def __init__(self, tower: nn.Module, projector: nn.Module, config):
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


VISION_BUILDERS = {"idefics3": Idefics3VisionPart, "llava": LlavaVisionPart}


class VisionPart(nn.Module):
    """The family's vision graph with the export's names and example input."""

    def __init__(self, model: nn.Module, family: VLMFamily, facts: VisionFacts):
        super().__init__()
        self.facts = facts
        self.inner = VISION_BUILDERS[family.model_type](_attr(model, family.vision_tower), _attr(model, family.projector),
                                                        model.config)

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
    import warnings

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
