"""The peer's model: ``nn.Transformer`` with a shared embedding and the tied output projection, and its weights
in the peer's own names (``params_of``, ``from_params``, ``save_weights``, ``load_weights``). See
``tools.peer_torch``."""

from __future__ import annotations

import contextlib
import math
import os
import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np
import safetensors
import safetensors.torch
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from spec import validate, weights_io
from spec.config import Config
from spec.schema import param_specs

FRAMEWORK = "torch.nn.Transformer"      # the safetensors metadata "framework" of the peer's files
INITS = ("default", "xavier")          # Transformer(..., init=): torch's own, or the PyTorch tutorial's


def native_bf16() -> bool:
    """Whether this CPU has bf16 dot-product instructions (avx512_bf16 or AMX, ``torch.cpu.get_capabilities``)."""
    caps = torch.cpu.get_capabilities()
    return bool(caps.get("avx512_bf16") or caps.get("amx_bf16"))


def positional_encoding(length: int, d_model: int) -> Tensor:
    """The sinusoidal table (section 3.5), (length, D) float32, sin and cos interleaved, positions from 0;
    computed in float64 and rounded once."""
    pos = torch.arange(length, dtype=torch.float64)[:, None]                  # (L, 1)
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64)                  # (D/2,)
    angle = pos / 10000.0 ** (two_i / d_model)                                # (L, D/2)
    return torch.stack([angle.sin(), angle.cos()], dim=-1).flatten(1).float()  # (L, D)


def host_ids(x: Any) -> np.ndarray:
    """Token ids (NumPy, nested lists or a torch tensor) as a host NumPy array, for ``spec.validate``."""
    if isinstance(x, Tensor):
        return x.detach().cpu().numpy()
    return np.asarray(x)


def to_tensor(ids: np.ndarray) -> Tensor:
    """Validated host ids -> an int64 tensor."""
    return torch.as_tensor(np.asarray(ids, dtype=np.int64))


def _check_config(c: Config) -> None:
    if c.d_k * c.n_heads != c.d_model or c.d_v * c.n_heads != c.d_model:
        raise ValueError(f"peer: nn.Transformer's heads are d_model / n_heads = {c.d_model / c.n_heads:g} wide; "
                         f"the config has d_k={c.d_k}, d_v={c.d_v}")


