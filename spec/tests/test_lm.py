"""The decoder-only model of the spec: config, schema, FLOPs, reference, generation and its gradient."""

from __future__ import annotations

import numpy as np
import pytest

import spec
from spec import backward, flops, sampling, shapes, training, validate
from spec import reference as ref
from spec.numerics import Numerics

EXACT = Numerics("exact")


def _small():
    return spec.preset("lm_tiny", dtype="float32", param_dtype="float32", d_model=8, d_k=4, d_v=2, d_ff=6,
                       n_heads=2, vocab_size=11, max_len=16)


def test_presets_and_schema():
    c = spec.preset("gpt2_small")
    assert c.decoder_only and c.norm_first and (c.n_decoder_layers, c.d_model, c.n_heads, c.d_ff, c.max_len) == (
        12, 768, 12, 3072, 1024)
    names = [p.name for p in spec.param_specs(spec.preset("lm_tiny"))]
    assert names[0] == "embedding" and names[-2:] == ["decoder.final_norm.scale", "decoder.final_norm.bias"]
    assert not any(n.startswith("encoder.") or ".cross_attn" in n for n in names)
    # 12 layers of 4 D^2 attention + 2 D F FFN (+ biases, norms), the tied 50257 x 768 embedding: 123,616,512
    assert spec.param_count(c) == 50257 * 768 + 12 * (4 * 768 * 768 + 2 * 768 * 3072 + 3072 + 768 + 4 * 768) + 2 * 768
    assert shapes.dropout_sites(spec.preset("lm_tiny"))[0] == "tgt_embed"


def test_transformer_and_language_model_refuse_the_other_config():
    c = _small()
    with pytest.raises(ValueError, match="decoder-only model; build it as a LanguageModel"):
        ref.Transformer({}, c, EXACT)
    with pytest.raises(ValueError, match="a LanguageModel is decoder-only"):
        ref.LanguageModel({}, spec.preset("tiny"), EXACT)


def test_decode_flops_of_a_prefill_are_the_forward_flops():
    c = spec.preset("gpt2_small")
    assert flops.decode_flops(c, 2, 512, 0) == flops.forward_flops(c, 2, 0, 512)
    assert flops.decode_flops(c, 1, 1, 511) < flops.decode_flops(c, 1, 1, 0) * 2  # a step grows with context


def test_gradient_matches_central_differences():
    c = _small()
    P = {k: v.astype(np.float64) for k, v in spec.init_params(c, 1).items()}
    tokens = np.array([[1, 5, 6, 7, 3, 2], [1, 4, 9, 2, 0, 0]])
    _, g = backward.gradients_at(P, None, tokens[:, :-1], tokens[:, 1:], c, 0.1)

    def loss(Q):
        logits = ref.LanguageModel(Q, c, EXACT).forward(tokens[:, :-1])
        return training.label_smoothed_cross_entropy(logits, tokens[:, 1:], c, 0.1)
    for name in ("embedding", "decoder.layers.0.self_attn.w_q", "decoder.layers.1.ffn.w_1", "decoder.final_norm.scale"):
        idx, h = tuple(1 for _ in P[name].shape), 1e-6
        up, down = ({k: v.copy() for k, v in P.items()} for _ in range(2))
        up[name][idx] += h
        down[name][idx] -= h
        assert (loss(up) - loss(down)) / (2 * h) == pytest.approx(g[name][idx], rel=1e-6, abs=1e-9)


def test_generate_rows_as_if_alone_and_cached_as_recomputed():
    c = _small()
    P = ref.as_float64(spec.init_params(c, 2), c)
    prompt = np.array([[1, 5, 9, 4], [1, 7, 0, 0], [1, 3, 4, 0]])
    greedy = sampling.generate(P, prompt, c, EXACT, 6, temperature=0.0)
    for b, n in enumerate((4, 2, 3)):
        alone = sampling.generate(P, prompt[b:b + 1, :n], c, EXACT, 6, temperature=0.0)[0]
        np.testing.assert_array_equal(greedy[b, :len(alone)], alone)
    sampled = sampling.generate(P, prompt, c, EXACT, 6, temperature=1.0, top_k=5, top_p=0.9, seed=4)
    other = prompt.copy()
    other[1:] = prompt[0]
    np.testing.assert_array_equal(sampling.generate(P, other, c, EXACT, 6, temperature=1.0, top_k=5, top_p=0.9,
                                                    seed=4)[0], sampled[0])
    model = ref.LanguageModel(P, c, EXACT)
    full = model.forward(prompt)
    cache, steps = model.init_cache(3, 4), []
    for t in range(4):
        logits, cache = model.decode(prompt[:, t:t + 1], cache)
        steps.append(logits)
    np.testing.assert_allclose(np.concatenate(steps, axis=1), full, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(("prompt", "max_new", "message"), [
    ([[0, 0]], 2, "prompt: row 0 is empty"),
    ([[1, 0, 5]], 2, "prompt: row 0 has pad_id=0 before a token"),
    ([[1, 5]], 0, "max_new_tokens must be a positive int"),
    ([[1] * 15], 2, "prompt: a prompt of 15 tokens and max_new_tokens=2 need 17 positions but max_len is 16"),
])
def test_prompt_errors(prompt, max_new, message):
    with pytest.raises(ValueError, match=message):
        validate.check_prompt(np.array(prompt), _small(), max_new)


def test_sampling_ties_and_top_p():
    nx = Numerics("float32")
    z = np.array([[-np.inf, -np.inf, 1.0, 1.0, 0.0, 0.0]])
    assert sampling.sample(z, np.array([0.0]), 1.0, 1, 1.0, nx)[0] == 2          # top-1 of a tie: the lower id
    assert sampling.sample(z, np.array([0.99]), 0.0, None, 1.0, nx)[0] == 2       # greedy: the lower id
    # p of the top pair = 2e / (2e + 2) = 0.731: top_p 0.7 keeps the first token that reaches it (two tokens)
    assert sampling.sample(z, np.array([0.99]), 1.0, None, 0.6, nx)[0] == 3


def test_lm_reverse_batch_rows():
    from spec import demo
    c = spec.preset("lm_tiny")
    tokens = demo.lm_reverse_batch(np.random.default_rng(0), c, 8)
    for row in tokens:
        n = int(np.argmax(row == c.eos_id))                       # BOS seq EOS: the prompt
        seq = row[1:n]
        assert row[0] == c.bos_id and 8 <= len(seq) <= 16
        np.testing.assert_array_equal(row[n + 1:2 * n], seq[::-1])
        assert row[2 * n] == c.eos_id and (row[2 * n + 1:] == c.pad_id).all()
