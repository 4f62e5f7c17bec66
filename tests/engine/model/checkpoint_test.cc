// Checkpoint: safetensors files written here (single, sharded, misaligned) read back bit-exact,
// and every malformed file or index is rejected with its own code and a message naming it.
#include "engine/model/checkpoint.h"

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/engine/model/checkpoint_test_util.h"

namespace modserve::engine {
namespace {

using ::modserve::engine::testing::Bf16Tensor;
using ::modserve::engine::testing::F16Tensor;
using ::modserve::engine::testing::F32Tensor;
using ::modserve::engine::testing::IsOk;
using ::modserve::engine::testing::MakeParts;
using ::modserve::engine::testing::RandomValues;
using ::modserve::engine::testing::RawSafetensors;
using ::modserve::engine::testing::SafetensorsParts;
using ::modserve::engine::testing::ScratchDir;
using ::modserve::engine::testing::StatusIs;
using ::modserve::engine::testing::TestTensor;
using ::modserve::engine::testing::WriteBytes;
using ::modserve::engine::testing::WriteSafetensors;
using ::testing::ElementsAre;

std::vector<TestTensor> MixedTensors() {
  return {
      F32Tensor("router.weight", {2, 3}, RandomValues(6, 1)),
      Bf16Tensor("embed.weight", {4, 5}, RandomValues(20, 2)),
      F16Tensor("odd.weight", {3, 1}, RandomValues(3, 3)),  // 6 bytes: padding follows
      F32Tensor("scalar", {}, {2.5f}),
      F32Tensor("empty", {0, 5}, {}),
      Bf16Tensor("four.dims", {1, 2, 1, 2}, RandomValues(4, 4)),
  };
}

// Asserts that `ckpt` holds exactly `tensors`, each with its dtype, shape and bytes.
void ExpectHolds(const Checkpoint& ckpt, const std::vector<TestTensor>& tensors) {
  EXPECT_EQ(ckpt.num_tensors(), static_cast<int64_t>(tensors.size()));
  uint64_t total = 0;
  for (const TestTensor& t : tensors) {
    SCOPED_TRACE(t.name);
    absl::StatusOr<TensorView> v = ckpt.Get(t.name);
    ASSERT_THAT(v, IsOk());
    EXPECT_EQ(DTypeName(v->dtype), t.dtype);
    ASSERT_EQ(v->ndim, static_cast<int>(t.shape.size()));
    for (int i = 0; i < v->ndim; ++i) EXPECT_EQ(v->shape[i], t.shape[i]);
    ASSERT_EQ(v->bytes(), t.bytes.size());
    EXPECT_NE(v->data, nullptr);
    EXPECT_EQ(std::memcmp(v->data, t.bytes.data(), t.bytes.size()), 0);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(v->data) % DTypeBytes(v->dtype), 0u);
    total += t.bytes.size();
  }
  EXPECT_EQ(ckpt.total_bytes(), total);
}

TEST(CheckpointTest, ReadsMixedDtypesBitExact) {
  ScratchDir dir;
  const std::vector<TestTensor> tensors = MixedTensors();
  WriteSafetensors(dir.File("model.safetensors"), tensors);
  absl::StatusOr<Checkpoint> ckpt = Checkpoint::Open(dir.path());
  ASSERT_THAT(ckpt, IsOk());
  ExpectHolds(*ckpt, tensors);
  EXPECT_THAT(ckpt->Names(), ElementsAre("embed.weight", "empty", "four.dims", "odd.weight",
                                         "router.weight", "scalar"));
  EXPECT_EQ(ckpt->aligned_copy_bytes(), 0u);
  const TensorInfo* info = ckpt->Find("odd.weight");
  ASSERT_NE(info, nullptr);
  EXPECT_EQ(info->file, "model.safetensors");
  EXPECT_EQ(info->dtype, DType::kF16);
  EXPECT_THAT(info->shape, ElementsAre(3, 1));
  EXPECT_EQ(info->bytes, 6u);
  EXPECT_FALSE(info->copied);
  // The bf16 values decode to the floats that were rounded into them.
  const std::vector<float> embed = RandomValues(20, 2);
  const TensorView ev = *ckpt->Get("embed.weight");
  for (int i = 0; i < 20; ++i) {
    EXPECT_EQ(Bf16ToF32(ev.as<bf16_t>()[i]), Bf16ToF32(F32ToBf16(embed[i])));
  }
}

TEST(CheckpointTest, MissingTensorIsNotFound) {
  ScratchDir dir;
  WriteSafetensors(dir.File("model.safetensors"), MixedTensors());
  absl::StatusOr<Checkpoint> ckpt = Checkpoint::Open(dir.path());
  ASSERT_THAT(ckpt, IsOk());
  EXPECT_THAT(ckpt->Get("nope"), StatusIs(absl::StatusCode::kNotFound, "'nope'"));
  EXPECT_EQ(ckpt->Find("nope"), nullptr);
  EXPECT_FALSE(ckpt->Contains("nope"));
}

TEST(CheckpointTest, ViewsSurviveMovingTheCheckpoint) {
  ScratchDir dir;
  const std::vector<TestTensor> tensors = MixedTensors();
  WriteSafetensors(dir.File("model.safetensors"), tensors);
  absl::StatusOr<Checkpoint> opened = Checkpoint::Open(dir.path());
  ASSERT_THAT(opened, IsOk());
  const TensorView before = *opened->Get("router.weight");
  Checkpoint moved = *std::move(opened);
  EXPECT_EQ(moved.Get("router.weight")->data, before.data);
  EXPECT_EQ(std::memcmp(before.data, tensors[0].bytes.data(), tensors[0].bytes.size()), 0);
}

TEST(CheckpointTest, ReleasedPagesReadTheFileAgain) {
  // 64 KiB of f32: at least 15 whole pages of 4 KiB inside the tensor, whatever its offset.
  ScratchDir dir;
  const std::vector<TestTensor> tensors = {F32Tensor("big", {16384}, RandomValues(16384, 9)),
                                           F32Tensor("small", {3}, RandomValues(3, 10))};
  WriteSafetensors(dir.File("model.safetensors"), tensors);
  absl::StatusOr<Checkpoint> ckpt = Checkpoint::Open(dir.path());
  ASSERT_THAT(ckpt, IsOk());
  const TensorView big = *ckpt->Get("big");
  EXPECT_GE(ckpt->ReleasePages(big.data, big.bytes()), 15u * 4096u);
  EXPECT_EQ(std::memcmp(big.data, tensors[0].bytes.data(), tensors[0].bytes.size()), 0);
  // No whole page inside a 12-byte tensor; memory outside the mappings is left alone.
  const TensorView small = *ckpt->Get("small");
  EXPECT_EQ(ckpt->ReleasePages(small.data, small.bytes()), 0u);
  std::vector<uint8_t> heap(1 << 16, 7);
  EXPECT_EQ(ckpt->ReleasePages(heap.data(), heap.size()), 0u);
  EXPECT_EQ(heap[12345], 7);
  ExpectHolds(*ckpt, tensors);
}

TEST(CheckpointTest, MisalignedTensorIsServedFromAnAlignedCopy) {
  ScratchDir dir;
  const std::vector<TestTensor> tensors = {F32Tensor("a", {3}, RandomValues(3, 7)),
                                           Bf16Tensor("b", {2}, RandomValues(2, 8))};
  SafetensorsParts parts = MakeParts(tensors, /*align=*/1);
  // Data section at an odd file offset: every tensor in it is misaligned.
  while ((8 + parts.header.size()) % 4 != 1) parts.header.push_back(' ');
  WriteBytes(dir.File("model.safetensors"),
             RawSafetensors(parts.header.size(), parts.header, parts.data));
  absl::StatusOr<Checkpoint> ckpt = Checkpoint::Open(dir.path());
  ASSERT_THAT(ckpt, IsOk());
  ExpectHolds(*ckpt, tensors);
  EXPECT_TRUE(ckpt->Find("a")->copied);
  EXPECT_TRUE(ckpt->Find("b")->copied);
  EXPECT_EQ(ckpt->aligned_copy_bytes(), 12u + 4u);
}

TEST(CheckpointTest, ReadsShardsListedByTheIndex) {
  ScratchDir dir;
  const std::vector<TestTensor> tensors = MixedTensors();
  const std::vector<TestTensor> first(tensors.begin(), tensors.begin() + 3);
  const std::vector<TestTensor> second(tensors.begin() + 3, tensors.end());
  WriteSafetensors(dir.File("model-00001-of-00002.safetensors"), first);
  WriteSafetensors(dir.File("model-00002-of-00002.safetensors"), second);
  std::string map;
  for (size_t i = 0; i < tensors.size(); ++i) {
    absl::StrAppend(&map, i ? "," : "", "\"", tensors[i].name, "\":\"model-0000", i < 3 ? 1 : 2,
                    "-of-00002.safetensors\"");
  }
  WriteBytes(dir.File("model.safetensors.index.json"),
             absl::StrCat(R"({"metadata":{"total_size":1},"weight_map":{)", map, "}}"));
  absl::StatusOr<Checkpoint> ckpt = Checkpoint::Open(dir.path());
  ASSERT_THAT(ckpt, IsOk());
  ExpectHolds(*ckpt, tensors);
  EXPECT_EQ(ckpt->file_paths().size(), 2u);
  EXPECT_EQ(ckpt->Find("scalar")->file, "model-00002-of-00002.safetensors");
}

TEST(CheckpointTest, SingleFileWinsOverIndex) {
  ScratchDir dir;
  WriteSafetensors(dir.File("model.safetensors"), MixedTensors());
  WriteBytes(dir.File("model.safetensors.index.json"), "not even json");
  EXPECT_THAT(Checkpoint::Open(dir.path()), IsOk());
}

TEST(CheckpointTest, EmptyDirectoryIsNotFound) {
  ScratchDir dir;
  EXPECT_THAT(Checkpoint::Open(dir.path()),
              StatusIs(absl::StatusCode::kNotFound,
                       "neither model.safetensors nor model.safetensors.index.json"));
}

TEST(CheckpointTest, OpenFileOnMissingFileIsNotFound) {
  ScratchDir dir;
  EXPECT_THAT(Checkpoint::OpenFile(dir.File("x.safetensors")),
              StatusIs(absl::StatusCode::kNotFound, dir.File("x.safetensors")));
}

// A file with the given header text and `data_bytes` zero bytes of data.
std::string WithHeader(const std::string& header, size_t data_bytes = 64) {
  return RawSafetensors(header.size(), header, std::string(data_bytes, '\0'));
}

struct MalformedFile {
  std::string label;
  std::string bytes;
  std::string expect;  // a substring of the DataLoss message
};

const std::vector<MalformedFile>& MalformedFiles() {
  static const auto* rows = new std::vector<MalformedFile>{
      {"Empty", "", "file is 0 bytes, too short"},
      {"ShorterThanEight", std::string("\x05\0\0\0\0", 5), "file is 5 bytes, too short"},
      {"HeaderLengthPastEnd", RawSafetensors(100, "{}", ""),
       "header length 100 runs past the end of the file (10 bytes)"},
      {"HeaderLengthTwoToTheSixty", RawSafetensors(uint64_t{1} << 60, "{}", ""),
       "header length 1152921504606846976 runs past the end"},
      {"HeaderNotJson", WithHeader("{\"a\": "), "header is not valid JSON"},
      {"HeaderNotObject", WithHeader("[1, 2]"), "header is not a JSON object"},
      {"EntryNotObject", WithHeader(R"({"w": 3})"), "tensor 'w' entry must be an object"},
      {"MissingDtype", WithHeader(R"({"w": {"shape": [2], "data_offsets": [0, 8]}})"),
       "tensor 'w' has no 'dtype'"},
      {"MissingShape", WithHeader(R"({"w": {"dtype": "F32", "data_offsets": [0, 8]}})"),
       "tensor 'w' has no 'shape'"},
      {"MissingOffsets", WithHeader(R"({"w": {"dtype": "F32", "shape": [2]}})"),
       "tensor 'w' has no 'data_offsets'"},
      {"DtypeNotString", WithHeader(R"({"w": {"dtype": 4, "shape": [2], "data_offsets": [0, 8]}})"),
       "tensor 'w' 'dtype' must be a string, got 4"},
      {"DtypeI8", WithHeader(R"({"w": {"dtype": "I8", "shape": [2], "data_offsets": [0, 2]}})"),
       "tensor 'w' has unsupported dtype \"I8\""},
      {"DtypeF64", WithHeader(R"({"w": {"dtype": "F64", "shape": [2], "data_offsets": [0, 16]}})"),
       "tensor 'w' has unsupported dtype \"F64\""},
      {"ShapeNotList",
       WithHeader(R"({"w": {"dtype": "F32", "shape": "2", "data_offsets": [0, 8]}})"),
       "tensor 'w' 'shape' must be a list of integers"},
      {"ShapeHasFloat",
       WithHeader(R"({"w": {"dtype": "F32", "shape": [2.0], "data_offsets": [0, 8]}})"),
       "tensor 'w' 'shape' must be a list of integers"},
      {"ShapeNegative",
       WithHeader(R"({"w": {"dtype": "F32", "shape": [-2, 2], "data_offsets": [0, 8]}})"),
       "tensor 'w' 'shape' [-2,2] has negative dimension -2"},
      {"ShapeOverflows", WithHeader(R"({"w": {"dtype": "F32", "shape": [4294967296, 4294967296],
                          "data_offsets": [0, 0]}})"),
       "tensor 'w' 'shape' [4294967296, 4294967296] has more elements than fit in 64 bits"},
      {"ShapeBytesOverflow", WithHeader(R"({"w": {"dtype": "F32", "shape": [4611686018427387904],
                          "data_offsets": [0, 0]}})"),
       "more elements than fit in 64 bits"},
      {"ShapeTooManyDims",
       WithHeader(R"({"w": {"dtype": "F32", "shape": [1, 1, 1, 1, 2], "data_offsets": [0, 8]}})"),
       "tensor 'w' has 5 dimensions"},
      {"OffsetsNotPair",
       WithHeader(R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [8]}})"),
       "tensor 'w' 'data_offsets' must be [begin, end]"},
      {"OffsetsNegative",
       WithHeader(R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [-8, 0]}})"),
       "tensor 'w' 'data_offsets' must be [begin, end]"},
      {"OffsetsHuge", WithHeader(R"({"w": {"dtype": "F32", "shape": [2],
                          "data_offsets": [18446744073709551615, 7]}})"),
       "tensor 'w' 'data_offsets' must be [begin, end]"},
      {"OffsetsEndBeforeBegin",
       WithHeader(R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [16, 8]}})"),
       "tensor 'w' 'data_offsets' [16, 8] end before they begin"},
      {"OffsetsPastData",
       WithHeader(R"({"w": {"dtype": "F32", "shape": [32], "data_offsets": [0, 128]}})"),
       "tensor 'w' 'data_offsets' [0, 128] run past the end of the data section (64 bytes)"},
      {"ByteCountMismatch",
       WithHeader(R"({"w": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}})"),
       "tensor 'w' 'data_offsets' [0, 8] hold 8 bytes, but shape [3] of F32 needs 12"},
      {"Overlap", WithHeader(R"({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
                      "b": {"dtype": "BF16", "shape": [8], "data_offsets": [8, 24]}})"),
       "tensors 'a' [0, 16) and 'b' [8, 24) overlap"},
      {"OverlapInsideALongerTensor",
       WithHeader(R"({"a": {"dtype": "F32", "shape": [8], "data_offsets": [0, 32]},
                      "b": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]},
                      "c": {"dtype": "F32", "shape": [1], "data_offsets": [16, 20]}})"),
       "tensors 'a' [0, 32) and 'b' [4, 8) overlap"},
  };
  return *rows;
}

