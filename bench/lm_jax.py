"""The jax subjects of the decoder-only workloads (``bench.lm_run``): ``impl_jax.LanguageModel`` and a GPT-2 written
in Flax NNX with a KV cache, as the Flax examples write one (Flax ships no GPT), at the same sizes, random weights.

A subject returns once its result is on the host (``np.asarray``) or ready (``block_until_ready``).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import impl_jax
from bench.common import clock
from spec.config import Config


class Ours:
    """``impl_jax.from_params`` through the public API: ``init_cache``/``decode`` and ``generate``."""

    name = "impl_jax"

    def __init__(self, config: Config, params: dict[str, np.ndarray]):
        self.model, self.dtype = impl_jax.from_params(config, params), config.dtype

    def prefill(self, prompt: np.ndarray) -> None:
        cache = self.model.init_cache(len(prompt), prompt.shape[1])
        self.model.decode(prompt, cache)[0].block_until_ready()                         # (B, L, V) fp32

    def decode_steps(self, prompt: np.ndarray, n: int, capacity: int) -> list[float]:
        logits, cache = self.model.decode(prompt, self.model.init_cache(len(prompt), capacity))
        tokens, times = np.asarray(jnp.argmax(logits[:, -1:], axis=-1)), []              # (B, 1)
        for _ in range(n):
            start = clock()
            logits, cache = self.model.decode(tokens, cache)                             # (B, 1, V)
            tokens = np.asarray(jnp.argmax(logits[:, -1:], axis=-1))                     # (B, 1)
            times.append(clock() - start)
        return times

    def generate(self, prompt: np.ndarray, n: int) -> np.ndarray:
        return np.asarray(impl_jax.generate(self.model, prompt, n, temperature=0.0))     # (B, n)


def ours(config: Config, params: dict[str, np.ndarray], device: str) -> Ours:
    return Ours(config, params)


def _nnx_gpt(c: Config) -> Any:
    """GPT-2's layers from Flax's stock parts: ``nnx.Embed`` for tokens (tied to the head by ``attend``) and learned
    positions, pre-LN blocks of ``nnx.LayerNorm``, ``nnx.Linear`` (with biases) and GELU, attention by
    ``jax.nn.dot_product_attention`` over a fixed-capacity cache updated with ``lax.dynamic_update_slice``, a
    final LayerNorm. Weights and computation in ``c.dtype``; Flax's default init."""
    from flax import nnx

    dt, D, H, dk, rngs = jnp.dtype(c.dtype), c.d_model, c.n_heads, c.d_k, nnx.Rngs(0)

    def linear(i: int, o: int) -> nnx.Linear:
        return nnx.Linear(i, o, dtype=dt, param_dtype=dt, rngs=rngs)

    def norm() -> nnx.LayerNorm:
        return nnx.LayerNorm(D, epsilon=c.layer_norm_eps, dtype=dt, param_dtype=dt, rngs=rngs)

    class Block(nnx.Module):
        def __init__(self):
            self.ln1, self.qkv, self.proj = norm(), linear(D, 3 * H * dk), linear(H * dk, D)
            self.ln2, self.fc, self.out = norm(), linear(D, c.d_ff), linear(c.d_ff, D)

        def __call__(self, x, k, v, index):
            B, n, _ = x.shape                                                            # x (B, n, D)
            q, k_new, v_new = jnp.split(self.qkv(self.ln1(x)).reshape(B, n, 3 * H, dk), 3, axis=2)  # (B, n, H, dk)
            k = jax.lax.dynamic_update_slice(k, k_new, (0, index, 0, 0))                 # (B, cap, H, dk)
            v = jax.lax.dynamic_update_slice(v, v_new, (0, index, 0, 0))
            seen = jnp.arange(k.shape[1])[None, :] <= (index + jnp.arange(n))[:, None]   # (n, cap)
            y = jax.nn.dot_product_attention(q, k, v, mask=seen[None, None])             # (B, n, H, dk)
            x = x + self.proj(y.reshape(B, n, H * dk))
            return x + self.out(nnx.gelu(self.fc(self.ln2(x)))), k, v

    class GPT(nnx.Module):
        def __init__(self):
            self.wte = nnx.Embed(c.vocab_size, D, dtype=dt, param_dtype=dt, rngs=rngs)
            self.wpe = nnx.Embed(c.max_len, D, dtype=dt, param_dtype=dt, rngs=rngs)
            self.blocks = nnx.List([Block() for _ in range(c.n_decoder_layers)])
            self.ln_f = norm()

        def __call__(self, tokens, cache, index):
            """tokens (B, n) at positions index.., cache [(k, v)] per block -> logits (B, n, V) fp32, cache."""
            x = self.wte(tokens) + self.wpe(index + jnp.arange(tokens.shape[1]))[None]  # (B, n, D)
            new = []
            for block, (k, v) in zip(self.blocks, cache, strict=True):
                x, k, v = block(x, k, v, index)
                new.append((k, v))
            return self.wte.attend(self.ln_f(x)).astype(jnp.float32), new

    return GPT()


