// GemmGroup against separate Gemm calls on every backend here (the CPU backend per kernel ISA
// and thread count, CUDA when a device is visible): each member's output must be the same bits
// as its own Gemm, for float and quantized weights, groups that mix dtypes (and so activation
// layouts and decode/prefill kernels), biases, odd sizes and every row count from 1 to 33 plus
// two prefill sizes.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/backend/backend.h"
#include "engine/backend/cpu/cpu_backend.h"
#include "engine/backend/cpu/kernels.h"
#include "engine/backend/registry.h"
#include "engine/common/dtype.h"
#include "engine/common/quant.h"
#include "gtest/gtest.h"
#include "tests/engine/backend/host_tensor.h"

namespace modserve::backend {
namespace {

using test_util::HostTensor;

struct Variant {
  std::string backend;  // "cpu-<isa>" or a registry name
  int threads = 1;
};

void PrintTo(const Variant& v, std::ostream* os) {
  *os << v.backend << " " << v.threads << " threads";
}

std::string VariantName(const ::testing::TestParamInfo<Variant>& info) {
  std::string name = absl::StrCat(info.param.backend, "_", info.param.threads, "threads");
  for (char& c : name) {
    if (c == '-') c = '_';
  }
  return name;
}

std::vector<Variant> Variants() {
  std::vector<Variant> v;
  for (cpu::Isa isa : {cpu::Isa::kScalar, cpu::Isa::kAvx2, cpu::Isa::kAvx512, cpu::Isa::kAvx512Vnni, cpu::Isa::kAmx}) {
    // 1 thread: one range per member; 3: ranges that start inside one member and end in the next.
    for (int threads : {1, 3}) v.push_back({"cpu-" + std::string(cpu::IsaName(isa)), threads});
  }
  for (const std::string& name : CompiledBackends()) {
    if (name != "cpu") v.push_back({name, 0});
  }
  return v;
}

// One member's weight (and bias), described on the host.
struct MemberSpec {
  DType dtype;
  int64_t m;
  DType bias = DType::kI32;  // kI32: no bias
  bool prepare = false;       // through Backend::PrepareGemmWeight, as the transformer does
};

// Weight rows as `dtype` from Normal(0, 0.5) values, quantized with the reference quantizers.
HostTensor MakeWeight(std::mt19937& rng, DType dtype, int64_t m, int64_t k) {
  if (!DTypeIsQuantized(dtype)) return test_util::Random(rng, dtype, {m, k}, 0.5f);
  const HostTensor values = test_util::Random(rng, DType::kF32, {m, k}, 0.5f);
  HostTensor w(dtype, {m, k});
  const absl::Status st = quant::QuantizeRow(dtype, values.f32(), m * k, w.storage.data());
  EXPECT_TRUE(st.ok()) << st;
  return w;
}

class GemmGroupTest : public ::testing::TestWithParam<Variant> {
 protected:
  void SetUp() override {
    const Variant& v = GetParam();
    for (cpu::Isa isa : {cpu::Isa::kScalar, cpu::Isa::kAvx2, cpu::Isa::kAvx512, cpu::Isa::kAvx512Vnni, cpu::Isa::kAmx}) {
      if (v.backend != "cpu-" + std::string(cpu::IsaName(isa))) continue;
      if (!cpu::CpuHasIsa(isa)) GTEST_SKIP() << "this CPU cannot run " << cpu::IsaName(isa);
      auto created = cpu::CpuBackend::Create({.num_threads = v.threads, .isa = isa});
      ASSERT_TRUE(created.ok()) << created.status();
      backend_ = std::move(created).value();
      return;
    }
    const std::vector<std::string> available = AvailableBackends();
    if (std::find(available.begin(), available.end(), v.backend) == available.end()) {
      GTEST_SKIP() << "backend " << v.backend << " has no usable device here";
    }
    auto created = CreateBackend(v.backend);
    ASSERT_TRUE(created.ok()) << created.status();
    backend_ = std::move(created).value();
  }

  // A device copy of `host`, alive until the test ends.
  TensorView Upload(const HostTensor& host) {
    auto buffer = backend_->Allocate(std::max<size_t>(host.storage.size(), 1));
    EXPECT_TRUE(buffer.ok()) << buffer.status();
    buffers_.push_back(std::move(buffer).value());
    const TensorView dst = host.MakeView(buffers_.back().data(), backend_->device());
    HostTensor copy = host;
    const absl::Status st = backend_->CopyToDevice(copy.view(), dst);
    EXPECT_TRUE(st.ok()) << st;
    return dst;
  }
  std::vector<uint8_t> Download(const TensorView& src) {
    std::vector<uint8_t> bytes(src.bytes());
    TensorView host = src;
    host.device = Device::kCpu;
    host.data = bytes.data();
    const absl::Status st = backend_->CopyToHost(src, host);
    EXPECT_TRUE(st.ok()) << st;
    return bytes;
  }

