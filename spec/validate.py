"""Input checks every backend runs before any computation.

Backends call these on host copies (``host_ids``) of their inputs so the
rules and the ``ValueError`` messages are identical everywhere. Token ids are
small; the copy costs one transfer per call.
"""

from __future__ import annotations

import math
import numbers

import numpy as np

from spec.config import Config


def host_ids(name: str, ids: object) -> np.ndarray:
    """Token ids given as a NumPy array or nested lists, as a NumPy array with their dtype kept (a framework's
    tensor is brought to the host by its impl first), for the checks below.

    Raises:
        ValueError: naming ``name`` if nested sequences are ragged (rows of different lengths).
    """
    try:
        return np.asarray(ids)
    except ValueError:  # NumPy's "inhomogeneous shape": say it in the spec's words
        raise ValueError(f"{name}: token ids must be a (batch, length) array, got rows of different lengths") from None


def check_tokens(name: str, ids: np.ndarray, c: Config, *, max_len: int | None = None) -> None:
    """Check a (B, L) batch of token ids.

    Raises:
        ValueError: naming ``name`` if ``ids`` is not an integer array, not of
            rank 2, has an empty batch or empty sequences, is longer than
            ``max_len`` (default ``c.max_len``), or holds an id outside
            ``[0, c.vocab_size)``.
    """
    ids = np.asarray(ids)
    max_len = c.max_len if max_len is None else max_len
    if ids.dtype == np.bool_ or not np.issubdtype(ids.dtype, np.integer):
        raise ValueError(f"{name}: token ids must be integers, got dtype {ids.dtype}")
    if ids.ndim != 2:
        raise ValueError(f"{name}: expected shape (batch, length), got rank {ids.ndim} shape {ids.shape}")
    if ids.shape[0] == 0:
        raise ValueError(f"{name}: batch is empty, shape {ids.shape}")
    if ids.shape[1] == 0:
        raise ValueError(f"{name}: sequences are empty, shape {ids.shape}")
    if ids.shape[1] > max_len:
        raise ValueError(f"{name}: length {ids.shape[1]} exceeds max_len {max_len}")
    lo, hi = int(ids.min()), int(ids.max())
    if lo < 0 or hi >= c.vocab_size:
        bad = lo if lo < 0 else hi
        raise ValueError(f"{name}: token id {bad} outside [0, vocab_size={c.vocab_size})")


def check_source(src: np.ndarray, c: Config) -> None:
    """``check_tokens`` for ``src`` (B, S), and no sequence all padding.

    Raises:
        ValueError: as ``check_tokens``, or if a source sequence is all
            ``pad_id`` (its encoder output would be undefined).
    """
    check_tokens("src", src, c)
    all_pad = np.flatnonzero((np.asarray(src) == c.pad_id).all(axis=1))
    if all_pad.size:
        raise ValueError(f"src: sequence {int(all_pad[0])} is all padding (pad_id={c.pad_id})")


def check_forward(src: np.ndarray, tgt_in: np.ndarray, c: Config) -> None:
    """Checks for ``forward(src, tgt_in)``: both batches valid and equal in size.

    Raises:
        ValueError: as ``check_source`` and ``check_tokens``, or if the batch
            sizes of ``src`` and ``tgt_in`` differ.
    """
    check_source(src, c)
    check_tokens("tgt_in", tgt_in, c)
    if np.shape(src)[0] != np.shape(tgt_in)[0]:
        raise ValueError(f"src and tgt_in batch sizes differ: {np.shape(src)[0]} vs {np.shape(tgt_in)[0]}")


def check_train_batch(src: np.ndarray, tgt_in: np.ndarray, tgt_out: np.ndarray, c: Config) -> None:
    """Checks for a training batch (``spec.training``'s loss of ``forward(src, tgt_in)`` against ``tgt_out``).

    Raises:
        ValueError: as ``check_forward`` and ``check_tokens``, if tgt_out's shape differs from tgt_in's, or if
            every target is ``pad_id`` (the loss is a mean over the non-pad targets).
    """
    check_forward(src, tgt_in, c)
    check_tokens("tgt_out", tgt_out, c)
    if np.shape(tgt_out) != np.shape(tgt_in):
        raise ValueError(f"tgt_out: shape {np.shape(tgt_out)} differs from tgt_in's {np.shape(tgt_in)}")
    if (np.asarray(tgt_out) == c.pad_id).all():
        raise ValueError("loss: every target is pad_id; the mean over non-pad positions is undefined")


