"""Checkpoints from and to ``transformers`` (``spec.convert``) in every backend, without a network: a
``MarianMTModel`` built from a small config with random weights, saved as the hub stores it, converted, and run in
each impl; and our weights loaded by ``transformers``. GPT-2's: ``tools.tests.test_convert_gpt2_hf``.

Logits are judged as the conformance suite judges an fp32 forward (``spec.tolerance.judge`` against the exact
forward of the converted model, given the fp32-faithful reference's own error), ``transformers``' own logits by the
same rule, on the checkpoint's vocabulary (rows the conversion appends for special tokens carry ``hub.NEVER``).
Greedy tokens must equal ``transformers``' ``generate``; the decisions' margins are first checked to be far
above the logits tolerance, so that equality is a fair demand.
"""

from __future__ import annotations

import importlib
import json

import numpy as np
import pytest

import spec
import spec.reference as ref
from spec import tolerance
from spec.convert import marian
from spec.golden_cases import random_tokens, valid_rows
from spec.numerics import Numerics
from text import cli
from text.marian import MarianTokenizer
from text.translate import host

spm = pytest.importorskip("sentencepiece")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
BACKENDS = ("torch", "jax", "tf")
V, NEW = 99, 12   # the checkpoints' vocabulary; greedy tokens per row


def impl_of(backend: str):
    return importlib.import_module(f"impl_{backend}")


def randomise_biases(model) -> None:
    """The hub's init leaves biases at zero and LayerNorms at one: a converter that dropped them would pass."""
    torch.manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") or "norm" in name or ".ln_" in name:
                p.add_(0.1 * torch.randn_like(p))
        if hasattr(model, "final_logits_bias"):
            model.final_logits_bias.normal_(0.0, 0.5)


@pytest.fixture(scope="module")
def marian_model(tmp_path_factory):
    """(folder, MarianMTModel) as the published models are configured: SiLU, scaled embedding, decoding from the
    pad token, every bias observable."""
    torch.manual_seed(0)
    hf = transformers.MarianConfig(
        vocab_size=V, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=48, decoder_ffn_dim=48, max_position_embeddings=64,
        pad_token_id=V - 1, eos_token_id=0, decoder_start_token_id=V - 1, activation_function="swish",
        scale_embedding=True)
    model = transformers.MarianMTModel(hf).eval()
    randomise_biases(model)
    with torch.no_grad():
        model.final_logits_bias[0, 0] = 1.3   # EOS: random weights then end every row after about 8 tokens
    folder = tmp_path_factory.mktemp("marian")
    model.save_pretrained(folder)
    _marian_tokenizer(folder)
    return folder, model


WORDS = ("the a cat dog sat ran on under mat table red blue quickly slowly and bird fish green small large house "
         "river tree window garden yellow happy quiet loud jumped walked over near behind with without morning "
         "evening winter summer").split()


def _marian_tokenizer(folder) -> None:
    """source.spm, target.spm (one SentencePiece model here) and vocab.json as Marian's folders hold them:
    ``</s>`` 0, ``<unk>`` 1, the pieces, ``<pad>`` last."""
    rng = np.random.default_rng(0)
    sentences = [" ".join(rng.choice(WORDS, rng.integers(3, 9))) for _ in range(300)]
    spm.SentencePieceTrainer.train(sentence_iterator=iter(sentences), model_prefix=str(folder / "spm"),
                                   vocab_size=V, model_type="bpe", character_coverage=1.0, num_threads=1,
                                   minloglevel=2)
    for side in ("source", "target"):
        (folder / f"{side}.spm").write_bytes((folder / "spm.model").read_bytes())
    pieces = [spm.SentencePieceProcessor(model_file=str(folder / "spm.model")).id_to_piece(i) for i in range(3, V)]
    vocab = {"</s>": 0, "<unk>": 1, **{p: i for i, p in enumerate(pieces, 2)}, "<pad>": V - 1}   # every id of V
    (folder / "vocab.json").write_text(json.dumps(vocab))


def _marian_batch(config) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    return random_tokens(rng, config, [9, 5, 7], 9, bos=False), random_tokens(rng, config, [7, 4, 6], 7, bos=True)


def judge(got: np.ndarray, exact: np.ndarray, faithful: np.ndarray, rows: np.ndarray, pad_id: int):
    pick = lambda a: valid_rows(np.asarray(a, np.float64)[..., :V], rows, pad_id)  # noqa: E731
    return tolerance.judge(pick(got), pick(exact), tolerance.error_stats(pick(faithful), pick(exact), "float32"))


