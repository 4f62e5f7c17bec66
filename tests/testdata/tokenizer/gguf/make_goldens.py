"""Writes the GGUF tokenizer goldens: what llama.cpp's own tokenizer makes of GGUF tokenizer
metadata, for modserve's LoadTokenizerFromGguf to match (tests/engine/tokenizer/
gguf_tokenizer_test.cc).

Two small vocabularies stand in for real ones, taken from the tokenizer goldens next door:
  vocab_bpe.json  "gpt2": llama3_style/tokenizer.json's 1000 tokens and merges; its added
                  tokens are control (special) or user-defined (not special) tokens, as
                  llama.cpp's converter types them
  vocab_spm.json  "llama": sp/tokenizer.model's pieces, scores and types (unknown, control, byte,
                  normal), plus a control and a user-defined token appended
Each case of goldens.json is one set of tokenizer.* keys over one vocabulary (every supported
tokenizer.ggml.pre on the BPE vocabulary; add_bos / add_eos / add_space_prefix variants); the
script writes it as a vocabulary-only GGUF file with the `gguf` package and asks llama.cpp
(llamacpp_tokenize.cc, built here against libllama) for the ids of every text, with and without
special tokens, and for the text of seeded random id streams. smollm2.json holds the same for the
real model's file (models/smollm2, tools/fetch_models.sh). Deterministic: a rerun with the same
llama.cpp gives byte-identical files.

  .venv/bin/python tests/testdata/tokenizer/gguf/make_goldens.py \
      [--llamacpp /tmp/llamacpp] [--only smollm2|synthetic]

Needs a llama.cpp build with libllama (tests/bench/llamacpp/compare.sh builds one from the
llama-cpp-python 0.3.36 sdist under /tmp/llamacpp) and a C++ compiler.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import random
import subprocess
import sys
import tempfile
import unicodedata

import gguf
import sentencepiece as spm

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.dirname(HERE)
REPO = os.path.dirname(os.path.dirname(os.path.dirname(DATA)))
SMOLLM2 = os.path.join(REPO, "models", "smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

# Every tokenizer.ggml.pre group of gguf_tokenizer.cc, by one of its names; the main ones get
# the long text set.
MAIN_PRES = ["default", "llama-bpe", "smollm", "qwen2", "gpt-2", "gpt-4o", "tekken"]
OTHER_PRES = ["dbrx", "chatglm-bpe", "glm4", "jais-2", "deepseek-coder", "deepseek-v3",
              "spark2_5", "falcon", "qwen35", "poro-chat", "viking", "chameleon",
              "granite-embed-multi-97m", "bailingmoe", "seed-coder", "ufakzeka", "laguna",
              "exaone-moe", "minicpm5"]

# The prompts of the SmolLM2 greedy goldens (tests/testdata/smollm2/make_goldens.py) lead the
# real model's texts.
PROMPT_TEXTS = [
    "The capital of France is",
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
    "<|im_end|>\n<|im_start|>user\nWhat is the boiling point of water at sea level?<|im_end|>\n"
    "<|im_start|>assistant\n",
]

EXTRA_TEXTS = [
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n"
    "What is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    " <|im_start|> spaced <|im_end|> ",
    "<|begin_of_text|><|begin_of_text|>x<|end_of_text|>",
    "<s> bos and </s> eos and <unk> written out",
    "[MASK][MASK] [MASK]",
    "<think>a</think><think>",
    "Mixture-of-Depths fortune fortunes unfortunate",
    "def fib(n):\n\tif n < 2:\n\t\treturn n\n\treturn fib(n - 1) + fib(n - 2)\n",
    "int main() {\n    std::vector<int> v{1, 2, 3};\n    return v[0] == 1 ? 0 : 1;\n}\n",
    "    indented\n        twice\n\n\n\nfour newlines\r\n\r\nwindows",
    "   \t \n  \u3000 \u00a0 mixed whitespace \u2028 line \u2029 para \u0085 nel",
    "1 12 123 1234 12345 123456 1234567 12.5 -3e10 0x1F 1,234,567 ١٢٣٤ ۱۲۳ १२३ ๑๒๓ ²³ ½ Ⅻ",
    "don't won't I'm you're he'll she'd it's we've THEY'RE 'tis rock'n'roll",
    "Ω≈ç√∫˜µ≤≥÷ åß∂ƒ©˙∆˚¬… œ∑´®†¥¨ˆøπ“‘ ¡™£¢∞§¶•ªº–≠",
    "e\u0301 a\u0300\u0301\u0302 \u0915\u093f \u0e01\u0e34 \U0001F469\u200d\U0001F4BB",
    "Ünïcödé ſ ß ẞ ﬁ ﬂ Ǆ ǅ ǆ İ ı ΐ",
    "emoji 😀😃😄 🇺🇸🇫🇷 👍🏽 🏳️‍🌈 ✈️ ⌚",
    "中文句子，带有标点。日本語の文、カタカナ、ひらがな。한국어 문장입니다.",
    "a\x00b\x01c\x7fd",
    "",
    " ",
    "\n",
    "x",
]


def sweep_texts(step: int) -> list:
    """Codepoints across every plane in a few contexts each: after a letter, before a digit,
    after a space, doubled, so that each regex class sees them."""
    cps = list(range(0x09, 0x0E)) + [0x1C, 0x1F, 0x20, 0x85, 0xA0, 0xAD, 0x1680, 0x180E]
    cps += list(range(0x2000, 0x2010)) + [0x2028, 0x2029, 0x202F, 0x205F, 0x2060, 0x3000, 0xFEFF]
    cps += [c for c in range(0x80, 0x32000, step) if not 0xD800 <= c < 0xE000]
    cps += [0xE0001, 0xE0020, 0xE0100, 0xF0000, 0xFFFFD, 0x10FFFD]
    lines, line = [], []
    for c in cps:
        ch = chr(c)
        line.append(f"a{ch}b {ch}1 {ch}{ch}")
        if len(line) == 16:
            lines.append(" ".join(line))
            line = []
    if line:
        lines.append(" ".join(line))
    return lines


def corpus() -> dict:
    with open(os.path.join(DATA, "corpus.json"), encoding="utf-8") as f:
        return json.load(f)


def bpe_vocab() -> dict:
    with open(os.path.join(DATA, "llama3_style", "tokenizer.json"), encoding="utf-8") as f:
        tj = json.load(f)
    by_id = {i: t for t, i in tj["model"]["vocab"].items()}
    types = {i: NORMAL for i in by_id}
    for a in tj["added_tokens"]:
        by_id[a["id"]] = a["content"]
        types[a["id"]] = CONTROL if a["special"] else USER_DEFINED
    n = max(by_id) + 1
    assert sorted(by_id) == list(range(n)), "ids must be dense"
    merges = [m if isinstance(m, str) else f"{m[0]} {m[1]}" for m in tj["model"]["merges"]]
    return {"model": "gpt2", "tokens": [by_id[i] for i in range(n)],
            "token_type": [types[i] for i in range(n)], "merges": merges,
            "bos": by_id_of(by_id, "<|begin_of_text|>"), "eos": by_id_of(by_id, "<|end_of_text|>")}


def by_id_of(by_id: dict, token: str) -> int:
    return next(i for i, t in by_id.items() if t == token)


def spm_vocab() -> dict:
    sp = spm.SentencePieceProcessor(model_file=os.path.join(DATA, "sp", "tokenizer.model"))
    tokens, scores, types = [], [], []
    for i in range(sp.get_piece_size()):
        tokens.append(sp.id_to_piece(i))
        scores.append(sp.get_score(i))
        if sp.is_unknown(i):
            types.append(UNKNOWN)
        elif sp.is_control(i):
            types.append(CONTROL)
        elif sp.is_unused(i):
            types.append(UNUSED)
        elif sp.is_byte(i):
            types.append(BYTE)
        else:
            types.append(NORMAL)
    for tok, t in (("<|im_start|>", CONTROL), ("<think>", USER_DEFINED)):
        tokens.append(tok)
        scores.append(0.0)
        types.append(t)
    return {"model": "llama", "tokens": tokens, "token_type": types, "scores": scores,
            "bos": sp.bos_id(), "eos": sp.eos_id(), "unk": sp.unk_id()}


def write_gguf(path: str, vocab: dict, keys: list) -> None:
    """A vocabulary-only GGUF: the llama hyperparameters llama.cpp insists on, then the
    tokenizer keys. `keys`: [key, type, value] with type string|u32|bool, as the C++ test
    writes them."""
    w = gguf.GGUFWriter(path, "llama")
    for k, v in (("llama.context_length", 2048), ("llama.embedding_length", 64),
                 ("llama.block_count", 1), ("llama.feed_forward_length", 128),
                 ("llama.attention.head_count", 2)):
        w.add_uint32(k, v)
    w.add_float32("llama.attention.layer_norm_rms_epsilon", 1e-5)
    w.add_string("tokenizer.ggml.model", vocab["model"])
    w.add_array("tokenizer.ggml.tokens", vocab["tokens"])
    w.add_array("tokenizer.ggml.token_type", vocab["token_type"])
    if "merges" in vocab:
        w.add_array("tokenizer.ggml.merges", vocab["merges"])
    if "scores" in vocab:
        w.add_array("tokenizer.ggml.scores", vocab["scores"])
    for key, kind, value in keys:
        {"string": w.add_string, "u32": w.add_uint32, "bool": w.add_bool}[kind](key, value)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def build_tool(llamacpp: str, out_dir: str) -> str:
    src = glob.glob(os.path.join(llamacpp, "*", "vendor", "llama.cpp"))
    if not src:
        sys.exit(f"make_goldens: no llama.cpp source under {llamacpp}")
    lib_dir = os.path.join(llamacpp, "build", "bin")
    if not os.path.exists(os.path.join(lib_dir, "libllama.so")):
        sys.exit(f"make_goldens: no libllama.so in {lib_dir} (build llama.cpp first)")
    exe = os.path.join(out_dir, "llamacpp_tokenize")
    subprocess.run(["c++", "-std=c++17", "-O2", os.path.join(HERE, "llamacpp_tokenize.cc"),
                    "-I", os.path.join(src[0], "include"), "-I",
                    os.path.join(src[0], "ggml", "include"), "-L", lib_dir, "-lllama",
                    f"-Wl,-rpath,{lib_dir}", "-o", exe], check=True)
    return exe


def run_llamacpp(exe: str, gguf_path: str, add_space_prefix: bool, texts: list,
                 streams: list, num_special: int) -> dict:
    """Ids of every text without special tokens, of the first `num_special` with them (BOS and
    EOS only change the ends), and decodes of every stream with and without special tokens."""
    requests = [f"E 0 {t.encode('utf-8').hex()}" for t in texts]
    requests += [f"E 1 {t.encode('utf-8').hex()}" for t in texts[:num_special]]
    encode_lines = len(requests)
    for s in streams:
        for skip in (0, 1):
            requests.append(f"D {skip} {','.join(map(str, s))}")
    proc = subprocess.run([exe, gguf_path, str(int(add_space_prefix))],
                          input="\n".join(requests) + "\n", capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"make_goldens: llamacpp_tokenize failed on {gguf_path}: {proc.stderr}")
    lines = proc.stdout.split("\n")
    info = lines[0].split(" ")
    assert info[0] == "info", lines[0]
    answers = lines[1:1 + len(requests)]
    ids = [[int(x) for x in a.split(",")] if a else [] for a in answers[:encode_lines]]
    texts_out = [bytes.fromhex(a).decode("utf-8", errors="replace")
                 for a in answers[encode_lines:]]
    return {
        "vocab_size": int(info[1]), "bos_id": int(info[2]), "eos_id": int(info[3]),
        "add_bos": info[4] == "1", "add_eos": info[5] == "1",
        "special_ids": [int(x) for x in info[6].split(",")] if len(info) > 6 else [],
        "ids": ids[:len(texts)], "ids_special": ids[len(texts):],
        "decodes": texts_out[0::2], "decodes_skip_special": texts_out[1::2],
    }


def random_streams(vocab_size: int, seed: int, count: int = 120) -> list:
    rng = random.Random(seed)
    return [[rng.randrange(vocab_size) for _ in range(rng.randrange(1, 20))] for _ in range(count)]


def write_json(path: str, obj) -> None:
    """One list entry per line: diffable without pretty-printing every number."""
    with open(path, "w", encoding="utf-8") as f:
        f.write(dump(obj, 0))
        f.write("\n")


def dump(obj, depth: int) -> str:
    pad = "  " * depth
    if isinstance(obj, dict) and depth < 3:
        items = [f"{pad}  {json.dumps(k)}: {dump(v, depth + 1)}" for k, v in obj.items()]
        return "{\n" + ",\n".join(items) + f"\n{pad}}}"
    if isinstance(obj, list) and depth < 3 and obj and isinstance(obj[0], (list, dict, str)):
        items = [f"{pad}  {dump(v, depth + 1) if isinstance(v, dict) else compact(v)}"
                 for v in obj]
        return "[\n" + ",\n".join(items) + f"\n{pad}]"
    return compact(obj)


def compact(obj) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def synthetic(exe: str, tmp: str) -> None:
    c = corpus()
    short = EXTRA_TEXTS + c["samples"] + sweep_texts(step=997)
    full = short + c["docs"][:15] + sweep_texts(step=499)
    texts = list(dict.fromkeys(full))  # one copy of each text, in first-seen order
    index = {t: i for i, t in enumerate(texts)}
    vocabs = {"bpe": bpe_vocab(), "spm": spm_vocab()}
    for name, v in vocabs.items():
        write_json(os.path.join(HERE, f"vocab_{name}.json"), v)

    cases = []
    def case(name, vocab, keys, text_set):
        cases.append({"name": name, "vocab": vocab, "keys": keys,
                      "texts": [index[t] for t in dict.fromkeys(text_set)]})

    bpe, sp = vocabs["bpe"], vocabs["spm"]
    bpe_ids = [["tokenizer.ggml.bos_token_id", "u32", bpe["bos"]],
               ["tokenizer.ggml.eos_token_id", "u32", bpe["eos"]]]
    for pre in MAIN_PRES:
        case(f"bpe_{pre}", "bpe", [["tokenizer.ggml.pre", "string", pre]] + bpe_ids, full)
    for pre in OTHER_PRES:
        case(f"bpe_{pre}", "bpe", [["tokenizer.ggml.pre", "string", pre]] + bpe_ids, short)
    case("bpe_no_pre_key", "bpe", bpe_ids, short)
    case("bpe_llama-bpe_no_bos_eos_added", "bpe",
         [["tokenizer.ggml.pre", "string", "llama-bpe"]] + bpe_ids +
         [["tokenizer.ggml.add_bos_token", "bool", False],
          ["tokenizer.ggml.add_eos_token", "bool", True]], short)
    case("bpe_smollm_space_prefix", "bpe",
         [["tokenizer.ggml.pre", "string", "smollm"]] + bpe_ids +
         [["tokenizer.ggml.add_space_prefix", "bool", True],
          ["tokenizer.ggml.add_bos_token", "bool", True]], short)
    sp_ids = [["tokenizer.ggml.bos_token_id", "u32", sp["bos"]],
              ["tokenizer.ggml.eos_token_id", "u32", sp["eos"]],
              ["tokenizer.ggml.unknown_token_id", "u32", sp["unk"]]]
    case("spm_defaults", "spm", sp_ids, full)
    case("spm_no_space_prefix", "spm",
         sp_ids + [["tokenizer.ggml.add_space_prefix", "bool", False]], short)
    case("spm_eos_no_bos", "spm",
         sp_ids + [["tokenizer.ggml.add_bos_token", "bool", False],
                   ["tokenizer.ggml.add_eos_token", "bool", True]], short)
    case("spm_no_id_keys", "spm", [], short)

    streams = {"bpe": random_streams(len(bpe["tokens"]), 11),
               "spm": random_streams(len(sp["tokens"]), 12)}
    for cs in cases:
        v = vocabs[cs["vocab"]]
        keys = cs["keys"] + [["tokenizer.chat_template", "string", "{{ messages }}"]]
        cs["keys"] = keys
        path = os.path.join(tmp, cs["name"] + ".gguf")
        write_gguf(path, v, keys)
        space = next((k[2] for k in keys if k[0] == "tokenizer.ggml.add_space_prefix"),
                     v["model"] == "llama")
        got = run_llamacpp(exe, path, space, [texts[i] for i in cs["texts"]],
                           streams[cs["vocab"]], num_special=len(EXTRA_TEXTS))
        cs.update(got)
        print(f"{cs['name']}: {sum(len(x) for x in got['ids'])} ids over {len(cs['texts'])} texts")
    write_json(os.path.join(HERE, "goldens.json"),
               {"texts": texts, "streams": streams, "cases": cases})


def smollm2(exe: str) -> None:
    if not os.path.exists(SMOLLM2):
        sys.exit(f"make_goldens: {SMOLLM2} is missing (bash tools/fetch_models.sh)")
    c = corpus()
    hand = list(dict.fromkeys(PROMPT_TEXTS + EXTRA_TEXTS + c["samples"]))
    texts = list(dict.fromkeys(hand + c["docs"] + sweep_texts(step=211) + c["long_inputs"]))
    reader = gguf.GGUFReader(SMOLLM2)
    n = len(reader.fields["tokenizer.ggml.tokens"].data)
    streams = random_streams(n, 13, count=300)
    got = run_llamacpp(exe, SMOLLM2, False, texts, streams, num_special=len(hand))
    write_json(os.path.join(HERE, "smollm2.json"),
               dict({"file": "models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", "texts": texts,
                     "streams": streams}, **got))
    print(f"smollm2: {sum(len(x) for x in got['ids'])} ids over {len(texts)} texts")


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llamacpp", default="/tmp/llamacpp")
    ap.add_argument("--only", choices=["smollm2", "synthetic"])
    args = ap.parse_args()
    print(f"Python's Unicode data: {unicodedata.unidata_version}")
    with tempfile.TemporaryDirectory() as tmp:
        exe = build_tool(args.llamacpp, tmp)
        if args.only in (None, "synthetic"):
            synthetic(exe, tmp)
        if args.only in (None, "smollm2"):
            smollm2(exe)


if __name__ == "__main__":
    main()
