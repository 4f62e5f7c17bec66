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


def gguf_file(kvs, tensors, version=3, align=32):
    """A GGUF file from (key, type id, value bytes) and (name, ggml type, ne, data) lists,
    written here byte by byte (the seeds must stay small, under the fuzzer's 4 KiB inputs)."""
    def s(x):
        x = x.encode() if isinstance(x, str) else x
        return struct.pack("<Q", len(x)) + x
    out = b"GGUF" + struct.pack("<IQQ", version, len(tensors), len(kvs))
    for key, t, value in kvs:
        out += s(key) + struct.pack("<I", t) + value
    data = b""
    for name, t, ne, payload in tensors:
        data += b"\0" * (-len(data) % align)
        out += s(name) + struct.pack("<I", len(ne)) + b"".join(struct.pack("<Q", d) for d in ne)
        out += struct.pack("<IQ", t, len(data))
        data += payload
    out += b"\0" * (-len(out) % align)
    return out + data


def gguf_corpus():
    u32 = lambda v: struct.pack("<I", v)  # noqa: E731
    f32 = lambda v: struct.pack("<f", v)  # noqa: E731
    f64 = lambda v: struct.pack("<d", v)  # noqa: E731
    string = lambda v: struct.pack("<Q", len(v)) + v.encode()  # noqa: E731
    # A whole MoD model, as small as the rules allow: d_model 8, one routed layer of two heads
    # of 4, d_ff 8, vocab 4 (every tensor F32; Q/K order does not matter to the parser).
    d, ff, vocab = 8, 8, 4
    llama = [("general.architecture", 8, string("llama")),
             ("llama.embedding_length", 4, u32(d)), ("llama.feed_forward_length", 4, u32(ff)),
             ("llama.block_count", 4, u32(1)), ("llama.attention.head_count", 4, u32(2)),
             ("llama.attention.head_count_kv", 4, u32(1)),
             ("llama.attention.layer_norm_rms_epsilon", 6, f32(1e-5)),
             ("llama.context_length", 4, u32(64)), ("llama.vocab_size", 4, u32(vocab))]
    mod = [("modserve.mod.format_version", 4, u32(1)),
           ("modserve.mod.routed_layers", 9, struct.pack("<IQi", 5, 1, 0)),
           ("modserve.mod.threshold", 12, f64(0.5))]

    def t(name, *shape):  # shape outer to inner, as numpy; GGUF stores it reversed
        n = 1
        for x in shape:
            n *= x
        return (name, 0, list(reversed(shape)), struct.pack(f"<{n}f", *[0.01 * i for i in range(n)]))
    tensors = [t("token_embd.weight", vocab, d), t("output_norm.weight", d),
               t("blk.0.attn_norm.weight", d), t("blk.0.ffn_norm.weight", d),
               t("blk.0.attn_q.weight", d, d), t("blk.0.attn_k.weight", 4, d),
               t("blk.0.attn_v.weight", 4, d), t("blk.0.attn_output.weight", d, d),
               t("blk.0.ffn_gate.weight", ff, d), t("blk.0.ffn_up.weight", ff, d),
               t("blk.0.ffn_down.weight", d, ff)]
    write("gguf", "valid_dense_tied", gguf_file(llama, tensors))
    write("gguf", "valid_mod", gguf_file(llama + mod, tensors + [t("blk.0.mod_router.weight", 1, d)]))
    write("gguf", "valid_v2_untied", gguf_file(llama, tensors + [t("output.weight", vocab, d)],
                                               version=2))
    write("gguf", "valid_every_type", gguf_file([
        ("u8", 0, b"\x07"), ("i8", 1, b"\xff"), ("u16", 2, b"\x01\x02"), ("i16", 3, b"\xfe\xff"),
        ("u32", 4, u32(7)), ("i32", 5, struct.pack("<i", -7)), ("f32", 6, f32(0.5)),
        ("bool", 7, b"\x01"), ("str", 8, string("hi")),
        ("strs", 9, struct.pack("<IQ", 8, 2) + string("a") + string("bc")),
        ("u64", 10, struct.pack("<Q", 1 << 40)), ("i64", 11, struct.pack("<q", -1)),
        ("f64", 12, f64(0.25)), ("general.alignment", 4, u32(64))],
        [("q8", 8, [32, 2], b"\x01" * 68), ("q4k", 12, [256], b"\x02" * 144),
         ("bf16", 30, [3], b"\0" * 6)], align=64))
    # Tokenizer metadata (LoadTokenizerFromGguf): a byte-level BPE with a pre-tokenizer, control
    # and user-defined tokens and a merge; a SentencePiece-style one with scores and byte tokens.
    utf8 = lambda v: struct.pack("<Q", len(v.encode())) + v.encode()  # noqa: E731
    strs = lambda *v: struct.pack("<IQ", 8, len(v)) + b"".join(utf8(x) for x in v)  # noqa: E731
    i32s = lambda *v: struct.pack(f"<IQ{len(v)}i", 5, len(v), *v)  # noqa: E731
    f32s = lambda *v: struct.pack(f"<IQ{len(v)}f", 6, len(v), *v)  # noqa: E731
    gpt2 = [("tokenizer.ggml.model", 8, string("gpt2")), ("tokenizer.ggml.pre", 8, string("smollm")),
            ("tokenizer.ggml.tokens", 9, strs("a", "b", "ab", "\u0120", "1", "<|im_end|>", "<x>")),
            ("tokenizer.ggml.token_type", 9, i32s(1, 1, 1, 1, 1, 3, 4)),
            ("tokenizer.ggml.merges", 9, strs("a b", "\u0120 a")),
            ("tokenizer.ggml.eos_token_id", 4, u32(5)),
            ("tokenizer.chat_template", 8, string("{{ x }}"))]
    write("gguf", "valid_tokenizer_gpt2", gguf_file(llama + gpt2, tensors))
    spm = [("tokenizer.ggml.model", 8, string("llama")),
           ("tokenizer.ggml.tokens", 9, strs("<unk>", "<s>", "</s>", "<0x41>", "\u2581a", "a")),
           ("tokenizer.ggml.scores", 9, f32s(0, 0, 0, 0, -1, -2)),
           ("tokenizer.ggml.token_type", 9, i32s(2, 3, 3, 6, 1, 1))]
    write("gguf", "valid_tokenizer_llama", gguf_file(spm, []))
    write("gguf", "bad_tokenizer_types_short", gguf_file(
        spm[:2] + [("tokenizer.ggml.token_type", 9, i32s(1))], []))
    write("gguf", "bad_tokenizer_pre", gguf_file(
        [("tokenizer.ggml.pre", 8, string("unknown-pre"))] + gpt2[:1] + gpt2[2:], []))
    write("gguf", "bad_tensor_past_end", gguf_file(llama, [("a", 0, [1 << 20], b"")]))
    write("gguf", "bad_count", b"GGUF" + struct.pack("<IQQ", 3, 1 << 60, 0))
    write("gguf", "bad_unknown_arch", gguf_file([("general.architecture", 8, string("qwen2"))],
                                                []))


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
    put("valid_prompt_logprobs", req(prompt_logprobs=3))
    put("valid_prompt_logprobs_zero", req(prompt_logprobs=0))
    put("bad_prompt_logprobs", req(prompt_logprobs=21))


