"""Shape and dtype of every layer's inputs and outputs, machine-readable.

Shapes are tuples of axis letters (see ``spec.config``) or the literal 1 for a
broadcast axis; dtypes are "act" (the config's ``dtype``), "float32", "bool"
or "int". ``LAYERS`` is the table; ``resolve`` turns an entry into concrete
shapes and dtypes, and ``intermediates`` lists what a full forward records.
"""

from __future__ import annotations

import numpy as np

from spec.config import Config

Entry = tuple[tuple[str | int, ...], str]

# name -> {"inputs": {...}, "outputs": {...}}; source: paper section.
LAYERS: dict[str, dict[str, dict[str, Entry]]] = {
    "positional_encoding": {  # section 3.5
        "inputs": {},
        "outputs": {"pe": (("L", "D"), "float32")}},
    "embedding": {  # section 3.4: E[ids] * sqrt(D) + PE
        "inputs": {"ids": (("B", "L"), "int")},
        "outputs": {"x": (("B", "L", "D"), "act")}},
    "scaled_dot_product_attention": {  # equation 1
        "inputs": {"q": (("B", "T", "H", "K"), "act"), "k": (("B", "S", "H", "K"), "act"),
                   "v": (("B", "S", "H", "C"), "act"), "mask": (("B", 1, "T", "S"), "bool")},
        "outputs": {"out": (("B", "T", "H", "C"), "act")}},
    "multi_head_attention": {  # section 3.2.2
        "inputs": {"x_q": (("B", "T", "D"), "act"), "x_kv": (("B", "S", "D"), "act"),
                   "mask": (("B", 1, "T", "S"), "bool")},
        "outputs": {"out": (("B", "T", "D"), "act")}},
    "add_norm": {  # section 3.1: LayerNorm(x + Sublayer(x)), y = Sublayer(x)
        "inputs": {"x": (("B", "L", "D"), "act"), "y": (("B", "L", "D"), "act")},
        "outputs": {"out": (("B", "L", "D"), "act")}},
    "feed_forward": {  # equation 2; hidden (B, L, F)
        "inputs": {"x": (("B", "L", "D"), "act")},
        "outputs": {"out": (("B", "L", "D"), "act")}},
    "encoder_layer": {  # section 3.1
        "inputs": {"x": (("B", "S", "D"), "act"), "mask": (("B", 1, 1, "S"), "bool")},
        "outputs": {"out": (("B", "S", "D"), "act")}},
    "decoder_layer": {  # section 3.1
        "inputs": {"y": (("B", "T", "D"), "act"), "memory": (("B", "S", "D"), "act"),
                   "self_mask": (("B", 1, "T", "T"), "bool"), "memory_mask": (("B", 1, 1, "S"), "bool")},
        "outputs": {"out": (("B", "T", "D"), "act")}},
    "encoder": {
        "inputs": {"src": (("B", "S"), "int")},
        "outputs": {"memory": (("B", "S", "D"), "act")}},
    "decoder": {
        "inputs": {"tgt_in": (("B", "T"), "int"), "memory": (("B", "S", "D"), "act")},
        "outputs": {"hidden": (("B", "T", "D"), "act")}},
    "output_projection": {  # section 3.4, tied to the embedding
        "inputs": {"h": (("B", "T", "D"), "act")},
        "outputs": {"logits": (("B", "T", "V"), "float32")}},
}


def sizes(c: Config, **dims: int) -> dict[str, int]:
    """Axis letter -> size: the config's D, H, K, C, F, V plus the given B, S, T, L."""
    return {"D": c.d_model, "H": c.n_heads, "K": c.d_k, "C": c.d_v, "F": c.d_ff, "V": c.vocab_size, **dims}


def resolve(entry: Entry, c: Config, **dims: int) -> tuple[tuple[int, ...], str]:
    """A table entry as (concrete shape, concrete dtype name)."""
    axes, dtype = entry
    n = sizes(c, **dims)
    shape = tuple(a if isinstance(a, int) else n[a] for a in axes)
    return shape, c.dtype if dtype == "act" else dtype


