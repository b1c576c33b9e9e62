"""The translation workload's peers (torch's environment: ``transformers`` and ``ctranslate2``) compute our function
from the same weights: Marian's logits, CTranslate2's token log-probabilities, both's greedy tokens."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import spec
from bench import translate_common as tc
from spec import demo, weights_io

torch = pytest.importorskip("torch")
impl_torch = pytest.importorskip("impl_torch")
pytest.importorskip("transformers")
pytest.importorskip("ctranslate2")
translate_peers = pytest.importorskip("bench.translate_peers")



@pytest.fixture(scope="module")
def setup():
    """The reverse-task model of the golden cases (trained: its translations end at several lengths), in fp32 with
    Marian's LayerNorm epsilon (1e-5 for the 1e-6 it was trained with: the same translations here), on six
    reverse-task sources."""
    stored, params = weights_io.load_weights(Path(spec.__file__).parent / "golden_inputs" / "reverse_demo.safetensors")
    config = stored.replace(dtype="float32", param_dtype="float32", dropout=0.0, layer_norm_eps=1e-5)
    params = {k: np.asarray(v, np.float32) for k, v in params.items()}
    src = demo.reverse_batch(np.random.default_rng(0), config, 6)[0]                # (6, S), right-padded
    return config, params, src, impl_torch.from_params(config, params)


def _log_probs(model, src: np.ndarray, tgt_out: list[list[int]]) -> list[np.ndarray]:
    """Our log-probabilities of each row's target tokens, teacher-forced from BOS."""
    out = []
    for i, row in enumerate(tgt_out):
        tgt_in = np.array([[model.config.bos_id, *row[:-1]]])
        with torch.inference_mode():
            logits = model(src[i:i + 1], tgt_in)[0].double()                       # (T, V)
        out.append(torch.log_softmax(logits, -1)[np.arange(len(row)), row].numpy())
    return out


def test_marian_computes_our_logits(setup):
    config, params, src, ours = setup
    hf = translate_peers.Marian(config, params).model
    tgt_in = np.random.default_rng(2).integers(3, config.vocab_size, (len(src), 7))
    tgt_in[:, 0] = config.bos_id
    with torch.inference_mode():
        a = ours(src, tgt_in).numpy()
        b = hf(input_ids=torch.from_numpy(src), attention_mask=torch.from_numpy(src != config.pad_id),
               decoder_input_ids=torch.from_numpy(tgt_in)).logits.numpy()
    assert np.abs(a - b).max() <= 1e-5 * np.abs(a).max()                           # fp32 summation order only


def test_ctranslate2_scores_our_tokens_and_every_peer_translates_as_we_do(setup):
    config, params, src, ours = setup
    with torch.inference_mode():
        want = tc.unpad(config, impl_torch.greedy_search(ours, src, 20).numpy())
    assert len({len(row) for row in want}) > 1                                    # rows end at several lengths
    ct2 = translate_peers.CTranslate2(config, params, "float32", 1)
    assert tc.unpad(config, ct2.search(src, 20, 1, 0.6)) == want
    assert tc.unpad(config, translate_peers.Marian(config, params).search(src, 20, 1, 0.6)) == want
    rows = [[ct2.vocab[t] for t in row if t != config.pad_id] for row in src.tolist()]
    targets = [[ct2.vocab[t] for t in row] for row in want]
    scores = ct2.translator.score_batch(rows, targets)
    for got, mine in zip(scores, _log_probs(ours, src, [[*row, config.eos_id] for row in want]), strict=True):
        np.testing.assert_allclose(got.log_probs, mine, atol=1e-4)                  # EOS's log-probability too
