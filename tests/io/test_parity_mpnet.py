"""MPNet (the encoder of all-mpnet-base-v2) against transformers' MPNetModel, and from a folder.

Small random configs built offline (no downloads), every weight randomised, float64, 40-token sequences (so
that the relative position bias reads its logarithmic buckets, distances ≥ 8), a right-padded and a
left-padded row. Loss L = ⟨R, last_hidden_state⟩ + ⟨R_p, pooler_output⟩, R = 0 at padded positions.
Criterion ‖ours − HF‖/‖HF‖ ≤ 1e-10 for the output, the pooler, every parameter's gradient and the gradient
of the word embeddings' output (HF's ``inputs_embeds``); the key-bias gradient, zero in exact arithmetic,
≤ 1e-10 ‖∂L/∂W_K‖ on both sides. Then all-mpnet-base-v2's layout as a folder (config.json and
model.safetensors from save_pretrained, the tokenizer transformers writes, the sentence-transformers module
files): token ids, embeddings against transformers and sentence-transformers.
"""

from __future__ import annotations

import json
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import pytest

from helpers import nrel, randomise_

torch = pytest.importorskip("torch", reason="parity tests need PyTorch: pip install torch==2.13.0")
transformers = pytest.importorskip("transformers", reason="HF parity tests need transformers: pip install transformers")

from transformer_np.errors import ModelConfigError  # noqa: E402
from transformer_np.io.hf_model import position_ids  # noqa: E402
from transformer_np.io.interop import (  # noqa: E402
    config_from_hf_dict,
    from_hf,
    hf_backward,
    hf_forward,
    to_hf_state_dict,
)
from transformer_np.model.heads import pooler_backward, pooler_forward  # noqa: E402

pytestmark = pytest.mark.hf

TOL64 = 1e-10
VOCAB = ["<s>", "<pad>", "</s>", "<unk>", "[UNK]", "the", "bank", "river", "money", ",", ".", "!", "<mask>"] + \
        [chr(c) for c in range(ord("a"), ord("z") + 1)] + ["##" + chr(c) for c in range(ord("a"), ord("z") + 1)]
V, D, B, N = len(VOCAB), 8, 3, 40


def mpnet(seed: int, **kw):
    cfg = transformers.MPNetConfig(**{**dict(vocab_size=V, hidden_size=D, num_hidden_layers=2, num_attention_heads=2,
                                             intermediate_size=12, max_position_embeddings=64, hidden_dropout_prob=0.0,
                                             attention_probs_dropout_prob=0.0, layer_norm_eps=1e-7), **kw})
    cfg._attn_implementation = "eager"
    model = transformers.MPNetModel(cfg).to(torch.float64).eval()
    randomise_(model, seed)
    return model


def batch(pad: int, seed: int = 1):
    rng = np.random.default_rng(seed)
    ids = rng.integers(3, V, size=(B, N))
    am = np.ones((B, N), dtype=np.int64)
    am[1, 31:] = 0                                        # right padding
    am[2, :9] = 0                                         # left padding, longer than the 8 exact buckets
    ids[am == 0] = pad
    return ids, am


def hf_run(model, ids, am, R, Rp):
    """HF's forward and backward; the word lookup's output keeps its gradient (HF's inputs_embeds)."""
    kept = {}

    def keep(_module, _inputs, out):
        out.retain_grad()
        kept["e"] = out

    hook = model.embeddings.word_embeddings.register_forward_hook(keep)
    try:
        out = model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(am))
    finally:
        hook.remove()
    ((out.last_hidden_state * torch.tensor(R)).sum() + (out.pooler_output * torch.tensor(Rp)).sum()).backward()
    return out, kept["e"].grad


def ours_run(params, config, ids, am, R, Rp):
    H, cache = hf_forward(params, config, input_ids=ids, attention_mask=am)
    pooled, pc = pooler_forward(H, params["pooler.W"], params["pooler.b"])
    dH_pool, dW, db = pooler_backward(Rp, pc)
    grads = hf_backward(R + dH_pool, cache, input_grad=True)
    grads["pooler.W"], grads["pooler.b"] = dW, db
    return H, pooled, grads


@pytest.mark.parametrize("pad_token_id", [1, 0])
def test_output_and_every_gradient_long_sequences(pad_token_id):
    """pad_token_id = 0 too: HF's MPNet counts positions from padding index 1 whatever the config says."""
    model = mpnet(seed=20 + pad_token_id, pad_token_id=pad_token_id)
    config, params = from_hf(model)
    assert config.position_pad == 1 and config.relative_attention_num_buckets == 32
    ids, am = batch(pad_token_id)
    rng = np.random.default_rng(2)
    R = rng.normal(size=(B, N, D)) * am[:, :, None]
    Rp = rng.normal(size=(B, D)) * am[:, :1]
    out, de_ref = hf_run(model, ids, am, R, Rp)
    H, pooled, grads = ours_run(params, config, ids, am, R, Rp)
    assert nrel(H, out.last_hidden_state) <= TOL64
    assert nrel(pooled, out.pooler_output) <= TOL64
    assert nrel(grads.pop("inputs_embeds"), de_ref) <= TOL64
    mapped = to_hf_state_dict(grads, config)
    hf_params = dict(model.named_parameters())
    assert set(mapped) == set(hf_params)                  # the relative table and the pooler included
    for name, p in hf_params.items():
        if name.endswith("attn.k.bias"):                  # exactly 0: softmax ignores q·b_K, constant along a row
            scale = np.linalg.norm(mapped[name.replace("bias", "weight")].numpy())
            assert np.linalg.norm(mapped[name].numpy()) <= 1e-10 * scale and float(p.grad.norm()) <= 1e-10 * scale
            continue
        assert nrel(mapped[name].numpy(), p.grad) <= TOL64, name
    assert np.linalg.norm(mapped["encoder.relative_attention_bias.weight"].numpy()[16:]) > 0   # keys after: read


