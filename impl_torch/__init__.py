"""The Transformer in PyTorch (placeholder until issue 3)."""
