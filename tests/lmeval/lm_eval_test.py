"""lm-eval (PyPI) runs two local tasks (tests/lmeval/*.yaml over JSON files here; no downloads)
against the built `modserve --http_port` with its `local-completions` model, and every number it
reports equals the same task computed without the server or lm-eval: prompts tokenized by Hugging
Face `tokenizers` (the reference BPE) the way lm-eval splits context and continuation, scored by
`modserve-generate --prompt_logprobs` (the offline engine), summed and aggregated here.

    python3 tests/lmeval/lm_eval_test.py BUILD_DIR/bin/modserve models/demo

lm-eval comes from its own virtual environment (its dependencies are heavy, and it would change
the shared .venv): `bash tools/install_lm_eval.sh` makes .venv-lmeval; MODSERVE_LM_EVAL names
another `lm_eval` executable. Without one the test exits 77 (CTest: skipped). Label `slow`.
"""

import glob
import json
import math
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tests", "common"))
from loopback import Server  # noqa: E402

BINARY, MODEL = None, None
TASKS = ("modserve_tiny_loglik", "modserve_tiny_mc")
# One request at a time (num_concurrent=1) and the server's KV storage type: each prefill then
# runs exactly as the lone offline one does, so the numbers are equal, not merely close (two
# prompts prefilled in one batch round differently, by up to ~1e-5 relative).
TOLERANCE = 1e-9


def lm_eval_executable():
    path = os.environ.get("MODSERVE_LM_EVAL") or os.path.join(ROOT, ".venv-lmeval", "bin",
                                                              "lm_eval")
    return path if os.path.exists(path) else None


def as_bool(value):
    """lm-eval's samples files hold a response's fields as strings ("True"/"False")."""
    if isinstance(value, bool):
        return value
    return {"True": True, "False": False}[value]


def read_jsonl(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


class Reference:
    """The independent computation: HF tokenizers + modserve-generate --prompt_logprobs."""

    def __init__(self, model):
        from tokenizers import Tokenizer
        self.tok = Tokenizer.from_file(os.path.join(model, "tokenizer.json"))
        self.generate = os.path.join(os.path.dirname(BINARY), "modserve-generate")
        self.model = model

    def encode(self, text):
        return self.tok.encode(text, add_special_tokens=False).ids

    def loglikelihood(self, context, continuation):
        """(sum of the continuation's logprobs, whether every token is the model's top choice),
        with lm-eval's split: trailing spaces of the context move to the continuation, and the
        context's tokens are a prefix of the whole text's."""
        n_spaces = len(context) - len(context.rstrip())
        if n_spaces:
            continuation = context[-n_spaces:] + continuation
            context = context[:-n_spaces]
        whole = self.encode(context + continuation)
        ctxlen = len(self.encode(context))
        out = subprocess.run(
            [self.generate, "--model", self.model, "--prompt_ids", ",".join(map(str, whole)),
             "--max_new_tokens", "1", "--prompt_logprobs", "1", "--json", "--threads", "1",
             "--kv_cache_dtype", "auto"],  # the server's default KV storage
            capture_output=True, text=True, check=True)
        prompt = json.loads(out.stdout)["prompt_logprobs"]
        assert [p["token_id"] for p in prompt] == whole
        scored = prompt[ctxlen:]
        total = sum(p["logprob"] for p in scored)
        greedy = all(p["logprob"] >= max(t["logprob"] for t in p["top"]) for p in scored)
        return total, greedy


class LmEvalTest(unittest.TestCase):
    def test_local_tasks_match_the_offline_engine(self):
        lm_eval = lm_eval_executable()
        with Server(BINARY, MODEL, "--threads", "1", "--http_port", "0") as server, \
                tempfile.TemporaryDirectory() as out:
            url = f"http://127.0.0.1:{server.http_port}/v1/completions"
            env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1",
                       TRANSFORMERS_OFFLINE="1", HF_HOME=os.path.join(out, "hf"),
                       TOKENIZERS_PARALLELISM="false")
            subprocess.run(
                [lm_eval, "run", "--model", "local-completions", "--model_args",
                 f"model=demo,base_url={url},tokenizer_backend=remote,tokenized_requests=True,"
                 "num_concurrent=1,max_retries=1,timeout=300",
                 "--tasks", ",".join(TASKS), "--include_path", HERE, "--batch_size", "1",
                 "--log_samples", "--output_path", out, "--seed", "1234"],
                cwd=ROOT, env=env, check=True)
            [results_file] = glob.glob(os.path.join(out, "**", "results_*.json"), recursive=True)
            with open(results_file) as f:
                results = json.load(f)["results"]
            samples = {t: read_jsonl(glob.glob(os.path.join(out, "**", f"samples_{t}_*.jsonl"),
                                               recursive=True)[0]) for t in TASKS}
        ref = Reference(MODEL)

        # Loglikelihood task: each document's (loglikelihood, is_greedy), then perplexity and acc.
        lls, accs = [], []
        for s in sorted(samples["modserve_tiny_loglik"], key=lambda s: s["doc_id"]):
            got_ll, got_greedy = s["filtered_resps"][0]
            want_ll, want_greedy = ref.loglikelihood(s["doc"]["context"],
                                                     s["doc"]["continuation"])
            self.assertAlmostEqual(float(got_ll), want_ll, delta=TOLERANCE, msg=s["doc"])
            self.assertEqual(as_bool(got_greedy), want_greedy, s["doc"])
            lls.append(want_ll)
            accs.append(int(want_greedy))
        r = results["modserve_tiny_loglik"]
        self.assertAlmostEqual(r["perplexity,none"], math.exp(-sum(lls) / len(lls)),
                               delta=TOLERANCE * r["perplexity,none"])
        self.assertAlmostEqual(r["acc,none"], sum(accs) / len(accs), delta=1e-12)

        # Multiple choice: every choice's loglikelihood; acc by the highest, acc_norm by the
        # highest per byte (lm-eval normalizes by the choice's length in bytes).
        acc, acc_norm = [], []
        for s in sorted(samples["modserve_tiny_mc"], key=lambda s: s["doc_id"]):
            doc = s["doc"]
            want = [ref.loglikelihood(doc["question"], " " + c)[0] for c in doc["choices"]]
            got = [float(x[0]) for x in s["filtered_resps"]]
            for g, w in zip(got, want):
                self.assertAlmostEqual(g, w, delta=TOLERANCE, msg=doc)
            best = max(range(len(want)), key=lambda i: want[i])
            lengths = [len((" " + c).encode()) for c in doc["choices"]]
            best_norm = max(range(len(want)), key=lambda i: want[i] / lengths[i])
            acc.append(int(best == doc["answer"]))
            acc_norm.append(int(best_norm == doc["answer"]))
        r = results["modserve_tiny_mc"]
        self.assertAlmostEqual(r["acc,none"], sum(acc) / len(acc), delta=1e-12)
        self.assertAlmostEqual(r["acc_norm,none"], sum(acc_norm) / len(acc_norm), delta=1e-12)
        print(json.dumps({t: {k: v for k, v in results[t].items() if "," in k} for t in TASKS},
                         indent=1))


if __name__ == "__main__":
    BINARY, MODEL = sys.argv[1], sys.argv[2]
    if lm_eval_executable() is None:
        print("lm_eval_test: no lm-eval (bash tools/install_lm_eval.sh, or set MODSERVE_LM_EVAL);"
              " skipped")
        sys.exit(77)
    unittest.main(argv=sys.argv[:1])
