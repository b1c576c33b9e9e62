"""The jax bench: ``impl_jax`` and Flax's stock Transformer parts (``flax.nnx``), for ``bench.run``.

Every function returns a subject (or a zero-argument call) whose methods return only once the device is done
(``block_until_ready``; NumPy results are already on the host). Shapes: B batch, S source, T target length,
V vocabulary, D d_model.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import impl_jax
from bench.common import TRAIN, clock, peer_learning_rate
from spec.config import Config


def setup(device: str) -> dict[str, Any]:
    """Pin JAX to ``device`` ("cpu", or "cuda": JAX's GPU platform) with true fp32 products (no TF32) for the
    bench process; the environment to record: versions and the device's name."""
    import flax
    import jaxlib

    jax.config.update("jax_platforms", "cpu" if device == "cpu" else "cuda")
    jax.config.update("jax_default_matmul_precision", "highest")
    dev = jax.devices()[0]
    return {"jax": jax.__version__, "jaxlib": jaxlib.__version__, "flax": flax.__version__,
            "device_name": dev.device_kind, "platform_version": dev.client.platform_version}


def matmul(dtype: str, device: str, M: int, K: int, N: int) -> Any:
    """One jitted (M, K) x (K, N) product ``a @ b`` in ``dtype`` operands (bf16: XLA's native bf16 dot, bf16
    result), synchronised."""
    key_a, key_b = jax.random.split(jax.random.key(0))
    a = jax.random.normal(key_a, (M, K), jnp.float32).astype(dtype)  # (M, K)
    b = jax.random.normal(key_b, (K, N), jnp.float32).astype(dtype)  # (K, N)
    product = jax.jit(jnp.matmul)
    return lambda: product(a, b).block_until_ready()                   # (M, N)


class Ours:
    """``impl_jax`` through its public API only (``spec.api``)."""

    name = "impl_jax"

    def __init__(self, config: Config, params: dict[str, np.ndarray]):
        self.model, self.config, self.dtype = impl_jax.from_params(config, params), config, config.dtype

    def forward(self, src: np.ndarray, tgt_in: np.ndarray) -> None:
        self.model(src, tgt_in).block_until_ready()                                  # (B, T, V) fp32

    def greedy(self, src: np.ndarray, max_new_tokens: int) -> np.ndarray:
        return impl_jax.greedy_search(self.model, src, max_new_tokens)               # (B, L) int64

    def beam(self, src: np.ndarray, max_new_tokens: int, beam_size: int) -> np.ndarray:
        return impl_jax.beam_search(self.model, src, beam_size, 0.6, max_new_tokens)  # (B, L) int64

    def cached_steps(self, src: np.ndarray, n: int) -> list[float]:
        cache = self.model.init_cache(self.model.encode(src), src, n)
        tokens = jnp.full((src.shape[0], 1), self.config.bos_id, jnp.int32)        # (B, 1)
        times = []
        for _ in range(n):
            start = clock()
            logits, cache = self.model.decode(tokens, cache)                         # (B, 1, V)
            tokens = jnp.argmax(logits[:, -1], axis=-1)[:, None].block_until_ready()  # (B, 1)
            times.append(clock() - start)
        return times

    def recomputed_steps(self, src: np.ndarray, n: int) -> list[float]:
        prefix = np.full((src.shape[0], 1), self.config.bos_id, np.int64)            # (B, t)
        times = []
        for _ in range(n):
            start = clock()
            logits = self.model(src, prefix)                                         # (B, t, V)
            best = np.asarray(jnp.argmax(logits[:, -1], axis=-1))                    # (B,)
            times.append(clock() - start)
            prefix = np.concatenate([prefix, best[:, None]], axis=1)
        return times


def ours(config: Config, params: dict[str, np.ndarray], device: str) -> Ours:
    """``impl_jax.from_params(config, params)`` on the default device (``setup`` pinned the platform)."""
    return Ours(config, params)


def _flax_transformer(config: Config, dropout: float = 0.0) -> Any:
    """Flax's stock parts as a Transformer (``flax.nnx``: the API Flax recommends for new code): an ``nnx.Embed``
    shared by source and target with the tied output ``attend``, sinusoidal PE, post-LN layers of
    ``nnx.MultiHeadAttention``, ``nnx.Linear`` and ``nnx.LayerNorm``, ``nnx.Dropout(dropout)`` on the embeddings
    and each sublayer's output (the paper's places; a no-op at 0). bf16 is the Flax idiom ``dtype=jnp.bfloat16``
    (fp32 params, bf16 computation); Flax's default init."""
    from flax import nnx

    c = config
    dt, D, rngs = jnp.dtype(config.dtype), config.d_model, nnx.Rngs(0)

    def attention():
        return nnx.MultiHeadAttention(c.n_heads, D, qkv_features=c.n_heads * c.d_k, out_features=D,
                                      dtype=dt, deterministic=True, decode=False, rngs=rngs)

    def norm():
        return nnx.LayerNorm(D, epsilon=c.layer_norm_eps, dtype=dt, rngs=rngs)

    def ffn():
        return nnx.Sequential(nnx.Linear(D, c.d_ff, dtype=dt, rngs=rngs), nnx.relu,
                              nnx.Linear(c.d_ff, D, dtype=dt, rngs=rngs))

    class Layer(nnx.Module):
        def __init__(self, cross: bool):
            self.self_attn, self.self_norm, self.ffn, self.ffn_norm = attention(), norm(), ffn(), norm()
            self.cross_attn, self.cross_norm = (attention(), norm()) if cross else (None, None)
            self.drop = nnx.Dropout(dropout, rngs=rngs)

        def __call__(self, x, mask, memory=None, memory_mask=None):
            x = self.self_norm(x + self.drop(self.self_attn(x, mask=mask)))
            if self.cross_attn is not None:
                x = self.cross_norm(x + self.drop(self.cross_attn(x, memory, mask=memory_mask)))
            return self.ffn_norm(x + self.drop(self.ffn(x)))

    class Transformer(nnx.Module):
        def __init__(self):
            self.embed = nnx.Embed(c.vocab_size, D, dtype=dt, rngs=rngs)
            self.encoder = nnx.List([Layer(False) for _ in range(c.n_encoder_layers)])
            self.decoder = nnx.List([Layer(True) for _ in range(c.n_decoder_layers)])
            self.pe = nnx.Variable(impl_jax.layers.positional_encoding(c.max_len, D))  # (max_len, D) fp32
            self.drop = nnx.Dropout(dropout, rngs=rngs)

        def embed_tokens(self, ids):
            x = self.embed(ids) * jnp.sqrt(jnp.asarray(D, dt))
            return self.drop((x + self.pe[...][:ids.shape[1]]).astype(dt))  # (B, L, D)

        def __call__(self, src, tgt):
            src_keep = (src != c.pad_id)[:, None, None, :]                # (B, 1, 1, S)
            T = tgt.shape[1]
            causal = jnp.tril(jnp.ones((T, T), bool))[None, None] & (tgt != c.pad_id)[:, None, None, :]
            x = self.embed_tokens(src)
            for layer in self.encoder:
                x = layer(x, src_keep)
            y = self.embed_tokens(tgt)
            for layer in self.decoder:
                y = layer(y, causal, x, src_keep)
            return self.embed.attend(y).astype(jnp.float32)               # (B, T, V)

    return Transformer()


class Peer:
    """``_flax_transformer`` without dropout, the forward ``jax.jit``-compiled over the split state."""

    name = "flax.nnx.Transformer"

    def __init__(self, config: Config):
        from flax import nnx

        self.dtype = config.dtype
        graph, state = nnx.split(_flax_transformer(config))
        self.state = state
        self.program = jax.jit(  # the jitted forward (``bench.profile`` lowers it)
            lambda state, src, tgt: nnx.merge(graph, state)(src, tgt))

    def forward(self, src: np.ndarray, tgt_in: np.ndarray) -> None:
        self.program(self.state, jnp.asarray(src, jnp.int32), jnp.asarray(tgt_in, jnp.int32)).block_until_ready()


def peer(config: Config, device: str) -> Peer:
    """Flax's stock Transformer parts at ``config``'s sizes, in ``config.dtype``, with Flax's default init."""
    return Peer(config)


class PeerTrainer:
    """The peer's training step in Flax's functional idiom: ``_flax_transformer`` with dropout ``config.dropout``
    split into its ``nnx.Param``s and the rest (the dropout RNG), one ``jax.jit`` of merge, forward,
    ``optax.softmax_cross_entropy`` on ``optax.smooth_labels`` targets averaged over the non-pad ones (fp32
    logits), ``jax.value_and_grad`` and ``optax.adam`` at a constant learning rate (buffers donated); bf16 as
    ``dtype=jnp.bfloat16`` modules over fp32 params. ``float(loss)`` synchronises."""

    name = Peer.name

    def __init__(self, config: Config):
        import optax
        from flax import nnx

        self.dtype, pad, V = config.dtype, config.pad_id, config.vocab_size
        graph, params, rest = nnx.split(_flax_transformer(config, config.dropout), nnx.Param, ...)
        tx = optax.adam(peer_learning_rate(config), b1=TRAIN.beta1, b2=TRAIN.beta2, eps=TRAIN.adam_eps)

        def step(params, rest, opt_state, src, tgt_in, tgt_out):
            def loss_fn(params, rest):
                model = nnx.merge(graph, params, rest, copy=True)
                logits = model(src, tgt_in)                                          # (B, T, V) fp32
                q = optax.smooth_labels(jax.nn.one_hot(tgt_out, V), TRAIN.label_smoothing)  # (B, T, V)
                keep = tgt_out != pad                                                # (B, T)
                loss = jnp.sum(optax.softmax_cross_entropy(logits, q) * keep) / jnp.sum(keep)
                return loss, nnx.split(model, nnx.Param, ...)[2]                     # the advanced RNG
            (loss, rest), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, rest)
            updates, opt_state = tx.update(grads, opt_state, params)
            return loss, optax.apply_updates(params, updates), rest, opt_state

        self.state = params, rest, tx.init(params)
        self.program = jax.jit(step, donate_argnums=(0, 1, 2))  # the jitted step (``bench.profile`` lowers it)

    def step(self, src: np.ndarray, tgt_in: np.ndarray, tgt_out: np.ndarray) -> None:
        """src (B, S), tgt_in (B, T), tgt_out (B, T): one Adam step."""
        loss, *self.state = self.program(*self.state, *(jnp.asarray(a, jnp.int32) for a in (src, tgt_in, tgt_out)))
        float(loss)


def peer_trainer(config: Config, device: str) -> PeerTrainer:
    """The stock peer's own training step in ``config.dtype`` (mixed precision for bf16), fp32 master weights."""
    return PeerTrainer(config)
