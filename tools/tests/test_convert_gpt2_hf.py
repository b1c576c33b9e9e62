"""A ``GPT2LMHeadModel`` (``spec.convert.gpt2``) in every backend, without a network, as
``tools.tests.test_convert_hf`` tries Marian's: built from a small config with random weights, saved as the hub
stores it, converted, and run in each impl; our language model read by ``transformers``; GPT-2's tokenizer.

Logits are judged as an fp32 forward of the conformance suite; greedy tokens must equal ``transformers``'
``generate``, after the decisions' margins are checked to be far above the logits tolerance.
"""

from __future__ import annotations

import numpy as np
import pytest

import spec
import spec.reference as ref
from spec.convert import gpt2
from spec.numerics import Numerics
from text.bpe import ByteLevelBPE
from text.translate import host
from tools.tests.test_convert_hf import BACKENDS, NEW, WORDS, V, impl_of, judge, randomise_biases, smallest_gap

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def gpt2_model(tmp_path_factory):
    """(folder, GPT2LMHeadModel) with GPT-2's one special token, BOS and EOS at once, and no pad token."""
    torch.manual_seed(0)
    hf = transformers.GPT2Config(vocab_size=V, n_positions=32, n_embd=32, n_layer=2, n_head=4, bos_token_id=V - 1,
                                 eos_token_id=V - 1)
    model = transformers.GPT2LMHeadModel(hf).eval()
    randomise_biases(model)
    folder = tmp_path_factory.mktemp("gpt2")
    model.save_pretrained(folder)
    return folder, model


def _lm_judge(got, params, config, tokens):
    P = ref.as_float64(params, config)
    exact, faithful = (ref.LanguageModel(P, config, Numerics(m)).forward(tokens) for m in ("exact", "float32"))
    return judge(got, exact, faithful, tokens, config.pad_id)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_gpt2_checkpoint_computes_and_continues_as_transformers_does(backend, gpt2_model):
    folder, hf_model = gpt2_model
    config, params = gpt2.load(folder)
    tokens = np.random.default_rng(0).integers(0, V, (2, 9))
    with torch.no_grad():
        theirs = hf_model(input_ids=torch.tensor(tokens)).logits.numpy()
        continued = hf_model.generate(torch.tensor(tokens), do_sample=False, max_new_tokens=NEW,
                                      pad_token_id=config.eos_id).numpy()[:, tokens.shape[1]:]
    assert _lm_judge(theirs, params, config, tokens).ok
    impl = impl_of(backend)
    model = impl.from_params(config, params)
    verdict = _lm_judge(host(model(tokens)), params, config, tokens)
    assert verdict.ok, verdict.reason()
    ours = host(impl.generate(model, tokens, NEW, temperature=0.0))
    assert _lm_margin(params, config, tokens, ours) > 1e-4              # far above fp32 noise, as Marian's
    assert np.array_equal(ours, continued[:, :ours.shape[1]]) and ours.shape[1] == NEW


def _lm_margin(params, config, prompt, new) -> float:
    """The smallest gap between the chosen and the next logit over the greedy decisions that continued
    ``prompt`` (B, L) with ``new`` (B, N), exact: the logits at positions L - 1 .. L + N - 2, but where ``new``
    holds padding (after a row's EOS)."""
    seq = np.concatenate([prompt, new[:, :-1]], axis=1)
    logits = ref.LanguageModel(ref.as_float64(params, config), config, Numerics("exact")).forward(seq)
    return smallest_gap(logits[:, prompt.shape[1] - 1:], new, config.pad_id)


@pytest.mark.parametrize("backend", BACKENDS)
def test_our_language_model_is_read_by_gpt2_from_every_backend(backend, tmp_path):
    config = spec.preset("lm_tiny", vocab_size=V, d_k=8, d_v=8, activation="gelu_tanh", attention_bias=True,
                         positions="learned", scale_embedding=False, layer_norm_eps=1e-5, dtype="float32",
                         param_dtype="float32")
    impl = impl_of(backend)
    params = impl.params_of(impl.from_params(config, spec.init_params(config, 3, observable=True)))
    gpt2.save(tmp_path, config, params)
    hf_model = transformers.GPT2LMHeadModel.from_pretrained(tmp_path).eval()
    tokens = np.random.default_rng(1).integers(3, V, (2, 9))
    with torch.no_grad():
        theirs = hf_model(input_ids=torch.tensor(tokens)).logits.numpy()
    verdict = _lm_judge(theirs, params, config, tokens)
    assert verdict.ok, verdict.reason()


def test_a_gpt2_tokenizer_reads_text_as_transformers_does(tmp_path):
    """vocab.json and merges.txt of a byte-level BPE with ``<|endoftext|>`` last, as GPT-2's folder holds them;
    the config as ``spec.convert.gpt2`` converts such a checkpoint (pad and BOS appended)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    rng = np.random.default_rng(0)
    texts = [" ".join(rng.choice(WORDS, 8)) for _ in range(200)]
    tok.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=320, special_tokens=["<|endoftext|>"],
                                                       initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.model.save(str(tmp_path))
    V, eot = tok.get_vocab_size(), tok.token_to_id("<|endoftext|>")
    config = spec.preset("lm_tiny", vocab_size=V + 2, pad_id=V, bos_id=V + 1, eos_id=eot)
    ours = ByteLevelBPE.from_gpt2(tmp_path, config)
    theirs = transformers.GPT2Tokenizer.from_pretrained(tmp_path)
    for text in ["the cat sat on the mat", "  Grüße, 世界!\n\tdone"]:
        assert ours.encode(text) == theirs(text).input_ids
        assert ours.decode(ours.encode(text) + [eot, V]) == text
    assert eot not in ours.encode("slowly<|endoftext|>")    # the name in a text is text, as text.bpe says
    assert (ours.pad_id, ours.bos_id, ours.eos_id) == (V, V + 1, eot)
