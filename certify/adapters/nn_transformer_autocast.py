"""``torch.nn.Transformer`` in bf16 the other way a torch user takes: fp32 weights, the forward under
``torch.autocast("cpu", torch.bfloat16)`` (``tools.peer_torch``'s way; ``certify.adapters.nn_transformer`` casts
the module instead). bf16 configs only."""

from certify.adapters.nn_transformer import Backend


def make_backend() -> Backend:
    return Backend(autocast=True)