  bool Runs(const std::vector<MemberSpec>& specs) const {
    for (const MemberSpec& s : specs) {
      if (!backend_->Supports(OpKind::kGemm, s.dtype)) return false;
    }
    return true;
  }

  // For every n in `ns`: one GemmGroup over `specs` against one Gemm per member, bit for bit.
  // The outputs start out as different garbage, so an element either path leaves unwritten
  // shows up too.
  void ExpectSameBits(const std::vector<MemberSpec>& specs, int64_t k,
                      const std::vector<int64_t>& ns, uint32_t seed) {
    std::mt19937 rng(seed);
    std::vector<TensorView> w, bias;
    for (const MemberSpec& s : specs) {
      w.push_back(Upload(MakeWeight(rng, s.dtype, s.m, k)));
      if (s.prepare) {
        absl::StatusOr<TensorView> prepared = backend_->PrepareGemmWeight(w.back());
        ASSERT_TRUE(prepared.ok()) << prepared.status();
        w.back() = *prepared;
      }
      bias.push_back(s.bias == DType::kI32 ? TensorView()
                                           : Upload(test_util::Random(rng, s.bias, {s.m})));
    }
    for (int64_t n : ns) {
      const std::string what =
          absl::StrCat("n=", n, " k=", k, " first member ", std::string(DTypeName(specs[0].dtype)));
      const TensorView x = Upload(test_util::Random(rng, DType::kF32, {n, k}));
      std::vector<GemmOperand> group;
      std::vector<TensorView> separate;
      for (size_t g = 0; g < specs.size(); ++g) {
        HostTensor garbage_a(DType::kF32, {n, specs[g].m}), garbage_b(DType::kF32, {n, specs[g].m});
        for (int64_t i = 0; i < n * specs[g].m; ++i) {
          garbage_a.f32()[i] = 1.0e30f;
          garbage_b.f32()[i] = -3.0e29f;
        }
        group.push_back({w[g], bias[g], Upload(garbage_a)});
        separate.push_back(Upload(garbage_b));
      }
      backend_->GemmGroup(x, group);
      for (size_t g = 0; g < specs.size(); ++g) backend_->Gemm(x, w[g], bias[g], separate[g]);
      ASSERT_TRUE(backend_->Synchronize().ok());
      for (size_t g = 0; g < specs.size(); ++g) {
        const std::vector<uint8_t> got = Download(group[g].out);
        const std::vector<uint8_t> want = Download(separate[g]);
        ASSERT_EQ(got.size(), want.size());
        if (std::memcmp(got.data(), want.data(), got.size()) == 0) continue;
        const float* a = reinterpret_cast<const float*>(got.data());
        const float* b = reinterpret_cast<const float*>(want.data());
        int64_t first = 0;
        while (std::memcmp(a + first, b + first, 4) == 0) ++first;
        ADD_FAILURE() << what << ": member " << g << " (" << std::string(DTypeName(specs[g].dtype))
                      << ", m=" << specs[g].m << ") differs first at row " << first / specs[g].m
                      << ", col " << first % specs[g].m << ": " << a[first] << " against "
                      << b[first];
        return;
      }
    }
  }

