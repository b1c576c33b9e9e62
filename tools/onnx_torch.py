"""ONNX export of an ``impl_torch.Transformer`` (greedy translation over the graphs: ``tools.onnx_translate``)::

    python -m tools.onnx_torch model.safetensors out/      # out/encoder.onnx, out/decoder.onnx

    from tools import onnx_torch as X, onnx_translate as R
    X.export(model, "out")                                 # an impl_torch.Transformer computing in float32
    sessions = R.sessions("out")                           # ONNX Runtime, CPU: no torch needed from here on
    tokens = R.greedy(sessions, src)                       # (B, L) int64, as spec.search.greedy_search

Two graphs, float32, opset 17, dynamic batch (B), source length (S), new tokens (n) and cache length (t), the
KV cache laid out as ``impl_torch.KVCache`` holds it (heads-major, l = decoder layer):

* ``encoder.onnx``: ``src`` (B, S) int64 -> ``memory`` (B, S, D) float32, ``memory_mask`` (B, S) bool (True at
  a non-pad position), ``memory_k.l`` (B, H, S, K), ``memory_v.l`` (B, H, S, C): the cross-attention K/V.
* ``decoder.onnx``: n new ``tokens`` (B, n) int64 at position t, with ``memory_mask`` and ``memory_k.l`` /
  ``memory_v.l`` from the encoder and the cache ``key_mask`` (B, t) bool, ``self_k.l`` (B, H, t, K),
  ``self_v.l`` (B, H, t, C) -> ``logits`` (B, n, V) float32, ``length`` () int64 = t + n, and the cache holding
  the new positions: ``next_key_mask`` (B, t + n), ``next_self_k.l``, ``next_self_v.l``. The empty cache has
  t = 0. The cache grows by concatenation rather than into a preallocated capacity: ONNX has no in-place
  buffers, and a grown cache needs no capacity chosen ahead.

Both graphs carry the model's config as JSON in their metadata (``config``), so ``greedy`` knows the special
ids and ``max_len``. The exporter is TorchScript's (``torch.onnx.export(dynamo=False)``): the dynamo exporter
needs onnxscript besides. It traces the model's public ``encode`` and ``decode``, whose id checks run on a NumPy
host copy the trace cannot follow: they check the trace's example inputs, and ``greedy`` checks each input on the
host before a graph runs.

Not exported: bfloat16 compute. The graph exports, but ONNX Runtime's CPU provider (1.32) refuses it when the
session is created: ``NOT_IMPLEMENTED : Could not find an implementation for Add(14) node with name
'/encoder/layers.0/Add'``. Parameters stored in bf16 (``param_dtype``) with float32 compute export as float32,
which is exact (a bf16 value is an fp32 value). Checked by ``tools/tests/test_onnx_torch.py`` on the CPU
provider only.
"""

from __future__ import annotations

import argparse
import copy
import os
import warnings
from pathlib import Path
from typing import Any

from spec import weights_io
from spec.config import Config
from spec.data_parallel_cli import HelpFormatter

ENCODER, DECODER = "encoder.onnx", "decoder.onnx"
OPSET = 17  # the first with LayerNormalization, which the layer norm exports to (``_export``)


def names(config: Config) -> dict[str, list[str]]:
    """The graphs' input and output names, in the order the graphs take and give them."""
    layers = range(config.n_decoder_layers)
    memory = [f"memory_{kv}.{i}" for i in layers for kv in "kv"]
    cache = ["key_mask", *(f"self_{kv}.{i}" for i in layers for kv in "kv")]
    return {"encoder_in": ["src"], "encoder_out": ["memory", "memory_mask", *memory],
            "decoder_in": ["tokens", "memory_mask", *cache, *memory],
            "decoder_out": ["logits", "length", *(f"next_{n}" for n in cache)]}


