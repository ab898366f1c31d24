"""The fused inference paths of round 4 (MiniLM-like shapes: short rows, many small calls) against the
plain path (``assert_paths_close``, k = the longest reduction), hostile inputs included.

* the attention's optimistic softmax (:func:`transformer_np.fast.attention._sums_safe`): inference rows
  without the [V | 1] product are exponentiated without their maxima and checked by their row sums
  afterwards; a block that overflows, underflows to 0 or to subnormals, or holds a NaN is recomputed
  with the maxima;
* one product per attention projection (:func:`transformer_np.fast.mha._stacked`) for weights laid
  out as ``load_pretrained`` lays them out — views of [W_Q | W_K | W_V ; b_Q | b_K | b_V] and [W_O ; b_O] — an
  edit through a view seen, a replaced entry used as given;
* the inference embedding block (:func:`transformer_np.fast.inference._embeddings_infer`), non-finite rows
  still named.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import transformer_np as tnp
from helpers import assert_paths_close, attention_mask_case, nontrivial_params
from transformer_np import fast
from transformer_np.errors import NonFiniteError
from transformer_np.fast import attention as fast_attention
from transformer_np.fast import mha as fast_mha
from transformer_np.io.pretrained import _qkv_layout
from transformer_np.ops import kernels as plain

DTYPES = [np.float32, np.float64]


def _qkv(r, B, h, n_q, n_k, d_k, d_v, dtype):
    return (r.standard_normal((B, h, n_q, d_k)).astype(dtype), r.standard_normal((B, h, n_k, d_k)).astype(dtype),
            r.standard_normal((B, h, n_k, d_v)).astype(dtype))


def _spy_sums(monkeypatch) -> list[bool]:
    """Every verdict of ``_sums_safe`` from now on (True: the optimistic block was kept)."""
    verdicts: list[bool] = []
    real = fast_attention._sums_safe

    def spy(ell, n_k):
        verdicts.append(real(ell, n_k))
        return verdicts[-1]

    monkeypatch.setattr(fast_attention, "_sums_safe", spy)
    return verdicts


def _inference_vs_plain(Q, K, V, mask, c: float = 16.0):
    k = max(K.shape[-2], Q.shape[-1])
    Op, cp = plain.attention_forward(Q, K, V, mask)
    for store in (True, False):
        O, ci = fast.attention_forward(Q, K, V, mask, store_attention=store, for_backward=False)
        assert_paths_close(O, Op, k=k, c=c, paths=("inference O", "plain O"))
        if store:
            assert_paths_close(ci["weights"], cp["weights"], k=k, c=c, paths=("inference A", "plain A"))
    return Op


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mask_kind", ["none", "padding", "full"])
@pytest.mark.parametrize("shape", [(32, 12, 22, 22, 16), (1, 1, 1, 1, 16), (2, 3, 1, 5, 8), (3, 2, 40, 40, 16),
                                   (2, 4, 7, 9, 12)])
def test_optimistic_rows_agree_with_plain_and_are_kept(monkeypatch, dtype, mask_kind, shape):
    """MiniLM's shape (32 × 12 heads of 22 × 22), batch 1 with T = 1, n_q ≠ n_k, 40 keys (past 2·d_v, where
    the non-optimistic path would defer the normalisation), d_k = 12 (1/√d_k not folded): ordinary
    scores pass the check, so the optimistic block is kept (no recomputation), and agree with plain."""
    B, h, n_q, n_k, d_k = shape
    r = np.random.default_rng(sum(shape))
    Q, K, V = _qkv(r, B, h, n_q, n_k, d_k, d_k, dtype)
    verdicts = _spy_sums(monkeypatch)
    _inference_vs_plain(Q, K, V, attention_mask_case(mask_kind, B, n_q, n_k, dtype, r))
    assert verdicts and all(verdicts)


@pytest.mark.parametrize("dtype", DTYPES)
def test_overflowing_exponentials_are_recomputed_with_the_maxima(monkeypatch, dtype):
    """Scores far past exp's range: without the maxima exp gives inf, ℓ = inf and A = inf/inf = NaN; the
    check refuses the block and the recomputed one agrees with plain (tolerance as for huge logits:
    exp turns the scores' relative rounding into an absolute one of the weights)."""
    r = np.random.default_rng(3)
    Q, K, V = _qkv(r, 2, 3, 22, 22, 16, 16, np.float64)
    Q *= 1e3
    Q, K, V = (a.astype(dtype) for a in (Q, K, V))
    verdicts = _spy_sums(monkeypatch)
    s_max = float(np.abs(Q.astype(np.float64) @ K.astype(np.float64).swapaxes(-1, -2)).max() / 4)
    Op = _inference_vs_plain(Q, K, V, None, c=16 * (1 + s_max / math.sqrt(22)))
    assert np.all(np.isfinite(Op)) and verdicts and not any(verdicts)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("depth", ["zero", "subnormal"])
def test_underflowing_rows_are_recomputed_with_the_maxima(monkeypatch, dtype, depth):
    """Every key of a row shifted far down by a finite mask: without the maxima the row's exponentials are
    all 0 (ℓ = 0: A = 0/0) or subnormal (a few significant bits: A off by percents); with them the row
    is an ordinary softmax. Both fail the check and are recomputed."""
    fi = np.finfo(dtype)
    shift = {"zero": 3.0 * math.log(float(fi.max)), "subnormal": -math.log(float(fi.tiny)) + 12.0}[depth]
    r = np.random.default_rng(4)
    Q, K, V = _qkv(r, 2, 2, 9, 11, 16, 16, dtype)
    mask = np.full((2, 1, 1, 11), -shift, dtype=dtype)
    verdicts = _spy_sums(monkeypatch)
    _inference_vs_plain(Q, K, V, mask)
    assert verdicts and not any(verdicts)


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_fully_masked_sequence_is_uniform_and_the_others_agree(dtype):
    """Sequence 0 with every key masked (finfo.min, the padding mask's value): its rows sum to 0 without
    the maxima, so its block is recomputed — uniform rows as the plain path's — and nothing is NaN."""
    r = np.random.default_rng(5)
    Q, K, V = _qkv(r, 2, 12, 22, 22, 16, 16, dtype)
    mask = np.zeros((2, 1, 1, 22), dtype=dtype)
    mask[0] = np.finfo(dtype).min
    Op = _inference_vs_plain(Q, K, V, mask)
    assert np.all(np.isfinite(Op))
    _, c = fast.attention_forward(Q, K, V, mask, for_backward=False)
    assert_paths_close(c["weights"][0], np.full((12, 22, 22), 1 / 22, dtype=dtype), k=22,
                       paths=("inference A", "uniform 1/n"))


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_nan_gives_the_nans_of_the_fast_training_forward(dtype):
    """A NaN in one query row and one key: the optimistic block's ℓ is NaN, it is recomputed with the
    maxima, and the NaNs land where the fast training forward (which bounds first) puts them."""
    r = np.random.default_rng(6)
    Q, K, V = _qkv(r, 2, 2, 8, 8, 16, 16, dtype)
    Q[0, 1, 3, 2] = np.nan
    K[1, 0, 5, 0] = np.nan
    O_t, _ = fast.attention_forward(Q, K, V, None, store_attention=False, for_backward=True)
    for store in (True, False):
        O_i, _ = fast.attention_forward(Q, K, V, None, store_attention=store, for_backward=False)
        assert np.isnan(O_i).any()
        assert_paths_close(O_i, O_t, k=16, paths=("inference O", "training O"))


@pytest.mark.parametrize("dtype", DTYPES)
def test_the_check_on_the_row_sums(dtype):
    fi = np.finfo(dtype)
    n_k = 22
    lo = float(fi.tiny) * n_k * n_k * math.e / float(fi.eps)
    ok = np.array([[1.0], [lo * 1.01], [float(fi.max)]], dtype=dtype)
    assert fast_attention._sums_safe(ok, n_k)
    for bad in (0.0, lo * 0.99, np.inf, np.nan):
        assert not fast_attention._sums_safe(np.concatenate([ok, np.array([[bad]], dtype=dtype)]), n_k), bad


def test_rows_with_the_ones_column_or_statistics_keep_the_bound(monkeypatch):
    """Long rows (the [V | 1] product) and the training forward's row statistics are not optimistic:
    the bound decides beforehand and ``_sums_safe`` is never asked."""
    r = np.random.default_rng(7)
    verdicts = _spy_sums(monkeypatch)
    Q, K, V = _qkv(r, 1, 2, 130, 130, 16, 16, np.float32)     # 130 ≥ _ONES_MIN · d_v = 128
    fast.attention_forward(Q, K, V, store_attention=False, for_backward=False)
    Q, K, V = _qkv(r, 1, 2, 22, 22, 16, 16, np.float32)
    fast.attention_forward(Q, K, V, store_attention=False, for_backward=True)
    assert verdicts == []


# ----------------------------------------------------------------------------- one product per projection
def _stack(Ws, bs):
    """S = [W_1 | … ; b_1 | …] and its views (the layout of load_pretrained)."""
    d_in, w = Ws[0].shape
    S = np.concatenate([np.concatenate(Ws, axis=1), np.concatenate(bs)[None]], axis=0)
    return S, [S[:d_in, i * w:(i + 1) * w] for i in range(len(Ws))], [S[d_in, i * w:(i + 1) * w]
                                                                      for i in range(len(Ws))]


def test_stacked_accepts_only_views_of_one_array_in_order():
    r = np.random.default_rng(8)
    Ws = [r.standard_normal((6, 4)) for _ in range(3)]
    bs = [r.standard_normal(4) for _ in range(3)]
    S, Wv, bv = _stack(Ws, bs)
    assert fast_mha._stacked(tuple(Wv), tuple(bv)) is S
    S1, W1, b1 = _stack(Ws[:1], bs[:1])
    assert fast_mha._stacked(tuple(W1), tuple(b1)) is S1
    F = np.asfortranarray(S)
    for W, b in (((*Ws,), (*bs,)),                            # arrays of their own
                 ((Wv[1], Wv[0], Wv[2]), (bv[1], bv[0], bv[2])),   # the blocks out of order
                 ((Wv[0], Wv[1], Ws[2]), (*bv,)),            # one weight replaced
                 ((*Wv,), (bv[0], bv[1], bs[2])),            # one bias replaced
                 ((*Wv,), (bv[0], bv[1], bv[2].copy())),     # a copy
                 ((*Wv,), (bv[0], bv[1], Wv[2][0])),         # a row of the weights in the bias's place
                 ((F[:6, :4], F[:6, 4:8], F[:6, 8:]), (F[6, :4], F[6, 4:8], F[6, 8:])),   # not C-contiguous
                 ((S[:5, :4], S[:5, 4:8], S[:5, 8:]), (S[6, :4], S[6, 4:8], S[6, 8:])),   # part of the rows
                 ((S[:6, :3], S[:6, 4:7], S[:6, 8:11]), (S[6, :3], S[6, 4:7], S[6, 8:11]))):   # narrower
        assert fast_mha._stacked(W, b) is None


@pytest.fixture(scope="module")
def own_minilm():
    """all-MiniLM-L6-v2 loaded for this module alone (the tests below edit its weights)."""
    from transformer_np.io.pretrained import load_pretrained

    try:
        return load_pretrained("all-MiniLM-L6-v2")
    except ImportError as e:
        pytest.skip(str(e))


def test_load_pretrained_stacks_the_attention_weights_with_the_files_values(own_minilm):
    from transformer_np.io.interop import params_from_hf_state_dict
    from transformer_np.io.safetensors import load_safetensors

    ref = params_from_hf_state_dict(load_safetensors(own_minilm.folder / "model.safetensors"), own_minilm.config)
    assert list(own_minilm.params) == list(ref)
    for name, a in own_minilm.params.items():
        np.testing.assert_array_equal(a, ref[name])          # exact: the same numbers, copied
    for dt in (np.float32, np.float64):
        P = own_minilm.params_as(dt)
        for layer in range(own_minilm.config.n_layers):
            pre = f"layers.{layer}.attn."
            for group, shape in (("QKV", (385, 1152)), ("O", (385, 384))):
                S = fast_mha._stacked(tuple(P[pre + "W_" + c] for c in group),
                                            tuple(P[pre + "b_" + c] for c in group))
                assert S is not None and S.shape == shape and S.dtype == dt


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(3, 7), (1, 1)])
def test_one_product_agrees_with_three_and_with_plain(dtype, shape):
    """MHA with the stacked layout (inference: [X | 1] S and [ctx | 1] [W_O ; b_O]; training: one
    X [W_Q | W_K | W_V] product) against separate arrays and the plain op."""
    r = np.random.default_rng(9)
    d, h = 48, 4
    B, n = shape
    x = r.standard_normal((B, n, d)).astype(dtype)
    p = {f"{k}_{c}": r.standard_normal((d, d) if k == "W" else d).astype(dtype) for k in "Wb" for c in "QKVO"}
    fused = dict(p)
    for group in ("QKV", "O"):
        _, Wv, bv = _stack([p["W_" + c] for c in group], [p["b_" + c] for c in group])
        fused.update({"W_" + c: W for c, W in zip(group, Wv)}, **{"b_" + c: b for c, b in zip(group, bv)})
    mask = attention_mask_case("padding", B, n, n, dtype, r)
    ref = plain.mha_forward(x, p, h, mask)[0]
    for fb in (False, True):
        three = fast.mha_forward(x, p, h, mask, for_backward=fb)[0]
        one = fast.mha_forward(x, fused, h, mask, for_backward=fb)[0]
        assert one.shape == (B, n, d) and one.dtype == dtype and one.flags.c_contiguous
        assert_paths_close(one, three, k=d + 1, paths=("one product", "separate products"))
        assert_paths_close(one, ref, k=d + 1, paths=("one product", "plain"))


