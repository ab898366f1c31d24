"""The pure-Python WordPiece tokenizer: hand-checked pieces, and ids identical to the
reference (``tokenizers`` from tokenizer.json, and transformers' AutoTokenizer called as
sentence-transformers calls it) on a varied corpus and on random Unicode strings."""

from __future__ import annotations

import os
import random

import numpy as np
import pytest

from transformer_np.io.tokenizer import WordPieceTokenizer, basic_normalize, pre_tokenize, wordpiece

os.environ.setdefault("HF_HUB_OFFLINE", "1")

CORPUS = [
    "The boat drifted slowly toward the river bank.",
    "She deposited her paycheck at the bank on Monday.",
    "Hello, world! How are you?!",
    "Crème brûlée, jalapeño, naïve café — déjà vu.",
    "ÉCOLE NORMALE SUPÉRIEURE in Paris",
    "The price rose 12.5% to $1,234.56 on 2024-03-15.",
    "Call +1 (555) 867-5309 or e-mail info@example.com.",
    "Antidisestablishmentarianism is a notoriously long word.",
    "Pneumonoultramicroscopicsilicovolcanoconiosis, supercalifragilisticexpialidocious!",
    "我爱北京天安门。",
    "Mixed 中文 and English text: 模型 works?",
    "Tokyo (東京) is the capital of Japan; Kyoto (京都) was before.",
    "ΟΔΥΣΣΕΥΣ and Ἀθῆναι are Greek.",
    "Привет, как дела? Всё хорошо.",
    "Emoji 😀 and symbols ©®™ are often unknown.",
    "tabs\tand\nnewlines\r\nare whitespace",
    "Don't stop-believing; it's 'quoted' \"text\" [brackets] {braces} <angle>.",
    "A [MASK] token written literally, and [SEP] too.",
    "   leading and trailing spaces   ",
    "",
    "x" * 120,
    "unaffable unbelievable preprocessing tokenization",
    " ".join(f"word{i} number {i * 7}" for i in range(80)),   # > 256 tokens: truncated
]


def _model_folder():
    from transformer_np.io.pretrained import model_folder

    try:
        return model_folder("all-MiniLM-L6-v2")
    except ImportError as e:
        pytest.skip(str(e))


@pytest.fixture(scope="module")
def folder():
    return _model_folder()


@pytest.fixture(scope="module")
def tok(folder):
    return WordPieceTokenizer.from_folder(folder, max_length=256)


# ----------------------------------------------------------------------------- hand-checked pieces
def test_wordpiece_greedy_longest_match():
    vocab = {"[UNK]": 0, "un": 1, "##aff": 2, "##able": 3, "a": 4, "##ff": 5, "una": 6}
    assert wordpiece("unaffable", vocab) == ["una", "##ff", "##able"]     # longest first piece wins
    assert wordpiece("affable", vocab) == ["a", "##ff", "##able"]
    assert wordpiece("unx", vocab) == ["[UNK]"]                              # one bad piece: whole word
    assert wordpiece("a" * 101, {**vocab, "##a": 7}) == ["[UNK]"]            # longer than 100 chars


def test_normalize_and_split():
    assert basic_normalize("Héllo\tWÖRLD\x00\u200b") == "hello world"        # accents, case, controls
    assert basic_normalize("北京") == " 北  京 "                              # CJK isolated
    assert basic_normalize("ΣΑΣ") == "σασ"                                    # per-character lower-casing
    assert basic_normalize("Héllo", lowercase=False) == "Héllo"
    assert pre_tokenize("don't stop-now!") == ["don", "'", "t", "stop", "-", "now", "!"]
    assert pre_tokenize("a$b") == ["a", "$", "b"]                              # ASCII symbols are punctuation


def test_batch_layout(tok):
    b = tok(["Hello world", "a"])
    assert set(b) == {"input_ids", "attention_mask", "token_type_ids"}
    ids = b["input_ids"]
    assert ids.dtype == np.int64 and ids.shape == (2, 4)
    cls, sep, pad = tok.vocab["[CLS]"], tok.vocab["[SEP]"], tok.vocab["[PAD]"]
    assert ids[0].tolist() == [cls, tok.vocab["hello"], tok.vocab["world"], sep]
    assert ids[1].tolist() == [cls, tok.vocab["a"], sep, pad]
    assert b["attention_mask"].tolist() == [[1, 1, 1, 1], [1, 1, 1, 0]]
    assert not b["token_type_ids"].any()
    long = tok(["word " * 400])["input_ids"]
    assert long.shape == (1, 256) and long[0, 0] == cls and long[0, -1] == sep


