"""foxlm from Python: Forgetting Attention kernels for PyTorch and foxlm's models.

    import foxlm
    o = foxlm.ops.forgetting_attention(q, k, v, log_fgate)      # torch tensors, CUDA or CPU
    m = foxlm.load("path/to/model")                             # foxlm or FoX authors' folder
    m.loss(tokens); m.logits(tokens); m.generate(prompt_ids, max_new_tokens=32)

`import foxlm` needs only NumPy; the torch entry points import torch when first called.
See docs/python.md in the foxlm repository.
"""

from . import _foxlm, ops
from .model import Model, load

__version__ = _foxlm.__version__

__all__ = ["ops", "load", "Model", "cuda_status", "__version__"]


def cuda_status():
    """(True, "N CUDA device(s)") when foxlm's kernels can use a GPU here, else (False, why)."""
    return _foxlm.cuda_status()
