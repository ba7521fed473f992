"""Byte-level BPE tokenizer (the GPT-2 scheme) built from the vocabulary and merges a GGUF file carries.

    tok = ByteLevelBPE.from_gguf(GGUFFile("model.gguf"))
    ids = tok.encode("Hello world")          # special tokens in the text become their ids
    text = tok.decode(ids)

Pure Python (the standard library's ``unicodedata`` for the letter / number classes), so fp4kit.quality needs
neither the ``tokenizers`` nor the ``regex`` package. Encoding, in order:

1. Special tokens (GGUF token type 3 "control" and 4 "user defined") are cut out of the raw text first, the
   leftmost match and, at one position, the longest; each becomes its own id.
2. Pre-tokenization of the text between them. For the "smollm" family of pre-tokenizers (also "starcoder",
   "refact", "codeshell") every number character is first split off on its own. Then each piece is split by
   the GPT-2 pattern, here a hand-written scanner with the same leftmost-alternative semantics as
   ``'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+``
   (\\p{L}: Unicode category L*; \\p{N}: N*; \\s: the Unicode White_Space characters).
3. Each pre-token's UTF-8 bytes are mapped to GPT-2's printable byte alphabet and merged by BPE: repeatedly
   the adjacent pair with the lowest merge rank, all its non-overlapping occurrences left to right.

Decoding maps ordinary tokens back through the byte alphabet, keeps special tokens as they are, and decodes
the bytes as UTF-8 (invalid sequences become U+FFFD).
"""
from __future__ import annotations

import re
import unicodedata
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

__all__ = ["ByteLevelBPE", "pre_tokenize", "bytes_to_unicode", "DIGIT_SPLIT_PRE"]

#: GGUF ``tokenizer.ggml.pre`` values whose pre-tokenizer splits every number character off first.
DIGIT_SPLIT_PRE = ("smollm", "starcoder", "refact", "codeshell")

# Unicode White_Space property.
_WHITE = frozenset("\t\n\x0b\x0c\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009"
                   "\u200a\u2028\u2029\u202f\u205f\u3000")
_SPACE, _LETTER, _NUMBER, _OTHER = 0, 1, 2, 3
_CONTRACTIONS = ("s", "t", "re", "ve", "m", "ll", "d")


def _cls(ch: str, cache: Dict[str, int] = {}) -> int:  # noqa: B006 (a deliberate per-process cache)
    c = cache.get(ch)
    if c is None:
        if ch in _WHITE:
            c = _SPACE
        else:
            cat = unicodedata.category(ch)[0]
            c = _LETTER if cat == "L" else _NUMBER if cat == "N" else _OTHER
        cache[ch] = c
    return c


def _gpt2_split(s: str) -> List[str]:
    """Split s as the GPT-2 pattern does (see the module docstring)."""
    out: List[str] = []
    n, i = len(s), 0
    cls = [_cls(ch) for ch in s]

    def run(j: int, c: int) -> int:  # end of the run of class c starting at j
        while j < n and cls[j] == c:
            j += 1
        return j

    while i < n:
        ch, c = s[i], cls[i]
        if ch == "'":
            m = next((x for x in _CONTRACTIONS if s.startswith(x, i + 1)), None)
            if m is not None:
                out.append(s[i:i + 1 + len(m)])
                i += 1 + len(m)
                continue
        if c != _SPACE:                                   # \p{L}+, \p{N}+ or [^\s\p{L}\p{N}]+
            j = run(i, c)
        elif ch == " " and i + 1 < n and cls[i + 1] != _SPACE:  # " ?" + one of those runs
            j = run(i + 1, cls[i + 1])
        else:
            j = run(i, _SPACE)                            # \s+(?!\S) (backs off one), else \s+
            if j < n and j - 1 > i:
                j -= 1
        out.append(s[i:j])
        i = j
    return out


def _split_numbers(s: str) -> List[str]:
    """Every number character (Unicode category N*) becomes a piece of its own."""
    out, start = [], 0
    for i, ch in enumerate(s):
        if _cls(ch) == _NUMBER:
            if i > start:
                out.append(s[start:i])
            out.append(ch)
            start = i + 1
    if start < len(s):
        out.append(s[start:])
    return out


