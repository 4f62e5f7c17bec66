"""--help of every binary prints its usage line and every flag its main file defines (parsed from
the ABSL_FLAG definitions in that file, so a flag added later is checked too), and prints it
without doing the program's work. Usage: cli_help_test.py BINARY=SOURCE ... (BINARY=- for a
program without flags: only the usage line is checked)."""

import re
import subprocess
import sys
import unittest

_FLAG = re.compile(r"ABSL_FLAG\(\s*[^,]+?,\s*(\w+)\s*,", re.S)
PAIRS = []


class CliHelpTest(unittest.TestCase):
    def test_every_binary_lists_its_flags(self):
        self.assertTrue(PAIRS)
        for binary, source in PAIRS:
            with self.subTest(binary=binary):
                # Abseil exits 1 after --help; the programs without Abseil flags exit 0.
                p = subprocess.run([binary, "--help"], capture_output=True, text=True, timeout=60)
                out = p.stdout + p.stderr
                self.assertIn(p.returncode, (0, 1), out)
                self.assertNotIn("No flags matched", out)
                if source == "-":
                    self.assertIn("usage:", out)
                    continue
                with open(source) as f:
                    flags = _FLAG.findall(f.read())
                self.assertTrue(flags, f"no ABSL_FLAG in {source}")
                for flag in flags:
                    self.assertRegex(out, rf"--{flag}\b", f"{binary} --help lacks --{flag}")
                # The first line is the program's usage message.
                self.assertTrue(out.splitlines()[0].startswith(binary.rsplit("/", 1)[-1]), out)


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        binary, source = arg.split("=", 1)
        PAIRS.append((binary, source))
    unittest.main(argv=sys.argv[:1])
