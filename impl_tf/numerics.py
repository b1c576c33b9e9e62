"""How a product is computed in TensorFlow under the numerics contract of ``spec.numerics``.

Products with a parameter take bf16 operands, accumulate in fp32 and round once after the bias (``linear``).
The eager bf16 ``tf.matmul`` rounds its output to bf16, so it is never used. Two products meet the contract, with
the same result up to the order of fp32 summation: (a) under XLA, ``tf.matmul(..., output_type=tf.float32)`` on
bf16 operands; (b) an fp32 dot of the operands upcast to fp32 (the product of two bf16 values is exact in fp32).
``matmul_f32`` picks one per product from its static row count (``UPCAST_MIN_ROWS``): (b) runs at the fp32 GEMM
rate but converts the whole weight on every call, so it serves many rows (a forward, the encoder); (a) reads the
weight at half the bytes, so it serves few rows (a decode step). Eager TensorFlow has no kernel for (a), so
eagerly the operands are upcast (b). The measurements: docs/decisions-tf.md.

Parameters enter through ``round_to``, a rounding to the activation dtype held in fp32 with a straight-through
gradient, so weight gradients are fp32: the master weights' (``spec.training``).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator

import tensorflow as tf

# The fewest rows (the product's M: the activation's elements over the contracted axis) at which (b), the fp32
# dot of upcast operands, is used rather than (a), bf16 operands with an fp32 result (docs/decisions-tf.md).
UPCAST_MIN_ROWS = 128


def round_to(p: tf.Tensor | tf.Variable, dtype: tf.DType) -> tf.Tensor:
    """A parameter as it enters the computation (rule 0): rounded to ``dtype``, held in fp32 (same shape).

    Differentiable as a straight-through rounding: its fp32 gradient passes to ``p`` unchanged, the gradient of an
    fp32 master weight (``spec.training``), where autodiff of the casts would round it to ``dtype``.
    """
    @tf.custom_gradient
    def rounded(p: tf.Tensor) -> tuple[tf.Tensor, Callable]:
        return tf.cast(tf.cast(p, dtype), tf.float32), lambda dy: dy                      # p's shape
    return rounded(tf.convert_to_tensor(p))


def linear(x: tf.Tensor, w: tf.Tensor, bias: tf.Tensor | None = None, *, n_in: int = 1) -> tf.Tensor:
    """x (..., *I) times the parameter w (*I, *O) over the last ``n_in`` axes of x, plus bias (*O) -> (..., *O):
    fp32 accumulator, rounded once to x's dtype (rule 2), as ``np.tensordot(x, w, n_in)``."""
    batch = tf.shape(x)[:-n_in]
    y = matmul_f32(tf.reshape(x, tf.concat([batch, [-1]], 0)), tf.reshape(w, [math.prod(w.shape[:n_in]), -1]))
    if bias is not None:
        y += round_to(bias if bias.shape.rank == 1 else tf.reshape(bias, [-1]), x.dtype)  # as y's flat M1..Mb
    return tf.cast(tf.reshape(y, tf.concat([batch, w.shape[n_in:]], 0)), x.dtype)


def logits(x: tf.Tensor, table: tf.Tensor, bias: tf.Tensor | None = None) -> tf.Tensor:
    """The tied output product ``x E^T`` (section 3.4), plus ``bias`` (V) entering in x's dtype (rule 0): x (B, L, D),
    table (V, D) -> (B, L, V) float32, never rounded to x's dtype (rule 7)."""
    y = matmul_f32(x, table, transpose_b=True)
    return y if bias is None else y + round_to(bias, x.dtype)


def matmul_f32(a: tf.Tensor, b: tf.Tensor, transpose_b: bool = False) -> tf.Tensor:
    """``a @ b`` (batch dims broadcast) with an fp32 accumulator, returned in fp32 (module docstring).

    ``a`` is an activation (..., M, N); ``b`` a parameter (N, P) or (P, N), entering in a's dtype (``round_to``).
    """
    b = round_to(b, a.dtype)  # fp32, holding b in a's dtype

    def upcast() -> tf.Tensor:
        return tf.matmul(tf.cast(a, tf.float32), b, transpose_b=transpose_b)                # (..., P) fp32

    @tf.custom_gradient
    def bf16_operands(a: tf.Tensor, b: tf.Tensor) -> tuple[tf.Tensor, Callable]:
        # TensorFlow's gradient of a product with an fp32 result gives its bf16 operands fp32 cotangents; the
        # upcast product computes the same function, so its gradient is this one's (fp32 for b, a's rounded once).
        def grad(dy: tf.Tensor) -> list[tf.Tensor]:
            with tf.GradientTape() as tape:
                tape.watch([a, b])
                y = tf.matmul(tf.cast(a, tf.float32), b, transpose_b=transpose_b)           # (..., P) fp32
            return tape.gradient(y, [a, b], output_gradients=dy)                            # a's shape, b's
        y = tf.matmul(a, tf.cast(b, a.dtype), transpose_b=transpose_b, output_type=tf.float32)  # XLA only
        return y, grad

    if a.dtype == tf.float32 or tf.executing_eagerly():
        return upcast()
    if a.shape[:-1].is_fully_defined():
        return upcast() if math.prod(a.shape[:-1]) >= UPCAST_MIN_ROWS else bf16_operands(a, b)
    # Traced for any shape (a shape-polymorphic tf.function): XLA compiles each concrete shape, where the row
    # count is a constant, so it keeps only the branch taken (its conditional simplifier inlines it).
    rows = tf.reduce_prod(tf.shape(a)[:-1])
    return tf.cond(rows >= UPCAST_MIN_ROWS, upcast, lambda: bf16_operands(a, b))


@contextlib.contextmanager
def numerics_scope() -> Iterator[None]:
    """A context in which TensorFlow's matmul setting is what the contract needs on GPUs (rule 8); restored on exit.

    Inside: TF32 off (by default TensorFlow runs fp32 products on Ampere and later GPUs as TF32, a 10-bit
    mantissa, against fp32 mode's true fp32 products). The setting is process-wide, so the library never sets it
    itself: run GPU work inside ``with numerics_scope(): ...``. On the CPU it changes nothing.
    """
    before = tf.config.experimental.tensor_float_32_execution_enabled()
    tf.config.experimental.enable_tensor_float_32_execution(False)
    try:
        yield
    finally:
        tf.config.experimental.enable_tensor_float_32_execution(before)
