"""Executable spec of the Transformer of "Attention Is All You Need" (Vaswani et al., 2017)."""

from spec.config import BASE, BIG, PRESETS, TINY, Config, preset
from spec.init import init_params
from spec.numerics import BF16, EPS, MASKED_SCORE, Numerics, np_dtype
from spec.schema import ParamSpec, param_count, param_specs
from spec.weights_io import check_params, load_weights, read_config, save_weights

__version__ = "0.2.0"

__all__ = [
    "BASE", "BIG", "BF16", "EPS", "MASKED_SCORE", "PRESETS", "TINY", "Config", "Numerics", "ParamSpec",
    "check_params", "init_params", "load_weights", "np_dtype", "param_count", "param_specs", "preset",
    "read_config", "save_weights", "__version__",
]