def check_export(model: Any, folder: str | os.PathLike) -> None:
    """Refuse what cannot be exported, before anything is traced or written.

    Raises:
        ValueError: a model that is not an ``impl_torch.Transformer`` (a ``LanguageModel`` has no encoder), a
            ``config.dtype`` other than float32 (module docstring: ONNX Runtime's CPU provider runs no bf16), or
            a ``folder`` that exists and is not a directory.
    """
    import impl_torch

    if not isinstance(model, impl_torch.Transformer):
        raise ValueError(f"model: an impl_torch.Transformer is exported, got {type(model).__name__}")
    if model.config.dtype != "float32":
        raise ValueError(f"config.dtype={model.config.dtype!r}: only float32 compute exports (ONNX Runtime's CPU "
                         f"provider has no bfloat16 kernels); build the model with config.replace(dtype='float32')")
    if Path(folder).exists() and not Path(folder).is_dir():
        raise ValueError(f"folder: {folder} exists and is not a directory")


def export(model: Any, folder: str | os.PathLike) -> tuple[Path, Path]:
    """Write ``encoder.onnx`` and ``decoder.onnx`` (module docstring) for ``model`` into ``folder`` (created).

    The model is left as it was: a float32 CPU copy is traced (weights stored in bf16 are cast exactly).

    Returns:
        (the encoder's path, the decoder's path).
    Raises:
        ValueError: from ``check_export``.
    """
    check_export(model, folder)
    import torch

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    model = copy.deepcopy(model).to("cpu", torch.float32)
    c, n = model.config, names(model.config)
    # Trace sizes that differ from each other and from 0 and 1, so that no axis is mistaken for another; the
    # values do not matter to a trace.
    src = torch.full((2, 5), c.eos_id)
    src[1, 4] = c.pad_id
    with torch.no_grad():
        enc = _export(model, _encoder, (src,), folder / ENCODER, n["encoder_in"], n["encoder_out"])
        _, memory_mask, *memory = _encoder(model, src)
        tokens = torch.full((2, 4), c.bos_id)
        past = [torch.zeros(2, c.n_heads, 3, c.d_k if kv == "k" else c.d_v) for kv in "kv" * c.n_decoder_layers]
        cache = (torch.ones(2, 3, dtype=torch.bool), *past)
        dec = _export(model, _decoder, (tokens, memory_mask, *cache, *memory), folder / DECODER,
                      n["decoder_in"], n["decoder_out"])
    return enc, dec


def _encoder(model: Any, src: Any) -> tuple[Any, ...]:
    """src (B, S) int64 -> (memory (B, S, D), memory_mask (B, S), memory_k.0, memory_v.0, ...), as
    ``Transformer.encode`` and ``init_cache`` compute them."""
    from impl_torch import stacks

    memory = model.encode(src)
    kv = [t for layer in model.decoder.layers for t in layer.cross_attn.project_kv(memory)]
    return (memory, stacks.key_padding_mask(src, model.config.pad_id), *kv)


def _decoder(model: Any, tokens: Any, memory_mask: Any, key_mask: Any, *kv: Any) -> tuple[Any, ...]:
    """One ``Transformer.decode`` of tokens (B, n) over a cache of t positions (``names``' order) -> (logits,
    length, next_key_mask, next_self_k.0, next_self_v.0, ...)."""
    import torch

    from impl_torch import stacks

    L, n = model.config.n_decoder_layers, tokens.shape[1]
    # impl_torch's decode writes the new positions into a preallocated buffer; the buffer here is the cache given
    # with n empty positions appended, so the traced code is the model's own, writes included.
    grow = lambda t: torch.cat([t, t.new_zeros(t.shape[0], t.shape[1], n, t.shape[3])], 2)  # noqa: E731
    pairs = lambda ts: [(ts[2 * i], ts[2 * i + 1]) for i in range(L)]  # noqa: E731
    cache = stacks.KVCache(self_kv=pairs([grow(t) for t in kv[:2 * L]]),
                           key_mask=torch.cat([key_mask, torch.zeros_like(tokens, dtype=torch.bool)], 1),
                           memory_kv=pairs(kv[2 * L:]), memory_mask=memory_mask, length=key_mask.shape[1])
    logits, cache = model.decode(tokens, cache)
    length = torch.ones_like(cache.key_mask[0], dtype=torch.int64).sum()  # t + n as a tensor the trace follows
    return (logits, length, cache.key_mask, *(t for pair in cache.self_kv for t in pair))