  std::unique_ptr<Backend> backend_;
  std::vector<DeviceBuffer> buffers_;
};

// 1..33 rows (decode kernels, the float crossover at 16 or 32 rows, the first prefill sizes),
// then prefill with one and with two x-row blocks.
std::vector<int64_t> RowCounts() {
  std::vector<int64_t> ns;
  for (int64_t n = 1; n <= 33; ++n) ns.push_back(n);
  ns.push_back(64);
  ns.push_back(300);
  return ns;
}

TEST_P(GemmGroupTest, FloatMembersGetTheBitsOfTheirOwnGemm) {
  for (DType t : {DType::kF32, DType::kF16, DType::kBF16}) {
    // Odd m and k: tails of every micro-tile, vector width and weight-row split.
    const std::vector<MemberSpec> specs = {{t, 37}, {t, 13}, {t, 133}};
    if (!Runs(specs)) continue;
    ExpectSameBits(specs, 67, RowCounts(), 1);
  }
}

TEST_P(GemmGroupTest, QuantizedMembersGetTheBitsOfTheirOwnGemm) {
  for (DType t :
       {DType::kQ8_0, DType::kQ4_0, DType::kQ4_1, DType::kQ4_K, DType::kQ5_K, DType::kQ6_K}) {
    const std::vector<MemberSpec> specs = {{t, 37}, {t, 5}, {t, 70}};
    if (!Runs(specs)) continue;
    // k = 288: an odd number of 32-element blocks after the first 256 (a lone block in the
    // pair-interleaved layout) where the type allows it, else 512.
    const int64_t k = DTypeBlockElems(t) == 32 ? 288 : 512;
    ExpectSameBits(specs, k, RowCounts(), 2);
  }
}

TEST_P(GemmGroupTest, MixedDtypeGroupsGetTheBitsOfSeparateGemms) {
  // Both activation layouts in one group (Q4_x pair-interleaved, the others natural); float
  // members whose decode/prefill crossover differs from the quantized kernels'.
  const std::vector<std::vector<MemberSpec>> groups = {
      {{DType::kQ4_1, 45}, {DType::kQ8_0, 19}, {DType::kF32, 23}},
      {{DType::kQ4_K, 30}, {DType::kQ6_K, 17}, {DType::kBF16, 41}, {DType::kQ4_0, 9}},
      {{DType::kF16, 3}, {DType::kQ4_0, 66}},
  };
  uint32_t seed = 10;
  for (const std::vector<MemberSpec>& specs : groups) {
    if (!Runs(specs)) continue;
    ExpectSameBits(specs, 512, RowCounts(), seed++);
  }
}

TEST_P(GemmGroupTest, PreparedMembersGetTheBitsOfTheirOwnGemm) {
  // Prepared Q4_K, Q6_K and Q8_0 weights (the CPU's 16-row interleaved copies) are split
  // between threads in whole row groups: here they follow members whose row counts leave the pass
  // off a multiple of 16, beside unprepared members of the same dtypes, a float one, and a bias.
  const std::vector<MemberSpec> specs = {{DType::kQ4_K, 37},
                                         {DType::kQ4_K, 48, DType::kF32, true},
                                         {DType::kBF16, 23},
                                         {DType::kQ8_0, 32, DType::kI32, true},
                                         {DType::kQ4_K, 160, DType::kI32, true},
                                         {DType::kQ6_K, 11},
                                         {DType::kQ6_K, 64, DType::kF32, true},
                                         {DType::kQ8_0, 5},
                                         {DType::kQ8_0, 80, DType::kF32, true}};
  if (!Runs(specs)) GTEST_SKIP() << "the backend lacks one of the dtypes";
  ExpectSameBits(specs, 512, RowCounts(), 50);
}

TEST_P(GemmGroupTest, BiasesAreAddedAsGemmAddsThem) {
  // F32 on a quantized matrix; the weight's own 16-bit dtype and F32 on float matrices.
  const std::vector<MemberSpec> specs = {{DType::kQ8_0, 21, DType::kF32},
                                         {DType::kBF16, 11, DType::kBF16},
                                         {DType::kF16, 7, DType::kF16},
                                         {DType::kF32, 1, DType::kF32},
                                         {DType::kBF16, 9}};
  if (!Runs(specs)) GTEST_SKIP() << "the backend lacks one of the dtypes";
  ExpectSameBits(specs, 256, {1, 2, 7, 16, 17, 33, 40}, 20);
}

TEST_P(GemmGroupTest, OneMemberIsGemm) {
  ExpectSameBits({{DType::kQ4_1, 64}}, 256, {1, 4, 20}, 30);
  ExpectSameBits({{DType::kBF16, 64}}, 256, {1, 4, 20}, 31);
}

INSTANTIATE_TEST_SUITE_P(Backends, GemmGroupTest, ::testing::ValuesIn(Variants()), VariantName);

TEST(GemmGroupDeathTest, OverlappingOutputsAreACallerBug) {
  auto created = cpu::CpuBackend::Create({.num_threads = 1});
  ASSERT_TRUE(created.ok()) << created.status();
  std::mt19937 rng(40);
  HostTensor x = test_util::Random(rng, DType::kF32, {2, 64});
  HostTensor w = test_util::Random(rng, DType::kF32, {8, 64});
  std::vector<float> out(2 * 8 + 4);
  const TensorView a(out.data(), DType::kF32, {2, 8});
  const TensorView b(out.data() + 4, DType::kF32, {2, 8});
  EXPECT_DEATH((*created)->GemmGroup(x.view(), {{w.view(), {}, a}, {w.view(), {}, b}}), "overlap");
}

}  // namespace
}  // namespace modserve::backend