class Peer:
    """``_nnx_gpt`` split into graph and state, its call ``jax.jit``-compiled with the cache donated; ``generate``
    is greedy: the prefill and a ``lax.fori_loop`` of one-token steps in one compiled program."""

    name = "flax.nnx.GPT"

    def __init__(self, config: Config):
        from flax import nnx

        c = self.config = config
        self.dtype = c.dtype
        graph, self.state = nnx.split(_nnx_gpt(c))

        def step(state, tokens, cache, index):
            return nnx.merge(graph, state)(tokens, cache, index)

        def generate(state, prompt, n):
            B, L = prompt.shape
            logits, cache = step(state, prompt, self._cache(B, L + n), 0)
            out = jnp.zeros((B, n), jnp.int32).at[:, 0].set(jnp.argmax(logits[:, -1], axis=-1))

            def body(i, carry):
                out, cache = carry
                logits, cache = step(state, jax.lax.dynamic_slice_in_dim(out, i - 1, 1, axis=1), cache, L + i - 1)
                return out.at[:, i].set(jnp.argmax(logits[:, -1], axis=-1)), cache

            return jax.lax.fori_loop(1, n, body, (out, cache))[0]                        # (B, n)

        self._step = jax.jit(step, donate_argnums=2)
        self._generate = jax.jit(generate, static_argnums=2)

    def _cache(self, B: int, capacity: int) -> list[tuple[jax.Array, jax.Array]]:
        c = self.config
        shape = (B, capacity, c.n_heads, c.d_k)
        return [(jnp.zeros(shape, c.dtype), jnp.zeros(shape, c.dtype)) for _ in range(c.n_decoder_layers)]

    def prefill(self, prompt: np.ndarray) -> None:
        B, L = prompt.shape
        self._step(self.state, jnp.asarray(prompt, jnp.int32), self._cache(B, L), 0)[0].block_until_ready()

    def decode_steps(self, prompt: np.ndarray, n: int, capacity: int) -> list[float]:
        B, L = prompt.shape
        logits, cache = self._step(self.state, jnp.asarray(prompt, jnp.int32), self._cache(B, capacity), 0)
        tokens, times = np.asarray(jnp.argmax(logits[:, -1:], axis=-1)), []              # (B, 1)
        for i in range(n):
            start = clock()
            logits, cache = self._step(self.state, jnp.asarray(tokens, jnp.int32), cache, jnp.int32(L + i))
            tokens = np.asarray(jnp.argmax(logits[:, -1:], axis=-1))                     # (B, 1)
            times.append(clock() - start)
        return times

    def generate(self, prompt: np.ndarray, n: int) -> np.ndarray:
        return np.asarray(self._generate(self.state, jnp.asarray(prompt, jnp.int32), n))  # (B, n)


def peer(config: Config, device: str) -> Peer:
    return Peer(config)