def pre_tokenize(text: str, pre: str = "default") -> List[str]:
    """The pre-tokens of `text` (no special-token handling): see the module docstring, step 2."""
    pieces = _split_numbers(text) if pre in DIGIT_SPLIT_PRE else [text]
    return [t for p in pieces for t in _gpt2_split(p)]


def bytes_to_unicode() -> Dict[int, str]:
    """GPT-2's byte alphabet: printable Latin-1 bytes stand for themselves; the other 68 bytes (controls, space,
    0x7F-0xA0, 0xAD) are mapped in order to U+0100, U+0101, ..."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


class ByteLevelBPE:
    """tokens: the vocabulary (id = index); merges: "left right" strings in rank order; special: ids of the
    tokens cut out of raw text before pre-tokenization; pre: the GGUF pre-tokenizer name."""

    def __init__(self, tokens: Sequence[str], merges: Iterable[str], special: Iterable[int] = (),
                 pre: str = "default") -> None:
        self.tokens = list(tokens)
        self.vocab: Dict[str, int] = {t: i for i, t in enumerate(self.tokens)}
        self.ranks: Dict[Tuple[str, str], int] = {}
        for r, m in enumerate(merges):
            a, sep, b = m.partition(" ")
            if not sep:
                raise ValueError(f"merges[{r}]: {m!r} is not two symbols separated by a space")
            self.ranks.setdefault((a, b), r)
        self.special = sorted(set(special))
        self._special_set = frozenset(self.special)
        self.pre = pre
        self._b2u = bytes_to_unicode()
        self._u2b = {u: b for b, u in self._b2u.items()}
        texts = sorted({self.tokens[i] for i in self.special}, key=len, reverse=True)
        self._special_re = re.compile("|".join(map(re.escape, texts))) if texts else None
        self._cache: Dict[str, List[int]] = {}

    @classmethod
    def from_gguf(cls, f) -> "ByteLevelBPE":
        """From a GGUFFile's ``tokenizer.ggml.*`` metadata (model "gpt2": byte-level BPE)."""
        kind = f.get("tokenizer.ggml.model")
        if kind != "gpt2":
            raise NotImplementedError(f"GGUF tokenizer model {kind!r}: only byte-level BPE ('gpt2') is supported")
        tokens = f.get("tokenizer.ggml.tokens")
        types = f.metadata.get("tokenizer.ggml.token_type")
        special = [] if types is None else [i for i, t in enumerate(types) if int(t) in (3, 4)]  # control, user
        return cls(tokens, f.get("tokenizer.ggml.merges"), special, f.get("tokenizer.ggml.pre", "default"))

    def token_to_id(self, token: str) -> Optional[int]:
        return self.vocab.get(token)

    def _bpe(self, piece: str) -> List[int]:
        ids = self._cache.get(piece)
        if ids is not None:
            return ids
        word = [self._b2u[b] for b in piece.encode("utf-8")]
        while len(word) > 1:
            ranked = [(self.ranks[p], p) for p in zip(word, word[1:]) if p in self.ranks]
            if not ranked:
                break
            a, b = min(ranked)[1]
            merged, i = [], 0
            while i < len(word):
                if i + 1 < len(word) and word[i] == a and word[i + 1] == b:
                    merged.append(a + b)
                    i += 2
                else:
                    merged.append(word[i])
                    i += 1
            word = merged
        try:
            ids = [self.vocab[w] for w in word]
        except KeyError as e:
            raise ValueError(f"BPE: symbol {e.args[0]!r} of {piece!r} is not in the vocabulary") from None
        self._cache[piece] = ids
        return ids

    def _encode_plain(self, text: str, out: List[int]) -> None:
        for piece in pre_tokenize(text, self.pre):
            out.extend(self._bpe(piece))

    def encode(self, text: str) -> List[int]:
        out: List[int] = []
        pos = 0
        if self._special_re is not None:
            for m in self._special_re.finditer(text):
                self._encode_plain(text[pos:m.start()], out)
                out.append(self.vocab[m.group(0)])
                pos = m.end()
        self._encode_plain(text[pos:], out)
        return out

    def decode(self, ids: Sequence[int]) -> str:
        buf = bytearray()
        for i in ids:
            t = self.tokens[int(i)]
            if int(i) in self._special_set:
                buf += t.encode("utf-8")
            else:
                for ch in t:
                    b = self._u2b.get(ch)
                    buf += bytes([b]) if b is not None else ch.encode("utf-8")
        return buf.decode("utf-8", errors="replace")
