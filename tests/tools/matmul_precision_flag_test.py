"""--matmul_precision of every program that takes it: a value other than highest, high or medium
is refused before any work (exit status non-zero, the message naming the flag and the value),
each valid value runs (modserve-generate on the demo checkpoint, which has F32 weights: the
same tokens at every setting, since only Gemms of BF16 weights and bf16 attention read it), and the server reports
its value in GetModelInfo.
Usage: matmul_precision_flag_test.py MODEL_DIR GENERATE SERVER PERPLEXITY BENCH CLIENT"""

import json
import os
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from loopback import Server  # noqa: E402

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

    def test_the_server_reports_its_precision(self):
        for precision in ("medium", "highest"):
            with Server(ARGS["server"], ARGS["model"], "--matmul_precision", precision) as s:
                p = subprocess.run([ARGS["client"], "--server", s.address, "info"],
                                   capture_output=True, text=True, timeout=60)
                self.assertEqual(p.returncode, 0, p.stderr)
                self.assertIn(f'matmul_precision: "{precision}"', p.stdout)


if __name__ == "__main__":
    ARGS.update(zip(["model", "generate", "server", "perplexity", "bench", "client"],
                    sys.argv[1:7]))
    unittest.main(argv=sys.argv[:1])
