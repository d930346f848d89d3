"""Let the PyPI torchvision wheel import beside a CPU-only torch.

Every x86_64 torchvision wheel on PyPI is a CUDA build whose native ops library cannot load next
to ``torch+cpu``; torchvision then fails at import while registering meta kernels for ``nms`` and
``qnms``, which were never defined. This module, loaded at interpreter start by a ``.pth`` file,
defines those two op schemas just before torchvision is first imported. Everything transformers
and qwen-vl-utils use (``torchvision.transforms.v2`` on tensors) keeps working; only torchvision's
native ops and decoders are missing.
"""

import importlib.abc
import sys


_SCHEMAS = (
    "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
)
_LIBRARIES: list = []  # keeps the op library alive for the life of the process


class _DefineTorchvisionOps(importlib.abc.MetaPathFinder):
    """Meta-path hook that runs once, right before the first ``import torchvision``."""

    def find_spec(self, fullname, path, target=None):  # noqa: D102 - importlib protocol
        if fullname != "torchvision":
            return None
        sys.meta_path.remove(self)
        import torch

        if not hasattr(torch.ops.torchvision, "nms"):
            library = torch.library.Library("torchvision", "FRAGMENT")
            for schema in _SCHEMAS:
                library.define(schema)
            _LIBRARIES.append(library)
        return None  # the regular finders import torchvision itself


if not any(isinstance(finder, _DefineTorchvisionOps) for finder in sys.meta_path):
    sys.meta_path.insert(0, _DefineTorchvisionOps())
