"""Writes the seed corpora under tests/fuzz/corpus/<target>/ from the repository's test data.

Seeds are small (under 16 KiB each) so that libFuzzer's default input sizes reach them; they are
committed, and this script only needs rerunning when a target's input format changes. The
`request` seeds are built with the generated Python stubs (clients/python/modserve/v1). It does
not write regression inputs (tests/fuzz/regressions/ holds crash reproducers, added by hand).

    .venv/bin/python tests/fuzz/make_corpus.py
"""
import json
import math
import os
import shutil
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
TOK = os.path.join(ROOT, "tests", "testdata", "tokenizer")
sys.path.insert(0, os.path.join(ROOT, "clients", "python"))


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


# Flag byte of the `request` target (tests/fuzz/fuzz_targets.h).
SPLIT_TEXT, NO_TOKENIZER, SHORT_CONTEXT, NO_DEADLINE = 1, 2, 4, 8


def request_corpus():
    """Serialized GenerateRequests: valid ones (every field, defaults, the context edge of the
    64-token config) and one per documented refusal, each behind its flag byte."""
    from modserve.v1 import modserve_pb2 as pb

    def req(ids=(1, 17, 42), **fields):
        r = pb.GenerateRequest()
        if ids is not None:
            r.prompt_token_ids.ids.extend(ids)
        for path, value in fields.items():
            *parents, leaf = path.split("__")
            msg = r
            for p in parents:
                msg = getattr(msg, p)
            if isinstance(value, (list, tuple)):
                getattr(msg, leaf).extend(value)
            else:
                setattr(msg, leaf, value)
        return r

    def put(name, r, flags=0):
        write("request", name, bytes([flags]) + r.SerializeToString())

    def put_text(name, text, r=None, flags=0):
        body = (r or req(ids=None)).SerializeToString()
        write("request", name, bytes([flags | SPLIT_TEXT]) + struct.pack("<H", len(body)) + body +
              (text if isinstance(text, bytes) else text.encode()))

    put("valid_ids", req())
    put("valid_ids_no_deadline", req(), NO_DEADLINE)
    put("valid_every_field", req(
        request_id="req-1", sampling__temperature=0.7, sampling__top_k=5, sampling__top_p=0.9,
        sampling__min_p=0.05, sampling__repetition_penalty=1.1, sampling__presence_penalty=2.0,
        sampling__frequency_penalty=-2.0, sampling__seed=2 ** 64 - 1,
        stopping__max_new_tokens=7, stopping__stop=["\n\n", "END"],
        stopping__stop_token_ids=[0, 2047], stopping__ignore_eos=True, top_logprobs=20,
        routing__threshold=0.25, routing__return_decisions=True))
    put("valid_edges", req(
        request_id="x" * 128, sampling__temperature=0.0, sampling__top_p=1.0, sampling__min_p=0.0,
        sampling__top_k=0, stopping__max_new_tokens=1, stopping__stop=["s" * 256] * 16,
        routing__threshold=1e-9))
    put("valid_text", req(ids=None, prompt="Once upon a time", stopping__max_new_tokens=32))
    put("valid_context_edge", req(ids=[5] * 48, stopping__max_new_tokens=16), SHORT_CONTEXT)
    put("long_context_past_edge", req(ids=[5] * 49), SHORT_CONTEXT)
    put("long_max_new_tokens", req(stopping__max_new_tokens=2 ** 31 - 1))
    put("long_text", req(ids=None, prompt="The quick brown fox. " * 20), SHORT_CONTEXT)
    put_text("text_split", "Q: What is a computer?\nA:", req(ids=None, stopping__max_new_tokens=8))
    put_text("text_split_special", "<|bos|>Hello<|eos|> \u00e9\u2603")
    put_text("text_split_bad_utf8", b"ab\xc3(\xed\xa0\x80")
    put_text("text_split_empty", b"")
    put_text("text_split_no_tokenizer", "hello", flags=NO_TOKENIZER)
    put("bad_no_input", req(ids=None))
    put("bad_empty_ids", req(ids=[]))
    put("bad_id_negative", req(ids=[1, -1]))
    put("bad_id_vocab", req(ids=[1, 2048]))
    put("bad_request_id", req(request_id="x" * 129))
    put("bad_temperature", req(sampling__temperature=-0.5))
    put("bad_temperature_nan", req(sampling__temperature=math.nan))
    put("bad_top_k", req(sampling__top_k=-1))
    put("bad_top_p_zero", req(sampling__top_p=0.0))
    put("bad_top_p_inf", req(sampling__top_p=math.inf))
    put("bad_min_p", req(sampling__min_p=1.5))
    put("bad_repetition_penalty", req(sampling__repetition_penalty=0.0))
    put("bad_presence_penalty", req(sampling__presence_penalty=2.5))
    put("bad_frequency_penalty", req(sampling__frequency_penalty=-math.inf))
    put("bad_max_new_tokens", req(stopping__max_new_tokens=0))
    put("bad_stop_count", req(stopping__stop=["a"] * 17))
    put("bad_stop_empty", req(stopping__stop=["a", ""]))
    put("bad_stop_long", req(stopping__stop=["s" * 257]))
    put("bad_stop_token_id", req(stopping__stop_token_ids=[2048]))
    put("bad_top_logprobs", req(top_logprobs=21))
    put("bad_top_logprobs_negative", req(top_logprobs=-1))
    put("bad_threshold", req(routing__threshold=1.0))
    put("bad_threshold_nan", req(routing__threshold=math.nan))
    put("bad_prompt_no_tokenizer", req(ids=None, prompt="hi"), NO_TOKENIZER)
    put("bad_two_fields", req(ids=[], request_id="y" * 200, top_logprobs=99))


def main():
    for target in ("checkpoint", "config", "bpe_json", "tokenizer_encode", "tokenizer_decode",
                   "detokenizer", "request"):
        shutil.rmtree(os.path.join(HERE, "corpus", target), ignore_errors=True)
        os.makedirs(os.path.join(HERE, "corpus", target))
    checkpoint_corpus()
    config_corpus()
    bpe_json_corpus()
    tokenizer_corpus()
    request_corpus()


if __name__ == "__main__":
    main()
