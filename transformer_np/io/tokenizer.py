r"""BERT's WordPiece tokenizer in pure Python: text → the ids an encoder reads.

The pipeline, which mirrors the Hugging Face ``tokenizers`` BERT pipeline
(``BertNormalizer`` → ``BertPreTokenizer`` → ``WordPiece`` → ``[CLS] … [SEP]``) so that the
ids are identical to the reference's:

1. special tokens written literally in the text ("[MASK]", "[SEP]", …) are split out first,
   untouched (the longest match wins);
2. normalisation of the rest: drop NUL, U+FFFD and control characters (categories Cc, Cf, Co, Cs,
   except tab/newline/CR), turn every whitespace into " ", put spaces around CJK ideographs (each
   becomes its own word), strip accents (NFD, then drop non-spacing marks, category Mn) and
   lower-case, character by character (so a final "Σ" becomes "σ", as in ``tokenizers``);
3. pre-tokenisation: split on whitespace, and make every punctuation character (ASCII
   punctuation or Unicode category P*) a word of its own;
4. WordPiece: each word is cut greedily into the longest vocabulary pieces from the left,
   continuation pieces carrying the "##" prefix ("tokenization" → "token", "##ization");
   a word with a piece that cannot be matched, or longer than 100 characters, becomes
   [UNK];
5. [CLS] + pieces + [SEP], truncated so the whole fits in ``max_length`` (only the pieces
   are cut; [CLS] and [SEP] always stay), then right-padded with [PAD] to the longest
   sequence of the batch; ``attention_mask`` is 1 on real tokens, ``token_type_ids`` 0.
"""

from __future__ import annotations

import json
import os
import re
import unicodedata
from typing import Iterable

import numpy as np

__all__ = ["WordPieceTokenizer", "basic_normalize", "pre_tokenize", "wordpiece"]

# Unicode White_Space (what Rust's char::is_whitespace, used by ``tokenizers``, accepts).
_WHITESPACE = frozenset("\t\n\x0b\x0c\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006"
                        "\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000")

# The CJK ideograph blocks BERT isolates. As in ``tokenizers`` (Rust), the fifth range starts at
# U+2B920, not at U+2B820 as in Google's Python BERT: we match the reference implementation.
_CJK_RANGES = ((0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F),
               (0x2B740, 0x2B81F), (0x2B920, 0x2CEAF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F))


def _is_whitespace(c: str) -> bool:
    return c in _WHITESPACE


def _is_control(c: str) -> bool:
    if c in "\t\n\r":          # technically controls, but BERT counts them as whitespace
        return False
    # Cc, Cf, Co, Cs — not Cn (unassigned): the ``tokenizers`` tables do not list unassigned
    # code points as "other", so they survive as ordinary characters (and usually become [UNK]).
    return unicodedata.category(c) in ("Cc", "Cf", "Co", "Cs")


def _is_cjk(c: str) -> bool:
    cp = ord(c)
    return any(lo <= cp <= hi for lo, hi in _CJK_RANGES)


def _is_punctuation(c: str) -> bool:
    # ASCII punctuation includes $ + < = > ^ ` | ~, which Unicode files under symbols (S*).
    cp = ord(c)
    if 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126:
        return True
    return unicodedata.category(c).startswith("P")


def basic_normalize(text: str, lowercase: bool = True, strip_accents: bool | None = None,
                    clean_text: bool = True, handle_chinese_chars: bool = True) -> str:
    """BERT's normaliser (step 2 of the module docstring). ``strip_accents=None`` follows
    ``lowercase``, as in BERT."""
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    if clean_text:
        text = "".join(" " if _is_whitespace(c) else c for c in text
                       if not (c == "\x00" or c == "\ufffd" or _is_control(c)))
    if handle_chinese_chars:
        text = "".join(f" {c} " if _is_cjk(c) else c for c in text)
    if lowercase if strip_accents is None else strip_accents:
        text = "".join(c for c in unicodedata.normalize("NFD", text) if unicodedata.category(c) != "Mn")
    if lowercase:
        text = "".join(c.lower() for c in text)   # per character, like tokenizers (no final-sigma rule)
    return text


