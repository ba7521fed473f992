"""fp4kit's own GGUF reader (fp4kit.gguf_file) and byte-level BPE (fp4kit.bpe) on synthetic inputs: no model
file and no gguf / tokenizers / regex package needed (where `regex` is installed, the pre-tokenizer is also
checked against the GPT-2 pattern it implements). The real file is checked against the gguf and tokenizers
packages in test_quality.py. Under a second on 2 cores."""
import random
import struct

import numpy as np
import pytest

from fp4kit.bpe import ByteLevelBPE, bytes_to_unicode, pre_tokenize
from fp4kit.gguf_file import GGUFFile

# ---- a GGUF writer for the tests (the reader's spec, written the other way) -------------------------------------
U8, I8, U16, I16, U32, I32, F32, BOOL, STR, ARR, U64, I64, F64 = range(13)
_FMT = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i", F32: "<f", BOOL: "<?", U64: "<Q", I64: "<q",
        F64: "<d"}


def _s(x: str) -> bytes:
    b = x.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def _v(t, v) -> bytes:
    if t == STR:
        return _s(v)
    if t == ARR:
        et, items = v
        return struct.pack("<IQ", et, len(items)) + b"".join(_v(et, x) for x in items)
    return struct.pack(_FMT[t], v)


def write_gguf(path, kv, tensors, alignment=32, version=3):
    """kv: [(key, type, value)]; tensors: [(name, dims in ggml order, ggml type, data bytes)]."""
    head = b"GGUF" + struct.pack("<IQQ", version, len(tensors), len(kv))
    head += b"".join(_s(k) + struct.pack("<I", t) + _v(t, v) for k, t, v in kv)
    offs, off = [], 0
    for _, _, _, data in tensors:
        offs.append(off)
        off += -(-len(data) // alignment) * alignment
    for (name, dims, t, _), o in zip(tensors, offs):
        head += _s(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
        head += struct.pack("<IQ", t, o)
    head += b"\0" * (-len(head) % alignment)
    body = b""
    for (_, _, _, data), o in zip(tensors, offs):
        body += b"\0" * (o - len(body)) + data
    path.write_bytes(head + body)


def _q4_1(rng, rows, cols):
    """Random Q4_1 blocks and their values, element by element from the block definition."""
    data, vals = bytearray(), np.zeros((rows, cols), np.float32)
    for r in range(rows):
        for b in range(cols // 32):
            d, m = np.float16(rng.uniform(-0.1, 0.1)), np.float16(rng.uniform(-0.5, 0.5))
            q = rng.integers(0, 16, 32)
            data += d.tobytes() + m.tobytes() + bytes(int(q[i]) | int(q[i + 16]) << 4 for i in range(16))
            for j in range(32):
                vals[r, b * 32 + j] = np.float32(q[j]) * np.float32(d) + np.float32(m)
    return bytes(data), vals


def _q8_0(rng, rows, cols):
    data, vals = bytearray(), np.zeros((rows, cols), np.float32)
    for r in range(rows):
        for b in range(cols // 32):
            d = np.float16(rng.uniform(-0.05, 0.05))
            q = rng.integers(-128, 128, 32).astype(np.int8)
            data += d.tobytes() + q.tobytes()
            vals[r, b * 32:(b + 1) * 32] = q.astype(np.float32) * np.float32(d)
    return bytes(data), vals


@pytest.fixture
def synthetic(tmp_path):
    rng = np.random.default_rng(0)
    q41, v41 = _q4_1(rng, 3, 64)
    q80, v80 = _q8_0(rng, 2, 96)
    f32 = rng.standard_normal(5).astype(np.float32)
    kv = [("general.architecture", STR, "llama"), ("general.alignment", U32, 64), ("a.u8", U8, 200),
          ("a.i8", I8, -5), ("a.u16", U16, 60000), ("a.i16", I16, -30000), ("a.i32", I32, -7), ("a.f32", F32, 0.5),
          ("a.bool", BOOL, True), ("a.u64", U64, 1 << 40), ("a.i64", I64, -(1 << 40)), ("a.f64", F64, 0.25),
          ("a.name", STR, "Grüße ✓"), ("a.ints", ARR, (I32, [1, -2, 3])), ("a.strs", ARR, (STR, ["x", "", "ÿ z"])),
          ("a.nested", ARR, (ARR, [(U8, [1, 2]), (U8, [])]))]
    path = tmp_path / "t.gguf"
    write_gguf(path, kv, [("w41", [64, 3], 3, q41), ("norm", [5], 0, f32.tobytes()), ("w80", [96, 2], 8, q80)],
               alignment=64)
    return path, {"w41": v41, "norm": f32, "w80": v80}


def test_reader_metadata_tensors_and_dequantization(synthetic):
    path, want = synthetic
    f = GGUFFile(path)
    assert f.version == 3 and f.alignment == 64 and f.data_offset % 64 == 0
    m = f.metadata
    assert (m["a.u8"], m["a.i8"], m["a.u16"], m["a.i16"], m["a.i32"]) == (200, -5, 60000, -30000, -7)
    assert (m["a.f32"], m["a.bool"], m["a.u64"], m["a.i64"], m["a.f64"]) == (0.5, True, 1 << 40, -(1 << 40), 0.25)
    assert m["a.name"] == "Grüße ✓" and m["a.strs"] == ["x", "", "ÿ z"]
    assert m["a.ints"].tolist() == [1, -2, 3] and m["a.ints"].dtype == np.int32
    assert [a.tolist() for a in m["a.nested"]] == [[1, 2], []]
    assert list(f.tensors) == ["w41", "norm", "w80"]
    t = f.tensors["w41"]
    assert (t.shape, t.type_name, t.nbytes, t.offset % 64) == ((3, 64), "Q4_1", 3 * 2 * 20, 0)
    for name, v in want.items():
        got = f.tensor(name)
        assert got.dtype == np.float32 and got.shape == v.shape
        assert np.array_equal(got.view(np.uint32), v.view(np.uint32)), name
    assert f.get("general.architecture") == "llama" and f.get("missing", 7) == 7
    with pytest.raises(ValueError, match="'missing' is missing"):
        f.get("missing")
    with pytest.raises(KeyError, match="no tensor named 'nope'"):
        f.tensor("nope")


def test_reader_errors(tmp_path, synthetic):
    path, _ = synthetic
    raw = path.read_bytes()
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUX" + raw[4:])
    with pytest.raises(ValueError, match="not a GGUF file"):
        GGUFFile(bad)
    bad.write_bytes(raw[:4] + struct.pack("<I", 1) + raw[8:])
    with pytest.raises(NotImplementedError, match="GGUF version 1"):
        GGUFFile(bad)
    bad.write_bytes(raw[:200])
    with pytest.raises(ValueError, match="truncated GGUF file"):
        GGUFFile(bad)
    bad.write_bytes(raw[:-40])   # the last tensor's data is cut
    with pytest.raises(ValueError, match="w80: data .* past the end of the file"):
        GGUFFile(bad)
    q6k = tmp_path / "q6k.gguf"
    write_gguf(q6k, [], [("w", [256, 1], 14, bytes(210))])
    with pytest.raises(NotImplementedError, match="w is Q6_K; this reader dequantizes F32, Q4_1, Q8_0 only"):
        GGUFFile(q6k).tensor("w")


# ---- byte-level BPE ----------------------------------------------------------------------------------------------
PATTERN = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"


def test_pre_tokenizer_cases():
    assert pre_tokenize("Hello world, it's 2007!") == ["Hello", " world", ",", " it", "'s", " 2007", "!"]
    assert pre_tokenize("Hello world, it's 2007!", "smollm") == \
        ["Hello", " world", ",", " it", "'s", " ", "2", "0", "0", "7", "!"]
    assert pre_tokenize("a  b\n\n c\t") == ["a", " ", " b", "\n\n", " c", "\t"]
    assert pre_tokenize("x \n y") == ["x", " \n", " y"]
    assert pre_tokenize("'S 'sx \"'s") == ["'", "S", " '", "sx", " \"'", "s"]
    assert pre_tokenize("日本語 café ١٢ ½") == ["日本語", " café", " ١٢", " ½"]
    assert pre_tokenize("") == [] and pre_tokenize("   ") == ["   "]


def test_pre_tokenizer_matches_the_gpt2_pattern():
    regex = pytest.importorskip("regex", reason="the regex package is not installed (cross-check only)")
    pat = regex.compile(PATTERN)
    alphabet = list("ab Z'\t\n\r.,!-07sdtlmrev") + ["é", "日", "١", "²", "\u00a0", "\u3000", "\u2028", "😀", "  ", "’"]
    rng = random.Random(0)
    for _ in range(3000):
        s = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 20)))
        assert pre_tokenize(s) == pat.findall(s), repr(s)


def _toy():
    """A byte-level vocabulary (all 256 byte symbols), a few merges and two special tokens."""
    b2u = bytes_to_unicode()
    tokens = ["<|end|>", "<|im_start|>"] + [b2u[b] for b in range(256)]
    merges = ["l o", "lo w", "Ġ low", "e r", "low er", "Ġ l"]
    for m in merges:
        tokens.append(m.replace(" ", ""))
    return ByteLevelBPE(tokens, merges, special=[0, 1], pre="smollm"), tokens


def test_bpe_merges_in_rank_order_and_special_tokens():
    tok, tokens = _toy()
    assert len(bytes_to_unicode()) == 256 and bytes_to_unicode()[ord(" ")] == "Ġ"

    def pieces(text):
        return [tokens[i] for i in tok.encode(text)]
    assert pieces("lower") == ["lower"]          # l o -> lo w -> low, e r -> er, low er -> lower
    assert pieces(" low") == ["Ġlow"]            # "Ġ low" (rank 2) comes before "Ġ l" (rank 5)
    assert pieces(" lo") == ["Ġ", "lo"]          # l o (rank 0) before Ġ l (rank 5); there is no "Ġ lo"
    assert pieces("<|im_start|>low<|end|>") == ["<|im_start|>", "low", "<|end|>"]
    assert pieces("<|im_start|") == list("<|im_start|")   # not a special token: plain bytes (no merges apply)
    ids = tok.encode("<|end|> lower 42 é\n")
    assert tok.decode(ids) == "<|end|> lower 42 é\n"
    assert tok.token_to_id("<|end|>") == 0 and tok.token_to_id("nope") is None
    assert tok.decode([tok.token_to_id(bytes_to_unicode()[0xC3])]) == "\ufffd"   # half a UTF-8 sequence
    with pytest.raises(ValueError, match="is not two symbols"):
        ByteLevelBPE(tokens, ["ab"])
