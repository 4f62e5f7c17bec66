"""Writes the tokenizer golden data under tests/testdata/tokenizer/: three byte-level BPE
tokenizer.json files and one SentencePiece model, plus the encodings and decodings that the
reference libraries (Hugging Face `tokenizers`, Python `sentencepiece`) produce for the held-out
corpus, a hand-written multilingual sample and seeded random id streams. Deterministic: a rerun
reproduces byte-identical files. It does not touch models/ (the demo tokenizer is copied from
there).

  .venv/bin/python tools/make_tokenizer_goldens.py [--out tests/testdata/tokenizer]

Files written:
  corpus.json                held-out corpus documents and the sample lines (shared inputs)
  demo/tokenizer.json        copy of models/demo/tokenizer.json (GPT-2 regex ByteLevel, <|bos|>)
  llama3_style/tokenizer.json  Sequence[Split(Llama 3 regex), ByteLevel], merges as [a, b] pairs,
                             ignore_merges, special and non-special added tokens, Sequence post
                             processor [ByteLevel, TemplateProcessing(<|begin_of_text|> $A)]
  qwen2_style/tokenizer.json NFC normalizer, Split(Qwen2 regex), merges as legacy "a b" strings,
                             ByteLevel post-processor (no BOS)
  sp/tokenizer.model         SentencePiece BPE with byte fallback (Llama 2 style: BOS, no EOS)
  <name>/goldens.json        ids per corpus document and sample line (with and without special
                             tokens), decodes of random id streams (skip_special true and false)
"""
from __future__ import annotations

import argparse
import io
import json
import os
import random
import sys

import sentencepiece as spm
from tokenizers import (AddedToken, Regex, Tokenizer, decoders, models, normalizers,
                        pre_tokenizers, processors, trainers)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import corpus  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VOCAB_SIZE = 1000
NUM_RANDOM_STREAMS = 200
RANDOM_STREAM_MAX_LEN = 24

LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                  r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
                 r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

# Hand-written: scripts, emoji sequences, combining marks (decomposed, so NFC changes them),
# numbers, contractions, whitespace runs and added/special tokens written literally in text.
SAMPLES = [
    "Hello, world!",
    "我们的模型在每一层只处理一部分词元。",
    "混合深度模型：路由器为每个词元打分。",
    "日本語のテキストも正しく分割されるべきです。",
    "カタカナとひらがな、そして漢字。",
    "مرحبا بالعالم، هذا نص عربي للاختبار.",
    "नमस्ते दुनिया, यह हिंदी में एक परीक्षण है।",
    "Привет, мир! Это проверка токенизатора.",
    "Ελληνικά: γεια σου κόσμε.",
    "한국어 문장도 포함합니다.",
    "Family: 👨‍👩‍👧‍👦 and a wave 👋🏽 and a flag 🏳️‍🌈.",
    "Thumbs 👍🏿👍🏻 heart ❤️ fire 🔥🔥🔥",
    "Cafe\u0301 vs Café; n\u0303 vs ñ; A\u030a vs Å.",
    "Z\u0351\u036b\u0343\u036a\u0302\u036b\u033d\u034fa\u0300\u0301lgo\u0308 text",
    "Numbers: 1234567 and 3.14159 and 1,000,000 and ٣٤٥ and १२३.",
    "It's the end; they're here, we've won, I'm sure, you'll see, he'd go, don't.",
    "IT'S LOUD, THEY'RE HERE, WE'VE WON, I'M SURE, YOU'LL SEE",
    "tabs\tand\ttabs\t\tdouble",
    "line one\nline two\n\nline four\r\nwindows line",
    "multiple    spaces     here      and trailing   ",
    "   leading spaces",
    "\n\n\nleading newlines",
    "<|bos|> literally in the text <|bos|>",
    "a<|bos|>b<|eos|>c<|pad|>",
    "<|begin_of_text|>header<|end_of_text|>",
    "<|im_start|>user\nhi<|im_end|>",
    "think: <think>reasoning</think> done",
    "The Mixture-of-Depths router, mixture-of-depths again.",
    "a fortune cookie; fortunes; unfortunately; fortune.",
    "mask [MASK] and  [MASK]x",
    "Code: for (int i = 0; i < n; ++i) { x[i] += y[i] * 2; }",
    "def f(x):\n    return x ** 2  # square\n",
    "URL https://example.com/path?q=1&r=two#frag",
    "e-mail: someone@example.org, phone +1-555-0100",
    "Ünïcödé àçcéntš everywhere ſ ß ẞ ﬁ",
    "Mixed: English 中文 日本語 العربية हिन्दी русский 😀",
    "Zero\u200bwidth\u200cjoiners\u200d and nbsp\u00a0here",
    "Quotes “curly” ‘single’ «guillemets» — em dash – en dash …",
    "Math: ∀x ∈ ℝ, x² ≥ 0; ∑ᵢ aᵢ = ∞",
    "",
    " ",
    "x",
]


