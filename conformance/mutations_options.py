"""The checkpoint options' mutants (``conformance.mutants``), as ``conformance.mutations``': each replaces a
function or method of ``spec.reference``, looked up at call time, with a plausible bug in one of the options of
``spec.config`` that published checkpoints need."""

from __future__ import annotations

from spec.reference import layers

_original = {target: getattr(layers, name) if not cls else getattr(getattr(layers, cls), name)
             for target, cls, name in (("positional_encoding", "", "positional_encoding"),
                                       ("activation", "", "activation"),
                                       ("attention_init", "MultiHeadAttention", "__init__"),
                                       ("embedder_init", "Embedder", "__init__"))}


def _halves_interleaved(length, d_model, halves=False):
    return _original["positional_encoding"](length, d_model)  # Marian's sin-then-cos layout read as the paper's


def _gelu_for_relu(h, name, nx):
    return _original["activation"](h, "gelu" if name == "relu" else name, nx)


def _gelu_tanh_for_gelu(h, name, nx):
    return _original["activation"](h, "gelu_tanh" if name == "gelu" else name, nx)  # the approximation for erf


def _attention_bias_dropped(self, params, prefix, nx):
    _original["attention_init"](self, params, prefix, nx)
    self.b_q = self.b_k = self.b_v = self.b_o = None  # a converter that loads the weights and not the biases


def _logits_bias_dropped(self, params, c, nx):
    _original["embedder_init"](self, params, c, nx)
    self.bias = None


def _learned_positions_from_0(self, params, c, nx):
    _original["embedder_init"](self, params, c, nx)
    if self.positions is not None:  # every decode step reads the first rows: the cache's offset forgotten
        table = self.positions
        self.positions = _Rows(table)


class _Rows:
    def __init__(self, table):
        self.table = table

    def __getitem__(self, rows):
        return self.table[:rows.stop - rows.start]


def _scaled_anyway(self, params, c, nx):
    _original["embedder_init"](self, params, c.replace(scale_embedding=True), nx)


OPTION_MUTANTS: dict[str, tuple] = {
    "pe_halves_laid_out_interleaved": ("layers.positional_encoding", _halves_interleaved),
    "relu_replaced_by_gelu_erf": ("layers.activation", _gelu_for_relu),
    "gelu_replaced_by_gelu_tanh": ("layers.activation", _gelu_tanh_for_gelu),
    "attention_bias_dropped": ("layers.MultiHeadAttention.__init__", _attention_bias_dropped),
    "logits_bias_dropped": ("layers.Embedder.__init__", _logits_bias_dropped),
    "learned_positions_ignore_the_cache_offset": ("layers.Embedder.__init__", _learned_positions_from_0),
    "embedding_scaled_despite_scale_embedding_false": ("layers.Embedder.__init__", _scaled_anyway),
}