class Transformer(nn.Module):
    """``torch.nn.Transformer`` with a shared, tied embedding and the sinusoidal PE (module docstring).

    ``Transformer(config, seed=0, *, init="xavier")``: drawn with the CPU generator seeded from ``seed`` inside
    ``torch.random.fork_rng`` (the global RNG state is left as it was). ``init="xavier"`` (the default) re-draws
    every matrix, the embedding included, with ``xavier_uniform_``, the recipe of PyTorch's "Language Translation
    with nn.Transformer" tutorial, which a torch user translating follows; ``init="default"`` keeps torch's own
    initialisation, whose N(0, 1) embedding times sqrt(D)
    outweighs the unit-amplitude positional encoding sqrt(D) times (16 at D = 256), which slows the learning of
    anything positional (the tests' copy task). New models are in training mode, as any ``nn.Module``;
    ``from_params`` and ``load_weights`` return them in evaluation mode.
    ``model(src, tgt_in)``: (B, S), (B, T) ids -> logits (B, T, V) float32, in the model's current mode.

    Raises:
        ValueError: if d_k or d_v is not d_model / n_heads, ``seed`` is not a non-negative int, or ``init`` is
            not one of ``INITS``.
    """

    def __init__(self, config: Config, seed: int = 0, *, init: str = "xavier"):
        super().__init__()
        _check_config(config)
        if not validate.is_int(seed) or seed < 0:
            raise ValueError(f"seed must be a non-negative int, got {seed!r}")
        if init not in INITS:
            raise ValueError(f"init must be one of {INITS}, got {init!r}")
        c = self.config = config
        with torch.random.fork_rng(devices=[]):
            torch.default_generator.manual_seed(int(seed))
            self.embedding = nn.Embedding(c.vocab_size, c.d_model)
            self.dropout = nn.Dropout(c.dropout)
            self.transformer = nn.Transformer(
                d_model=c.d_model, nhead=c.n_heads, num_encoder_layers=c.n_encoder_layers,
                num_decoder_layers=c.n_decoder_layers, dim_feedforward=c.d_ff, dropout=c.dropout,
                batch_first=True, norm_first=c.norm_first, layer_norm_eps=c.layer_norm_eps)
            if init == "xavier":
                for p in self.parameters():
                    if p.dim() > 1:
                        nn.init.xavier_uniform_(p)
        self.register_buffer("pe", positional_encoding(c.max_len, c.d_model), persistent=False)

    # ------------------------------------------------------------- the pieces the forward and the searches share

    @contextlib.contextmanager
    def _autocast(self) -> Iterator[None]:
        """bf16 autocast on the CPU when ``config.dtype`` is bfloat16 and the CPU multiplies bf16 natively
        (``native_bf16``), else fp32 (emulated, autocast is many times slower). Under it the stock layers' fast
        paths for inference are off (``torch.backends.mha.set_fastpath_enabled``, restored after): they test
        ``torch.is_autocast_enabled()``, which asks about CUDA only, take the fast path under CPU autocast and fail
        ("expected scalar type Float but found BFloat16") in evaluation without gradients (torch 2.13)."""
        if self.config.dtype != "bfloat16" or not native_bf16():
            yield
            return
        fastpath = torch.backends.mha.get_fastpath_enabled()
        torch.backends.mha.set_fastpath_enabled(False)
        try:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                yield
        finally:
            torch.backends.mha.set_fastpath_enabled(fastpath)

    def _embed(self, ids: Tensor) -> Tensor:
        """(B, L) ids -> dropout(E[ids] * sqrt(D) + PE) (B, L, D)."""
        return self.dropout(self.embedding(ids) * math.sqrt(self.config.d_model) + self.pe[:ids.shape[1]])

    def _encode(self, src: Tensor) -> Tensor:
        """src (B, S) -> memory (B, S, D), padded source keys masked. In evaluation under ``inference_mode`` in
        fp32 the stock encoder takes its fast path (nested tensors; zeros at padded positions, which are masked)."""
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="The PyTorch API of nested tensors is in prototype stage")
            return self.transformer.encoder(self._embed(src), src_key_padding_mask=src == self.config.pad_id)

    def _decode(self, tgt: Tensor, memory: Tensor, src_pad: Tensor) -> Tensor:
        """tgt (B, T) ids, memory (B, S, D), src_pad (B, S) bool -> decoder output (B, T, D): causal mask,
        padded target and source keys masked."""
        T = tgt.shape[1]
        causal = torch.triu(torch.ones(T, T, dtype=torch.bool, device=tgt.device), diagonal=1)   # True: masked
        return self.transformer.decoder(self._embed(tgt), memory, tgt_mask=causal, tgt_is_causal=True,
                                        tgt_key_padding_mask=tgt == self.config.pad_id,
                                        memory_key_padding_mask=src_pad)

    def _project(self, h: Tensor) -> Tensor:
        """(..., D) -> logits (..., V) by the tied embedding, float32."""
        return F.linear(h, self.embedding.weight).float()

    def _logits(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        """Validated ids -> (B, T, V) float32 through ``nn.Transformer.forward`` (the stock call)."""
        c = self.config
        T = tgt_in.shape[1]
        causal = torch.triu(torch.ones(T, T, dtype=torch.bool, device=tgt_in.device), diagonal=1)
        src_pad, tgt_pad = src == c.pad_id, tgt_in == c.pad_id
        with self._autocast():
            h = self.transformer(self._embed(src), self._embed(tgt_in), tgt_mask=causal, tgt_is_causal=True,
                                 src_key_padding_mask=src_pad, tgt_key_padding_mask=tgt_pad,
                                 memory_key_padding_mask=src_pad)                          # (B, T, D)
            return self._project(h)                                                        # (B, T, V)

    def forward(self, src: Any, tgt_in: Any) -> Tensor:
        """Teacher forcing: src (B, S), tgt_in (B, T) ids -> logits (B, T, V) float32.

        Raises:
            ValueError: from ``spec.validate.check_forward``.
        """
        s, t = host_ids(src), host_ids(tgt_in)
        validate.check_forward(s, t, self.config)
        return self._logits(to_tensor(s), to_tensor(t))


@contextlib.contextmanager
def in_mode(model: nn.Module, training: bool) -> Iterator[None]:
    """``model`` in training or evaluation mode for the block, then every submodule back in its own mode."""
    modes = [(m, m.training) for m in model.modules()]
    model.train(training)
    try:
        yield
    finally:
        for m, mode in modes:
            m.training = mode


# ------------------------------------------------------------------------------------------------ weights

def params_of(model: Transformer) -> dict[str, np.ndarray]:
    """The peer's parameters as ``{state_dict key: float32 NumPy copy}``, in ``state_dict`` order."""
    return {k: v.detach().cpu().float().numpy().copy() for k, v in model.state_dict().items()}


def _names(config: Config) -> dict[str, tuple[int, ...]]:
    """The peer's parameter names and shapes for ``config`` (built on the meta device: nothing allocated)."""
    with torch.device("meta"):
        return {k: tuple(v.shape) for k, v in Transformer(config).state_dict().items()}


def from_params(config: Config, params: dict[str, np.ndarray]) -> Transformer:
    """A model holding ``params`` (the peer's own names, as ``params_of`` gives), in evaluation mode, fp32.

    Raises:
        ValueError: naming the first parameter missing, unexpected, of the wrong shape or non-finite; a
            canonical (``spec.schema``) parameter set is refused with its own message.
    """
    _check_config(config)
    want = _names(config)
    canonical = {s.name for s in param_specs(config)}
    if set(params) == canonical:
        raise ValueError("peer: these are canonical spec.schema parameters (e.g. spec.init_params); the stock peer "
                         "has its own names and initialisation: build it with Transformer(config, seed)")
    missing = [k for k in want if k not in params]
    if missing:
        raise ValueError(f"peer: missing parameter {missing[0]!r} ({len(missing)} missing in all)")
    unexpected = [k for k in params if k not in want]
    if unexpected:
        raise ValueError(f"peer: unexpected parameter {unexpected[0]!r} ({len(unexpected)} unexpected in all)")
    tensors = {}
    for k, shape in want.items():
        a = np.asarray(params[k], dtype=np.float32)
        if a.shape != shape:
            raise ValueError(f"peer: parameter {k!r}: expected shape {shape}, got {a.shape}")
        if not np.isfinite(a).all():
            raise ValueError(f"peer: parameter {k!r} holds non-finite values")
        tensors[k] = torch.from_numpy(a.copy())
    with torch.device("meta"):
        model = Transformer(config)
    model.load_state_dict(tensors, strict=True, assign=True)
    model.pe = positional_encoding(config.max_len, config.d_model)    # the buffer was built on the meta device
    return model.eval()


def save_weights(model: Transformer, path: str | os.PathLike) -> None:
    """The ``state_dict`` (fp32) as safetensors, the config as JSON in the metadata key ``"config"`` (as
    ``spec.weights_io``), ``"framework"``: ``FRAMEWORK``."""
    tensors = {k: v.detach().cpu().float().contiguous() for k, v in model.state_dict().items()}
    safetensors.torch.save_file(tensors, str(path), metadata={"config": model.config.to_json(),
                                                              "framework": FRAMEWORK})


def load_weights(path: str | os.PathLike, config: Config | None = None) -> Transformer:
    """A model from a file ``save_weights`` wrote, in evaluation mode; ``config`` defaults to the stored one
    (``spec.weights_io.config_for``: a config differing where the weights do not depend on it is used, with a
    warning).

    Raises:
        ValueError: naming the file if it is unreadable or holds no valid config, naming the field if ``config``
            differs where the weights depend on it, or naming the parameter as ``from_params``.
    """
    c = weights_io.config_for(path, weights_io.read_config(path), config)
    try:
        tensors = safetensors.torch.load_file(str(path))
    except (OSError, safetensors.SafetensorError) as e:
        raise ValueError(f"{path}: corrupt safetensors file ({e})") from e
    return from_params(c, {k: v.numpy() for k, v in tensors.items()})
