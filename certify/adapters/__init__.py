"""Conformance-suite adapters of third-party models, one module each, each defining ``make_backend()``
(the protocol of ``conformance.adapters.base``):

    pytest --pyargs conformance --backend certify.adapters.nn_transformer
"""

# in the order of the table
ADAPTERS = ("nn_transformer", "nn_transformer_autocast", "hf_marian", "hf_gpt2", "keras_layers", "flax_nnx")
