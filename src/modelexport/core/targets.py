"""The Snapdragon SoC table: data, not branches.

`soc_model` is the QNN chipset id (the `soc_model` provider option of ONNX Runtime's QNN EP and
ExecuTorch's `QcomChipset` value); `htp_arch` and `vtcm_mb` are those executorch 1.5.1's SoC
table and the context binaries built here report. DRAM bandwidth is the peak of the memory
interface on public spec sheets (GB/s); it bounds LLM decode speed (every weight byte is read
once per token), so it is marked None where no reliable figure is known.
"""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass

from .errors import TargetError

# With 16-bit weights the HTP computes a Conv close to its QDQ model up to 8 taps per kernel dimension
# (68.5 dB) and from 64 on (84 dB), and far from it in between (9 to 63 taps: about 34 dB; a 2-D 9x9:
# 33.0 dB) (bench/results/htp_wide_kernel.json).
HTP_16BIT_WEIGHT_MAX_TAPS = 8
HTP_16BIT_WEIGHT_WHOLE_FROM_TAPS = 64

# Features and the first HTP architecture that has them.
FEATURE_FLOORS: dict[str, int] = {
    "fp16": 69,             # float16 execution on HTP
    "block_quant_4bit": 69,  # block-wise 4-bit weights (16a4w_block)
    "weight_sharing": 73,    # one weight copy shared by several graphs of a context
}


@dataclass(frozen=True, eq=False, repr=False)
class SoC(str):
    """A row of the table, and its code name (`SM8650`): the value `modelexport.compile` parses a
    target into once, which travels where the name did (options, manifests, folder names) and
    compares, hashes, prints and pickles as the name."""
    name: str
    marketing_name: str
    htp_arch: int
    soc_model: int
    vtcm_mb: int
    dram_gbps: float | None
    aliases: tuple[str, ...] = ()

    def __new__(cls, name: str, *args, **kwargs):
        return super().__new__(cls, name)

    @property
    def vtcm_bytes(self) -> int:
        return self.vtcm_mb << 20

    def supports(self, feature: str) -> bool:
        return self.htp_arch >= FEATURE_FLOORS[feature]

    @property
    def features(self) -> dict[str, bool]:
        return {f: self.supports(f) for f in FEATURE_FLOORS}

    def to_dict(self) -> dict:
        d = asdict(self)
        d["features"] = self.features
        return d


_TABLE: tuple[SoC, ...] = (
    SoC("SM8350", "Snapdragon 888", 68, 30, 4, 51.2, ("888", "snapdragon-888")),
    SoC("SM8450", "Snapdragon 8 Gen 1", 69, 36, 8, 51.2, ("8gen1", "snapdragon-8-gen-1")),
    SoC("SM8475", "Snapdragon 8+ Gen 1", 69, 42, 8, 51.2, ("8+gen1", "8plusgen1", "snapdragon-8-plus-gen-1")),
    SoC("SM8550", "Snapdragon 8 Gen 2", 73, 43, 8, 67.2, ("8gen2", "snapdragon-8-gen-2")),
    SoC("SM8650", "Snapdragon 8 Gen 3", 75, 57, 8, 76.8, ("8gen3", "snapdragon-8-gen-3")),
    SoC("SM8750", "Snapdragon 8 Elite", 79, 69, 8, 84.8, ("8elite", "snapdragon-8-elite")),
    SoC("SM8850", "Snapdragon 8 Elite Gen 5", 81, 87, 8, 85.3, ("8elitegen5", "snapdragon-8-elite-gen-5")),
    SoC("SM8845", "Snapdragon 8 Gen 5", 81, 97, 8, None, ("8gen5", "snapdragon-8-gen-5")),
    SoC("SC8380XP", "Snapdragon X Elite", 73, 60, 8, 135.0, ("xelite", "snapdragon-x-elite")),
    SoC("SA8295", "Snapdragon Cockpit SA8295P", 68, 39, 8, 68.3, ("sa8295p",)),
    SoC("SA8255", "Snapdragon Ride SA8255P", 73, 52, 8, None, ("sa8255p",)),
    SoC("SA8797", "Snapdragon SA8797P", 81, 72, 16, None, ("sa8797p",)),
    SoC("QCS9100", "Qualcomm QCS9100", 73, 77, 8, None, ()),
    SoC("QCM6490", "Qualcomm QCM6490", 68, 93, 2, None, ()),
    SoC("SSG2115P", "Snapdragon SSG2115P", 73, 46, 2, None, ()),
    SoC("SSG2125P", "Snapdragon SSG2125P", 73, 58, 2, None, ()),
    SoC("SXR1230P", "Snapdragon XR SXR1230P", 73, 45, 2, None, ()),
    SoC("SXR2230P", "Snapdragon XR2 Gen 2", 69, 53, 8, None, ("xr2gen2",)),
    SoC("SXR2330P", "Snapdragon XR SXR2330P", 79, 75, 8, None, ()),
    SoC("SAR2230P", "Snapdragon AR2 Gen 1", 81, 95, 4, None, ()),
    SoC("SW6100", "Snapdragon W5 Gen 2", 81, 96, 4, None, ()),
)


def _key(name: str) -> str:
    """Case, spaces, dashes, underscores and the word 'snapdragon' do not matter."""
    k = re.sub(r"[\s_\-]+", "", name.strip().lower())
    return k.removeprefix("snapdragon").replace("plus", "+")


_INDEX: dict[str, SoC] = {}
for _soc in _TABLE:
    for _name in (_soc.name, _soc.marketing_name, *_soc.aliases):
        _INDEX.setdefault(_key(_name), _soc)


def all_targets() -> tuple[SoC, ...]:
    return _TABLE


def known_names() -> list[str]:
    return [s.name for s in _TABLE]


def get_target(name: str | SoC) -> SoC:
    """Look up a SoC by its code (`SM8650`), marketing name or alias (`8gen3`); a SoC is itself."""
    soc = name if isinstance(name, SoC) else _INDEX.get(_key(name))
    if soc is None:
        raise TargetError(
            f"unknown target {name!r}",
            "use one of: " + ", ".join(known_names()) + " (or a marketing name such as '8gen3'); "
            "`modelexport targets` lists them all",
        )
    return soc


def by_htp_arch(arch: int) -> list[SoC]:
    return [s for s in _TABLE if s.htp_arch == arch]


def by_soc_model(soc_model: int) -> SoC | None:
    return next((s for s in _TABLE if s.soc_model == soc_model), None)


def require_feature(soc: SoC, feature: str, what: str) -> None:
    """Refuse up front when the target's HTP is older than the feature's floor."""
    if not soc.supports(feature):
        floor = FEATURE_FLOORS[feature]
        newer = ", ".join(s.name for s in _TABLE if s.htp_arch >= floor and s.name.startswith("SM"))
        raise TargetError(
            f"{what} needs HTP V{floor} or newer; {soc.name} ({soc.marketing_name}) has V{soc.htp_arch}",
            f"choose another precision or a newer target ({newer})",
        )