# Flag byte of the `openai_request` target (tests/fuzz/fuzz_targets.h).
OA_CHAT, OA_NO_TOKENIZER, OA_SHORT, OA_NO_TEMPLATE, OA_LIMITS = 1, 2, 4, 8, 16


def openai_request_corpus():
    """HTTP request bodies: valid completions and chat requests using every field, prompt lists,
    and one per kind of refusal (types, unsupported fields, JSON, UTF-8, limits)."""
    def put(name, body, flags=0):
        write("openai_request", name, bytes([flags]) + (body if isinstance(body, bytes)
                                                        else json.dumps(body).encode()))

    every = {"model": "demo", "prompt": "Once upon a time", "max_tokens": 8, "temperature": 0.7,
             "top_p": 0.9, "top_k": 5, "min_p": 0.05, "repetition_penalty": 1.1,
             "presence_penalty": 0.5, "frequency_penalty": -0.5, "seed": 7, "stop": ["\n", "x"],
             "stop_token_ids": [2], "ignore_eos": True, "logprobs": 2, "echo": True,
             "stream": True, "stream_options": {"include_usage": True}, "user": "u",
             "routing_threshold": 0.3, "return_routing": True, "n": 1, "unknown": [1]}
    put("valid_every_field", every)
    put("valid_ids", {"prompt": [1, 17, 42], "max_tokens": 4})
    put("valid_lists", {"prompt": [[1, 17], [42, 5, 6]], "echo": True, "logprobs": 1})
    put("valid_texts", {"prompt": ["a b", "c"], "max_tokens": 2})
    put("valid_lm_eval", {"model": "demo", "prompt": [[5, 6, 7, 8]], "temperature": 0,
                          "max_tokens": 1, "logprobs": 1, "seed": 1234, "echo": True})
    put("valid_short_context", {"prompt": [1] * 48, "max_tokens": 16}, OA_SHORT)
    put("valid_limits", {"prompt": [1, 2, 3], "max_tokens": 8}, OA_LIMITS)
    chat = {"model": "demo", "messages": [{"role": "system", "content": "Be brief."},
                                          {"role": "user", "content": [
                                              {"type": "text", "text": "Hi"},
                                              {"type": "text", "text": "there"}]}],
            "max_completion_tokens": 8, "logprobs": True, "top_logprobs": 2, "stream": True,
            "stream_options": {"include_usage": False}, "tools": [], "add_generation_prompt": True,
            "response_format": {"type": "text"}}
    put("valid_chat", chat, OA_CHAT)
    put("valid_chat_default_length", {"messages": [{"role": "user", "content": "x"}]}, OA_CHAT)
    put("bad_json", b'{"prompt": "x",')
    put("bad_not_object", b"[1, 2]")
    put("bad_utf8", b'{"prompt": "ab\xff\xfe"}')
    put("bad_utf8_truncated", b'{"prompt": "\xc3\x28"}')
    put("bad_surrogate", b'{"prompt": "\\ud800"}')
    put("bad_types", {"prompt": "x", "max_tokens": "8", "temperature": "hot"})
    put("bad_n", {"prompt": "x", "n": 3})
    put("bad_suffix", {"prompt": "x", "suffix": "y"})
    put("bad_logit_bias", {"prompt": "x", "logit_bias": {"1": 5}})
    put("bad_stream_options", {"prompt": "x", "stream_options": {"include_usage": True}})
    put("bad_model", {"model": "gpt", "prompt": "x"})
    put("bad_vocab", {"prompt": [1, 99999]})
    put("bad_mixed", {"prompt": ["x", [1]]})
    put("bad_too_long", {"prompt": [1] * 60, "max_tokens": 16}, OA_SHORT)
    put("bad_limits", {"prompt": [1] * 9}, OA_LIMITS)
    put("bad_no_tokenizer", {"prompt": "text"}, OA_NO_TOKENIZER)
    put("bad_chat_no_template", {"messages": [{"role": "user", "content": "x"}]},
        OA_CHAT | OA_NO_TEMPLATE)
    put("bad_chat_content", {"messages": [{"role": "user", "content": 5}]}, OA_CHAT)
    put("bad_chat_tools", {"messages": [{"role": "user", "content": "x"}],
                           "tools": [{"type": "function"}]}, OA_CHAT)


def jinja_corpus():
    """The chat templates of tests/testdata/chat_templates and the feature templates of its
    goldens (each small)."""
    d = os.path.join(ROOT, "tests", "testdata", "chat_templates")
    for name in sorted(os.listdir(d)):
        if name.endswith(".jinja"):
            with open(os.path.join(d, name), "rb") as f:
                write("jinja", name[:-len(".jinja")], f.read())
    with open(os.path.join(d, "goldens.json")) as f:
        cases = json.load(f)["cases"]
    for c in cases:
        if "template" in c:
            write("jinja", "feature_" + c["name"], c["template"])


def main():
    for target in ("checkpoint", "gguf", "config", "bpe_json", "tokenizer_encode", "tokenizer_decode",
                   "detokenizer", "request", "openai_request", "jinja"):
        shutil.rmtree(os.path.join(HERE, "corpus", target), ignore_errors=True)
        os.makedirs(os.path.join(HERE, "corpus", target))
    checkpoint_corpus()
    gguf_corpus()
    config_corpus()
    bpe_json_corpus()
    tokenizer_corpus()
    request_corpus()
    openai_request_corpus()
    jinja_corpus()


if __name__ == "__main__":
    main()
