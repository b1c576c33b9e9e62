"""From text to text with any backend: parallel corpora, a shared subword tokenizer, batches by token count,
training through the common API (``spec.api``), translation and BLEU. Framework-neutral: the backend is an impl
module passed in (``impl_torch``, ``impl_jax``, ``impl_tf``).

    python -m text prepare --catalogs de --out data/en-de
    python -m text train --backend jax --data data/en-de --out runs/jax --minutes 30
    python -m text evaluate --backend torch --weights runs/jax/averaged.safetensors --data data/en-de
"""

__version__ = "0.2.0"
