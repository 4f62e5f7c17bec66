"""Writes the seed corpora under tests/fuzz/corpus/<target>/ from the repository's test data.

Seeds are small (under 16 KiB each) so that libFuzzer's default input sizes reach them; they are
committed, and this script only needs rerunning when a target's input format changes. It does
not write regression inputs (tests/fuzz/regressions/ holds crash reproducers, added by hand).

    .venv/bin/python tests/fuzz/make_corpus.py
"""
import json
import os
import shutil
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
TOK = os.path.join(ROOT, "tests", "testdata", "tokenizer")


def write(target, name, data):
    d = os.path.join(HERE, "corpus", target)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode("utf-8")
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def safetensors(tensors, pad_to=8, metadata=None, header_len=None):
    """tensors: [(name, dtype, shape, data_offsets, payload_bytes_or_None)]; returns file bytes."""
    header = {}
    if metadata is not None:
        header["__metadata__"] = metadata
    blob = b""
    for name, dtype, shape, offsets, payload in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": offsets}
        if payload is not None:
            blob += payload
    text = json.dumps(header, separators=(",", ":")).encode()
    if pad_to:
        text += b" " * (-len(text) % pad_to)
    n = len(text) if header_len is None else header_len
    return struct.pack("<Q", n) + text + blob


def checkpoint_corpus():
    f32 = struct.pack("<6f", 1, 2, 3, 4, 5, 6)
    write("checkpoint", "valid_one_f32", safetensors([("w", "F32", [2, 3], [0, 24], f32)]))
    write("checkpoint", "valid_mixed", safetensors([
        ("model.norm.weight", "F32", [4], [0, 16], b"\0" * 16),
        ("model.layers.0.router.weight", "BF16", [1, 4], [16, 24], b"\x80\x3f" * 4),
        ("lm_head.weight", "F16", [2, 2], [24, 32], b"\x00\x3c" * 4),
        ("empty", "F32", [0, 5], [32, 32], None),
        ("scalar", "F32", [], [32, 36], b"\0\0\x80\x3f"),
    ], metadata={"format": "pt"}))
    # Header length not a multiple of 8: the F32 tensor is misaligned and gets copied.
    write("checkpoint", "valid_misaligned", safetensors(
        [("w", "F32", [2], [0, 8], b"\0" * 8)], pad_to=0))
    write("checkpoint", "valid_empty_header", safetensors([]))
    write("checkpoint", "bad_overlap", safetensors([
        ("a", "F32", [4], [0, 16], b"\0" * 16), ("b", "F32", [2], [8, 16], None)]))
    write("checkpoint", "bad_past_end", safetensors([("a", "F32", [4], [0, 16], b"\0" * 8)]))
    write("checkpoint", "bad_header_len", safetensors([("a", "F32", [1], [0, 4], b"\0" * 4)],
                                                      header_len=1 << 60))
    write("checkpoint", "bad_dtype", safetensors([("a", "I64", [1], [0, 8], b"\0" * 8)]))
    write("checkpoint", "bad_shape", safetensors(
        [("a", "F32", [2 ** 62, 2 ** 62], [0, 4], b"\0" * 4)]))
    write("checkpoint", "short", b"\x10\0\0")


def config_corpus():
    ck = os.path.join(ROOT, "tests", "testdata", "checkpoints")
    for name in sorted(os.listdir(ck)):
        shutil.copy(os.path.join(ck, name, "config.json"),
                    os.path.join(HERE, "corpus", "config", name + ".json"))
    shutil.copy(os.path.join(ROOT, "models", "demo", "config.json"),
                os.path.join(HERE, "corpus", "config", "demo.json"))
    write("config", "unknown_mod_key.json", json.dumps(
        {"hidden_size": 8, "num_hidden_layers": 2, "num_attention_heads": 2, "vocab_size": 4,
         "max_position_embeddings": 16, "intermediate_size": 8,
         "mod": {"format_version": 1, "routed_layers": [1], "bogus": True}}))