def source_lengths(src: np.ndarray, c: Config) -> np.ndarray:
    """Number of non-pad tokens per source sequence, (B,) int64."""
    return (np.asarray(src) != c.pad_id).sum(axis=1).astype(np.int64)


def generation_limits(src: np.ndarray, c: Config, max_new_tokens: int | None, extra: int = 50) -> np.ndarray:
    """Per-sequence limit on generated tokens (EOS included), (B,) int64.

    Default: source length (non-pad tokens) + ``extra`` (50, paper section 6.1).
    ``max_new_tokens`` may be a Python or NumPy integer (not a bool).
    The decoder reads positions 0..limit-1, so a limit over ``c.max_len`` is
    an error, never silently cut.

    Raises:
        ValueError: if ``max_new_tokens`` is not a positive int, or a limit
            exceeds ``c.max_len``.
    """
    if max_new_tokens is None:
        limits = source_lengths(src, c) + extra
    else:
        if not is_int(max_new_tokens) or max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be a positive int, got {max_new_tokens!r}")
        limits = np.full(np.shape(src)[0], int(max_new_tokens), np.int64)
    if limits.max() > c.max_len:
        raise ValueError(
            f"generation may need {int(limits.max())} target positions but max_len is {c.max_len}; "
            f"pass max_new_tokens <= {c.max_len}")
    return limits


def is_int(x) -> bool:
    """A Python or NumPy integer, not a bool."""
    return isinstance(x, numbers.Integral) and not isinstance(x, (bool, np.bool_))


def check_beam(beam_size: int, alpha: float, limits: np.ndarray) -> None:
    """Checks for beam search with generation limits ``limits`` (B,) (from ``generation_limits``).

    ``beam_size`` may be a Python or NumPy integer, ``alpha`` any real number (not a bool).

    Raises:
        ValueError: unless ``beam_size`` is a positive int and ``alpha`` a finite
            number >= 0 whose length penalty ``((5 + L) / 6) ** alpha`` at the
            longest limit L is finite in float32 (a larger alpha would make every
            normalised score zero, and the choice meaningless).
    """
    if not is_int(beam_size) or beam_size < 1:
        raise ValueError(f"beam_size must be a positive int, got {beam_size!r}")
    if not isinstance(alpha, numbers.Real) or isinstance(alpha, (bool, np.bool_)) or not 0.0 <= alpha < math.inf:
        raise ValueError(f"alpha must be a finite float >= 0, got {alpha!r}")
    L = int(np.max(limits))
    try:
        penalty = ((5.0 + L) / 6.0) ** float(alpha)
    except OverflowError:
        penalty = math.inf
    if not penalty <= float(np.finfo(np.float32).max):
        raise ValueError(f"alpha={alpha!r} makes the length penalty ((5 + {L}) / 6) ** alpha overflow float32; "
                         f"use alpha <= {math.log(float(np.finfo(np.float32).max)) / math.log((5.0 + L) / 6.0):.4g}")


def check_capacity(capacity: int, c: Config) -> None:
    """A KV cache capacity (target positions): a Python or NumPy integer in [1, max_len].

    Raises:
        ValueError: naming the value, if it is not an int (bools are not) or lies outside [1, max_len].
    """
    if not is_int(capacity) or not 1 <= capacity <= c.max_len:
        raise ValueError(f"capacity must be an int in [1, max_len={c.max_len}], got {capacity!r}")


