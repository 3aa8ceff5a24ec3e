#!/usr/bin/env python3
"""Writes the small reference files that tests/io/reference_fixtures_test.cpp reads.

The files come from the reference Python implementations (the `gguf` package that ships with
llama.cpp and the `safetensors` package), so the C++ readers are checked against an independent
writer and against gguf-py's own Q8_0/Q4_0/Q5_0 quantize/dequantize and its decoding of the other
block formats (Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL):

  tests/fixtures/io/reference.gguf          GGUF v3: every metadata type, F32/F16/BF16/Q8_0/Q4_0/Q4_K/Q6_K tensors
                                            and Q4_1/Q5_0/Q5_1/Q2_K/Q3_K/Q5_K/IQ4_NL ones
  tests/fixtures/io/reference.safetensors   F32/F16/BF16/I8/U8/I32/I64 tensors and __metadata__
  tests/fixtures/io/reference_expected.json the values the readers must produce

Run by hand (needs numpy, gguf, safetensors):
  /path/to/venv/bin/python tools/reference/make_io_fixtures.py

With --check-writer FILE it instead reads a GGUF written by Tachyon's GgufWriter (from
`tests/io` with TACHYON_IO_WRITER_OUT=FILE) and verifies that gguf-py parses it and that its
Q8_0/Q4_0 blocks equal gguf-py's quantization of the same inputs, byte for byte.
"""
import argparse
import json
import pathlib

import numpy as np

import gguf
from gguf import quants
from safetensors.numpy import save_file

ROOT = pathlib.Path(__file__).resolve().parents[2]
OUT = ROOT / "tests" / "fixtures" / "io"


def ramp(shape, scale, offset=0.0):
    n = int(np.prod(shape))
    # Deterministic values with a spread of magnitudes and both signs.
    v = np.sin(np.arange(n, dtype=np.float64) * 0.731 + offset) * scale
    return v.astype(np.float32).reshape(shape)