def test_position_ids_count_from_one_whatever_the_pad_token():
    config = config_from_hf_dict(mpnet(seed=0, pad_token_id=0).config.to_dict())
    assert config.max_len == 64 - 2 and config.n_positions == 64
    ids = np.array([[5, 6, 7, 1, 1], [1, 1, 5, 6, 7], [5, 0, 6, 1, 7]])
    ref = transformers.models.mpnet.modeling_mpnet.create_position_ids_from_input_ids(torch.tensor(ids), 1)
    assert np.array_equal(position_ids(ids, config), ref.numpy())     # exact: integer positions


def test_configs_and_layers_that_cannot_run_are_refused():
    d = mpnet(seed=0).config.to_dict()
    with pytest.raises(ModelConfigError, match="relative_attention_num_buckets.*32.*got the integer 16"):
        config_from_hf_dict({**d, "relative_attention_num_buckets": 16})
    with pytest.raises(ModelConfigError, match="bare mpnet layer cannot run alone"):
        from_hf(mpnet(seed=0).encoder.layer[0])


# ----------------------------------------------------------------------------- all-mpnet-base-v2's folder
SENTENCES = ["The river bank!", "money, the bank.", "a", "the bank of the river, the money of the bank " * 3]


def _write_folder(folder, model) -> None:
    """all-mpnet-base-v2's files for a random small model: the weights, config.json (MPNetForMaskedLM, as the
    real one), the tokenizer transformers writes from a vocabulary, and the sentence-transformers modules."""
    model.save_pretrained(str(folder), safe_serialization=True)
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, "architectures": ["MPNetForMaskedLM"]}))
    vocab = folder / "vocab.txt"
    vocab.write_text("\n".join(VOCAB) + "\n", encoding="utf-8")
    tok = transformers.MPNetTokenizer(vocab={t: i for i, t in enumerate(VOCAB)}, do_lower_case=True,
                                      unk_token="[UNK]", model_max_length=512)
    tok.save_pretrained(str(folder))
    (folder / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}]))
    (folder / "1_Pooling").mkdir()
    (folder / "1_Pooling" / "config.json").write_text(json.dumps({
        "word_embedding_dimension": D, "pooling_mode_cls_token": False, "pooling_mode_mean_tokens": True,
        "pooling_mode_max_tokens": False, "pooling_mode_mean_sqrt_len_tokens": False}))
    (folder / "2_Normalize").mkdir()
    (folder / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 60, "do_lower_case": False}))


def _hf_embeddings(model, batch) -> np.ndarray:
    with torch.no_grad():
        H = model(input_ids=torch.tensor(batch["input_ids"]),
                  attention_mask=torch.tensor(batch["attention_mask"])).last_hidden_state.numpy()
    m = batch["attention_mask"][:, :, None]
    e = (H * m).sum(axis=1) / m.sum(axis=1)
    return e / np.linalg.norm(e, axis=1, keepdims=True)


def test_all_mpnet_base_v2_layout_runs_from_a_folder(tmp_path):
    from transformer_np.io.pretrained import load_pretrained

    model = mpnet(seed=30)
    _write_folder(tmp_path, model)
    m = load_pretrained(tmp_path)
    assert m.config.model_type == "mpnet" and m.max_seq_length == 60 and m.pooling == "mean" and m.normalize
    ours_tok = m.tokenize(SENTENCES)
    hf_tok = transformers.AutoTokenizer.from_pretrained(str(tmp_path))(SENTENCES, padding=True, truncation=True,
                                                                       max_length=60, return_tensors="np")
    assert np.array_equal(ours_tok["input_ids"], hf_tok["input_ids"])           # exact: integer ids
    assert np.array_equal(ours_tok["attention_mask"], hf_tok["attention_mask"])   # exact: 0/1 integers
    assert ours_tok["input_ids"][0, 0] == VOCAB.index("<s>") and VOCAB.index("</s>") in ours_tok["input_ids"][0]
    ref = transformers.AutoModel.from_pretrained(str(tmp_path), dtype=torch.float64).eval()
    H = m.forward(ours_tok, dtype=np.float64)
    with torch.no_grad():
        H_ref = ref(input_ids=torch.tensor(hf_tok["input_ids"]),
                    attention_mask=torch.tensor(hf_tok["attention_mask"])).last_hidden_state
    assert nrel(H, H_ref) <= TOL64
    E = m.encode(SENTENCES, dtype=np.float64, batch_size=2)
    assert nrel(E, _hf_embeddings(ref, dict(hf_tok))) <= TOL64


def test_all_mpnet_base_v2_layout_matches_sentence_transformers(tmp_path):
    st = pytest.importorskip("sentence_transformers", reason="pip install sentence-transformers")
    from transformer_np.io.pretrained import load_pretrained

    model = mpnet(seed=31)
    _write_folder(tmp_path, model)
    ref = st.SentenceTransformer(str(tmp_path), device="cpu").double()
    E_ref = ref.encode(SENTENCES, convert_to_numpy=True, batch_size=2)
    E = load_pretrained(tmp_path).encode(SENTENCES, dtype=np.float64, batch_size=2)
    assert nrel(E, E_ref) <= TOL64
