"""Third-party Transformers certified against the spec's contract: adapters that load the canonical weights into
``torch.nn.Transformer``, Hugging Face models, Keras' and Flax NNX's layers (``certify.adapters``), and the command
that runs the conformance suite against each and writes ``docs/certified.md``::

    python -m certify                  # every adapter, one pytest process each
    python -m certify --only nn_transformer --out /tmp/certified.md
"""