def check_decode(tokens: np.ndarray, c: Config, cache_batch: int, cache_length: int, capacity: int) -> None:
    """Checks for ``decode(tokens, cache)``: n new tokens (B, n) into a KV cache of batch ``cache_batch``
    holding ``cache_length`` of ``capacity`` positions.

    Raises:
        ValueError: as ``check_tokens`` (named ``tokens``), if the batch differs from the cache's, or if
            the cache has no room for n more positions.
    """
    check_tokens("tokens", tokens, c)
    B, n = np.shape(tokens)
    if B != cache_batch:
        raise ValueError(f"tokens: batch {B} differs from the cache's {cache_batch}")
    if cache_length + n > capacity:
        raise ValueError(f"tokens: {n} new positions after {cache_length} exceed the cache capacity {capacity}")


def check_model_kind(c: Config, decoder_only: bool) -> None:
    """A config for the model being built: ``Transformer`` (encoder-decoder) or ``LanguageModel`` (decoder-only).

    Raises:
        ValueError: naming the other class, if ``c.decoder_only`` is not ``decoder_only``.
    """
    if c.decoder_only and not decoder_only:
        raise ValueError("config: n_encoder_layers=0 is a decoder-only model; build it as a LanguageModel")
    if decoder_only and not c.decoder_only:
        raise ValueError(f"config: a LanguageModel is decoder-only (n_encoder_layers=0), got n_encoder_layers="
                         f"{c.n_encoder_layers}; build an encoder-decoder as a Transformer")


def check_lm_batch(tokens: np.ndarray, c: Config) -> None:
    """Checks for next-token prediction on tokens (B, T): inputs ``tokens[:, :-1]``, targets ``tokens[:, 1:]``.

    Raises:
        ValueError: as ``check_tokens`` (named ``tokens``), if T < 2, or if every target is ``pad_id``.
    """
    check_tokens("tokens", tokens, c)
    if np.shape(tokens)[1] < 2:
        raise ValueError(f"tokens: next-token prediction needs a length >= 2, got shape {np.shape(tokens)}")
    if (np.asarray(tokens)[:, 1:] == c.pad_id).all():
        raise ValueError("loss: every target is pad_id; the mean over non-pad positions is undefined")


def check_prompt(prompt: np.ndarray, c: Config, max_new_tokens: int) -> np.ndarray:
    """Checks for ``generate``: prompts (B, L), right-padded with ``pad_id``, and the tokens to add. Returns each
    row's prompt length (B,) int64.

    Raises:
        ValueError: as ``check_tokens`` (named ``prompt``), for a row that is all padding (an empty prompt) or has
            ``pad_id`` before a token (prompts are right-padded), a ``max_new_tokens`` that is not a positive int,
            or a row whose length plus ``max_new_tokens`` exceeds ``max_len`` (never silently cut).
    """
    check_tokens("prompt", prompt, c)
    real = np.asarray(prompt) != c.pad_id
    lengths = real.sum(axis=1).astype(np.int64)
    if (lengths == 0).any():
        raise ValueError(f"prompt: row {int(np.flatnonzero(lengths == 0)[0])} is empty (all pad_id={c.pad_id})")
    gaps = np.flatnonzero((real != (np.arange(real.shape[1]) < lengths[:, None])).any(axis=1))
    if gaps.size:
        raise ValueError(f"prompt: row {int(gaps[0])} has pad_id={c.pad_id} before a token; prompts are "
                         f"right-padded")
    if not is_int(max_new_tokens) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be a positive int, got {max_new_tokens!r}")
    if int(lengths.max()) + int(max_new_tokens) > c.max_len:
        raise ValueError(f"prompt: a prompt of {int(lengths.max())} tokens and max_new_tokens={max_new_tokens} need "
                         f"{int(lengths.max()) + int(max_new_tokens)} positions but max_len is {c.max_len}")
    return lengths


def check_cache_size(batch: int, capacity: int, c: Config) -> None:
    """A decoder-only model's KV cache: ``batch`` an int >= 1, ``capacity`` as ``check_capacity``.

    Raises:
        ValueError: naming the value.
    """
    if not is_int(batch) or batch < 1:
        raise ValueError(f"batch must be an int >= 1, got {batch!r}")
    check_capacity(capacity, c)

