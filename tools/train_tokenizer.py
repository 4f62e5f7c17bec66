"""Trains the demo's byte-level BPE tokenizer (GPT-2 style pre-tokenizer, Hugging Face
tokenizer.json) on the training split of the corpus. Deterministic for a given corpus.

  .venv/bin/python tools/train_tokenizer.py --vocab_size 2048 --out models/demo
"""
from __future__ import annotations

import argparse
import os

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

import corpus

SPECIALS = ["<|pad|>", "<|bos|>", "<|eos|>"]  # ids 0, 1, 2


def train(vocab_size: int) -> Tokenizer:
    train_docs, _ = corpus.split()
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(train_docs, trainer=trainer)
    # Like Llama: encode() puts <|bos|> in front; the model predicts <|eos|> after a document.
    tok.post_processor = processors.TemplateProcessing(single="<|bos|> $A",
                                                       special_tokens=[("<|bos|>", 1)])
    return tok


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--vocab_size", type=int, default=2048)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    tok = train(args.vocab_size)
    os.makedirs(args.out, exist_ok=True)
    tok.save(os.path.join(args.out, "tokenizer.json"), pretty=True)
    print(f"vocab {tok.get_vocab_size()} -> {args.out}/tokenizer.json")


if __name__ == "__main__":
    main()
