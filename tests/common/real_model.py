"""Where the real reference model lives and what a test does without it: SmolLM2-135M-Instruct
(Q4_1 GGUF) that tools/fetch_models.sh places under models/smollm2/ (tools/test.sh runs it
first). Without the file a test fails in CI (CI=true), where the fetch must have worked, and
skips on a developer machine without network.

    from real_model import require_smollm2
    path = require_smollm2()    # inside a test
"""
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SMOLLM2 = os.path.join(ROOT, "models", "smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")


def require_smollm2():
    """The model's path; fails (CI) or skips (elsewhere) the calling test when it is missing."""
    if os.path.isfile(SMOLLM2):
        return SMOLLM2
    msg = f"{SMOLLM2} is missing: run `bash tools/fetch_models.sh`"
    if os.environ.get("CI") == "true":
        pytest.fail(f"{msg} (CI must have it: tools/test.sh fetches it first)")
    pytest.skip(msg)
