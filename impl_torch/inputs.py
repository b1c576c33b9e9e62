"""Token ids into impl_torch: a host copy for ``spec.validate`` (``host_ids``), then a tensor on the model's
device (``device_ids``). Eager torch runs every shape as given, so nothing is padded to shape buckets here.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor

from spec import validate

Ids = Tensor | np.ndarray | Sequence[Sequence[int]]  # token ids (B, L), any integer dtype


def host_ids(ids: Ids, name: str = "src") -> np.ndarray:
    """A NumPy host copy of token ids, for ``spec.validate`` (dtype kept, so a float array is reported; ragged
    nested lists refused in the spec's words, naming ``name``)."""
    if isinstance(ids, Tensor):
        ids = ids.detach().cpu()
        return (ids.float() if ids.dtype == torch.bfloat16 else ids).numpy()  # NumPy has no bf16
    return validate.host_ids(name, ids)


def device_ids(ids: Ids, device: torch.device) -> Tensor:
    """Validated token ids as an int64 tensor on ``device`` (NumPy arrays in any memory layout)."""
    return torch.as_tensor(np.ascontiguousarray(ids) if not isinstance(ids, Tensor) else ids, device=device).long()
