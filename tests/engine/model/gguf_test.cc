// GgufFile: files written byte by byte here (gguf_test_util.h) read back exactly, typed getters
// with their codes, and every malformed header rejected with DataLoss and a message naming the
// file and the key or tensor at fault.
#include "engine/model/gguf.h"

#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/engine/model/checkpoint_test_util.h"
#include "tests/engine/model/gguf_test_util.h"

namespace modserve::engine {
namespace {

using ::modserve::engine::testing::Bytes;
using ::modserve::engine::testing::GgufBuilder;
using ::modserve::engine::testing::IsOk;
using ::modserve::engine::testing::PutString;
using ::modserve::engine::testing::PutU32;
using ::modserve::engine::testing::PutU64;
using ::modserve::engine::testing::ScratchDir;
using ::modserve::engine::testing::StatusIs;
using ::modserve::engine::testing::WriteBytes;
namespace gt = ::modserve::engine::testing::gguf_type;
namespace mt = ::modserve::engine::testing::ggml_type;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

class GgufFileTest : public ::testing::Test {
 protected:
  absl::StatusOr<GgufFile> OpenBytes(const std::string& bytes) {
    WriteBytes(path_, bytes);
    return GgufFile::Open(path_);
  }
  absl::StatusOr<GgufFile> OpenBuilt(const GgufBuilder& b) { return OpenBytes(b.Build()); }

  ScratchDir dir_;
  const std::string path_ = dir_.File("model.gguf");
};

std::string F32Data(std::vector<float> v) { return Bytes(v); }

GgufBuilder SmallFile() {
  GgufBuilder b;
  b.KvString("general.architecture", "llama")
      .KvU32("llama.block_count", 2)
      .Tensor("a.weight", mt::kF32, {3, 2}, F32Data({1, 2, 3, 4, 5, 6}))
      .Tensor("b.weight", mt::kF16, {4}, std::string(8, '\x3c'))
      .Tensor("q.weight", mt::kQ8_0, {32, 2}, std::string(68, '\x07'));
  return b;
}

TEST_F(GgufFileTest, ReadsTensorsInPlace) {
  absl::StatusOr<GgufFile> f = OpenBuilt(SmallFile());
  ASSERT_THAT(f, IsOk());
  EXPECT_EQ(f->version(), 3u);
  EXPECT_EQ(f->alignment(), 32u);
  EXPECT_EQ(f->data_offset() % 32, 0u);
  ASSERT_EQ(f->tensors().size(), 3u);

  const GgufTensor* a = f->FindTensor("a.weight");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->ggml_type, mt::kF32);
  EXPECT_EQ(a->dtype, DType::kF32);
  EXPECT_EQ(a->ndim, 2);
  EXPECT_EQ(a->ne[0], 3);
  EXPECT_EQ(a->ne[1], 2);
  EXPECT_THAT(a->shape(), ElementsAre(2, 3));
  EXPECT_EQ(a->bytes, 24u);
  float v[6];
  std::memcpy(v, a->data, 24);
  EXPECT_THAT(v, ElementsAre(1, 2, 3, 4, 5, 6));