def test_editing_or_replacing_a_weight_is_seen_by_encode(own_minilm):
    """The (d, 3d) product reads the views' memory: an in-place edit of W_K changes the embeddings exactly as
    the same edit on separate arrays does; a replaced W_V is used as given (three products)."""
    enc = own_minilm
    sentences = ["The river bank was flooded.", "He paid money into the bank.", "ok"]
    before = enc.encode(sentences)
    name_k, name_v = "layers.2.attn.W_K", "layers.4.attn.W_V"
    separate = {k: np.array(v) for k, v in enc.params.items()}   # contiguous copies: the three-product path
    old_k, old_v = enc.params[name_k].copy(), enc.params[name_v]
    try:
        enc.params[name_k] *= 0.5                                # in place, through the view
        separate[name_k] *= 0.5
        enc.params[name_v] = old_v[::-1].copy()                  # replaced by another array
        separate[name_v] = old_v[::-1].copy()
        after = enc.encode(sentences)
        enc_sep = type(enc)(enc.config, separate, enc.tokenizer, enc.max_seq_length, enc.pooling, enc.normalize,
                            enc.folder, enc.dense)
        assert fast_mha._stacked(tuple(separate[f"layers.2.attn.W_{c}"] for c in "QKV"),
                                       tuple(separate[f"layers.2.attn.b_{c}"] for c in "QKV")) is None
        assert_paths_close(after, enc_sep.encode(sentences), k=enc.config.d_ff,
                           paths=("edited views", "edited separate arrays"))
        assert np.abs(after - before).max() > 1e-3            # the edit changed the embeddings
    finally:
        enc.params[name_k][...] = old_k
        enc.params[name_v] = old_v
    assert_paths_close(enc.encode(sentences), before, k=enc.config.d_ff, paths=("restored", "before"))


