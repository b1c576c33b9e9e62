"""How a product is computed in impl_jax (``spec.numerics``): everything framework-specific about it, fenced here.

In bf16 mode every matrix product takes bf16 operands, accumulates in fp32 (``preferred_element_type``) and is
rounded to bf16 once, after its bias; attention scores, softmax and LayerNorm statistics stay fp32. In fp32 mode
the same code runs in fp32 with ``Precision.HIGHEST``, so no product runs as TF32 or bf16 passes on an
accelerator. Every program compiles with ``XLA_OPTIONS`` (``jit``). The measurements behind the choices:
docs/decisions-jax.md.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax import lax

F32 = jnp.float32

# XLA may keep a value in fp32 across a bf16 rounding the program asks for ("excess precision", on by default),
# skipping for instance the rounding of residual sums before LayerNorm (rule 5). Every jit of impl_jax compiles
# with it off; a caller who jits the model in a jit of their own passes these options to it too (``jax.jit(f,
# compiler_options=impl_jax.XLA_OPTIONS)``): JAX takes compiler options from the outermost jit only.
# LLVM's optimization level 1 (XLA's default is 3): the same run time and weights (a loss's fp32 sum may end 1 ulp
# apart), a compile in 60-85% of the time within one process, undecided from a fresh one (docs/decisions-jax.md);
# level 0 changes the weights' bits.
XLA_OPTIONS = {"xla_allow_excess_precision": False, "xla_backend_optimization_level": 1}

# A product of two bf16 values is exact in fp32, so an fp32 product of bf16 operands upcast to fp32 is the
# contract's product as a bf16-operand dot with an fp32 accumulator is (up to the order of the fp32 sums, which the
# contract leaves free). On XLA's CPU backend products with many rows (M, per matrix of a batched product) run
# faster upcast, few-row products (a decoding step) faster with bf16 operands; the crossover lies near M = 256.
UPCAST_MIN_ROWS = 256


@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def round_to(p: jax.Array, dtype: str) -> jax.Array:
    """Rule 0: parameter ``p`` rounded to ``dtype`` and held in fp32 (exact: bf16 -> fp32 is exact), with the
    identity as its gradient, so the master weight's gradient is the rounded weight's (``spec.training``).

    A bf16 computation on these weights computes what it computes on bf16 weights, bit for bit: every product
    upcasts its bf16 activation (``matmul_f32``), and biases and norm parameters enter fp32 arithmetic either way.
    """
    return p.astype(dtype).astype(F32)


round_to.defvjp(lambda p, dtype: (round_to(p, dtype), None), lambda dtype, _, g: (g,))


def linear(x: jax.Array, w: jax.Array, bias: jax.Array | None = None, *, n_in: int = 1) -> jax.Array:
    """x (..., *I) times w (*I, *O) over the last ``n_in`` axes of x, plus bias (*O) -> (..., *O) in x's dtype:
    ``matmul_f32``'s numerics, the bias added in fp32, rounded once (rule 2).

    One 2-D product of the flattened operands: an einsum keeping the head axes (``bsd,dhk->bhsk``) let XLA's
    layout assignment transpose the weight on every call; this reads it as stored.
    """
    lead, n = x.shape[:x.ndim - n_in], math.prod(w.shape[:n_in])
    y = matmul_f32("mi,io->mo", x.reshape(-1, n), w.reshape(n, -1))    # (rows, O) fp32
    if bias is not None:
        y = y + bias.reshape(-1)                                        # fp32
    return y.astype(x.dtype).reshape(*lead, *w.shape[n_in:])


def logits(x: jax.Array, table: jax.Array, bias: jax.Array | None = None) -> jax.Array:
    """The tied output projection x E^T (section 3.4), plus ``bias`` in fp32: x (B, T, D), table (V, D), bias (V)
    -> (B, T, V) float32, never rounded (rule 7)."""
    y = matmul_f32("bnd,vd->bnv", x, table)
    return y if bias is None else y + bias.astype(F32)


def matmul_f32(eq: str, a: jax.Array, b: jax.Array) -> jax.Array:
    """``jnp.einsum(eq, a, b)`` with fp32 accumulation and result; HIGHEST pins fp32 operands to true fp32 products.

    Operands of two dtypes (a bf16 activation, a weight held in fp32 by ``round_to``) and bf16 operands of a product
    of at least ``UPCAST_MIN_ROWS`` rows (a's free axes) are upcast to fp32 first: the same result, faster.
    """
    lhs, rhs = eq.split("->")[0].split(",")
    rows = math.prod(n for axis, n in zip(lhs, a.shape, strict=True) if axis not in rhs)  # M: a's free axes
    if a.dtype != b.dtype or (a.dtype == jnp.bfloat16 and rows >= UPCAST_MIN_ROWS):
        a, b = a.astype(F32), b.astype(F32)
    return jnp.einsum(eq, a, b, preferred_element_type=F32, precision=lax.Precision.HIGHEST)


def jit(fun: Callable, **kwargs) -> Callable:
    """``jax.jit(fun, **kwargs)`` compiled with ``XLA_OPTIONS`` when called at the top level; inside a caller's
    trace it is traced into the caller's program, whose jit decides the options (JAX refuses them nested)."""
    compiled, nested = jax.jit(fun, compiler_options=XLA_OPTIONS, **kwargs), jax.jit(fun, **kwargs)

    @functools.wraps(fun)
    def call(*args, **kw):
        traced = any(isinstance(x, jax.core.Tracer) for x in jax.tree.leaves((args, kw)))
        return (nested if traced else compiled)(*args, **kw)
    call._cache_size = compiled._cache_size  # programs compiled at the top level (the tests count them)
    call.lower = compiled.lower              # the top-level program, for inspection (``train_dp``'s HLO)
    return call