def _marian_logits(model, src: np.ndarray, tgt_in: np.ndarray, start: int, pad_id: int) -> np.ndarray:
    hf_tgt = np.where(np.arange(tgt_in.shape[1]) == 0, start, tgt_in)        # Marian's own start token
    with torch.no_grad():
        return model(input_ids=torch.tensor(src), attention_mask=torch.tensor(src != pad_id),
                     decoder_input_ids=torch.tensor(hf_tgt)).logits.numpy()


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_marian_checkpoint_computes_transformers_logits_in_every_backend(backend, marian_model):
    folder, hf_model = marian_model
    config, params = marian.load(folder)
    src, tgt_in = _marian_batch(config)
    P = ref.as_float64(params, config)
    exact, faithful = (ref.forward(P, src, tgt_in, config, Numerics(m)) for m in ("exact", "float32"))
    theirs = _marian_logits(hf_model, src, tgt_in, config.pad_id, config.pad_id)
    assert judge(theirs, exact, faithful, tgt_in, config.pad_id).ok   # the conversion is the same function
    ours = host(impl_of(backend).from_params(config, params)(src, tgt_in))
    verdict = judge(ours, exact, faithful, tgt_in, config.pad_id)
    assert verdict.ok, verdict.reason()
    assert np.abs(valid_rows(ours[..., :V] - theirs, tgt_in, config.pad_id)).max() < 1e-5


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_marian_checkpoint_translates_as_transformers_does(backend, marian_model):
    folder, hf_model = marian_model
    config, params = marian.load(folder)
    src, _ = _marian_batch(config)
    with torch.no_grad():
        theirs = hf_model.generate(torch.tensor(src), attention_mask=torch.tensor(src != config.pad_id),
                                   num_beams=1, do_sample=False, max_new_tokens=NEW, forced_eos_token_id=None,
                                   bad_words_ids=[[config.pad_id]]).numpy()[:, 1:]  # without the start token
    ours = host(impl_of(backend).greedy_search(impl_of(backend).from_params(config, params), src, NEW))
    assert _margin(params, config, src, ours) > 1e-4                     # far above fp32 noise (~1e-6 here)
    width = max(ours.shape[1], theirs.shape[1])
    pad = lambda a: np.pad(a, ((0, 0), (0, width - a.shape[1])), constant_values=config.pad_id)  # noqa: E731
    assert np.array_equal(pad(ours), pad(theirs))


def _margin(params, config, src, out) -> float:
    """The smallest gap between the chosen and the next logit over the greedy decisions of ``out``, exact."""
    tgt_in = np.concatenate([np.full((len(src), 1), config.bos_id), out[:, :-1]], axis=1)
    return smallest_gap(ref.forward(ref.as_float64(params, config), src, tgt_in, config, Numerics("exact")),
                         tgt_in, config.pad_id)


def smallest_gap(logits: np.ndarray, rows: np.ndarray, pad_id: int) -> float:
    """The smallest gap between the largest and the next of ``logits`` (B, T, >= V) over the checkpoint's
    vocabulary, at ``rows``' (B, T) non-pad positions."""
    top2 = np.sort(logits[..., :V], axis=-1)[..., -2:]
    return float(valid_rows(top2[..., 1] - top2[..., 0], rows, pad_id).min())


@pytest.mark.parametrize("backend", BACKENDS)
def test_our_weights_are_read_by_marian_from_every_backend(backend, tmp_path):
    config = spec.preset("tiny", vocab_size=V, d_k=8, d_v=8, activation="silu", attention_bias=True,
                         logits_bias=True, positions="sinusoidal_halves", layer_norm_eps=1e-5, dtype="float32",
                         param_dtype="float32")
    impl = impl_of(backend)
    params = impl.params_of(impl.from_params(config, spec.init_params(config, 3, observable=True)))
    marian.save(tmp_path, config, params)
    hf_model = transformers.MarianMTModel.from_pretrained(tmp_path).eval()
    src, tgt_in = _marian_batch(config)
    P = ref.as_float64(params, config)
    exact, faithful = (ref.forward(P, src, tgt_in, config, Numerics(m)) for m in ("exact", "float32"))
    theirs = _marian_logits(hf_model, src, tgt_in, config.bos_id, config.pad_id)
    verdict = judge(theirs, exact, faithful, tgt_in, config.pad_id)
    assert verdict.ok, verdict.reason()


SENTENCES = ["the cat sat on the mat", "a blue dog ran quickly under the red table and the cat", "slowly"]


def test_a_marian_tokenizer_reads_text_as_transformers_does(marian_model):
    folder, _ = marian_model
    config, _ = marian.load(folder)
    theirs = transformers.MarianTokenizer(source_spm=str(folder / "source.spm"), target_spm=str(folder / "target.spm"),
                                          vocab=str(folder / "vocab.json"))
    ours = MarianTokenizer.load(folder, config)
    ids = ours.encode(SENTENCES + ["zebra!"])                         # pieces missing from vocab.json: <unk>
    assert [row + [config.eos_id] for row in ids] == theirs(SENTENCES + ["zebra!"]).input_ids
    assert ours.decode([row + [config.eos_id, config.pad_id] for row in ids[:3]]) == SENTENCES


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_marian_folder_translates_from_the_command_line_as_transformers_does(backend, marian_model, tmp_path,
                                                                                capsys):
    folder, hf_model = marian_model
    theirs_tokenizer = transformers.MarianTokenizer(source_spm=str(folder / "source.spm"),
                                                    target_spm=str(folder / "target.spm"),
                                                    vocab=str(folder / "vocab.json"))
    batch = theirs_tokenizer(SENTENCES, return_tensors="pt", padding=True)
    with torch.no_grad():
        out = hf_model.generate(**batch, num_beams=1, do_sample=False, max_new_tokens=40, forced_eos_token_id=None,
                                bad_words_ids=[[V - 1]])
    (tmp_path / "in.txt").write_text("\n".join(SENTENCES) + "\n")
    cli.main(["translate", "--backend", backend, "--marian", str(folder), "--beam", "1", "--input",
              str(tmp_path / "in.txt")])
    lines = capsys.readouterr().out.splitlines()
    assert lines == theirs_tokenizer.batch_decode(out, skip_special_tokens=True) and all(lines)
