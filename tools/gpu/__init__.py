"""The GPU run's parts (``python -m tools.gpu_run``): the conformance suite, the bench's forward and training step
as a share of the chip's peak, and decoding against the peers; each step a process of its own under a time budget."""
