"""The demo corpus: Debian's `fortunes` and `fortunes-min` cookie files (BSD-style licence, see
/usr/share/doc/fortunes/copyright), split into documents at '%' lines, deduplicated, with a fixed
5% held-out split chosen by a hash of each document's text (so the split never depends on order).
"""
from __future__ import annotations

import hashlib
import os

FORTUNE_DIR = "/usr/share/games/fortunes"
EXCLUDE = {"ascii-art"}  # pictures drawn in characters, not English text
HELDOUT_MOD = 20  # one document in 20 is held out


def _read_text(path: str) -> str:
    raw = open(path, "rb").read()
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw.decode("latin-1")


def documents(fortune_dir: str = FORTUNE_DIR) -> list:
    if not os.path.isdir(fortune_dir):
        raise SystemExit(f"{fortune_dir} is missing: install Debian's fortunes and fortunes-min "
                         f"(tools/install_deps.sh)")
    names = sorted(n for n in os.listdir(fortune_dir)
                   if "." not in n and n not in EXCLUDE and
                   os.path.isfile(os.path.join(fortune_dir, n)))
    seen, docs = set(), []
    for n in names:
        path = os.path.join(fortune_dir, n)
        if os.path.exists(path + ".u8"):
            path += ".u8"
        for chunk in _read_text(path).split("\n%\n"):
            text = "\n".join(line.rstrip() for line in chunk.strip("\n%").split("\n")).strip()
            if len(text) < 8 or text in seen:
                continue
            seen.add(text)
            docs.append(text)
    return docs


def is_heldout(text: str) -> bool:
    return int(hashlib.sha1(text.encode("utf-8")).hexdigest(), 16) % HELDOUT_MOD == 0


def split() -> tuple:
    docs = documents()
    train = [d for d in docs if not is_heldout(d)]
    held = [d for d in docs if is_heldout(d)]
    return train, held