def pre_tokenize(text: str) -> list[str]:
    """Split normalised text into words: on whitespace, and around every punctuation mark."""
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    words, cur = [], []
    for c in text:
        if _is_whitespace(c):
            if cur:
                words.append("".join(cur))
                cur = []
        elif _is_punctuation(c):
            if cur:
                words.append("".join(cur))
                cur = []
            words.append(c)
        else:
            cur.append(c)
    if cur:
        words.append("".join(cur))
    return words


def wordpiece(word: str, vocab: dict[str, int], unk_token: str = "[UNK]", prefix: str = "##",
              max_chars: int = 100) -> list[str]:
    """Greedy longest-match-first segmentation of one word into vocabulary pieces.

    Returns ``[unk_token]`` when the word is longer than ``max_chars`` or some position
    has no matching piece (BERT discards partial matches for the whole word).
    """
    if not isinstance(word, str):
        raise TypeError(f"word must be a str, got {type(word).__name__}")
    if not isinstance(vocab, dict):
        raise TypeError(f"vocab must be a dict of piece -> id, got {type(vocab).__name__}")
    if len(word) > max_chars:
        return [unk_token]
    pieces, start = [], 0
    while start < len(word):
        end, piece = len(word), None
        while start < end:
            sub = word[start:end] if start == 0 else prefix + word[start:end]
            if sub in vocab:
                piece = sub
                break
            end -= 1
        if piece is None:
            return [unk_token]
        pieces.append(piece)
        start = end
    return pieces


def _read_vocab_txt(path: str) -> dict[str, int]:
    vocab: dict[str, int] = {}
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f):
            tok = line.rstrip("\n").rstrip("\r")
            vocab.setdefault(tok, i)   # first occurrence wins, like BERT's load_vocab for duplicates
    return vocab