def _export(model: Any, fn: Any, args: tuple, path: Path, inputs: list[str], outputs: list[str]) -> Path:
    """Trace ``fn(model, *args)`` to ``path`` with every axis but the feature axes dynamic, the config in the
    metadata."""
    import onnx
    import torch

    class Graph(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, *xs: Any) -> tuple[Any, ...]:
            return fn(self.model, *xs)

    # The exporter's own layer_norm needs its normalized shape constant, and the trace records x.shape[-1:] as a
    # computed shape; the model normalises over the last axis alone, which LayerNormalization's axis=-1 says.
    def layer_norm(g: Any, x: Any, shape: Any, w: Any, b: Any, *_: Any) -> Any:
        return g.op("LayerNormalization", x, w, b, epsilon_f=model.config.layer_norm_eps, axis_i=-1)

    torch.onnx.register_custom_op_symbolic("aten::layer_norm", layer_norm, OPSET)
    try:
        with warnings.catch_warnings():
            # sqrt(D) and sqrt(d_k) are read off static feature axes, constants in every graph; the TorchScript
            # exporter itself is deprecated in favour of the dynamo one, which needs onnxscript.
            warnings.filterwarnings("ignore", "Converting a tensor to a Python float")
            warnings.filterwarnings("ignore", "You are using the legacy TorchScript-based ONNX export")
            warnings.filterwarnings("ignore", "The feature will be removed")  # the exporter's own logging setup
            # The id checks of encode and decode, on a host copy (module docstring): constants to the trace.
            for host in ("Converting a tensor to a NumPy array", "Converting a tensor to a Python boolean",
                         "torch.as_tensor results are registered as constants"):
                warnings.filterwarnings("ignore", host, torch.jit.TracerWarning)
            torch.onnx.export(Graph(), args, str(path), dynamo=False, opset_version=OPSET, input_names=inputs,
                              output_names=outputs, dynamic_axes=_dynamic_axes(inputs + outputs))
    finally:
        torch.onnx.unregister_custom_op_symbolic("aten::layer_norm", OPSET)
    proto = onnx.load(str(path))
    onnx.helper.set_model_props(proto, {"config": model.config.to_json()})
    onnx.save(proto, str(path))
    return path


def _dynamic_axes(all_names: list[str]) -> dict[str, dict[int, str]]:
    """Each named tensor's dynamic axes: batch, and the length axis (S, n or t; K/V heads-major, axis 2)."""
    axes = {"src": "S", "memory": "S", "memory_mask": "S", "tokens": "n", "logits": "n", "key_mask": "t",
            "next_key_mask": "t_next"}
    out = {}
    for name in all_names:
        if name == "length":
            continue
        if name.startswith(("memory_k", "memory_v")):
            out[name] = {0: "B", 2: "S"}
        elif "self_" in name:
            out[name] = {0: "B", 2: "t_next" if name.startswith("next_") else "t"}
        else:
            out[name] = {0: "B", 1: axes[name]}
    return out


def main(argv: list[str] | None = None) -> tuple[Path, Path]:
    """The command line: a canonical weights file -> the two graphs in a folder, computing in float32."""
    p = argparse.ArgumentParser(prog="python -m tools.onnx_torch", description=__doc__, formatter_class=HelpFormatter)
    p.add_argument("weights", type=Path, help="a canonical safetensors file (any backend's save_weights)")
    p.add_argument("out", type=Path, help=f"the folder to write {ENCODER} and {DECODER} into")
    args = p.parse_args(argv)
    import impl_torch

    config = weights_io.read_config(args.weights).replace(dtype="float32")
    with warnings.catch_warnings():  # the stored dtype is bf16 compute, as a rule: float32 is what this exports
        warnings.filterwarnings("ignore", ".*using the given config", UserWarning)
        model = impl_torch.load_weights(args.weights, config)
    paths = export(model, args.out)
    print(*paths, sep="\n")
    return paths


if __name__ == "__main__":
    main()
