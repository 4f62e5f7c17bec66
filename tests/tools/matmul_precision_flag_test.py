"""--matmul_precision of every program that takes it: a value other than highest, high or medium
is refused before any work (exit status non-zero, the message naming the flag and the value),
and each valid value runs (modserve-generate on the demo checkpoint, which has F32 weights: the
same tokens at every setting, since only the AMX BF16 Gemm reads it).
Usage: matmul_precision_flag_test.py MODEL_DIR GENERATE SERVER PERPLEXITY BENCH"""

import json
import subprocess
import sys
import unittest

ARGS = {}


class MatmulPrecisionFlagTest(unittest.TestCase):
    def test_an_unknown_value_is_refused_by_name(self):
        model = ARGS["model"]
        for name, cmd in [
            ("generate", [ARGS["generate"], "--model", model, "--prompt_ids", "1,2,3"]),
            ("server", [ARGS["server"], "--model", model, "--port", "0"]),
            ("perplexity", [ARGS["perplexity"], "--model", model, "--windows", "/nonexistent"]),
            ("bench", [ARGS["bench"], "--shapes", "110m", "--workdir", "/nonexistent"]),
        ]:
            with self.subTest(program=name):
                p = subprocess.run(cmd + ["--matmul_precision", "low"], capture_output=True,
                                   text=True, timeout=60)
                out = p.stdout + p.stderr
                self.assertNotEqual(p.returncode, 0, out)
                self.assertIn("matmul", out)
                self.assertIn('"low"', out)
                self.assertIn("highest, high, medium", out)

    def test_every_value_runs_and_f32_weights_do_not_depend_on_it(self):
        tokens = {}
        for precision in ("highest", "high", "medium"):
            p = subprocess.run([ARGS["generate"], "--model", ARGS["model"], "--prompt_ids",
                                ",".join(str(i) for i in range(1, 40)), "--max_new_tokens", "8",
                                "--json", "--matmul_precision", precision],
                               capture_output=True, text=True, timeout=120)
            self.assertEqual(p.returncode, 0, p.stderr)
            tokens[precision] = json.loads(p.stdout)["token_ids"]
        self.assertEqual(tokens["high"], tokens["highest"])
        self.assertEqual(tokens["medium"], tokens["highest"])


if __name__ == "__main__":
    ARGS.update(zip(["model", "generate", "server", "perplexity", "bench"], sys.argv[1:6]))
    unittest.main(argv=sys.argv[:1])
