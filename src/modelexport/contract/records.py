"""What every typed section of the manifest is built from: a path inside the bundle (`BundlePath`) and a
model serialized as written (`_Recorded`)."""
from __future__ import annotations

import re
from pathlib import PurePosixPath
from typing import Annotated, Any, ClassVar

from pydantic import AfterValidator, BaseModel, SerializationInfo, SerializerFunctionWrapHandler, model_serializer


def _inside_the_bundle(path: str) -> str:
    """A path a manifest records for a file of its bundle: relative, never climbing out. A manifest
    naming `/etc/passwd` or `../../x` is tampered with, and no reader may follow it."""
    p = PurePosixPath(path.replace("\\", "/"))
    if not path or p.is_absolute() or ".." in p.parts or re.match(r"^[A-Za-z]:", path):
        raise ValueError(f"{path!r} is not a path inside the bundle")
    return path


# Every field naming a file of the bundle has this type (SourceModel.path and CacheInfo.root name
# places outside it by design).
BundlePath = Annotated[str, AfterValidator(_inside_the_bundle)]

class _Recorded(BaseModel):
    """Serialized as written: under `exclude_none` a field the writer set to None stays (as null);
    only fields never set are left out. `keeps_none` limits that to some fields (None: all)."""
    keeps_none: ClassVar[frozenset[str] | None] = None

    @model_serializer(mode="wrap")
    def _written_nones(self, handler: SerializerFunctionWrapHandler, info: SerializationInfo) -> Any:
        data = handler(self)
        if not isinstance(data, dict) or not info.exclude_none or info.include is not None or info.exclude is not None:
            return data
        keep = self.model_fields_set if self.keeps_none is None else self.model_fields_set & self.keeps_none
        nones = {k for k in keep if k not in data and getattr(self, k) is None}
        if not nones:
            return data
        out = {k: data.get(k) for k in type(self).model_fields if k in data or k in nones}
        return out | {k: v for k, v in data.items() if k not in out}
