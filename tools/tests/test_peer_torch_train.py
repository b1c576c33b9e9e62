"""The stock peer's training step: its loss, schedule and RNG discipline, a second initialisation that learns,
train-state round trips."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from spec import training
from tools import peer_torch as P
from tools.peer_torch import model as peer_model
from tools.peer_torch.train import param_names
from tools.tests.peer_torch_cases import CONFIG, batch, reference_logits, train_copy


def test_loss_at_step_one_equals_an_independent_computation(monkeypatch):
    c = CONFIG.replace(dropout=0.0)
    src, tgt_in, tgt_out = batch(c, np.random.default_rng(2))
    model = P.Transformer(c, seed=0)
    want = training.label_smoothed_cross_entropy(reference_logits(c, P.params_of(model), src, tgt_in), tgt_out, c,
                                                 0.1)
    loss, model, state = P.train_step(model, P.init_train_state(model), src, tgt_in, tgt_out)
    assert loss.dtype == torch.float32 and loss.ndim == 0 and state.step == 1
    assert float(loss) == pytest.approx(want, rel=1e-5)

    # bf16 autocast (as on a CPU with bf16 dot products): fp32 master weights, the loss of the forward under
    # autocast, close to the float64 one
    monkeypatch.setattr(peer_model, "native_bf16", lambda: True)
    b = c.replace(dtype="bfloat16", param_dtype="bfloat16")
    model = P.Transformer(b, seed=0)
    before = P.params_of(model)
    with torch.inference_mode():
        forward = training.label_smoothed_cross_entropy(model.eval()(src, tgt_in).numpy(), tgt_out, b, 0.1)
    model.train()
    loss, model, state = P.train_step(model, P.init_train_state(model), src, tgt_in, tgt_out)
    assert float(loss) == pytest.approx(forward, rel=1e-6)
    assert float(loss) == pytest.approx(want, rel=3e-2)
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert all(not np.array_equal(before[k], v) for k, v in P.params_of(model).items())


def test_dropout_masks_come_from_the_state_generator():
    c = CONFIG.replace(dropout=0.3)
    src, tgt_in, tgt_out = batch(c, np.random.default_rng(3))

    def losses(seed, steps=2):
        model = P.Transformer(c, seed=0)
        state = P.init_train_state(model, seed=seed)
        return [float(P.train_step(model, state, src, tgt_in, tgt_out)[0]) for _ in range(steps)]

    assert losses(7) == losses(7)
    assert losses(7)[0] != losses(8)[0]
    # the first step's loss is the forward with the global generator set to a fresh one seeded 7
    model = P.Transformer(c, seed=0).train()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(7)
        logits = model(src, tgt_in)
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), torch.as_tensor(tgt_out).flatten(),
                                             ignore_index=c.pad_id, label_smoothing=0.1)
    assert float(loss.detach()) == losses(7)[0]


def test_no_global_rng_state_is_changed():
    c = CONFIG.replace(dropout=0.2)
    src, tgt_in, tgt_out = batch(c, np.random.default_rng(4))
    before = torch.random.get_rng_state()
    model = P.Transformer(c, seed=5)
    assert torch.equal(torch.random.get_rng_state(), before)
    state = P.init_train_state(model, seed=5)
    P.train_step(model, state, src, tgt_in, tgt_out)
    assert torch.equal(torch.random.get_rng_state(), before)
    P.greedy_search(model, src, max_new_tokens=4)
    P.beam_search(model, src, max_new_tokens=4)
    assert torch.equal(torch.random.get_rng_state(), before)
    # seeded: the same seed the same weights, another seed other weights
    same = [P.params_of(P.Transformer(c, seed=5)) for _ in range(2)]
    assert all(np.array_equal(same[0][k], same[1][k]) for k in same[0])
    assert not np.array_equal(P.params_of(P.Transformer(c, seed=6))["embedding.weight"],
                              P.params_of(P.Transformer(c, seed=5))["embedding.weight"])


def _implied_lr(before, after, state, t):
    """The learning rate Adam applied at step t, from the parameter change and its moments after the step."""
    tc, ratios = state.train_config, []
    for name, p in param_names(state).items():
        st = state.optimizer.state[p]
        m_hat = st["exp_avg"].double().numpy() / (1 - tc.beta1 ** t)
        v_hat = st["exp_avg_sq"].double().numpy() / (1 - tc.beta2 ** t)
        u = m_hat / (np.sqrt(v_hat) + tc.adam_eps)
        big = np.abs(u) > 0.5
        ratios.append((before[name] - after[name])[big].astype(np.float64) / u[big])
    return float(np.median(np.concatenate(ratios)))


def test_the_optimizer_follows_the_schedule_times_lr_scale():
    c = CONFIG.replace(dropout=0.0)
    tc = training.TrainConfig(warmup_steps=4, lr_scale=0.5)
    src, tgt_in, tgt_out = batch(c, np.random.default_rng(5))
    model = P.Transformer(c, seed=0)
    state = P.init_train_state(model, tc)
    for t in range(1, 11):
        want = training.learning_rate(t, c.d_model, tc.warmup_steps, scale=tc.lr_scale)
        assert state.optimizer.param_groups[0]["lr"] == pytest.approx(want, rel=1e-12)
        before = P.params_of(model)
        P.train_step(model, state, src, tgt_in, tgt_out)
        assert state.last_lr == pytest.approx(want, rel=1e-12)
        if t in (1, 2, 10):
            assert _implied_lr(before, P.params_of(model), state, t) == pytest.approx(want, rel=2e-3)


def test_the_default_init_learns_too():
    model, losses = train_copy("default", 150)
    assert np.mean(losses[-10:]) < 0.4 * np.mean(losses[:5])


def test_train_state_round_trip_resumes_bit_for_bit(tmp_path):
    c = CONFIG.replace(dropout=0.2)
    tc = training.TrainConfig(warmup_steps=3, lr_scale=0.7)
    rng = np.random.default_rng(7)
    batches = [batch(c, rng) for _ in range(4)]
    model = P.Transformer(c, seed=0)
    state = P.init_train_state(model, tc, seed=1)
    for b in batches[:2]:
        P.train_step(model, state, *b)
    P.save_weights(model, tmp_path / "w.safetensors")
    P.save_train_state(state, tmp_path / "s.safetensors")
    straight = [float(P.train_step(model, state, *b)[0]) for b in batches[2:]]
    resumed_model = P.load_weights(tmp_path / "w.safetensors")
    resumed = P.load_train_state(tmp_path / "s.safetensors", resumed_model)
    assert resumed.step == 2 and resumed.train_config == tc
    assert [float(P.train_step(resumed_model, resumed, *b)[0]) for b in batches[2:]] == straight
    a, b = P.params_of(model), P.params_of(resumed_model)
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert resumed.optimizer.param_groups[0]["lr"] == state.optimizer.param_groups[0]["lr"]


def test_a_state_of_another_model_is_refused():
    src, tgt_in, tgt_out = batch(CONFIG, np.random.default_rng(9))
    state = P.init_train_state(P.Transformer(CONFIG, seed=0))
    with pytest.raises(ValueError, match="another model"):
        P.train_step(P.Transformer(CONFIG, seed=0), state, src, tgt_in, tgt_out)