class CheckpointMalformedTest : public ::testing::TestWithParam<MalformedFile> {};

TEST_P(CheckpointMalformedTest, IsDataLossNamingFileAndProblem) {
  ScratchDir dir;
  WriteBytes(dir.File("model.safetensors"), GetParam().bytes);
  const absl::StatusOr<Checkpoint> ckpt = Checkpoint::Open(dir.path());
  EXPECT_THAT(ckpt, StatusIs(absl::StatusCode::kDataLoss, GetParam().expect));
  EXPECT_THAT(ckpt, StatusIs(absl::StatusCode::kDataLoss, dir.File("model.safetensors")));
}

INSTANTIATE_TEST_SUITE_P(CheckpointTest, CheckpointMalformedTest,
                         ::testing::ValuesIn(MalformedFiles()),
                         [](const ::testing::TestParamInfo<MalformedFile>& info) {
                           return info.param.label;
                         });

TEST(CheckpointTest, ZeroLengthTensorsNeverOverlap) {
  ScratchDir dir;
  WriteBytes(dir.File("model.safetensors"),
             WithHeader(R"({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
                            "b": {"dtype": "F32", "shape": [0], "data_offsets": [8, 8]}})"));
  EXPECT_THAT(Checkpoint::Open(dir.path()), IsOk());
}

