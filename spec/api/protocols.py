"""The contract's types (``spec.api``): the model protocols of the encoder-decoder and the decoder-only model, and
the KV cache every impl's ``decode`` takes and returns."""

from __future__ import annotations

from typing import Any, Protocol

from spec.config import Config

KV_CACHE_FIELDS = ("self_kv", "key_mask", "memory_kv", "memory_mask", "length")


class KVCache(Protocol):
    """The decoder's state for incremental decoding (section 3.1, a few positions per call), fields in the order of
    ``KV_CACHE_FIELDS``, heads-major as the attention products read them (docs/decisions.md, "The KV cache").

    Attributes:
        self_kv: per decoder layer a pair k (B, H, P, K), v (B, H, P, C) in ``config.dtype``, for P = capacity.
        key_mask: (B, P) bool, True at a written non-pad position.
        memory_kv: per decoder layer k (B, H, S, K), v (B, H, S, C): the encoder output's, computed once.
        memory_mask: (B, S) bool, True at a non-pad source position.
        length: the positions written.
    """

    self_kv: Any
    key_mask: Any
    memory_kv: Any
    memory_mask: Any
    length: Any


class Model(Protocol):
    """A Transformer of one impl: ``torch.nn.Module``, a JAX pytree, or a ``tf.Module``; ``config`` is the
    ``spec.config.Config`` it computes by."""

    config: Config

    def __call__(self, src: Any, tgt_in: Any, intermediates: bool = False, *, rng: Any = None) -> Any:
        """The teacher-forced forward pass (section 3, figure 1), without dropout unless given the framework's own
        RNG as the keyword-only ``rng=`` (never a global one, never the module's mode).

        Args:
            src: (B, S) int token ids; tgt_in: (B, T) int, the targets shifted right (BOS first).
            intermediates: also return the tensors of ``spec.shapes.intermediates`` (with dropout, ``dropout=True``:
                each site's keep mask too).
        Returns:
            logits (B, T, V) float32; with ``intermediates``, ``(logits, {name: tensor})``.
        Raises:
            ValueError: bad token ids, an all-padding source, batch sizes that differ (``spec.validate``).
        """

    def encode(self, src: Any) -> Any:
        """The encoder stack (section 3.1): src (B, S) int -> memory (B, S, D) in ``config.dtype``.

        Raises:
            ValueError: as ``__call__`` for ``src``.
        """

    def init_cache(self, memory: Any, src: Any, capacity: int) -> KVCache:
        """An empty ``KVCache`` for ``capacity`` target positions, the cross-attention K/V of ``memory`` computed.

        Args:
            memory: (B, S, D), ``encode(src)``; src: (B, S) int, for the key padding mask; capacity: P >= 1.
        Raises:
            ValueError: as ``encode`` for ``src``, or a capacity outside [1, max_len].
        """

    def decode(self, tokens: Any, cache: KVCache) -> tuple[Any, KVCache]:
        """n new target tokens at positions ``cache.length`` .. ``cache.length + n - 1`` (decoder of section 3.1).

        The cache passed in is consumed: go on with the returned one (torch writes the cache's buffers in place,
        returns a new cache over them and refuses the consumed one with a ``ValueError``; JAX and TensorFlow
        return a new cache and leave the passed one as it was).

        Args:
            tokens: (B, n) int; cache: from ``init_cache`` or the previous ``decode``.
        Returns:
            (logits (B, n, V) float32, the cache holding the n new positions).
        Raises:
            ValueError: bad token ids, a batch other than the cache's, or more positions than its capacity.
        """


class DecoderOnlyModel(Protocol):
    """A decoder-only language model of one impl (``LanguageModel``, ``config.decoder_only``): the decoder stack
    without cross-attention, pre-LN or post-LN as ``config.norm_first`` says, the tied embedding as the output
    projection."""

    config: Config

    def __call__(self, tokens: Any, intermediates: bool = False, *, rng: Any = None) -> Any:
        """The forward pass over whole sequences, causal and with a key padding mask, without dropout unless given
        the framework's own RNG as ``rng=`` (as ``Model.__call__``).

        Args:
            tokens: (B, T) int token ids; logits at position t predict token t + 1.
            intermediates: also return the tensors of ``spec.shapes.intermediates(config, B, 0, T)``.
        Returns:
            logits (B, T, V) float32; with ``intermediates``, ``(logits, {name: tensor})``.
        Raises:
            ValueError: bad token ids (``spec.validate.check_tokens``, named ``tokens``).
        """

    def init_cache(self, batch: int, capacity: int) -> KVCache:
        """An empty ``KVCache`` of ``capacity`` positions for ``batch`` sequences; ``memory_kv`` is empty and
        ``memory_mask`` None (no encoder).

        Raises:
            ValueError: a batch that is not an int >= 1, or a capacity outside [1, max_len].
        """

    def decode(self, tokens: Any, cache: KVCache) -> tuple[Any, KVCache]:
        """As ``Model.decode``: n new tokens at ``cache.length``.. (a prefill is the first call, with a whole
        prompt) -> (logits (B, n, V) float32, the cache holding them)."""