# ----------------------------------------------------------------------------- against the reference
def test_corpus_matches_tokenizers_json(folder, tok):
    tokenizers = pytest.importorskip("tokenizers", reason="pip install tokenizers")
    ref = tokenizers.Tokenizer.from_file(str(folder / "tokenizer.json"))
    ref.enable_truncation(256)
    ref.enable_padding(pad_id=0, pad_token="[PAD]")                   # to the longest
    enc = ref.encode_batch(CORPUS)
    ours = tok(CORPUS)
    assert len(CORPUS) >= 20
    # exact: token ids and masks are integers
    np.testing.assert_array_equal(ours["input_ids"], np.array([e.ids for e in enc]))
    np.testing.assert_array_equal(ours["attention_mask"], np.array([e.attention_mask for e in enc]))   # exact: integers
    np.testing.assert_array_equal(ours["token_type_ids"], np.array([e.type_ids for e in enc]))   # exact: integers
    # the corpus exercises what it claims to: pieces, [UNK], truncation, a literal special token
    flat = [t for e in enc for t in e.tokens]
    assert any(t.startswith("##") for t in flat) and "[UNK]" in flat and "[MASK]" in flat
    assert len(tok.tokenize(CORPUS[-1])) > 256


def test_corpus_matches_autotokenizer_as_sentence_transformers_calls_it(folder, tok):
    transformers = pytest.importorskip("transformers", reason="pip install transformers")
    ref = transformers.AutoTokenizer.from_pretrained(str(folder))
    r = ref(CORPUS, padding=True, truncation="longest_first", max_length=256, return_tensors="np")
    ours = tok(CORPUS)
    for k in ("input_ids", "attention_mask", "token_type_ids"):
        np.testing.assert_array_equal(ours[k], r[k])   # exact: integers
    for s in CORPUS[:10]:
        assert tok.tokenize(s) == ref.tokenize(s)


def test_vocab_txt_path_equals_tokenizer_json_path(folder, tmp_path, tok):
    for name in ("vocab.txt", "tokenizer_config.json"):
        (tmp_path / name).write_bytes((folder / name).read_bytes())
    tok_txt = WordPieceTokenizer.from_folder(tmp_path, max_length=256)
    np.testing.assert_array_equal(tok_txt(CORPUS)["input_ids"], tok(CORPUS)["input_ids"])   # exact: integer ids


def test_random_unicode_matches_tokenizers(folder, tok):
    """1,500 random strings mixing ASCII, Latin-1, combining marks, Greek, CJK (and the CJK
    extension ranges where BERT implementations disagree), controls, unassigned and
    special tokens. U+061D is left out: it was assigned (Po) in Unicode 14, after the
    character tables of ``tokenizers`` — a version difference, not a pipeline one."""
    tokenizers = pytest.importorskip("tokenizers", reason="pip install tokenizers")
    ref = tokenizers.Tokenizer.from_file(str(folder / "tokenizer.json"))
    ref.no_padding()
    ref.no_truncation()
    big = WordPieceTokenizer.from_folder(folder, max_length=10**6)
    rng = random.Random(0)
    pools = [range(0x20, 0x7F), range(0xA0, 0x250), range(0x300, 0x370), range(0x370, 0x400),
             range(0x2000, 0x2070), range(0x4E00, 0x4E40), range(0x2B810, 0x2B930), range(0, 0x20),
             range(0x3000, 0x3040), range(0xFFF0, 0x10000), range(0x1F600, 0x1F610),
             [c for c in range(0x600, 0x700) if c != 0x61D], range(0xAC00, 0xAC20),
             [0x85, 0x1C, 0x2028, 0x2029, 0x200B, 0xAD, 0x3A3, 0x130]]
    words = ["[MASK]", "[CLS]", "[SEP]", "[PAD]", "[UNK]", "[mask]", "bank", "unaffable"]
    bad = []
    for _ in range(1500):
        s = "".join(rng.choice(words) + " " if rng.random() < 0.05 else chr(rng.choice(rng.choice(pools)))
                    for _ in range(rng.randint(0, 40)))
        if ref.encode(s).ids != big.encode(s):
            bad.append(s)
    assert not bad, f"{len(bad)} mismatches, e.g. {bad[:3]!r}"


def test_bad_input(tok):
    with pytest.raises(TypeError, match="sentences"):
        tok(42)
    with pytest.raises(TypeError, match="sentences"):
        tok([])
    with pytest.raises(TypeError, match=r"sentences\[1\]"):
        tok(["ok", None])
    with pytest.raises(ValueError, match="max_length"):
        tok(["ok"], max_length=1)
    with pytest.raises(ValueError, match="unk_token"):
        WordPieceTokenizer({"a": 0})
    with pytest.raises(ValueError, match="neither tokenizer.json nor vocab.txt"):
        WordPieceTokenizer.from_folder(os.path.dirname(__file__))
