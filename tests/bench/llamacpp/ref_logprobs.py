"""modserve on a GGUF file against the float64 reference on the same file's weights.

modserve-generate decodes greedily from prompt ids; the reference (tools/modref: every tensor
expanded by the `gguf` package's dequantizer, computed in float64) is then teacher-forced on
modserve's tokens, and the largest differences of the chosen tokens' logprobs and of the top-1 /
top-2 margins are printed. What is left is modserve's arithmetic (activations rounded to 8 bits
per 32-element block for quantized weights, f32 sums), so files written by different quantizers
(modserve-quantize, llama_quantize.cc) can be compared on equal terms. A probe, not a test.

  .venv/bin/python tests/bench/llamacpp/ref_logprobs.py FILE.gguf [N_NEW] [PROMPT_IDS]
"""
import json
import os
import subprocess
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path.insert(0, os.path.join(ROOT, "tools"))
from modref import gguf_io  # noqa: E402

path = sys.argv[1]
n_new = int(sys.argv[2]) if len(sys.argv) > 2 else 24
prompt = [int(t) for t in (sys.argv[3] if len(sys.argv) > 3 else
                           "1,450,4996,17354,1701,432,3262,975,278,17366,11203,29889").split(",")]
generate = os.path.join(ROOT, os.environ.get("MODSERVE_BIN_DIR", "build/bin"), "modserve-generate")
run = subprocess.run([generate, "--model", path, "--prompt_ids", ",".join(map(str, prompt)),
                      "--max_new_tokens", str(n_new), "--temperature", "0", "--ignore_eos",
                      "--top_logprobs", "2", "--json", "--threads", "2"],
                     capture_output=True, text=True, check=True)
ms = json.loads(run.stdout)
model = gguf_io.load(path)
with torch.no_grad():
    logits, _ = model(torch.tensor([prompt + ms["token_ids"]]))
logprobs = torch.log_softmax(logits[0].double(), -1)
worst_lp = worst_margin = 0.0
for k, token in enumerate(ms["token_ids"]):
    row = logprobs[len(prompt) - 1 + k]
    worst_lp = max(worst_lp, abs(row[token].item() - ms["logprobs"][k]))
    top2 = torch.topk(row, 2).values
    tops = ms["top_logprobs"][k]
    worst_margin = max(worst_margin, abs((top2[0] - top2[1]).item()
                                         - (tops[0]["logprob"] - tops[1]["logprob"])))
print(f"{path}: {len(ms['token_ids'])} teacher-forced steps on modserve's tokens, "
      f"max |dlogprob| {worst_lp:.4f}, max |dmargin| {worst_margin:.4f}")