class WordPieceTokenizer:
    """A BERT WordPiece tokenizer.

    Build it from a model folder with :meth:`from_folder` (``tokenizer.json`` preferred,
    else ``vocab.txt`` + ``tokenizer_config.json``), or directly from a vocabulary.

    Attributes:
        vocab: token -> id; ``ids_to_tokens`` is the inverse.
        max_length: the truncation length in tokens, [CLS] and [SEP] included.
        lowercase, strip_accents, handle_chinese_chars, clean_text: the normaliser's options.
    """

    def __init__(self, vocab: dict[str, int], max_length: int = 512, lowercase: bool = True,
                 strip_accents: bool | None = None, handle_chinese_chars: bool = True,
                 clean_text: bool = True, unk_token: str = "[UNK]", cls_token: str = "[CLS]",
                 sep_token: str = "[SEP]", pad_token: str = "[PAD]", mask_token: str = "[MASK]",
                 max_input_chars_per_word: int = 100, prefix: str = "##",
                 special_tokens: Iterable[str] | None = None):
        if not isinstance(vocab, dict) or not vocab:
            raise TypeError("vocab must be a non-empty dict of token -> id")
        if not isinstance(max_length, int) or isinstance(max_length, bool) or max_length < 2:
            raise ValueError(f"max_length must be an integer ≥ 2 (room for [CLS] and [SEP]), got {max_length!r}")
        for name, tok in (("unk_token", unk_token), ("cls_token", cls_token), ("sep_token", sep_token),
                          ("pad_token", pad_token)):
            if tok not in vocab:
                raise ValueError(f"{name} {tok!r} is not in the vocabulary")
        self.vocab = vocab
        self.ids_to_tokens = {i: t for t, i in vocab.items()}
        self.max_length = max_length
        self.lowercase, self.strip_accents = lowercase, strip_accents
        self.handle_chinese_chars, self.clean_text = handle_chinese_chars, clean_text
        self.unk_token, self.cls_token, self.sep_token, self.pad_token = unk_token, cls_token, sep_token, pad_token
        self.max_input_chars_per_word, self.prefix = max_input_chars_per_word, prefix
        specials = list(special_tokens) if special_tokens is not None else [
            t for t in (pad_token, unk_token, cls_token, sep_token, mask_token) if t in vocab]
        self.special_tokens = specials
        # Longest first, so a longer special token wins over a prefix of it.
        self._special_re = (re.compile("|".join(re.escape(t) for t in sorted(specials, key=len, reverse=True)))
                            if specials else None)

    # ---- construction ---------------------------------------------------------------
    @classmethod
    def from_folder(cls, folder, max_length: int | None = None) -> "WordPieceTokenizer":
        """Read ``tokenizer.json`` (a WordPiece model with a BertNormalizer) or, failing that,
        ``vocab.txt`` with the options of ``tokenizer_config.json``.

        ``max_length`` None = ``tokenizer_config.json``'s ``model_max_length`` (else 512).
        """
        folder = os.fspath(folder)
        tj, vt = os.path.join(folder, "tokenizer.json"), os.path.join(folder, "vocab.txt")
        tc = os.path.join(folder, "tokenizer_config.json")
        conf = {}
        if os.path.isfile(tc):
            with open(tc, encoding="utf-8") as f:
                conf = json.load(f)
        if max_length is None:
            mml = conf.get("model_max_length", 512)
            max_length = int(mml) if isinstance(mml, (int, float)) and mml < 1e6 else 512
        if os.path.isfile(tj):
            return cls._from_tokenizer_json(tj, max_length)
        if os.path.isfile(vt):
            sa = conf.get("strip_accents")
            return cls(_read_vocab_txt(vt), max_length=max_length, lowercase=bool(conf.get("do_lower_case", True)),
                       strip_accents=sa if isinstance(sa, bool) else None,
                       handle_chinese_chars=bool(conf.get("tokenize_chinese_chars", True)),
                       unk_token=conf.get("unk_token", "[UNK]"), cls_token=conf.get("cls_token", "[CLS]"),
                       sep_token=conf.get("sep_token", "[SEP]"), pad_token=conf.get("pad_token", "[PAD]"),
                       mask_token=conf.get("mask_token", "[MASK]"))
        raise ValueError(f"folder {folder!r} has neither tokenizer.json nor vocab.txt")

    @classmethod
    def _from_tokenizer_json(cls, path: str, max_length: int) -> "WordPieceTokenizer":
        with open(path, encoding="utf-8") as f:
            tj = json.load(f)
        model = tj.get("model") or {}
        if model.get("type") != "WordPiece":
            raise ValueError(f"{path}: only WordPiece tokenizers are supported, got model type {model.get('type')!r}")
        norm = tj.get("normalizer") or {}
        if norm.get("type") != "BertNormalizer":
            raise ValueError(f"{path}: expected a BertNormalizer, got {norm.get('type')!r}")
        pre = (tj.get("pre_tokenizer") or {}).get("type")
        if pre != "BertPreTokenizer":
            raise ValueError(f"{path}: expected a BertPreTokenizer, got {pre!r}")
        vocab = {str(k): int(v) for k, v in model["vocab"].items()}
        specials = [t["content"] for t in tj.get("added_tokens", []) if t.get("special")]
        by_id = {v: k for k, v in vocab.items()}
        post = tj.get("post_processor") or {}
        cls_tok, sep_tok = "[CLS]", "[SEP]"
        if post.get("type") == "TemplateProcessing":
            single = [s["SpecialToken"]["id"] for s in post.get("single", []) if "SpecialToken" in s]
            if len(single) == 2:
                cls_tok, sep_tok = single
        elif post.get("type") == "BertProcessing":
            sep_tok, cls_tok = by_id[post["sep"][1]], by_id[post["cls"][1]]
        pad = (tj.get("padding") or {}).get("pad_token", "[PAD]")
        return cls(vocab, max_length=max_length, lowercase=bool(norm.get("lowercase", True)),
                   strip_accents=norm.get("strip_accents"),
                   handle_chinese_chars=bool(norm.get("handle_chinese_chars", True)),
                   clean_text=bool(norm.get("clean_text", True)), unk_token=model.get("unk_token", "[UNK]"),
                   cls_token=cls_tok, sep_token=sep_tok, pad_token=pad,
                   max_input_chars_per_word=int(model.get("max_input_chars_per_word", 100)),
                   prefix=model.get("continuing_subword_prefix", "##"), special_tokens=specials)

    # ---- text -> tokens -------------------------------------------------------------
    def tokenize(self, text: str) -> list[str]:
        """The WordPiece tokens of one text (no [CLS]/[SEP], no truncation)."""
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        tokens: list[str] = []
        pos = 0
        chunks = []
        if self._special_re is not None:
            for m in self._special_re.finditer(text):
                chunks.append((text[pos:m.start()], False))
                chunks.append((m.group(), True))
                pos = m.end()
        chunks.append((text[pos:], False))
        for chunk, special in chunks:
            if special:
                tokens.append(chunk)
                continue
            norm = basic_normalize(chunk, self.lowercase, self.strip_accents, self.clean_text,
                                   self.handle_chinese_chars)
            for word in pre_tokenize(norm):
                tokens.extend(wordpiece(word, self.vocab, self.unk_token, self.prefix,
                                        self.max_input_chars_per_word))
        return tokens

    def convert_tokens_to_ids(self, tokens: list[str]) -> list[int]:
        unk = self.vocab[self.unk_token]
        return [self.vocab.get(t, unk) for t in tokens]

    def convert_ids_to_tokens(self, ids) -> list[str]:
        return [self.ids_to_tokens.get(int(i), self.unk_token) for i in ids]

    def encode(self, text: str, max_length: int | None = None) -> list[int]:
        """[CLS] + ids + [SEP], the pieces truncated to fit ``max_length`` (default: self.max_length)."""
        m = self.max_length if max_length is None else max_length
        ids = self.convert_tokens_to_ids(self.tokenize(text))[: max(m - 2, 0)]
        return [self.vocab[self.cls_token]] + ids + [self.vocab[self.sep_token]]

    def __call__(self, sentences, max_length: int | None = None) -> dict[str, np.ndarray]:
        """Tokenise a batch: ``{"input_ids", "attention_mask", "token_type_ids"}``, each an
        int64 array (B, T) right-padded to the longest sequence T of the batch."""
        if isinstance(sentences, str):
            sentences = [sentences]
        if not isinstance(sentences, (list, tuple)) or not sentences:
            raise TypeError(f"sentences must be a str or a non-empty list of str, got {type(sentences).__name__}"
                            + (" (empty)" if isinstance(sentences, (list, tuple)) else ""))
        for i, s in enumerate(sentences):
            if not isinstance(s, str):
                raise TypeError(f"sentences[{i}] must be a str, got {type(s).__name__}")
        if max_length is not None and (not isinstance(max_length, int) or isinstance(max_length, bool)
                                       or max_length < 2):
            raise ValueError(f"max_length must be an integer ≥ 2, got {max_length!r}")
        seqs = [self.encode(s, max_length) for s in sentences]
        T = max(len(s) for s in seqs)
        pad = self.vocab[self.pad_token]
        ids = np.full((len(seqs), T), pad, dtype=np.int64)               # (B, T)
        mask = np.zeros((len(seqs), T), dtype=np.int64)
        for b, s in enumerate(seqs):
            ids[b, :len(s)] = s
            mask[b, :len(s)] = 1
        return {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