// A two-shard directory where `weight_map` is written verbatim (the shards hold "a" and "b").
class ShardedIndexTest : public ::testing::Test {
 protected:
  void SetUp() override {
    WriteSafetensors(dir_.File("s1.safetensors"), {F32Tensor("a", {2}, {1.0f, 2.0f})});
    WriteSafetensors(dir_.File("s2.safetensors"), {F32Tensor("b", {1}, {3.0f})});
  }
  absl::StatusOr<Checkpoint> OpenWithIndex(const std::string& index_json) {
    WriteBytes(dir_.File("model.safetensors.index.json"), index_json);
    return Checkpoint::Open(dir_.path());
  }
  ScratchDir dir_;
};

TEST_F(ShardedIndexTest, ValidIndexOpens) {
  EXPECT_THAT(OpenWithIndex(R"({"weight_map": {"a": "s1.safetensors", "b": "s2.safetensors"}})"),
              IsOk());
}

TEST_F(ShardedIndexTest, MissingShardIsNotFound) {
  EXPECT_THAT(OpenWithIndex(R"({"weight_map": {"a": "s1.safetensors", "b": "s9.safetensors"}})"),
              StatusIs(absl::StatusCode::kNotFound, "lists shard 's9.safetensors'"));
}

TEST_F(ShardedIndexTest, TensorNotInTheShardItNames) {
  EXPECT_THAT(OpenWithIndex(R"({"weight_map": {"a": "s1.safetensors", "b": "s1.safetensors"}})"),
              StatusIs(absl::StatusCode::kDataLoss,
                       "tensor 'b' is listed in shard 's1.safetensors', but that shard has no "
                       "such tensor"));
}

