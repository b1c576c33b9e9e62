"""The peer's training: ``torch.optim.Adam`` under equation 3's schedule, label-smoothed cross entropy, and its
checkpoints. See ``tools.peer_torch``."""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

import safetensors
import safetensors.torch
import torch
from torch import Tensor, nn

from spec import validate
from spec.training import TrainConfig, learning_rate
from tools.peer_torch.model import FRAMEWORK, Transformer, host_ids, in_mode, to_tensor


@dataclasses.dataclass
class TrainState:
    """``step``: updates done; ``train_config``; ``optimizer``: ``torch.optim.Adam`` over the model's parameters;
    ``scheduler``: the ``LambdaLR`` giving equation 3 (times ``lr_scale``) at step ``step + 1``; ``rng``: the CPU
    ``torch.Generator`` the dropout masks are drawn from; ``loss_fn``: the label-smoothed cross-entropy;
    ``names``: the model's parameter names, in the optimizer's order; ``last_lr``: the learning rate of the last
    update (None before the first)."""

    step: int
    train_config: TrainConfig
    optimizer: torch.optim.Adam
    scheduler: torch.optim.lr_scheduler.LambdaLR
    rng: torch.Generator
    loss_fn: nn.CrossEntropyLoss
    names: list[str]
    last_lr: float | None = None


def _lr(tc: TrainConfig, d_model: int, step: int) -> float:
    """Equation 3 times ``lr_scale`` at step (from 1)."""
    return learning_rate(step, d_model, tc.warmup_steps, scale=getattr(tc, "lr_scale", 1.0))


def init_train_state(model: Transformer, train_config: TrainConfig | None = None, seed: int = 0) -> TrainState:
    """A fresh state: Adam (betas, eps of ``train_config``; fused) at step 0, the ``LambdaLR`` schedule of
    equation 3 times ``lr_scale``, the dropout generator seeded from ``seed``.

    Raises:
        ValueError: if ``seed`` is not a non-negative int.
    """
    if not validate.is_int(seed) or seed < 0:
        raise ValueError(f"seed must be a non-negative int, got {seed!r}")
    tc = TrainConfig() if train_config is None else train_config
    d_model = model.config.d_model
    # base lr 1: LambdaLR's factor is the learning rate itself; its epoch e (0 at construction) is step e + 1.
    names, params = zip(*model.named_parameters(), strict=True)
    optimizer = torch.optim.Adam(params, lr=1.0, betas=(tc.beta1, tc.beta2), eps=tc.adam_eps,
                                 fused=True)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda e: _lr(tc, d_model, e + 1))
    return TrainState(step=0, train_config=tc, optimizer=optimizer, scheduler=scheduler,
                      rng=torch.Generator().manual_seed(int(seed)),
                      loss_fn=nn.CrossEntropyLoss(ignore_index=model.config.pad_id,
                                                  label_smoothing=tc.label_smoothing),
                      names=list(names))


def train_step(model: Transformer, state: TrainState, src: Any, tgt_in: Any, tgt_out: Any
               ) -> tuple[Tensor, Transformer, TrainState]:
    """One Adam step in training mode -> (loss, model, state), both updated in place; the loss (0-d float32) is
    the batch's before the update. Every submodule is left in the mode it had.

    Raises:
        ValueError: from ``spec.validate.check_train_batch``, or if ``state`` was made for another model; before
            anything is computed.
    """
    s, ti, to = host_ids(src), host_ids(tgt_in), host_ids(tgt_out)
    validate.check_train_batch(s, ti, to, model.config)
    held, own = state.optimizer.param_groups[0]["params"], list(model.parameters())
    if len(held) != len(own) or any(a is not b for a, b in zip(held, own, strict=True)):
        raise ValueError("train state: its optimizer holds another model's parameters")
    y = to_tensor(to)                                                                    # (B, T)
    with in_mode(model, True), torch.random.fork_rng(devices=[]):
        torch.default_generator.set_state(state.rng.get_state())
        logits = model._logits(to_tensor(s), to_tensor(ti))                              # (B, T, V) float32
        loss = state.loss_fn(logits.flatten(0, 1), y.flatten())                          # () float32
        state.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        state.rng.set_state(torch.default_generator.get_state())
    state.last_lr = state.optimizer.param_groups[0]["lr"]
    state.optimizer.step()
    state.scheduler.step()
    state.step += 1
    return loss.detach(), model, state


def save_train_state(state: TrainState, path: str | os.PathLike) -> None:
    """Adam's moments as ``m.<name>``, ``v.<name>`` (the peer's names), the generator's state as ``rng``; metadata
    ``step``, ``train_config`` (JSON) and ``framework`` (the layout of ``spec.train_state_io``, the peer's names)."""
    names = param_names(state)
    tensors: dict[str, Tensor] = {}
    for name, p in names.items():
        st = state.optimizer.state.get(p, {})
        for key, field in (("m", "exp_avg"), ("v", "exp_avg_sq")):
            tensors[f"{key}.{name}"] = st[field].float().contiguous() if field in st else torch.zeros_like(p)
    tensors["rng"] = state.rng.get_state()
    meta = {"step": str(state.step), "train_config": json.dumps(dataclasses.asdict(state.train_config)),
            "framework": FRAMEWORK}
    safetensors.torch.save_file(tensors, str(path), metadata=meta)


def load_train_state(path: str | os.PathLike, model: Transformer) -> TrainState:
    """The state ``save_train_state`` wrote, for ``model``: training goes on bit for bit as if uninterrupted.

    Raises:
        ValueError: naming the file if it is unreadable, or naming the first moment missing or misshapen.
    """
    try:
        with safetensors.safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
        tensors = safetensors.torch.load_file(str(path))
        step, tc = int(meta["step"]), TrainConfig(**json.loads(meta["train_config"]))
    except (OSError, safetensors.SafetensorError, KeyError, TypeError, ValueError) as e:
        raise ValueError(f"{path}: not a train state file ({e!r})") from e
    state = init_train_state(model, tc)
    for name, p in param_names(state).items():
        for key in ("m", "v"):
            t = tensors.get(f"{key}.{name}")
            if t is None or t.shape != p.shape:
                raise ValueError(f"{path}: moment {key}.{name} is missing or not of shape {tuple(p.shape)}")
        if step > 0:
            state.optimizer.state[p] = {"step": torch.tensor(float(step), dtype=torch.float32),
                                        "exp_avg": tensors[f"m.{name}"].clone(),
                                        "exp_avg_sq": tensors[f"v.{name}"].clone()}
    if "rng" in tensors and meta.get("framework") == FRAMEWORK:
        state.rng.set_state(tensors["rng"])
    state.step = step
    state.scheduler.last_epoch = step
    for group in state.optimizer.param_groups:
        group["lr"] = _lr(tc, model.config.d_model, step + 1)
    state.scheduler._last_lr = [g["lr"] for g in state.optimizer.param_groups]
    return state


def param_names(state: TrainState) -> dict[str, nn.Parameter]:
    """{name: parameter} of the optimizer's parameters, named as the model names them."""
    return dict(zip(state.names, state.optimizer.param_groups[0]["params"], strict=True))
