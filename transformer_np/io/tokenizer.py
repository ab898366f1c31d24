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

Files are checked when read (:meth:`WordPieceTokenizer.from_folder`): the JSON files with the
bounds of :mod:`transformer_np.io.jsonfile` (size, depth, objects where objects belong); the
vocabulary must map strings to distinct non-negative integer ids; the special tokens ([UNK],
[CLS], [SEP], [PAD]) must be in it, with the ids the file's post-processor and added tokens
state. A violation is a :class:`~transformer_np.errors.ModelFolderError` naming the file and key.
"""

from __future__ import annotations

import io
import itertools
import json
import os
import re
import unicodedata
from collections.abc import Iterable

import numpy as np

from .._files import open_regular
from ..errors import InputTypeError, InputValueError, ModelFolderError
from .jsonfile import read_json

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


# ASCII text, the common case, takes two C-level string calls instead of per-character Python: among
# ASCII characters the controls are 0–31 and 127 (\t \n \r count as whitespace and become spaces, the
# rest — \x0b and \x0c included, Unicode category Cc — are removed), there are no CJK ideographs and
# no accents (NFD leaves ASCII unchanged), and str.lower() is the per-character lowering.
_ASCII_CLEAN = {cp: (" " if chr(cp) in "\t\n\r" else None) for cp in (*range(32), 127)}
_ASCII_PUNCT = "!-/:-@\\[-`{-~"                                   # the four ranges of _is_punctuation
_ASCII_WORDS = re.compile(f"[^\t\n\x0b\x0c\r {_ASCII_PUNCT}]+|[{_ASCII_PUNCT}]")


def basic_normalize(text: str, lowercase: bool = True, strip_accents: bool | None = None,
                    clean_text: bool = True, handle_chinese_chars: bool = True) -> str:
    """BERT's normaliser (step 2 of the module docstring). ``strip_accents=None`` follows
    ``lowercase``, as in BERT."""
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    if text.isascii():                                     # the same result by two C-level calls
        if clean_text:
            text = text.translate(_ASCII_CLEAN)
        return text.lower() if lowercase else text
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
    if text.isascii():                                     # whitespace / punctuation among ASCII: a regex
        return _ASCII_WORDS.findall(text)
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


MAX_VOCAB_TXT_BYTES = 64 * 2 ** 20
MAX_VOCAB_ENTRIES = 1 << 21      # tokens of a vocabulary read without a vocab_size to compare with (BERT: 30,522)
MAX_TOKEN_CHARS = 1024           # characters of one vocab.txt line (WordPiece never matches a piece over 100)


def _read_vocab_txt(path: str, vocab_size: int | None = None) -> dict[str, int]:
    """``vocab.txt`` (one token per line, its id the line number) → token -> id, read line by line.

    The file is opened by :func:`transformer_np._files.open_regular` (regular files only, without blocking) and
    checked while it is read: each line is at most :data:`MAX_TOKEN_CHARS` characters, the whole at most
    :data:`MAX_VOCAB_TXT_BYTES` characters, and the line count at most ``vocab_size`` (the model's, from
    config.json: line i is token id i, so a line past it names an id the model does not have) or else
    :data:`MAX_VOCAB_ENTRIES` — so a 10-million-line file is refused after ``vocab_size`` lines, not read."""
    limit = MAX_VOCAB_ENTRIES if vocab_size is None else vocab_size
    why = (f"the model's vocab_size is {vocab_size} (config.json), and line i is token id i" if vocab_size is not None
           else f"at most {MAX_VOCAB_ENTRIES} tokens are read")
    vocab: dict[str, int] = {}
    chars = 0
    with open_regular(path, error=ModelFolderError, what="vocabulary file") as raw:
        f = io.TextIOWrapper(raw, encoding="utf-8", newline=None)   # universal newlines, as BERT's load_vocab
        try:
            for i in itertools.count():
                line = f.readline(MAX_TOKEN_CHARS + 2)
                if not line:
                    break
                chars += len(line)
                if i >= limit:
                    raise ModelFolderError(f"{path}: line {i + 1} is token id {i}, but {why}")
                tok = line.rstrip("\n")
                if len(tok) > MAX_TOKEN_CHARS:
                    raise ModelFolderError(f"{path}: line {i + 1} is longer than the {MAX_TOKEN_CHARS} characters a "
                                           f"token may have")
                if chars > MAX_VOCAB_TXT_BYTES:
                    raise ModelFolderError(f"{path}: more than the {MAX_VOCAB_TXT_BYTES} bytes a vocabulary file may "
                                           f"have")
                vocab.setdefault(tok, i)   # first occurrence wins, like BERT's load_vocab for duplicates
        except UnicodeDecodeError as e:
            raise ModelFolderError(f"{path}: not UTF-8 text ({e})") from None
        except OSError as e:
            raise ModelFolderError(f"{path}: cannot be read ({e.strerror or e})") from None
        finally:
            f.detach()
    if not vocab:
        raise ModelFolderError(f"{path}: the vocabulary is empty")
    return vocab


def _check_vocab(vocab) -> None:
    """token -> id with str tokens and distinct non-negative int ids (InputValueError/InputTypeError)."""
    if not isinstance(vocab, dict) or not vocab:
        raise InputTypeError("vocab must be a non-empty dict of token -> id")
    seen: dict[int, str] = {}
    for tok, i in vocab.items():
        if not isinstance(tok, str):
            raise InputTypeError(f"vocab keys must be strings (tokens), got {tok!r}")
        if isinstance(i, bool) or not isinstance(i, (int, np.integer)):
            raise InputTypeError(f"vocab[{tok!r}] must be an integer id, got {i!r}")
        if i < 0:
            raise InputValueError(f"vocab[{tok!r}] must be a non-negative id, got {i}")
        if i in seen:
            raise InputValueError(f"vocab ids must be distinct: {seen[i]!r} and {tok!r} both have id {i}")
        seen[int(i)] = tok


def _token_text(value, key: str, where: str) -> str:
    """A special token from a config: a string, or an AddedToken object {"content": str, …}."""
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]
    if not isinstance(value, str):
        raise ModelFolderError(f"{where}: {key} must be a string, got {value!r:.60}")
    return value


def _positive(d: dict, key: str, default: int, where: str) -> int:
    """d[key] (or ``default``) as an integer >= 1 (e.g. ``max_input_chars_per_word``: 0 would make every word
    [UNK])."""
    v = _get(d, key, int, default, where)
    if v < 1:
        raise ModelFolderError(f"{where}{key} must be an integer >= 1, got {v}")
    return v


def _get(d: dict, key: str, kind, default, where: str):
    """d[key] (or ``default``) checked to be of ``kind`` (bool is never an int here). ``where`` is the
    message prefix: "file: " or "file: model." (the key path so far)."""
    v = d.get(key, default)
    if v is None and default is None:
        return None
    if isinstance(v, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,)):
        ok = False
    else:
        ok = isinstance(v, kind)
    if not ok:
        names = {dict: "a JSON object", list: "a JSON array", str: "a string", bool: "true or false", int: "an integer",
                 float: "a number"}
        name = " or ".join(names[k] for k in (kind if isinstance(kind, tuple) else (kind,)))
        raise ModelFolderError(f"{where}{key} must be {name}, got {v!r:.60}")
    return v


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
        _check_vocab(vocab)
        if not isinstance(max_length, int) or isinstance(max_length, bool) or max_length < 2:
            raise InputValueError(f"max_length must be an integer ≥ 2 (room for [CLS] and [SEP]), got {max_length!r}")
        for name, tok in (("unk_token", unk_token), ("cls_token", cls_token), ("sep_token", sep_token),
                          ("pad_token", pad_token)):
            if tok not in vocab:
                raise InputValueError(f"{name} {tok!r} is not in the vocabulary")
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
    def from_folder(cls, folder, max_length: int | None = None, *, vocab_size: int | None = None
                    ) -> WordPieceTokenizer:
        """Read ``tokenizer.json`` (a WordPiece model with a BertNormalizer) or, failing that,
        ``vocab.txt`` with the options of ``tokenizer_config.json``.

        ``max_length`` None = ``tokenizer_config.json``'s ``model_max_length`` (else 512). ``vocab_size`` (the
        model's, when known): the vocabulary is compared with it while it is read — a ``vocab.txt`` line past it,
        or a ``model.vocab`` with more entries, is refused before the rest is read or checked.
        """
        folder = os.fspath(folder)
        tj, vt = os.path.join(folder, "tokenizer.json"), os.path.join(folder, "vocab.txt")
        tc = os.path.join(folder, "tokenizer_config.json")
        conf = read_json(tc, error=ModelFolderError) if os.path.lexists(tc) else {}
        if max_length is None:
            mml = _get(conf, "model_max_length", (int, float), 512, tc + ": ")
            # transformers writes 1e30 for "no limit": then 512, BERT's positions
            max_length = int(mml) if 2 <= mml < 1e6 else 512
        if os.path.lexists(tj):
            # a tokenizer.json without a padding section (transformers 5 writes none) pads with the config's token
            pad = _token_text(conf["pad_token"], "pad_token", tc) if conf.get("pad_token") is not None else "[PAD]"
            return cls._from_tokenizer_json(tj, max_length, vocab_size, pad)
        if os.path.lexists(vt):
            sa = _get(conf, "strip_accents", bool, None, tc + ": ")
            tokens = {k: _token_text(conf.get(k, f"[{k[:-6].upper()}]"), k, tc)
                      for k in ("unk_token", "cls_token", "sep_token", "pad_token", "mask_token")}
            try:
                return cls(_read_vocab_txt(vt, vocab_size), max_length=max_length,
                           lowercase=_get(conf, "do_lower_case", bool, True, tc + ": "), strip_accents=sa,
                           handle_chinese_chars=_get(conf, "tokenize_chinese_chars", bool, True, tc + ": "), **tokens)
            except (InputTypeError, InputValueError) as e:
                raise ModelFolderError(f"{vt} with {tc}: {e}") from None
        raise ModelFolderError(f"folder {folder!r} has neither tokenizer.json nor vocab.txt")

    @classmethod
    def _from_tokenizer_json(cls, path: str, max_length: int, vocab_size: int | None = None,
                             pad_default: str = "[PAD]") -> WordPieceTokenizer:
        tj = read_json(path, error=ModelFolderError)
        model = _get(tj, "model", dict, None, path + ": ")
        if model is None:
            raise ModelFolderError(f"{path}: model is missing (a WordPiece tokenizer needs model.type and model.vocab)")
        if model.get("type") != "WordPiece":
            raise ModelFolderError(f"{path}: only WordPiece tokenizers are supported, got model type "
                                   f"{model.get('type')!r:.60}")
        norm = _get(tj, "normalizer", dict, None, path + ": ") or {}
        if norm.get("type") != "BertNormalizer":
            raise ModelFolderError(f"{path}: expected a BertNormalizer, got {norm.get('type')!r:.60}")
        pre = (_get(tj, "pre_tokenizer", dict, None, path + ": ") or {}).get("type")
        if pre != "BertPreTokenizer":
            raise ModelFolderError(f"{path}: expected a BertPreTokenizer, got {pre!r:.60}")
        vocab = _get(model, "vocab", dict, None, path + ": model.")
        if not vocab:
            raise ModelFolderError(f"{path}: model.vocab must be a non-empty object of token -> id, got "
                                   f"{vocab!r:.60}")
        if vocab_size is not None and len(vocab) > vocab_size:
            raise ModelFolderError(f"{path}: model.vocab has {len(vocab)} tokens, more than the model's vocab_size "
                                   f"{vocab_size} (config.json)")
        try:
            _check_vocab(vocab)
        except (InputTypeError, InputValueError) as e:
            raise ModelFolderError(f"{path}: model.{e}") from None
        by_id = {v: k for k, v in vocab.items()}
        specials = []
        added = _get(tj, "added_tokens", list, [], path + ": ")
        for i, t in enumerate(added):
            if not isinstance(t, dict) or not isinstance(t.get("content"), str):
                raise ModelFolderError(f"{path}: added_tokens[{i}] must be an object with a string content")
            if t.get("special"):
                content, tid = t["content"], t.get("id")
                if content in vocab and tid is not None and tid != vocab[content]:
                    raise ModelFolderError(f"{path}: added_tokens[{i}] gives {content!r} the id {tid!r}, but "
                                           f"model.vocab gives it {vocab[content]}")
                specials.append(content)
        post = _get(tj, "post_processor", dict, None, path + ": ") or {}
        cls_tok, sep_tok = "[CLS]", "[SEP]"
        if post and post.get("type") not in ("TemplateProcessing", "BertProcessing", "RobertaProcessing"):
            raise ModelFolderError(f"{path}: post_processor.type = {post.get('type')!r:.60} is not implemented here "
                                   f"(TemplateProcessing, BertProcessing or RobertaProcessing: [CLS] sentence [SEP]); "
                                   f"refusing rather than adding other special tokens than the file says")
        try:
            if post.get("type") == "TemplateProcessing":
                single = post.get("single")
                kinds = [next(iter(s)) if isinstance(s, dict) and len(s) == 1 else None for s in single] \
                    if isinstance(single, list) else None
                if kinds != ["SpecialToken", "Sequence", "SpecialToken"] or single[1]["Sequence"].get("id") != "A" \
                        or any(next(iter(s.values())).get("type_id", 0) != 0 for s in single):
                    raise ModelFolderError(f"{path}: post_processor.single is {json.dumps(single)[:120]}; only the "
                                           f"template [CLS] $A [SEP] (type ids 0) is implemented here — refusing "
                                           f"rather than replacing it")
                cls_tok, sep_tok = single[0]["SpecialToken"]["id"], single[2]["SpecialToken"]["id"]
                for tok, spec in (post.get("special_tokens") or {}).items():
                    ids = spec.get("ids")
                    if tok in vocab and isinstance(ids, list) and ids != [vocab[tok]]:
                        raise ModelFolderError(f"{path}: post_processor.special_tokens gives {tok!r} the ids {ids}, "
                                               f"but model.vocab gives it {vocab[tok]}")
            elif post.get("type") in ("BertProcessing", "RobertaProcessing"):
                # one sentence is cls A sep under both (RobertaProcessing differs in pairs, cls A sep sep B sep, and
                # in offsets — trim_offsets, add_prefix_space —, neither of which is computed here): MPNet's files
                sep_tok, cls_tok = by_id[post["sep"][1]], by_id[post["cls"][1]]
        except (KeyError, IndexError, TypeError, AttributeError):
            raise ModelFolderError(f"{path}: post_processor ({post.get('type')!r:.40}) is malformed or names an id "
                                   f"that is not in model.vocab") from None
        pad = _get(_get(tj, "padding", dict, None, path + ": ") or {}, "pad_token", str, pad_default,
                   path + ": padding.")
        strip = norm.get("strip_accents")
        if strip is not None and not isinstance(strip, bool):
            raise ModelFolderError(f"{path}: normalizer.strip_accents must be true, false or null, got {strip!r:.40}")
        where = path + ": normalizer."
        try:
            return cls(vocab, max_length=max_length, lowercase=_get(norm, "lowercase", bool, True, where),
                       strip_accents=strip, handle_chinese_chars=_get(norm, "handle_chinese_chars", bool, True, where),
                       clean_text=_get(norm, "clean_text", bool, True, where),
                       unk_token=_get(model, "unk_token", str, "[UNK]", path + ": model."),
                       cls_token=_token_text(cls_tok, "the [CLS] token", path),
                       sep_token=_token_text(sep_tok, "the [SEP] token", path), pad_token=pad,
                       max_input_chars_per_word=_positive(model, "max_input_chars_per_word", 100, path + ": model."),
                       prefix=_get(model, "continuing_subword_prefix", str, "##", path + ": model."),
                       special_tokens=specials)
        except (InputTypeError, InputValueError) as e:
            raise ModelFolderError(f"{path}: {e}") from None

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
            pieces = self._word_pieces()
            for word in pre_tokenize(norm):
                got = pieces.get(word)
                if got is None:
                    got = pieces[word] = tuple(wordpiece(word, self.vocab, self.unk_token, self.prefix,
                                                         self.max_input_chars_per_word))
                tokens.extend(got)
        return tokens

    _WORD_CACHE_SIZE = 1 << 16       # words remembered by tokenize (the dict is emptied when full)

    def _word_pieces(self) -> dict:
        """The word → WordPiece pieces cache of :meth:`tokenize`: a word is segmented once, not on every
        call. Keyed on what segmentation reads (the vocab object and size, [UNK], the prefix, the word
        length limit): replacing any of them starts a new cache."""
        key = (id(self.vocab), len(self.vocab), self.unk_token, self.prefix, self.max_input_chars_per_word)
        cache = getattr(self, "_pieces", None)
        if cache is None or cache[0] != key or len(cache[1]) >= self._WORD_CACHE_SIZE:
            cache = self._pieces = (key, {})
        return cache[1]

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
