"""The tokenizer's speed path (round 4): ASCII text normalised and split by C-level string calls, and
words segmented once per tokenizer (a word → pieces cache). Both must give what the per-character
path gives — these are string functions, so the comparisons are exact."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from transformer_np.io import tokenizer as T

ASCII = st.text(alphabet=st.characters(min_codepoint=0, max_codepoint=127), max_size=40)
OPTIONS = st.sampled_from([{}, {"lowercase": False}, {"clean_text": False}, {"strip_accents": False},
                           {"lowercase": False, "clean_text": False}])
NBSP = "\u00a0"   # a non-ASCII whitespace: appending it sends a text down the per-character path


@settings(max_examples=400, deadline=None, derandomize=True)
@given(ASCII, OPTIONS)
def test_ascii_normalize_is_the_per_character_result(text, options):
    fast = T.basic_normalize(text, **options)
    slow = T.basic_normalize(text + NBSP, **options)
    tail = T.basic_normalize(NBSP, **options)
    # exact: the same string operations' results, one path per character, the other by translate/lower
    assert slow[:len(slow) - len(tail)] == fast


@settings(max_examples=400, deadline=None, derandomize=True)
@given(ASCII)
def test_ascii_pre_tokenize_is_the_per_character_result(text):
    # exact: a trailing whitespace character adds no word
    assert T.pre_tokenize(text) == T.pre_tokenize(text + NBSP)


def test_known_ascii_cases():
    assert T.basic_normalize("Hello\tWORLD\x0b\x00!") == "hello world!"          # \x0b: a control, removed
    assert T.pre_tokenize("don't stop,now\n(ok)") == ["don", "'", "t", "stop", ",", "now", "(", "ok", ")"]
    assert T.pre_tokenize("a$b+c") == ["a", "$", "b", "+", "c"]                 # ASCII symbols split too


def _tok(**kw):
    vocab = {t: i for i, t in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "un", "##aff", "##able",
                                         "aff", "the", ",", "."])}
    return T.WordPieceTokenizer(vocab, **kw)


def test_word_cache_gives_the_uncached_pieces_and_follows_a_new_vocab():
    tok = _tok()
    text = "The unaffable, the unaffable. Xyz"
    first = tok.tokenize(text)
    again = tok.tokenize(text)                                   # from the word cache
    expected = [p for w in T.pre_tokenize(T.basic_normalize(text)) for p in T.wordpiece(w, tok.vocab)]
    assert first == again == expected == ["the", "un", "##aff", "##able", ",", "the", "un", "##aff", "##able",
                                          ".", "[UNK]"]
    tok.vocab = {**tok.vocab, "xyz": 12}                         # a new vocab: a new cache
    assert tok.tokenize(text)[-1] == "xyz"
    tok.unk_token = "[MASK]"                                     # what segmentation reads: a new cache too
    assert tok.tokenize("qqq") == ["[MASK]"]


def test_word_cache_is_bounded(monkeypatch):
    tok = _tok()
    monkeypatch.setattr(T.WordPieceTokenizer, "_WORD_CACHE_SIZE", 3)
    for w in ("the", "un", "aff", "the", "unaffable"):
        tok.tokenize(w)
        assert len(tok._pieces[1]) <= 3
