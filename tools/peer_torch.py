"""The stock peer: ``torch.nn.Transformer`` as a torch user builds and trains it, behind the subset of the common
API (``spec.api``) that the translation demo's training loop (``text.train``, ``text.translate``) calls, so the
loop drives it exactly like ``impl_torch``::

    import spec
    from tools import peer_torch as P

    config = spec.preset("mini")
    model = P.Transformer(config, seed=0)               # torch's own default initialisation, seeded
    state = P.init_train_state(model, spec.training.TrainConfig(warmup_steps=400, lr_scale=0.5), seed=0)
    loss, model, state = P.train_step(model, state, src, tgt_in, tgt_out)   # NumPy int64 (B, S), (B, T)
    tokens = P.beam_search(model, src)                  # (B, L) int64 NumPy: beam 4, alpha 0.6, EOS included

The model: ``nn.Transformer`` at the config's hyperparameters (post-LN unless ``norm_first``, ReLU,
``layer_norm_eps``, ``batch_first``, dropout ``config.dropout`` inside the stock layers), one ``nn.Embedding``
shared by source, target and the tied output projection, scaled by sqrt(d_model), plus the sinusoidal positional
encoding and dropout after the sum; a causal target mask and key padding masks for source and target pad ids.
What the stock module is, and the paper's model is not: the heads are d_model / n_heads wide (a config whose
d_k or d_v differs is refused), and ``nn.Transformer`` always puts a final LayerNorm on each stack, post-LN too.
Initialisation: ``nn.Transformer``'s Xavier-uniform on every matrix of the stack, and by default
(``init="xavier"``) on the embedding too, as PyTorch's translation tutorial does (``init="default"`` keeps
``nn.Embedding``'s N(0, 1)). Not ``spec.init_params``: the parameters have the peer's own names (the ``state_dict``
keys), which ``from_params``, ``params_of``, ``save_weights`` and ``load_weights`` speak; canonical parameters are
refused. ``save_train_state``/``load_train_state`` (the loop's checkpoints) keep Adam's moments, the step, the
config and the dropout generator, so a resumed run goes on bit for bit.

Precision: fp32 parameters whatever ``config.param_dtype``; for ``config.dtype == "bfloat16"`` every forward
(teacher-forced, training and search) runs under ``torch.autocast("cpu", torch.bfloat16)``; logits are returned
float32. Training: ``torch.optim.Adam`` (fused kernel) with a ``LambdaLR`` schedule giving
``spec.training.learning_rate(t, d_model, warmup_steps, scale=lr_scale)`` at step t = 1, 2, ...,
``nn.CrossEntropyLoss(ignore_index=pad_id, label_smoothing=...)`` on the fp32 logits. Dropout masks come from the
train state's ``torch.Generator`` (the stock layers draw from torch's global CPU generator, so each step runs
inside ``torch.random.fork_rng`` with the global state set from the state's generator and read back after);
construction likewise seeds inside ``fork_rng``: no global RNG state is left changed.

Search (``spec.search``'s algorithms): evaluation mode and ``torch.inference_mode`` whatever the model's mode
(restored after); the encoder runs once per search, the decoder over the whole prefix at every step (the stock
module has no KV cache); rows that have finished drop out of the batch. CPU only.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
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
from spec.search import length_penalty
from spec.training import TrainConfig, learning_rate

__version__ = "0.1"
FRAMEWORK = "torch.nn.Transformer"      # the safetensors metadata "framework" of the peer's files
INITS = ("default", "xavier")          # Transformer(..., init=): torch's own, or the PyTorch tutorial's


def positional_encoding(length: int, d_model: int) -> Tensor:
    """The sinusoidal table (section 3.5), (length, D) float32, sin and cos interleaved, positions from 0;
    computed in float64 and rounded once."""
    pos = torch.arange(length, dtype=torch.float64)[:, None]                  # (L, 1)
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64)                  # (D/2,)
    angle = pos / 10000.0 ** (two_i / d_model)                                # (L, D/2)
    return torch.stack([angle.sin(), angle.cos()], dim=-1).flatten(1).float()  # (L, D)


def _ids(x: Any) -> np.ndarray:
    """Token ids (NumPy, nested lists or a torch tensor) as a host NumPy array, for ``spec.validate``."""
    if isinstance(x, Tensor):
        return x.detach().cpu().numpy()
    return np.asarray(x)


def _tensor(ids: np.ndarray) -> Tensor:
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
        """bf16 autocast on the CPU when ``config.dtype`` is bfloat16. Under it the stock layers' inference fast
        paths are turned off for the block (``torch.backends.mha.set_fastpath_enabled``, restored after): they
        test ``torch.is_autocast_enabled()``, which asks about CUDA only, take the fast path under CPU autocast
        and fail ("expected scalar type Float but found BFloat16") in evaluation without gradients (torch 2.13)."""
        if self.config.dtype != "bfloat16":
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
        s, t = _ids(src), _ids(tgt_in)
        validate.check_forward(s, t, self.config)
        return self._logits(_tensor(s), _tensor(t))


@contextlib.contextmanager
def _mode(model: nn.Module, training: bool) -> Iterator[None]:
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


# ----------------------------------------------------------------------------------------------- training

@dataclasses.dataclass
class TrainState:
    """``step``: updates done; ``train_config``; ``optimizer``: ``torch.optim.Adam`` over the model's parameters;
    ``scheduler``: the ``LambdaLR`` giving equation 3 (times ``lr_scale``) at step ``step + 1``; ``rng``: the CPU
    ``torch.Generator`` the dropout masks are drawn from; ``loss_fn``: the label-smoothed cross-entropy;
    ``names``: the model's parameter names, in the optimizer's order; ``last_lr``: the learning rate of the last
    update (None before the first)."""

    step: int
    train_config: TrainConfig
    optimizer: torch.optim.Adam
    scheduler: torch.optim.lr_scheduler.LambdaLR
    rng: torch.Generator
    loss_fn: nn.CrossEntropyLoss
    names: list[str]
    last_lr: float | None = None


def _lr(tc: TrainConfig, d_model: int, step: int) -> float:
    """Equation 3 times ``lr_scale`` at step (from 1)."""
    return learning_rate(step, d_model, tc.warmup_steps, scale=getattr(tc, "lr_scale", 1.0))


def init_train_state(model: Transformer, train_config: TrainConfig | None = None, seed: int = 0) -> TrainState:
    """A fresh state: Adam (betas, eps of ``train_config``; fused) at step 0, the ``LambdaLR`` schedule of
    equation 3 times ``lr_scale``, the dropout generator seeded from ``seed``.

    Raises:
        ValueError: if ``seed`` is not a non-negative int.
    """
    if not validate.is_int(seed) or seed < 0:
        raise ValueError(f"seed must be a non-negative int, got {seed!r}")
    tc = TrainConfig() if train_config is None else train_config
    d_model = model.config.d_model
    # base lr 1: LambdaLR's factor is the learning rate itself; its epoch e (0 at construction) is step e + 1.
    names, params = zip(*model.named_parameters(), strict=True)
    optimizer = torch.optim.Adam(params, lr=1.0, betas=(tc.beta1, tc.beta2), eps=tc.adam_eps,
                                 fused=True)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda e: _lr(tc, d_model, e + 1))
    return TrainState(step=0, train_config=tc, optimizer=optimizer, scheduler=scheduler,
                      rng=torch.Generator().manual_seed(int(seed)),
                      loss_fn=nn.CrossEntropyLoss(ignore_index=model.config.pad_id,
                                                  label_smoothing=tc.label_smoothing),
                      names=list(names))


def train_step(model: Transformer, state: TrainState, src: Any, tgt_in: Any, tgt_out: Any
               ) -> tuple[Tensor, Transformer, TrainState]:
    """One Adam step in training mode -> (loss, model, state), both updated in place; the loss (0-d float32) is
    the batch's before the update. Every submodule is left in the mode it had.

    Raises:
        ValueError: from ``spec.validate.check_train_batch``, or if ``state`` was made for another model; before
            anything is computed.
    """
    s, ti, to = _ids(src), _ids(tgt_in), _ids(tgt_out)
    validate.check_train_batch(s, ti, to, model.config)
    held, own = state.optimizer.param_groups[0]["params"], list(model.parameters())
    if len(held) != len(own) or any(a is not b for a, b in zip(held, own, strict=True)):
        raise ValueError("train state: its optimizer holds another model's parameters")
    y = _tensor(to)                                                                      # (B, T)
    with _mode(model, True), torch.random.fork_rng(devices=[]):
        torch.default_generator.set_state(state.rng.get_state())
        logits = model._logits(_tensor(s), _tensor(ti))                                  # (B, T, V) float32
        loss = state.loss_fn(logits.flatten(0, 1), y.flatten())                          # () float32
        state.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        state.rng.set_state(torch.default_generator.get_state())
    state.last_lr = state.optimizer.param_groups[0]["lr"]
    state.optimizer.step()
    state.scheduler.step()
    state.step += 1
    return loss.detach(), model, state


def save_train_state(state: TrainState, path: str | os.PathLike) -> None:
    """Adam's moments as ``m.<name>``, ``v.<name>`` (the peer's names), the generator's state as ``rng``; metadata
    ``step``, ``train_config`` (JSON) and ``framework`` (the layout of ``spec.train_state_io``, the peer's names)."""
    names = _param_names(state)
    tensors: dict[str, Tensor] = {}
    for name, p in names.items():
        st = state.optimizer.state.get(p, {})
        for key, field in (("m", "exp_avg"), ("v", "exp_avg_sq")):
            tensors[f"{key}.{name}"] = st[field].float().contiguous() if field in st else torch.zeros_like(p)
    tensors["rng"] = state.rng.get_state()
    meta = {"step": str(state.step), "train_config": json.dumps(dataclasses.asdict(state.train_config)),
            "framework": FRAMEWORK}
    safetensors.torch.save_file(tensors, str(path), metadata=meta)


def load_train_state(path: str | os.PathLike, model: Transformer) -> TrainState:
    """The state ``save_train_state`` wrote, for ``model``: training goes on bit for bit as if uninterrupted.

    Raises:
        ValueError: naming the file if it is unreadable, or naming the first moment missing or misshapen.
    """
    try:
        with safetensors.safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
        tensors = safetensors.torch.load_file(str(path))
        step, tc = int(meta["step"]), TrainConfig(**json.loads(meta["train_config"]))
    except (OSError, safetensors.SafetensorError, KeyError, TypeError, ValueError) as e:
        raise ValueError(f"{path}: not a train state file ({e!r})") from e
    state = init_train_state(model, tc)
    for name, p in _param_names(state).items():
        for key in ("m", "v"):
            t = tensors.get(f"{key}.{name}")
            if t is None or t.shape != p.shape:
                raise ValueError(f"{path}: moment {key}.{name} is missing or not of shape {tuple(p.shape)}")
        if step > 0:
            state.optimizer.state[p] = {"step": torch.tensor(float(step), dtype=torch.float32),
                                        "exp_avg": tensors[f"m.{name}"].clone(),
                                        "exp_avg_sq": tensors[f"v.{name}"].clone()}
    if "rng" in tensors and meta.get("framework") == FRAMEWORK:
        state.rng.set_state(tensors["rng"])
    state.step = step
    state.scheduler.last_epoch = step
    for group in state.optimizer.param_groups:
        group["lr"] = _lr(tc, model.config.d_model, step + 1)
    state.scheduler._last_lr = [g["lr"] for g in state.optimizer.param_groups]
    return state


def _param_names(state: TrainState) -> dict[str, nn.Parameter]:
    """{name: parameter} of the optimizer's parameters, named as the model names them."""
    return dict(zip(state.names, state.optimizer.param_groups[0]["params"], strict=True))


# ------------------------------------------------------------------------------------------------- search

def _special_mask(c: Config) -> Tensor:
    """(V,) bool, True at pad and BOS: never generated."""
    mask = torch.zeros(c.vocab_size, dtype=torch.bool)
    mask[[c.pad_id, c.bos_id]] = True
    return mask


def _next_logits(model: Transformer, prefix: Tensor, memory: Tensor, src_pad: Tensor) -> Tensor:
    """prefix (N, t) ids from BOS, memory (N, S, D), src_pad (N, S) -> the last position's logits (N, V) fp32."""
    h = model._decode(prefix, memory, src_pad)                                            # (N, t, D)
    return model._project(h[:, -1])                                                       # (N, V)


def greedy_search(model: Transformer, src: Any, max_new_tokens: int | None = None) -> np.ndarray:
    """Greedy decoding (``spec.search.greedy_search``): src (B, S) ids -> tokens (B, L) int64 NumPy, EOS
    included, right-padded with pad; evaluation mode and ``inference_mode`` whatever the model's mode.

    Raises:
        ValueError: from ``spec.validate.check_source`` and ``generation_limits``.
    """
    c = model.config
    host = _ids(src)
    validate.check_source(host, c)
    limits = validate.generation_limits(host, c, max_new_tokens)
    B, L = len(limits), int(limits.max())
    with _mode(model, False), torch.inference_mode(), model._autocast():
        src_t = _tensor(host)
        src_pad = src_t == c.pad_id                                                       # (B, S)
        memory = model._encode(src_t)                                                     # (B, S, D)
        special = _special_mask(c)
        limit = torch.as_tensor(limits)
        out = torch.full((B, L), c.pad_id, dtype=torch.long)
        prefix = torch.full((B, 1), c.bos_id, dtype=torch.long)                           # (B, t)
        live = torch.arange(B)                                                            # rows still decoding
        for t in range(L):
            logits = _next_logits(model, prefix, memory, src_pad).masked_fill(special, -torch.inf)   # (n, V)
            tokens = logits.argmax(dim=-1)                                                # first of equal maxima
            out[live, t] = tokens
            going = (tokens != c.eos_id) & (t + 1 < limit[live])                          # (n,)
            if not going.any():
                out = out[:, :t + 1]
                break
            prefix = torch.cat([prefix, tokens[:, None]], dim=1)[going]
            memory, src_pad, live = memory[going], src_pad[going], live[going]
    return out.numpy()


def _stable_desc(x: Tensor) -> Tensor:
    """Indices sorting ``x`` (N, M) descending along the last axis; equal values keep index order."""
    return torch.sort(x, dim=-1, descending=True, stable=True).indices


def _stable_top(x: Tensor, n: int) -> Tensor:
    """``_stable_desc(x)[:, :n]`` without sorting all of x (N, M): ``topk``, then its n indices in the stable order;
    rows with a tie across the n-th value (-inf ones included) take the full stable sort."""
    values, idx = torch.topk(x, n, dim=-1)                                                # (N, n)
    idx = idx.sort(dim=-1).values
    idx = idx.gather(-1, _stable_desc(x.gather(-1, idx)))
    tied = (x >= values[:, -1:]).sum(dim=-1) != n                                        # (N,)
    if tied.any():
        idx[tied] = _stable_desc(x[tied])[:, :n]
    return idx


def beam_search(model: Transformer, src: Any, beam_size: int = 4, alpha: float = 0.6,
                max_new_tokens: int | None = None) -> np.ndarray:
    """Beam search (``spec.search``'s module docstring), batched over rows: src (B, S) -> tokens (B, L) int64
    NumPy, EOS included, right-padded with pad; evaluation mode and ``inference_mode`` whatever the model's mode.

    Raises:
        ValueError: from ``spec.validate.check_source``, ``generation_limits`` and ``check_beam``.
    """
    c = model.config
    host = _ids(src)
    validate.check_source(host, c)
    limits = validate.generation_limits(host, c, max_new_tokens)
    validate.check_beam(beam_size, alpha, limits)
    k, alpha, V = int(beam_size), float(alpha), c.vocab_size
    B, L = len(limits), int(limits.max())
    results: list[np.ndarray | None] = [None] * B
    neg_inf = torch.tensor(-torch.inf)
    with _mode(model, False), torch.inference_mode(), model._autocast():
        src_t = _tensor(host)
        src_pad = (src_t == c.pad_id).repeat_interleave(k, dim=0)                        # (B k, S)
        memory = model._encode(src_t).repeat_interleave(k, dim=0)                         # (B k, S, D)
        special = _special_mask(c)
        live = torch.arange(B)                                                            # rows still searching
        limit = torch.as_tensor(limits)                                                   # (B,)
        max_lp = torch.tensor([length_penalty(int(n), alpha) for n in limits], dtype=torch.float32)   # (B,)
        alive_seq = torch.zeros((B, k, 0), dtype=torch.long)                              # (n, k, t)
        alive_lp = torch.full((B, k), -torch.inf).index_fill(1, torch.tensor([0]), 0.0)  # (n, k) fp32
        fin_seq = torch.full((B, k, L), c.pad_id, dtype=torch.long)                       # (n, k, L)
        fin_score = torch.full((B, k), -torch.inf)                                        # (n, k)
        for t in range(1, L + 1):
            n = len(live)
            prefix = torch.cat([torch.full((n * k, 1), c.bos_id, dtype=torch.long),
                                alive_seq.flatten(0, 1)], dim=1)                          # (n k, t)
            logits = _next_logits(model, prefix, memory, src_pad)                         # (n k, V) fp32
            logp = torch.log_softmax(logits, dim=-1).masked_fill(special, -torch.inf)
            cand = (alive_lp[:, :, None] + logp.view(n, k, V)).flatten(1)                 # (n, k V)
            top = _stable_top(cand, 2 * k)                                                # (n, 2k)
            top_score = cand.gather(1, top)
            beam, tok = top // V, top % V
            seq = torch.cat([alive_seq.gather(1, beam[:, :, None].expand(-1, -1, t - 1)), tok[:, :, None]],
                            dim=2)                                                        # (n, 2k, t)
            is_eos = tok == c.eos_id
            lp_t = torch.tensor(length_penalty(t, alpha), dtype=torch.float32)

            alive_score = torch.where(is_eos, neg_inf, top_score)
            alive = _stable_desc(alive_score)[:, :k]                                      # (n, k)
            alive_seq = seq.gather(1, alive[:, :, None].expand(-1, -1, t))
            alive_lp = alive_score.gather(1, alive)

            new_score = torch.where(is_eos, top_score / lp_t, neg_inf)
            merged = torch.cat([fin_score, new_score], dim=1)                             # (n, 3k)
            keep = _stable_desc(merged)[:, :k]
            new_seq = F.pad(seq, (0, L - t), value=c.pad_id)                              # (n, 2k, L)
            fin_seq = torch.cat([fin_seq, new_seq], dim=1).gather(1, keep[:, :, None].expand(-1, -1, L))
            fin_score = merged.gather(1, keep)

            bound = alive_lp.max(dim=1).values / max_lp[live]                            # (n,) fp32
            stop = (t == limit[live]) | (fin_score.min(dim=1).values >= bound)
            for i in torch.nonzero(stop).flatten().tolist():
                b = int(live[i])
                if torch.isfinite(fin_score[i, 0]):
                    row = fin_seq[i, 0]
                    results[b] = row[:int(torch.nonzero(row == c.eos_id)[0, 0]) + 1].numpy()
                else:
                    results[b] = alive_seq[i, 0].numpy()
            going = ~stop
            if not going.any():
                break
            live, alive_seq, alive_lp, fin_seq, fin_score = (
                live[going], alive_seq[going], alive_lp[going], fin_seq[going], fin_score[going])
            beams = going.repeat_interleave(k)
            memory, src_pad = memory[beams], src_pad[beams]
    out = np.full((B, max(len(r) for r in results)), c.pad_id, np.int64)
    for b, r in enumerate(results):
        out[b, :len(r)] = r
    return out