def decoder_sublayers(c: Config) -> tuple[str, ...]:
    """A decoder layer's sublayers in order: without cross-attention in a decoder-only model."""
    return ("self_attn", "ffn") if c.decoder_only else ("self_attn", "cross_attn", "ffn")


def dropout_sites(c: Config) -> list[str]:
    """Where dropout applies in training (section 5.4, ``spec.training``), in the order a forward reaches them: the
    embedding sums of both stacks and every sublayer's output, before its residual sum; never attention weights.
    A decoder-only model has the decoder's only."""
    sites = [] if c.decoder_only else ["src_embed"]
    sites += [f"encoder.layers.{i}.{sub}" for i in range(c.n_encoder_layers) for sub in ("self_attn", "ffn")]
    sites += ["tgt_embed"]
    sites += [f"decoder.layers.{i}.{sub}" for i in range(c.n_decoder_layers) for sub in decoder_sublayers(c)]
    return sites


def intermediates(c: Config, B: int, S: int, T: int, dropout: bool = False
                  ) -> dict[str, tuple[tuple[int, ...], str]]:
    """Every tensor a full forward records (``spec.reference.forward`` inside ``spec.recording.recording()``):
    name -> (shape, dtype). A dropout site's tensor is its value after dropout; a forward with dropout (an ``rng``,
    ``dropout``) also records each site's keep mask as ``<site>.keep``, bool, True where the element was kept.
    A decoder-only model (``LanguageModel``'s forward of tokens (B, T)) records no ``src_embed`` or ``encoder.*``;
    pass S=0."""
    act, out = c.dtype, {}
    if not c.decoder_only:
        out["src_embed"] = ((B, S, c.d_model), act)
    for i in range(c.n_encoder_layers):
        for sub in ("self_attn", "ffn"):
            out[f"encoder.layers.{i}.{sub}"] = ((B, S, c.d_model), act)
            out[f"encoder.layers.{i}.{sub}.residual"] = ((B, S, c.d_model), act)
        out[f"encoder.layers.{i}.out"] = ((B, S, c.d_model), act)
    if not c.decoder_only:
        out["encoder.out"] = ((B, S, c.d_model), act)
    out["tgt_embed"] = ((B, T, c.d_model), act)
    for i in range(c.n_decoder_layers):
        for sub in decoder_sublayers(c):
            out[f"decoder.layers.{i}.{sub}"] = ((B, T, c.d_model), act)
            out[f"decoder.layers.{i}.{sub}.residual"] = ((B, T, c.d_model), act)
        out[f"decoder.layers.{i}.out"] = ((B, T, c.d_model), act)
    out["decoder.out"] = ((B, T, c.d_model), act)
    out["logits"] = ((B, T, c.vocab_size), "float32")
    if dropout:
        out.update({f"{site}.keep": (out[site][0], "bool") for site in dropout_sites(c)})
    return out


# Shape buckets: a compiling backend (jax, tf) pads its inputs to these sizes so that varying shapes compile a
# bounded number of programs. Padding changes no real result: padded source keys are pad_id (masked, exactly zero
# weight), padded target positions come after the real ones (the causal mask hides them), added batch rows are
# all pad_id (every key masked: a finite, uniform attention) and are dropped with the padded positions.

def batch_bucket(b: int) -> int:
    """The padded batch for b >= 1 rows: the next power of two."""
    return 1 << (b - 1).bit_length()


def length_bucket(n: int, max_len: int) -> int:
    """The padded length for 1 <= n <= max_len positions: the next power of two, at least 8, at most max_len."""
    return min(max(8, 1 << (n - 1).bit_length()), max_len)


def pad_ids(ids: np.ndarray, batch: int, length: int, pad_id: int) -> np.ndarray:
    """Token ids (B, L) in the top left corner of a (batch, length) int32 array of ``pad_id``."""
    out = np.full((batch, length), pad_id, np.int32)
    out[:ids.shape[0], :ids.shape[1]] = ids
    return out