  const GgufTensor* q = f->FindTensor("q.weight");
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(q->dtype, DType::kQ8_0);
  EXPECT_EQ(q->bytes, 68u);  // 2 rows of one 34-byte block
  EXPECT_EQ(q->offset % 32, 0u);
  EXPECT_EQ(q->data[0], 7);
  EXPECT_EQ(f->FindTensor("missing"), nullptr);
}

TEST_F(GgufFileTest, AcceptsVersion2AndCustomAlignment) {
  GgufBuilder b = SmallFile();
  b.version = 2;
  b.alignment = 64;
  b.KvU32("general.alignment", 64);
  absl::StatusOr<GgufFile> f = OpenBuilt(b);
  ASSERT_THAT(f, IsOk());
  EXPECT_EQ(f->version(), 2u);
  EXPECT_EQ(f->alignment(), 64u);
  EXPECT_EQ(f->data_offset() % 64, 0u);
  for (const GgufTensor& t : f->tensors()) EXPECT_EQ(t.offset % 64, 0u) << t.name;
}

TEST_F(GgufFileTest, TypedGettersReadEveryType) {
  GgufBuilder b;
  b.KvRaw("u8", gt::kU8, std::string(1, '\xfe'))
      .KvRaw("i8", gt::kI8, std::string(1, '\xfe'))
      .KvRaw("u16", gt::kU16, Bytes(std::vector<uint16_t>{65535}))
      .KvRaw("i16", gt::kI16, Bytes(std::vector<int16_t>{-300}))
      .KvU32("u32", 4000000000u)
      .KvI32("i32", -7)
      .KvU64("u64", uint64_t{1} << 40)
      .KvI64("i64", std::numeric_limits<int64_t>::min())
      .KvF32("f32", 1e-5f)
      .KvF64("f64", 0.125)
      .KvBool("yes", true)
      .KvString("s", "hello")
      .KvStringArray("tokens", {"a", "", "\xc4\xa0the"})
      .KvF32Array("scores", {0.5f, -1.0f})
      .KvI32Array("types", {1, 3, 6})
      .KvArray("u8s", gt::kU8, 3, std::string("\x01\x02\x03", 3))
      .KvArray("i64s", gt::kI64, 2, Bytes(std::vector<int64_t>{5, -6}))
      .KvArray("f64s", gt::kF64, 1, Bytes(std::vector<double>{2.5}));
  absl::StatusOr<GgufFile> f = OpenBuilt(b);
  ASSERT_THAT(f, IsOk());
  EXPECT_EQ(f->metadata().size(), 18u);
  EXPECT_EQ(f->metadata()[0].first, "u8");
  EXPECT_EQ(*f->GetU32("u8"), 254u);
  EXPECT_EQ(*f->GetI32("i8"), -2);
  EXPECT_EQ(*f->GetU32("u16"), 65535u);
  EXPECT_EQ(*f->GetI64("i16"), -300);
  EXPECT_EQ(*f->GetU32("u32"), 4000000000u);
  EXPECT_EQ(*f->GetI32("i32"), -7);
  EXPECT_EQ(*f->GetU64("u64"), uint64_t{1} << 40);
  EXPECT_EQ(*f->GetI64("u64"), int64_t{1} << 40);
  EXPECT_EQ(*f->GetI64("i64"), std::numeric_limits<int64_t>::min());
  EXPECT_EQ(*f->GetF32("f32"), 1e-5f);
  EXPECT_EQ(*f->GetF64("f64"), 0.125);
  EXPECT_EQ(*f->GetF32("f64"), 0.125f);
  EXPECT_TRUE(*f->GetBool("yes"));
  EXPECT_EQ(*f->GetString("s"), "hello");
  EXPECT_THAT(*f->GetStringArray("tokens"), ElementsAre("a", "", "\xc4\xa0the"));
  EXPECT_THAT(*f->GetF32Array("scores"), ElementsAre(0.5f, -1.0f));
  EXPECT_THAT(*f->GetF32Array("f64s"), ElementsAre(2.5f));
  EXPECT_THAT(*f->GetI32Array("types"), ElementsAre(1, 3, 6));
  EXPECT_THAT(*f->GetI32Array("u8s"), ElementsAre(1, 2, 3));
  EXPECT_THAT(*f->GetI64Array("i64s"), ElementsAre(5, -6));
  const GgufValue* tokens = f->Find("tokens");
  ASSERT_NE(tokens, nullptr);
  EXPECT_EQ(tokens->type, GgufType::kArray);
  EXPECT_EQ(tokens->array_type, GgufType::kString);
  EXPECT_EQ(tokens->array_size, 3u);
  EXPECT_EQ(f->Find("absent"), nullptr);
  EXPECT_FALSE(f->Contains("absent"));
}

TEST_F(GgufFileTest, GetterErrorsNameTheKey) {
  GgufBuilder b;
  b.KvU32("big", 4000000000u).KvI32("neg", -1).KvString("s", "x").KvI32Array("ids", {1, -2});
  b.KvArray("wide", gt::kI64, 1, Bytes(std::vector<int64_t>{int64_t{1} << 40}));
  absl::StatusOr<GgufFile> f = OpenBuilt(b);
  ASSERT_THAT(f, IsOk());
  EXPECT_THAT(f->GetU32("absent"),
              StatusIs(absl::StatusCode::kNotFound, "metadata key 'absent' is missing"));
  EXPECT_THAT(f->GetU32("absent"), StatusIs(absl::StatusCode::kNotFound, path_));
  EXPECT_THAT(f->GetI32("big"), StatusIs(absl::StatusCode::kInvalidArgument,
                                         "metadata key 'big' = 4000000000 is outside"));
  EXPECT_THAT(f->GetU64("neg"),
              StatusIs(absl::StatusCode::kInvalidArgument, "metadata key 'neg' = -1 is outside"));
  EXPECT_THAT(f->GetU32("s"), StatusIs(absl::StatusCode::kInvalidArgument,
                                       "metadata key 's' has type STRING, expected an integer"));
  EXPECT_THAT(f->GetString("big"),
              StatusIs(absl::StatusCode::kInvalidArgument, "has type UINT32, expected STRING"));
  EXPECT_THAT(f->GetF32("big"), StatusIs(absl::StatusCode::kInvalidArgument, "'big'"));
  EXPECT_THAT(f->GetBool("neg"), StatusIs(absl::StatusCode::kInvalidArgument, "expected BOOL"));
  EXPECT_THAT(f->GetStringArray("ids"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "'ids' has type ARRAY of INT32, expected an ARRAY of STRING"));
  EXPECT_THAT(f->GetF32Array("ids"), StatusIs(absl::StatusCode::kInvalidArgument, "'ids'"));
  EXPECT_THAT(f->GetI32Array("s"), StatusIs(absl::StatusCode::kInvalidArgument, "'s'"));
  EXPECT_THAT(f->GetI32Array("wide"),
              StatusIs(absl::StatusCode::kInvalidArgument, "'wide' element 0 = 1099511627776"));
  EXPECT_THAT(f->GetStringArray("absent"), StatusIs(absl::StatusCode::kNotFound, "'absent'"));
}

TEST_F(GgufFileTest, ViewsSurviveAMove) {
  absl::StatusOr<GgufFile> f = OpenBuilt(SmallFile());
  ASSERT_THAT(f, IsOk());
  const uint8_t* data = f->FindTensor("a.weight")->data;
  GgufFile moved = *std::move(f);
  GgufFile again = std::move(moved);
  EXPECT_EQ(*again.GetString("general.architecture"), "llama");
  EXPECT_EQ(again.FindTensor("a.weight")->data, data);
  MappedFile mapping = std::move(again).ReleaseMapping();
  float first;
  std::memcpy(&first, data, 4);  // still mapped, now by `mapping`
  EXPECT_EQ(first, 1.0f);
  EXPECT_EQ(mapping.path(), path_);
}

TEST_F(GgufFileTest, ZeroTensorsAndZeroElementTensors) {
  GgufBuilder b;
  b.KvString("general.architecture", "llama");
  ASSERT_THAT(OpenBuilt(b), IsOk());
  b.Tensor("empty", mt::kF32, {0, 4}, "");
  absl::StatusOr<GgufFile> f = OpenBuilt(b);
  ASSERT_THAT(f, IsOk());
  EXPECT_EQ(f->FindTensor("empty")->bytes, 0u);
  EXPECT_NE(f->FindTensor("empty")->data, nullptr);
}

// ---- malformed files: each is DataLoss and names the file and the problem ----

TEST_F(GgufFileTest, RejectsShortFilesAndBadMagic) {
  EXPECT_THAT(OpenBytes(""), StatusIs(absl::StatusCode::kDataLoss, "too short for the 24-byte"));
  EXPECT_THAT(OpenBytes("GGUF\3\0\0\0"), StatusIs(absl::StatusCode::kDataLoss, path_));
  GgufBuilder b = SmallFile();
  b.magic = 0x4c4d4747;  // "GGML"
  EXPECT_THAT(OpenBuilt(b), StatusIs(absl::StatusCode::kDataLoss, "not a GGUF file"));
  std::string safetensors(64, ' ');
  EXPECT_THAT(OpenBytes(safetensors), StatusIs(absl::StatusCode::kDataLoss, "not a GGUF file"));
}

TEST_F(GgufFileTest, RejectsUnsupportedVersions) {
  GgufBuilder b = SmallFile();
  b.version = 1;
  EXPECT_THAT(OpenBuilt(b), StatusIs(absl::StatusCode::kDataLoss, "GGUF version 1"));
  b.version = 0x03000000;
  EXPECT_THAT(OpenBuilt(b), StatusIs(absl::StatusCode::kDataLoss, "big-endian"));
  b.version = 4;
  EXPECT_THAT(OpenBuilt(b), StatusIs(absl::StatusCode::kDataLoss, "unknown GGUF version 4"));
}

TEST_F(GgufFileTest, RejectsCountsTheFileCannotHold) {
  GgufBuilder b = SmallFile();
  b.kv_count = uint64_t{1} << 60;
  EXPECT_THAT(OpenBuilt(b), StatusIs(absl::StatusCode::kDataLoss,
                                     "metadata count 1152921504606846976 cannot fit"));
  b.kv_count.reset();
  b.tensor_count = ~uint64_t{0};
  EXPECT_THAT(OpenBuilt(b), StatusIs(absl::StatusCode::kDataLoss,
                                     "tensor count 18446744073709551615 cannot fit"));
  // Plausible but lying: one more tensor than written runs off the end of the tensor infos
  // or into the data, and is caught there rather than sized from.
  b.tensor_count = 4;
  EXPECT_THAT(OpenBuilt(b), StatusIs(absl::StatusCode::kDataLoss, path_));
}

TEST_F(GgufFileTest, RejectsBadStringsAndArrays) {
  {
    GgufBuilder b;
    std::string v;
    PutU64(&v, uint64_t{1} << 62);  // string length
    b.KvRaw("general.name", gt::kString, v + "abc");
    EXPECT_THAT(OpenBuilt(b),
                StatusIs(absl::StatusCode::kDataLoss,
                         "metadata key 'general.name' has length 4611686018427387904, past the "
                         "end of the file"));
  }
  {
    GgufBuilder b;
    b.KvArray("tokenizer.ggml.tokens", gt::kString, uint64_t{1} << 61, "");
    EXPECT_THAT(OpenBuilt(b),
                StatusIs(absl::StatusCode::kDataLoss,
                         "'tokenizer.ggml.tokens' has 2305843009213693952 strings"));
  }
  {
    GgufBuilder b;
    b.KvArray("tokenizer.ggml.scores", gt::kF32, uint64_t{1} << 62, "");
    EXPECT_THAT(OpenBuilt(b), StatusIs(absl::StatusCode::kDataLoss,
                                       "'tokenizer.ggml.scores' has 4611686018427387904 "
                                       "elements of FLOAT32, more than"));
  }
  {
    GgufBuilder b;
    b.KvArray("nested", gt::kArray, 1, "");
    EXPECT_THAT(OpenBuilt(b), StatusIs(absl::StatusCode::kDataLoss, "'nested' is an array of"));
  }
  {
    GgufBuilder b;
    b.KvRaw("odd", 13, "");
    EXPECT_THAT(OpenBuilt(b), StatusIs(absl::StatusCode::kDataLoss,
                                       "'odd': the value type is 13, not a GGUF value type"));
  }
  {
    GgufBuilder b;
    b.KvRaw("flag", gt::kBool, std::string(1, '\2'));
    EXPECT_THAT(OpenBuilt(b), StatusIs(absl::StatusCode::kDataLoss, "'flag' is a bool of value 2"));
  }
  {
    GgufBuilder b;
    b.KvU32("dup", 1).KvU32("dup", 2);
    EXPECT_THAT(OpenBuilt(b), StatusIs(absl::StatusCode::kDataLoss, "'dup' appears twice"));
  }
  {
    GgufBuilder b;
    b.KvU32("bad\x01key\xff", 1).KvU32("bad\x01key\xff", 1);
    EXPECT_THAT(OpenBuilt(b), StatusIs(absl::StatusCode::kDataLoss, "'bad\\x01key\\xff'"));
  }
}

TEST_F(GgufFileTest, RejectsBadAlignment) {
  GgufBuilder b = SmallFile();
  b.KvU32("general.alignment", 24);
  EXPECT_THAT(OpenBuilt(b), StatusIs(absl::StatusCode::kDataLoss,
                                     "'general.alignment' = 24 is not a power of two"));
  GgufBuilder c = SmallFile();
  c.KvU32("general.alignment", 0);
  EXPECT_THAT(OpenBuilt(c), StatusIs(absl::StatusCode::kDataLoss, "= 0 is not a power of two"));
  GgufBuilder d = SmallFile();
  d.KvU64("general.alignment", 32);
  EXPECT_THAT(OpenBuilt(d), StatusIs(absl::StatusCode::kDataLoss,
                                     "'general.alignment' has type UINT64, expected UINT32"));
}

TEST_F(GgufFileTest, RejectsBadTensorInfos) {
  auto with = [](auto edit) {
    GgufBuilder b;
    b.KvString("general.architecture", "llama");
    edit(b);
    return b;
  };
  EXPECT_THAT(OpenBuilt(with([](GgufBuilder& b) {
                b.Tensor("five", mt::kF32, {1, 1, 1, 1, 1}, F32Data({1}));
              })),
              StatusIs(absl::StatusCode::kDataLoss, "tensor 'five' has 5 dimensions"));
  EXPECT_THAT(OpenBuilt(with([](GgufBuilder& b) {
                b.Tensor("huge", mt::kF32, {uint64_t{1} << 63}, "");
              })),
              StatusIs(absl::StatusCode::kDataLoss, "tensor 'huge' has dimension 0"));
  EXPECT_THAT(OpenBuilt(with([](GgufBuilder& b) {
                b.Tensor("wide", mt::kF32, {uint64_t{1} << 40, uint64_t{1} << 40}, "");
              })),
              StatusIs(absl::StatusCode::kDataLoss, "tensor 'wide' has more elements"));
  EXPECT_THAT(OpenBuilt(with([](GgufBuilder& b) {
                b.Tensor("bytes", mt::kF64, {uint64_t{1} << 62}, "");
              })),
              StatusIs(absl::StatusCode::kDataLoss, "tensor 'bytes' holds more bytes"));
  EXPECT_THAT(OpenBuilt(with([](GgufBuilder& b) { b.Tensor("t", 4, {4}, "0123"); })),
              StatusIs(absl::StatusCode::kDataLoss, "tensor 't' has unknown ggml type id 4"));
  EXPECT_THAT(OpenBuilt(with([](GgufBuilder& b) { b.Tensor("t", 1000, {4}, "0123"); })),
              StatusIs(absl::StatusCode::kDataLoss, "unknown ggml type id 1000"));
  EXPECT_THAT(OpenBuilt(with([](GgufBuilder& b) {
                b.Tensor("q", mt::kQ4_K, {255, 1}, std::string(144, '\0'));
              })),
              StatusIs(absl::StatusCode::kDataLoss,
                       "tensor 'q' of type Q4_K has rows of 255 elements, not a multiple of "
                       "its block of 256"));
  EXPECT_THAT(OpenBuilt(with([](GgufBuilder& b) {
                b.Tensor("a", mt::kF32, {1}, F32Data({1}))
                    .Tensor("a", mt::kF32, {1}, F32Data({2}));
              })),
              StatusIs(absl::StatusCode::kDataLoss, "tensor 'a' appears twice"));
  EXPECT_THAT(OpenBuilt(with([](GgufBuilder& b) {
                b.Tensor("a", mt::kF32, {1}, F32Data({1}), /*offset=*/4);
              })),
              StatusIs(absl::StatusCode::kDataLoss,
                       "tensor 'a' has data offset 4, not a multiple of the alignment 32"));
}

TEST_F(GgufFileTest, RejectsLyingOffsetsAndTruncation) {
  GgufBuilder b;
  b.Tensor("a", mt::kF32, {8}, F32Data(std::vector<float>(8, 1.0f)))
      .Tensor("b", mt::kF32, {8}, F32Data(std::vector<float>(8, 2.0f)));
  const std::string good = b.Build();
  ASSERT_THAT(OpenBytes(good), IsOk());
  // Cut inside b's data: the data section is short.
  EXPECT_THAT(OpenBytes(good.substr(0, good.size() - 4)),
              StatusIs(absl::StatusCode::kDataLoss,
                       "tensor 'b' [32, +32) runs past the end of the data section (60 bytes"));
  // Cut inside the tensor infos.
  EXPECT_THAT(OpenBytes(good.substr(0, 82)),
              StatusIs(absl::StatusCode::kDataLoss,
                       "tensor 'b': the data offset runs past the end of the file"));

  GgufBuilder far;
  far.Tensor("a", mt::kF32, {8}, F32Data(std::vector<float>(8, 1.0f)), uint64_t{1} << 40);
  EXPECT_THAT(OpenBuilt(far), StatusIs(absl::StatusCode::kDataLoss,
                                       "tensor 'a' [1099511627776, +32) runs past the end"));
  GgufBuilder wrap;
  wrap.Tensor("a", mt::kF32, {8}, F32Data(std::vector<float>(8, 1.0f)), ~uint64_t{31});
  EXPECT_THAT(OpenBuilt(wrap), StatusIs(absl::StatusCode::kDataLoss, "runs past the end"));

  GgufBuilder overlap;
  overlap.Tensor("a", mt::kF32, {16}, F32Data(std::vector<float>(16, 1.0f)))
      .Tensor("b", mt::kF32, {8}, "", /*offset=*/32);
  EXPECT_THAT(OpenBuilt(overlap),
              StatusIs(absl::StatusCode::kDataLoss, "tensors 'a' [0, 64) and 'b' [32, 64) overlap"));
}

TEST_F(GgufFileTest, NamesTheFileInEveryError) {
  EXPECT_THAT(GgufFile::Open(dir_.File("absent.gguf")),
              StatusIs(absl::StatusCode::kNotFound, "absent.gguf"));
  EXPECT_THAT(GgufFile::Open(dir_.path()), StatusIs(absl::StatusCode::kDataLoss,
                                                    "not a regular file"));
}

TEST(GgufTypesTest, GgmlTypeTable) {
  ASSERT_NE(FindGgmlType(12), nullptr);
  EXPECT_EQ(FindGgmlType(12)->name, "Q4_K");
  EXPECT_EQ(FindGgmlType(12)->block_bytes, DTypeBlockBytes(DType::kQ4_K));
  EXPECT_EQ(FindGgmlType(13)->name, "Q5_K");
  EXPECT_EQ(FindGgmlType(4), nullptr);
  EXPECT_EQ(DTypeFromGgmlType(11), std::nullopt);  // Q3_K: known to ggml, not run here
  // Every weight DType maps to a ggml type with the same block layout, and back.
  for (DType t : {DType::kF32, DType::kF16, DType::kBF16, DType::kQ8_0, DType::kQ4_0, DType::kQ4_1,
                  DType::kQ4_K, DType::kQ5_K, DType::kQ6_K}) {
    SCOPED_TRACE(DTypeName(t));
    const std::optional<uint32_t> id = GgmlTypeFromDType(t);
    ASSERT_TRUE(id.has_value());
    EXPECT_EQ(DTypeFromGgmlType(*id), t);
    EXPECT_EQ(FindGgmlType(*id)->name, DTypeName(t));
    EXPECT_EQ(FindGgmlType(*id)->block_elems, DTypeBlockElems(t));
    EXPECT_EQ(FindGgmlType(*id)->block_bytes, DTypeBlockBytes(t));
  }
  EXPECT_EQ(GgmlTypeFromDType(DType::kI32), std::nullopt);
}

TEST_F(GgufFileTest, IsGgufFileLooksAtTheMagic) {
  WriteBytes(path_, SmallFile().Build());
  EXPECT_TRUE(IsGgufFile(path_));
  WriteBytes(path_, "GGU");
  EXPECT_FALSE(IsGgufFile(path_));
  EXPECT_FALSE(IsGgufFile(dir_.path()));
  EXPECT_FALSE(IsGgufFile(dir_.File("absent")));
}

}  // namespace
}  // namespace modserve::engine