# Long words without spaces: the BPE merge loop must stay fast and still merge in rank order.
LONG_INPUTS = ["a" * 20000, "ab" * 5000, "1234567890" * 1000, "Hello" * 3000, "😀" * 2000]


def train_hf(pre_tokenizer, normalizer, special_tokens, docs) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    if normalizer is not None:
        tok.normalizer = normalizer
    tok.pre_tokenizer = pre_tokenizer
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, special_tokens=special_tokens,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(docs, trainer=trainer)
    return tok


def make_llama3_style(docs) -> str:
    pre = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok = train_hf(pre, None, ["<|begin_of_text|>", "<|end_of_text|>",
                               "<|reserved_special_token_0|>"], docs)
    tok.add_tokens([AddedToken("<think>", special=False, normalized=False),
                    AddedToken("</think>", special=False, normalized=False),
                    AddedToken("Mixture-of-Depths", special=False, normalized=True),
                    AddedToken("fortune", special=False, single_word=True, normalized=False)])
    tok.add_special_tokens([AddedToken("[MASK]", special=True, lstrip=True, rstrip=False,
                                       normalized=False)])
    bos = tok.token_to_id("<|begin_of_text|>")
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single="<|begin_of_text|> $A",
                                      pair="<|begin_of_text|> $A <|begin_of_text|> $B",
                                      special_tokens=[("<|begin_of_text|>", bos)])])
    data = json.loads(tok.to_str())
    data["model"]["ignore_merges"] = True  # as Llama 3 ships it
    return json.dumps(data, ensure_ascii=False, indent=2)


def make_qwen2_style(docs) -> str:
    pre = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok = train_hf(pre, normalizers.NFC(), ["<|endoftext|>", "<|im_start|>", "<|im_end|>"], docs)
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    data = json.loads(tok.to_str())
    # The legacy merges form ("a b" strings) that older files (GPT-2, Qwen2) still use.
    data["model"]["merges"] = [m if isinstance(m, str) else f"{m[0]} {m[1]}"
                               for m in data["model"]["merges"]]
    return json.dumps(data, ensure_ascii=False, indent=2)


def make_sentencepiece(docs, path: str) -> None:
    lines = [line for d in docs for line in d.split("\n") if line.strip()]
    # model_writer instead of model_prefix: the prefix (a temporary path) would be stored in the
    # model's trainer_spec and make reruns differ.
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_writer=model, vocab_size=VOCAB_SIZE,
        model_type="bpe", byte_fallback=True, character_coverage=0.9995,
        num_threads=1, input_sentence_size=0, shuffle_input_sentence=False,
        bos_id=1, eos_id=2, unk_id=0, pad_id=-1, split_digits=True, minloglevel=2)
    with open(path, "wb") as f:
        f.write(model.getvalue())


def random_streams(vocab_size: int, seed: int) -> list:
    rng = random.Random(seed)
    return [[rng.randrange(vocab_size) for _ in range(rng.randrange(1, RANDOM_STREAM_MAX_LEN))]
            for _ in range(NUM_RANDOM_STREAMS)]


def hf_goldens(tok: Tokenizer, docs: list, samples: list) -> dict:
    def enc(texts, special):
        return [tok.encode(t, add_special_tokens=special).ids for t in texts]

    streams = random_streams(tok.get_vocab_size(with_added_tokens=True), seed=1234)
    added = tok.get_added_tokens_decoder()
    return {
        "vocab_size": tok.get_vocab_size(with_added_tokens=True),
        "special_ids": sorted(i for i, t in added.items() if t.special),
        "token_ids": {t: tok.token_to_id(t) for t in ["<|bos|>", "<|eos|>", "<|begin_of_text|>",
                                                      "<|end_of_text|>", "<|endoftext|>",
                                                      "Ġthe", "the"]
                      if tok.token_to_id(t) is not None},
        "bos_id": tok.encode("", add_special_tokens=True).ids[:1],
        "corpus_ids": enc(docs, False),
        "corpus_ids_special": enc(docs, True),
        "sample_ids": enc(samples, False),
        "sample_ids_special": enc(samples, True),
        "sample_decodes": [tok.decode(ids, skip_special_tokens=False)
                           for ids in enc(samples, True)],
        "sample_decodes_skip_special": [tok.decode(ids, skip_special_tokens=True)
                                        for ids in enc(samples, True)],
        "long_ids": enc(LONG_INPUTS, False),
        "random_streams": streams,
        "random_decodes": [tok.decode(s, skip_special_tokens=False) for s in streams],
        "random_decodes_skip_special": [tok.decode(s, skip_special_tokens=True) for s in streams],
    }


