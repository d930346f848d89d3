"""A restricted read of a DCP directory's ``.metadata`` before torch reads it.

torch.distributed.checkpoint's ``FileSystemReader.read_metadata`` (torch 2.13) reads ``.metadata`` with a plain
``pickle.load``: whatever the file names, it imports and calls. :func:`check_dcp_metadata` first unpickles the file
with an unpickler that resolves only the classes DCP's metadata is made of (its dataclasses, ``torch.Size``, torch
dtypes and layouts, paths), so a crafted ``.metadata`` is refused before torch reads it; the file torch then reads
holds nothing else. Nothing here imports torch until a file is checked.
"""

from __future__ import annotations

import enum
import pickle
from pathlib import Path
from typing import Any

from easyr1.errors import CheckpointError


METADATA_NAME = ".metadata"

# module -> the names a DCP .metadata file may refer to (what torch 2.13's dcp.save pickles, and no function that
# could do more than build a value)
ALLOWED_GLOBALS: dict[str, frozenset[str]] = {
    "torch.distributed.checkpoint.metadata": frozenset(
        {
            "Metadata",
            "MetadataIndex",
            "StorageMeta",
            "TensorStorageMetadata",
            "BytesStorageMetadata",
            "ChunkStorageMetadata",
            "TensorProperties",
            "_MEM_FORMAT_ENCODING",
        }
    ),
    "torch.distributed.checkpoint.filesystem": frozenset({"_StorageInfo"}),
    "torch.distributed.checkpoint.planner": frozenset({"LoadItemType", "WriteItemType"}),
    "torch.serialization": frozenset({"_get_layout"}),
    "torch": frozenset({"Size"}),
    "pathlib": frozenset({"Path", "PosixPath", "PurePath", "PurePosixPath"}),
    "collections": frozenset({"OrderedDict"}),
    "builtins": frozenset({"set", "frozenset", "slice", "complex"}),
}


class _Refused(pickle.UnpicklingError):
    """A global that no DCP metadata refers to."""


def _enum_member(owner: Any, name: Any) -> Any:
    """What ``builtins.getattr`` stands for in a DCP .metadata: an enum member by name. Early CPython 3.11 releases
    (Debian 12's 3.11.2 among them; 3.11.7 does not) pickle enum members as ``getattr(EnumClass, "NAME")``, and
    DCP's metadata holds enum members (WriteItemType, LoadItemType, _MEM_FORMAT_ENCODING). Only a member of an enum
    the unpickler resolved is returned, never another attribute (a method of an allowed value could be called by
    the pickle)."""
    allowed = isinstance(owner, enum.EnumMeta) and owner.__qualname__ in ALLOWED_GLOBALS.get(owner.__module__, ())
    if not (allowed and isinstance(name, str)):
        raise _Refused(f"builtins.getattr({owner!r}, {name!r})")
    try:
        return owner[name]
    except KeyError:
        raise _Refused(f"builtins.getattr({owner!r}, {name!r})") from None


class _MetadataUnpickler(pickle.Unpickler):
    """Resolves only :data:`ALLOWED_GLOBALS` and torch's dtypes (``torch.float32`` is pickled by name)."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("builtins", "getattr"):
            return _enum_member
        if name in ALLOWED_GLOBALS.get(module, ()):
            return super().find_class(module, name)
        if module == "torch":
            import torch

            if isinstance(getattr(torch, name, None), torch.dtype):
                return getattr(torch, name)
        raise _Refused(f"{module}.{name}")


def check_dcp_metadata(directory: Path) -> None:
    """Raise a :class:`CheckpointError` naming ``directory/.metadata`` if it refers to anything but the values DCP's
    metadata is made of (a pickle that would import or call something else); a missing file is left to the
    caller. Unreadable bytes (a truncated file) are left to the caller too: torch's own read reports them."""
    path = Path(directory) / METADATA_NAME
    if not path.is_file():
        return
    try:
        with open(path, "rb") as file:
            _MetadataUnpickler(file).load()
    except _Refused as refused:
        raise CheckpointError(
            f"{path}: refused to load: it refers to {refused}, which torch's checkpoint writer never puts there, so "
            "the file was made or altered elsewhere and could run code when loaded. Load only checkpoints you "
            "produced or trust (docs/security.md); resume from another checkpoint (trainer.load_checkpoint_path) or "
            "start without one"
        ) from None
    except Exception:  # a truncated pickle raises any of several types: damage, which the caller's read reports
        return