TEST_F(ShardedIndexTest, TensorInAShardTheIndexDoesNotName) {
  WriteSafetensors(dir_.File("s2.safetensors"),
                   {F32Tensor("b", {1}, {3.0f}), F32Tensor("c", {1}, {4.0f})});
  EXPECT_THAT(OpenWithIndex(R"({"weight_map": {"a": "s1.safetensors", "b": "s2.safetensors"}})"),
              StatusIs(absl::StatusCode::kDataLoss,
                       "s2.safetensors: tensor 'c' is not listed for this shard"));
}

TEST_F(ShardedIndexTest, SameTensorInTwoShards) {
  WriteSafetensors(dir_.File("s2.safetensors"),
                   {F32Tensor("a", {2}, {1.0f, 2.0f}), F32Tensor("b", {1}, {3.0f})});
  EXPECT_THAT(OpenWithIndex(R"({"weight_map": {"a": "s1.safetensors", "b": "s2.safetensors"}})"),
              StatusIs(absl::StatusCode::kDataLoss,
                       "tensor 'a' appears in both shard 's1.safetensors' and shard "
                       "'s2.safetensors'"));
}

TEST_F(ShardedIndexTest, IndexNotJson) {
  EXPECT_THAT(
      OpenWithIndex("{\"weight_map\": "),
      StatusIs(absl::StatusCode::kDataLoss, "model.safetensors.index.json: not valid JSON"));
}

TEST_F(ShardedIndexTest, IndexWithoutWeightMap) {
  EXPECT_THAT(OpenWithIndex(R"({"metadata": {}})"),
              StatusIs(absl::StatusCode::kDataLoss, "'weight_map' must be an object"));
}

TEST_F(ShardedIndexTest, ShardNameLeavingTheDirectory) {
  EXPECT_THAT(OpenWithIndex(R"({"weight_map": {"a": "../s1.safetensors"}})"),
              StatusIs(absl::StatusCode::kDataLoss,
                       "tensor 'a' maps to \"../s1.safetensors\", not a file name"));
}

TEST_F(ShardedIndexTest, CorruptShardNamesTheShard) {
  WriteBytes(dir_.File("s2.safetensors"), "tiny");
  EXPECT_THAT(OpenWithIndex(R"({"weight_map": {"a": "s1.safetensors", "b": "s2.safetensors"}})"),
              StatusIs(absl::StatusCode::kDataLoss, "s2.safetensors: file is 4 bytes"));
}

}  // namespace
}  // namespace modserve::engine