def sp_goldens(sp: spm.SentencePieceProcessor, docs: list, samples: list) -> dict:
    def enc(texts, special):
        out = []
        for t in texts:
            ids = sp.encode(t, out_type=int)
            out.append(([sp.bos_id()] if special else []) + ids)
        return out

    streams = random_streams(sp.get_piece_size(), seed=5678)
    return {
        "vocab_size": sp.get_piece_size(),
        "special_ids": [i for i in range(sp.get_piece_size()) if sp.is_control(i)],
        "bos_id": [sp.bos_id()],
        "eos_id": sp.eos_id(),
        "corpus_ids": enc(docs, False),
        "corpus_ids_special": enc(docs, True),
        "corpus_decodes": [sp.decode(ids) for ids in enc(docs, False)],
        "sample_ids": enc(samples, False),
        "sample_ids_special": enc(samples, True),
        "sample_decodes": [sp.decode(ids) for ids in enc(samples, False)],
        "long_ids": enc(LONG_INPUTS, False),
        "random_streams": streams,
        "random_decodes": [sp.decode(s) for s in streams],
    }


def utf8_goldens() -> dict:
    """Random byte strings, biased towards UTF-8 lead/continuation bytes, and Python's
    decode(errors="replace"), which substitutes maximal subparts as Rust's from_utf8_lossy does."""
    rng = random.Random(99)
    interesting = [0x00, 0x41, 0x7F, 0x80, 0xBF, 0xC0, 0xC1, 0xC2, 0xDF, 0xE0, 0xED, 0xEF, 0xF0,
                   0xF4, 0xF5, 0xFF, 0x9F, 0xA0, 0x8F, 0x90]
    cases = []
    for _ in range(400):
        n = rng.randrange(0, 9)
        b = bytes(rng.choice(interesting) if rng.random() < 0.7 else rng.randrange(256)
                  for _ in range(n))
        cases.append([b.hex(), b.decode("utf-8", errors="replace")])
    return {"cases": cases}


def write_json(path: str, obj) -> None:
    # One id list per line keeps the files diffable without pretty-printing every number.
    with open(path, "w", encoding="utf-8") as f:
        f.write("{\n")
        keys = list(obj)
        for i, k in enumerate(keys):
            v = obj[k]
            f.write(f"  {json.dumps(k)}: ")
            if isinstance(v, list):
                f.write("[\n")
                f.write(",\n".join("    " + json.dumps(x, ensure_ascii=False, separators=(",", ":"))
                                   for x in v))
                f.write("\n  ]")
            else:
                f.write(json.dumps(v, ensure_ascii=False))
            f.write(",\n" if i + 1 < len(keys) else "\n")
        f.write("}\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join(REPO, "tests", "testdata", "tokenizer"))
    args = ap.parse_args()
    train_docs, held_docs = corpus.split()
    os.makedirs(args.out, exist_ok=True)
    write_json(os.path.join(args.out, "corpus.json"),
               {"docs": held_docs, "samples": SAMPLES, "long_inputs": LONG_INPUTS})
    write_json(os.path.join(args.out, "utf8.json"), utf8_goldens())

    tokenizer_jsons = {
        "demo": open(os.path.join(REPO, "models", "demo", "tokenizer.json"),
                     encoding="utf-8").read(),
        "llama3_style": make_llama3_style(train_docs),
        "qwen2_style": make_qwen2_style(train_docs),
    }
    for name, text in tokenizer_jsons.items():
        d = os.path.join(args.out, name)
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "tokenizer.json"), "w", encoding="utf-8") as f:
            f.write(text)
        tok = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
        write_json(os.path.join(d, "goldens.json"), hf_goldens(tok, held_docs, SAMPLES))
        merges = json.loads(text)["model"]["merges"]
        form = "[a, b] pairs" if merges and isinstance(merges[0], list) else "'a b' strings"
        print(f"{name}: vocab {tok.get_vocab_size(with_added_tokens=True)}, merges as {form}")

    d = os.path.join(args.out, "sp")
    os.makedirs(d, exist_ok=True)
    make_sentencepiece(train_docs, os.path.join(d, "tokenizer.model"))
    sp = spm.SentencePieceProcessor(model_file=os.path.join(d, "tokenizer.model"))
    write_json(os.path.join(d, "goldens.json"), sp_goldens(sp, held_docs, SAMPLES))
    print(f"sp: vocab {sp.get_piece_size()}")


if __name__ == "__main__":
    main()