# ----------------------------------------------------------------------------- the embedding block
def _emb_cfg(**kw):
    base = dict(n_layers=1, d_model=24, n_heads=4, d_ff=40, vocab_size=60, max_len=12, dropout=0.0,
                type_vocab_size=3)
    base.update(kw)
    return tnp.EncoderConfig(**base)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("types", ["none", "zeros", "ones", "mixed"])
@pytest.mark.parametrize("shape", [(3, 7), (1, 1), (2, 12)])
@pytest.mark.parametrize("ln", [True, False])
def test_inference_embeddings_agree_with_the_plain_block(dtype, types, shape, ln):
    """H^(0) of the inference forward (:func:`_embeddings_infer`: positions and a single token type broadcast,
    the value-only LayerNorm) against the plain forward's H^(0); without the LayerNorm the sums are the
    plain block's, in its order, so they agree bit for bit."""
    cfg = _emb_cfg(embedding_layer_norm=ln)
    B, n = shape
    r = np.random.default_rng(B * 100 + n)
    p = nontrivial_params(cfg, 1, dtype)
    ids = r.integers(0, cfg.vocab_size, (B, n))
    tt = {"none": None, "zeros": np.zeros((B, n), np.int64), "ones": np.ones((B, n), np.int64),
          "mixed": r.integers(0, 3, (B, n))}[types]
    _, c = tnp.encoder_forward(p, cfg, input_ids=ids, token_type_ids=tt, for_backward=False)
    _, c_plain = tnp.encoder_forward(p, cfg, input_ids=ids, token_type_ids=tt, fast=False)
    h0, h0_plain = c["hidden_states"][0], c_plain["hidden_states"][0]
    assert h0.dtype == dtype and h0.shape == (B, n, cfg.d_model)
    if ln:
        assert_paths_close(h0, h0_plain, k=cfg.d_model, paths=("inference H0", "plain H0"))
    else:
        np.testing.assert_array_equal(h0, h0_plain)          # exact: the same sums of the same rows, in order