def mini_tokenizer(src, num_merges, extra_vocab=()):
    """A copy of tokenizer.json `src` cut down to the 256 byte tokens, the first merges and the
    tokens those merges make, plus the added tokens."""
    t = json.load(open(src))
    vocab = t["model"]["vocab"]
    merges = t["model"]["merges"][:num_merges]
    keep = {}
    for tok, i in sorted(vocab.items(), key=lambda kv: kv[1]):
        if len(keep) < 256 + len(t["added_tokens"]) or tok in extra_vocab:
            keep[tok] = i
    for m in merges:
        a, b = m.split(" ") if isinstance(m, str) else m
        for x in (a, b, a + b):
            if x in vocab:
                keep[x] = vocab[x]
    # Renumber densely, keeping added tokens' ids.
    added = {a["content"]: a["id"] for a in t["added_tokens"]}
    ids = sorted(set(keep.values()) | set(added.values()))
    remap = {old: new for new, old in enumerate(ids)}
    t["model"]["vocab"] = {tok: remap[i] for tok, i in keep.items()}
    t["model"]["merges"] = merges
    for a in t["added_tokens"]:
        a["id"] = remap[a["id"]]
    pp = t.get("post_processor") or {}
    for p in [pp] + pp.get("processors", []):
        for st in (p.get("special_tokens") or {}).values():
            st["ids"] = [remap.get(i, 0) for i in st["ids"]]
    return json.dumps(t, ensure_ascii=False, separators=(",", ":"))


def bpe_json_corpus():
    write("bpe_json", "demo_mini.json",
          mini_tokenizer(os.path.join(TOK, "demo", "tokenizer.json"), 40))
    write("bpe_json", "llama3_mini.json",
          mini_tokenizer(os.path.join(TOK, "llama3_style", "tokenizer.json"), 40))
    write("bpe_json", "qwen2_mini.json",
          mini_tokenizer(os.path.join(TOK, "qwen2_style", "tokenizer.json"), 40))
    write("bpe_json", "not_bpe.json", '{"model":{"type":"WordPiece","vocab":{}}}')


def text_samples():
    demo = json.load(open(os.path.join(TOK, "demo", "goldens.json")))
    texts = list(demo["sample_decodes_skip_special"])
    texts += ["", " ", "\n\n", "<|bos|>Hello<|eos|>", "a" * 64, "It's 2024: 123456 ok?",
              "\u00e9\u0301 NFC/NFD", "\U0001F468\u200d\U0001F469\u200d\U0001F467"]
    return texts


def tokenizer_corpus():
    texts = text_samples()
    utf8 = json.load(open(os.path.join(TOK, "utf8.json")))["cases"]
    for i, text in enumerate(texts):
        for flags in (0 + (i % 2) * 2, 1 + (i % 2) * 2):
            write("tokenizer_encode", f"text{i:02d}_f{flags}", bytes([flags]) + text.encode())
    for i, (hexbytes, _) in enumerate(utf8[:16]):
        write("tokenizer_encode", f"bad_utf8_{i:02d}", bytes([i % 4]) + bytes.fromhex(hexbytes))

    demo = json.load(open(os.path.join(TOK, "demo", "goldens.json")))
    sp = json.load(open(os.path.join(TOK, "sp", "goldens.json")))
    streams = [(0, ids) for ids in demo["sample_ids_special"][:8] + demo["random_streams"][:6]]
    streams += [(1, ids) for ids in sp["sample_ids_special"][:8] + sp["random_streams"][:6]]
    for i, (tok, ids) in enumerate(streams):
        ids = ids[:200]
        for skip in (0, 2):
            write("tokenizer_decode", f"ids{i:02d}_f{tok | skip}",
                  bytes([tok | skip]) + b"".join(struct.pack("<I", x) for x in ids))
            # Detokenizer records: chunk length byte, then 2-byte ids.
            rec = bytearray([tok | skip])
            j = 0
            while j < len(ids):
                n = 1 + (j * 7 + i) % 4
                chunk = ids[j:j + n]
                rec.append(len(chunk))
                for x in chunk:
                    rec += struct.pack("<H", x)
                j += n
            write("detokenizer", f"ids{i:02d}_f{tok | skip}", bytes(rec))


def main():
    for target in ("checkpoint", "config", "bpe_json", "tokenizer_encode", "tokenizer_decode",
                   "detokenizer"):
        shutil.rmtree(os.path.join(HERE, "corpus", target), ignore_errors=True)
        os.makedirs(os.path.join(HERE, "corpus", target))
    checkpoint_corpus()
    config_corpus()
    bpe_json_corpus()
    tokenizer_corpus()


if __name__ == "__main__":
    main()
