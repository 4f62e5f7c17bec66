"""modserve's GGML block layouts (engine/common/quant.h) against the `gguf` package's.

The built helper quant_dump quantizes seeded rows (incl. zeros, spikes, all-negative rows, tiny
and large scales) with modserve's reference quantizers and writes the blocks and modserve's
dequantization. Here `gguf.quants` - an independent implementation, the one the Python
reference model uses to read GGUF files - dequantizes the same bytes, and for the types it can
quantize (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1) re-quantizes the same inputs.

The binary is found through $MODSERVE_QUANT_DUMP (ctest sets it) or under
$MODSERVE_BUILD_DIR/tests (default build/, which tools/test.sh builds before pytest runs).
"""
import os
import subprocess

import numpy as np
import pytest

gguf_quants = pytest.importorskip("gguf.quants")
from gguf import GGMLQuantizationType as QT  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TYPES = {"Q8_0": QT.Q8_0, "Q4_0": QT.Q4_0, "Q4_1": QT.Q4_1, "Q5_0": QT.Q5_0, "Q5_1": QT.Q5_1,
         "Q4_K": QT.Q4_K, "Q5_K": QT.Q5_K, "Q6_K": QT.Q6_K}
ROW = 512  # elements per row in quant_dump


def _tool():
    path = os.environ.get("MODSERVE_QUANT_DUMP") or os.path.join(
        ROOT, os.environ.get("MODSERVE_BUILD_DIR", "build"), "tests", "quant_dump")
    if not os.path.exists(path):
        pytest.skip(f"{path} is not built (ninja -C build quant_dump)")
    return path


@pytest.fixture(scope="module")
def dumped(tmp_path_factory):
    out = tmp_path_factory.mktemp("quant")
    subprocess.run([_tool(), str(out)], check=True, timeout=60)
    data = {}
    for name in TYPES:
        src = np.fromfile(out / f"{name}.src.f32", dtype=np.float32).reshape(-1, ROW)
        blocks = np.fromfile(out / f"{name}.blocks", dtype=np.uint8).reshape(src.shape[0], -1)
        deq = np.fromfile(out / f"{name}.deq.f32", dtype=np.float32).reshape(src.shape)
        data[name] = (src, blocks, deq)
    return data


@pytest.mark.parametrize("name", list(TYPES))
def test_dequantize_matches_gguf_bit_for_bit(dumped, name):
    src, blocks, ours = dumped[name]
    block_elems, block_bytes = gguf_quants.GGML_QUANT_SIZES[TYPES[name]]
    assert blocks.shape[1] == ROW // block_elems * block_bytes
    theirs = gguf_quants.dequantize(blocks, TYPES[name])
    assert theirs.shape == ours.shape
    # Both form the same f32 products in the same order (d * sc, then times q, minus dmin * mn).
    np.testing.assert_array_equal(ours, theirs.astype(np.float32))


@pytest.mark.parametrize("name", ["Q8_0", "Q4_1", "Q4_0", "Q5_1", "Q5_0"])
def test_simple_quantizers_write_the_same_bytes_as_gguf(dumped, name):
    src, ours, _ = dumped[name]
    theirs = gguf_quants.quantize(src, TYPES[name]).reshape(ours.shape)
    if name != "Q4_0":
        np.testing.assert_array_equal(ours, theirs)
        return
    # gguf rounds Q4_0's x / d + 8.5 in float64 where GGML's C reference rounds in float32; the
    # two differ only where x / d lands within an f32 ulp of a half-level, which flips one
    # nibble by one level. Scales must agree exactly and nibble flips must be that rare.
    block_bytes = gguf_quants.GGML_QUANT_SIZES[QT.Q4_0][1]
    ob, tb = ours.reshape(-1, block_bytes), theirs.reshape(-1, block_bytes)
    np.testing.assert_array_equal(ob[:, :2], tb[:, :2])
    nibbles = lambda b: np.concatenate([b[:, 2:] & 15, b[:, 2:] >> 4], axis=1).astype(int)
    diff = np.abs(nibbles(ob) - nibbles(tb))
    assert diff.max() <= 1
    assert (diff > 0).mean() < 1e-3


@pytest.mark.parametrize("name", list(TYPES))
def test_round_trip_error_is_small_on_gaussian_rows(dumped, name):
    # Rows 0, 8, 16, ... are Gaussian (quant_dump); the gguf reading of our blocks must be close
    # to the input, relative to each row's RMS (quant_test.cc's bounds on 16384 elements, doubled
    # for the noisier 512-element rows).
    src, blocks, _ = dumped[name]
    theirs = gguf_quants.dequantize(blocks, TYPES[name])
    bound = {"Q8_0": 7e-5, "Q4_0": 1.8e-2, "Q4_1": 1.5e-2, "Q5_0": 4.6e-3, "Q5_1": 3.5e-3,
             "Q4_K": 1.3e-2, "Q5_K": 3.2e-3, "Q6_K": 8e-4}
    for r in range(0, src.shape[0], 8):
        x, y = src[r].astype(np.float64), theirs[r].astype(np.float64)
        if np.sqrt((x ** 2).mean()) < 1e-2:
            # The f16 scales turn subnormal (Q6_K's super-scale, ~rms / 4096, even underflows to
            # zero): a limit of the formats, the same in GGML, and far from real weights.
            continue
        nmse = ((y - x) ** 2).sum() / (x ** 2).sum()
        assert nmse < bound[name], (name, r, nmse)