@pytest.mark.parametrize("key", ["word", "position", "token_type", "ln.gamma"])
@pytest.mark.parametrize("value", [np.nan, np.inf])
def test_inference_embeddings_name_a_nonfinite_row(key, value):
    cfg = _emb_cfg()
    p = nontrivial_params(cfg, 2, np.float32)
    ids = np.array([[4, 5, 6]])
    row = {"word": 5, "position": 1, "token_type": 0, "ln.gamma": 0}[key]
    p["embeddings." + key][row] = value
    with pytest.raises(NonFiniteError, match=rf"params\['embeddings.{key}'\]"):
        tnp.encoder_forward(p, cfg, input_ids=ids, for_backward=False)


# ----------------------------------------------------------------------------- the whole stack, both layouts
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("norm", ["post", "pre"])
@pytest.mark.parametrize("shape", [(3, 7), (1, 1)])
def test_the_stack_with_the_loaded_layout_agrees_with_plain(dtype, norm, shape):
    """encoder_forward for inference on params laid out as load_pretrained lays them out (stacked attention
    projections), Post-LN and Pre-LN, padding, batch 1 with T = 1, against the plain path on the same values."""
    cfg = _emb_cfg(n_layers=2, norm_position=norm)
    B, n = shape
    p = nontrivial_params(cfg, 3, dtype)
    stacked = _qkv_layout(p)
    assert fast_mha._stacked(tuple(stacked[f"layers.1.attn.W_{c}"] for c in "QKV"),
                                   tuple(stacked[f"layers.1.attn.b_{c}"] for c in "QKV")) is not None
    r = np.random.default_rng(B + n)
    ids = r.integers(0, cfg.vocab_size, (B, n))
    am = np.ones((B, n), np.int64)
    am[0, max(1, n - 2):] = 0
    H, c = tnp.encoder_forward(stacked, cfg, input_ids=ids, attention_mask=am, for_backward=False)
    H_plain, c_plain = tnp.encoder_forward(p, cfg, input_ids=ids, attention_mask=am, fast=False)
    k = max(cfg.d_ff, cfg.d_model + 1)
    for h, h_plain in zip(c["hidden_states"] + [H], c_plain["hidden_states"] + [H_plain], strict=True):
        assert_paths_close(h, h_plain, k=k, paths=("inference, stacked", "plain"))


@pytest.mark.parametrize("name", ["layers.0.attn.b_K", "layers.1.attn.W_O", "layers.0.attn.b_O"])
def test_a_nonfinite_view_is_named(name):
    cfg = _emb_cfg(n_layers=2)
    p = _qkv_layout(nontrivial_params(cfg, 4, np.float32))
    p[name].flat[2] = np.nan                                  # through the view, into the stacked array
    with pytest.raises(NonFiniteError, match=rf"params\['{name}'\] must contain only finite values"):
        tnp.encoder_forward(p, cfg, input_ids=np.array([[1, 2, 3]]), for_backward=False)
