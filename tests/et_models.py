"""Small PyTorch models the ExecuTorch tests write into model.py files (`model.py:build`)."""
from __future__ import annotations

from pathlib import Path

# A pre-norm transformer stack: causal attention through F.scaled_dot_product_attention and an MLP
# with exact (erf) GELU, plus a topk over the sequence dimension as a "head".
TRANSFORMER = '''
import torch
from torch import nn
F = nn.functional


class Attention(nn.Module):
    def __init__(self, d=32, h=2):
        super().__init__()
        self.h = h
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(x).reshape(b, s, 3, self.h, d // self.h).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, s, d))


class MLP(nn.Module):
    def __init__(self, d=32):
        super().__init__()
        self.fc1 = nn.Linear(d, 2 * d)
        self.act = nn.GELU()          # exact (erf) GELU
        self.fc2 = nn.Linear(2 * d, d)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


class Block(nn.Module):
    def __init__(self, d=32):
        super().__init__()
        self.ln1, self.attn, self.ln2, self.mlp = nn.LayerNorm(d), Attention(d), nn.LayerNorm(d), MLP(d)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class Model(nn.Module):
    def __init__(self, n=1, d=32):
        super().__init__()
        self.layers = nn.ModuleList([Block(d) for _ in range(n)])

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


def build():
    torch.manual_seed(0)
    return Model().eval(), (torch.randn(1, 8, 32),)
'''

# An MLP whose head takes topk over dim 1 (the HTP op builder refuses it): a partly delegated .pte.
MLP_TOPK = '''
import torch
from torch import nn


class Head(nn.Module):
    def forward(self, x):
        return torch.topk(x, 4, dim=1)[0]


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(32, 64)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(64, 32)
        self.head = Head()

    def forward(self, x):
        return self.head(self.fc2(self.act(self.fc1(x))))


def build():
    torch.manual_seed(0)
    return Model().eval(), (torch.randn(1, 16, 32),)
'''

MLP = '''
import torch
from torch import nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(64, 128)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(128, 32)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


def build():
    torch.manual_seed(0)
    return Model().eval(), (torch.randn(1, 8, 64),)
'''

# torch.export cannot capture this: a Python `if` on a tensor value inside blocks.1.
DATA_DEPENDENT = '''
import torch
from torch import nn


class Gate(nn.Module):
    def forward(self, x):
        if x.sum() > 0:
            return x * 2
        return x - 1


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([nn.Linear(8, 8), Gate()])

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return x


def build():
    return Model().eval(), (torch.randn(2, 8),)
'''

MOBILENET_V2 = '''
import torch
from modelexport.zoo.mobilenet_v2 import mobilenet_v2


def build():
    return mobilenet_v2(), (torch.zeros(1, 3, 224, 224),)
'''


def write(folder: Path, name: str, source: str) -> str:
    """Write `source` as folder/name.py; returns the `path.py:build` spec."""
    p = Path(folder) / f"{name}.py"
    p.write_text(source)
    return f"{p}:build"