def write_gguf(expected):
    path = OUT / "reference.gguf"
    w = gguf.GGUFWriter(str(path), arch="llama")
    V = gguf.GGUFValueType
    w.add_uint8("t.u8", 250)
    w.add_int8("t.i8", -100)
    w.add_uint16("t.u16", 65000)
    w.add_int16("t.i16", -32000)
    w.add_uint32("t.u32", 4000000000)
    w.add_int32("t.i32", -2000000000)
    w.add_uint64("t.u64", 18000000000000000000)
    w.add_int64("t.i64", -9000000000000000000)
    w.add_float32("t.f32", 0.1)
    w.add_float64("t.f64", 1.0e-300)
    w.add_bool("t.bool", True)
    w.add_string("t.string", "h\u00e9llo \u2581world")
    w.add_array("t.strings", ["<unk>", "<s>", "\u2581the", ""])
    w.add_key_value("t.f32s", [0.5, -1.25, 3.0], V.ARRAY, sub_type=V.FLOAT32)
    w.add_key_value("t.i32s", [1, -2, 3], V.ARRAY, sub_type=V.INT32)
    w.add_key_value("t.nested", [[1, 2], [3]], V.ARRAY)
    expected["gguf_metadata"] = {
        "t.u8": 250, "t.i8": -100, "t.u16": 65000, "t.i16": -32000, "t.u32": 4000000000,
        "t.i32": -2000000000, "t.u64": "18000000000000000000", "t.i64": -9000000000000000000,
        "t.f32": float(np.float32(0.1)), "t.f64": 1.0e-300, "t.bool": True,
        "t.string": "h\u00e9llo \u2581world", "t.strings": ["<unk>", "<s>", "\u2581the", ""],
        "t.f32s": [0.5, -1.25, 3.0], "t.i32s": [1, -2, 3],
    }

    tensors = {}
    f32 = ramp((3, 4), 2.0)
    w.add_tensor("f32", f32)
    tensors["f32"] = {"type": "F32", "shape": [3, 4], "values": f32.ravel().tolist()}

    f16 = ramp((2, 8), 4.0, 1.0).astype(np.float16)
    w.add_tensor("f16", f16)
    tensors["f16"] = {"type": "F16", "shape": [2, 8], "values": f16.astype(np.float32).ravel().tolist()}

    bf16_src = ramp((4, 2), 3.0, 2.0)
    bf16_bits = (bf16_src.view(np.uint32) >> 16).astype(np.uint16)  # truncation is fine: values are exact
    w.add_tensor("bf16", bf16_bits, raw_shape=(4, 2), raw_dtype=gguf.GGMLQuantizationType.BF16)
    bf16_values = (bf16_bits.astype(np.uint32) << 16).view(np.float32)
    tensors["bf16"] = {"type": "BF16", "shape": [4, 2], "values": bf16_values.ravel().tolist()}

    for name, qtype, shape, scale in (("q8_0", gguf.GGMLQuantizationType.Q8_0, (3, 64), 5.0),
                                      ("q4_0", gguf.GGMLQuantizationType.Q4_0, (2, 96), 0.75),
                                      ("q5_0_rtn", gguf.GGMLQuantizationType.Q5_0, (2, 96), 0.75)):
        x = ramp(shape, scale, 3.0)
        x[0, 5] = 0.0
        x[1, 0:32] = 0.0  # an all-zero block (d = 0)
        q = quants.quantize(x, qtype)
        w.add_tensor(name, q, raw_dtype=qtype)
        deq = quants.dequantize(q, qtype)
        tensors[name] = {"type": qtype.name, "shape": list(shape), "values": deq.ravel().tolist(),
                         "source": x.ravel().tolist()}

    # Q4_K and Q6_K: gguf-py only decodes these, so the blocks are random bytes (every code and
    # every packed 6-bit scale/min, high bits included) with finite f16 super-block scales, and
    # the expected values are gguf-py's decoding of them.
    # The other block formats (Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q5_K, IQ4_NL) get the same treatment. Each
    # entry: the byte offset of the block's f16 scales and how many there are (d, then dmin / m).
    rng = np.random.default_rng(20261201)
    T = gguf.GGMLQuantizationType
    for name, qtype, shape, d_offset, n_d in (("q4_k", T.Q4_K, (3, 512), 0, 2),
                                              ("q6_k", T.Q6_K, (2, 768), 208, 1),
                                              ("q4_1", T.Q4_1, (3, 64), 0, 2),
                                              ("q5_0", T.Q5_0, (2, 96), 0, 1),
                                              ("q5_1", T.Q5_1, (2, 64), 0, 2),
                                              ("q2_k", T.Q2_K, (2, 512), 80, 2),
                                              ("q3_k", T.Q3_K, (3, 256), 108, 1),
                                              ("q5_k", T.Q5_K, (2, 512), 0, 2),
                                              ("iq4_nl", T.IQ4_NL, (2, 96), 0, 1)):
        block_size, type_size = gguf.GGML_QUANT_SIZES[qtype]
        n_blocks = shape[0] * shape[1] // block_size
        blocks = rng.integers(0, 256, size=(n_blocks, type_size), dtype=np.uint8)
        d = rng.uniform(1e-4, 3e-2, size=(n_blocks, 2)).astype(np.float16)
        d[1, n_d - 1] = 0.0  # a zero dmin / m (or d)
        if name in ("q4_1", "q5_1"):
            d[:, 1] = -d[:, 1]  # their m is an offset of either sign
        blocks[:, d_offset:d_offset + 2 * n_d] = d[:, :n_d].view(np.uint8).reshape(n_blocks, 2 * n_d)
        w.add_tensor(name, blocks.reshape(shape[0], -1), raw_dtype=qtype)
        deq = quants.dequantize(blocks.reshape(shape[0], -1), qtype)
        tensors[name] = {"type": qtype.name, "shape": list(shape), "values": deq.ravel().tolist()}
    expected["gguf_tensors"] = tensors

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write_safetensors(expected):
    arrays = {
        "f32": ramp((2, 3), 1.5),
        "f16": ramp((5,), 2.0, 1.0).astype(np.float16),
        "i8": np.array([-128, 0, 127], dtype=np.int8),
        "u8": np.array([[0, 255], [7, 8]], dtype=np.uint8),
        "i32": np.array([-(2**31), 2**31 - 1], dtype=np.int32),
        "i64": np.array([[-(2**63)], [2**62]], dtype=np.int64),
    }
    save_file(arrays, str(OUT / "reference.safetensors"), metadata={"format": "np", "note": "tachyon"})
    out = {}
    for name, a in arrays.items():
        values = a.astype(np.float64).ravel().tolist() if a.dtype.kind == "f" else [str(v) for v in a.ravel()]
        out[name] = {"dtype": {"float32": "F32", "float16": "F16", "int8": "I8", "uint8": "U8", "int32": "I32",
                               "int64": "I64"}[str(a.dtype)], "shape": list(a.shape), "values": values}
    expected["safetensors"] = out
    expected["safetensors_metadata"] = {"format": "np", "note": "tachyon"}


def check_writer(path):
    r = gguf.GGUFReader(path)
    print(f"{path}: {len(r.fields)} fields, {len(r.tensors)} tensors")
    for t in r.tensors:
        print(f"  {t.name} {t.tensor_type.name} {list(t.shape)}")
    src = {t.name: t for t in r.tensors}
    if "source" not in src:
        raise SystemExit("expected an F32 tensor named 'source'")
    x = np.array(src["source"].data, dtype=np.float32).reshape(-1, int(src["source"].shape[0]))
    for name, qtype in (("q8_0", gguf.GGMLQuantizationType.Q8_0), ("q4_0", gguf.GGMLQuantizationType.Q4_0)):
        ours = np.array(src[name].data, dtype=np.uint8).ravel()
        ref = quants.quantize(x, qtype).ravel()
        same = np.array_equal(ours, ref)
        print(f"  {name}: {'identical to' if same else 'DIFFERENT from'} gguf-py's quantization")
        if not same:
            raise SystemExit(1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--check-writer", metavar="FILE")
    args = ap.parse_args()
    if args.check_writer:
        check_writer(args.check_writer)
        return
    OUT.mkdir(parents=True, exist_ok=True)
    expected = {}
    write_gguf(expected)
    write_safetensors(expected)
    (OUT / "reference_expected.json").write_text(json.dumps(expected, indent=1) + "\n")
    for p in sorted(OUT.iterdir()):
        print(p.relative_to(ROOT), p.stat().st_size, "bytes")


if __name__ == "__main__":
    main()
