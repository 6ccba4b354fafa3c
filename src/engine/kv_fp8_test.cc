// The FP8 (e4m3fn) KV cache's element conversions: the quantiser on edge values and against the
// checkpoint converter, and every code read back by each ISA's attention kernel exactly as the
// reference reads it (NaN included).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "engine/cpu_features.h"
#include "engine/kernels.h"
#include "engine/kernels_ref.h"
#include "engine/kv_cache.h"
#include "model/dtype.h"

namespace pd::engine {
namespace {

using kernels::AttentionArgs;
using kernels::AttnSeq;
using kernels::PagedKv;

float Bits(uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

TEST(KvFp8Test, QuantiserEdgeValues) {
  const float inf = std::numeric_limits<float>::infinity();
  struct Case {
    float x;
    uint8_t code;
  };
  const Case cases[] = {
      {0.0f, 0x00},
      {-0.0f, 0x80},                   // the sign of zero is kept
      {std::ldexp(1.0f, -9), 0x01},    // the smallest subnormal
      {-std::ldexp(1.0f, -9), 0x81},   //
      {std::ldexp(1.0f, -10), 0x00},   // half the smallest subnormal: a tie, to even (0)
      {std::ldexp(3.0f, -10), 0x02},   // 1.5 units: a tie, to even (2)
      {std::ldexp(7.0f, -9), 0x07},    // the largest subnormal
      {std::ldexp(1.0f, -6), 0x08},    // the smallest normal
      {std::ldexp(15.5f, -10), 0x08},  // 7.75 subnormal units round up into the normal range
      {Bits(0x00000001u), 0x00},       // an f32 subnormal underflows to zero
      {1.0f, 0x38},                    //
      {1.0625f, 0x38},                 // halfway between 1 and 1.125: to even (1)
      {1.1875f, 0x3a},                 // halfway between 1.125 and 1.25: to even (1.25)
      {448.0f, 0x7e},                  // the largest finite
      {-448.0f, 0xfe},                 //
      {449.0f, 0x7e},                  // above: saturates (e4m3fn has no infinity)
      {464.0f, 0x7e},                  // would round to 480 (the NaN encoding): saturates
      {1e30f, 0x7e},                   //
      {inf, 0x7e},                     // infinity saturates, as vLLM's SATFINITE cast does
      {-inf, 0xfe},                    //
      {std::numeric_limits<float>::quiet_NaN(), 0x7f},  // NaN stays NaN
  };
  for (const Case& c : cases) {
    EXPECT_EQ(ref::F32ToE4m3Fast(c.x), c.code) << c.x;
    EXPECT_EQ(ref::QuantizeKvFp8(c.x, 1.0f), c.code) << c.x;
  }
  // The scale divides: 896 / 2 = 448; 0.75 / 0.5 = 1.5 (code 0x3c).
  EXPECT_EQ(ref::QuantizeKvFp8(896.0f, 2.0f), 0x7e);
  EXPECT_EQ(ref::QuantizeKvFp8(0.75f, 0.5f), 0x3c);
  EXPECT_TRUE(std::isnan(model::Fp8E4m3ToF32(0x7f)));
  EXPECT_TRUE(std::isnan(model::Fp8E4m3ToF32(0xff)));
}

// The fast quantiser gives the checkpoint converter's code (round to nearest even, saturating)
// for f32 values across the whole range, both signs, subnormals, infinities and NaNs included;
// and every finite code quantises back to itself.
TEST(KvFp8Test, QuantiserMatchesCheckpointConverter) {
  for (uint64_t b = 0; b <= 0xffffffffull; b += 4093) {
    const float x = Bits(static_cast<uint32_t>(b));
    ASSERT_EQ(ref::F32ToE4m3Fast(x), model::F32ToFp8E4m3(x)) << "bits " << b;
  }
  for (int c = 0; c < 256; ++c) {
    if ((c & 0x7f) == 0x7f) continue;  // NaN
    EXPECT_EQ(ref::F32ToE4m3Fast(model::Fp8E4m3ToF32(static_cast<uint8_t>(c))), c);
  }
}

TEST(KvFp8Test, ParseNamesAndSizes) {
  EXPECT_EQ(*ParseKvDType("fp8_e4m3"), KvDType::kFP8E4M3);
  EXPECT_EQ(*ParseKvDType("fp8"), KvDType::kFP8E4M3);  // vLLM's alias
  EXPECT_EQ(KvDTypeName(KvDType::kFP8E4M3), "fp8_e4m3");
  EXPECT_FALSE(ParseKvDType("fp8_e5m2").ok());
  KvCacheSpec spec;
  spec.num_layers = 2;
  spec.num_kv_heads = 2;
  spec.head_dim = 8;
  spec.page_size = 4;
  spec.dtype = KvDType::kBF16;
  const size_t bf16_bytes = spec.page_bytes();
  spec.dtype = KvDType::kFP8E4M3;
  EXPECT_EQ(spec.page_bytes() * 2, bf16_bytes);
  spec.latent_dim = 24;
  EXPECT_EQ(spec.page_bytes(), 4u * 24u);
}

// Scales: only fp8 has a fingerprint; it changes with any layer's k or v scale; a region refuses
// scales for the wrong number of layers or a non-positive one, naming the layer.
TEST(KvFp8Test, ScalesFingerprintAndValidation) {
  KvCacheSpec spec;
  spec.num_layers = 2;
  spec.num_kv_heads = 1;
  spec.head_dim = 8;
  spec.page_size = 4;
  EXPECT_EQ(KvScalesFingerprint(spec), 0u);
  spec.dtype = KvDType::kFP8E4M3;
  const uint64_t ones = KvScalesFingerprint(spec);
  EXPECT_NE(ones, 0u);
  spec.scales = {{1.0f, 1.0f}, {1.0f, 1.0f}};
  EXPECT_EQ(KvScalesFingerprint(spec), ones) << "empty scales mean 1.0";
  spec.scales[1].v_scale = 0.5f;
  EXPECT_NE(KvScalesFingerprint(spec), ones);
  EXPECT_TRUE(KvRegion::Create(spec, 2).ok());
  spec.scales[0].k_scale = 0.0f;
  auto bad = KvRegion::Create(spec, 2);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("layer 0"), std::string::npos) << bad.status().message();
  spec.scales.resize(1);
  EXPECT_FALSE(KvRegion::Create(spec, 2).ok());
}

class KvFp8IsaTest : public ::testing::TestWithParam<IsaLevel> {};

// One token attending to one position returns that position's V row (softmax weight 1): with
// all 256 codes as V, each kernel must read every code as the reference does, times v_scale,
// bit for bit (NaN codes as NaN). head_dim 256 takes AVX-512's general kernel, 128 its blocked one
// (the codes in two halves).
TEST_P(KvFp8IsaTest, AttentionReadsEveryCodeAsTheReference) {
  if (!IsaSupported(GetParam())) GTEST_SKIP() << "this CPU lacks " << IsaLevelName(GetParam());
  const kernels::IsaKernels& isa = kernels::KernelsFor(GetParam());
  for (int d : {256, 128}) {
    for (int half = 0; half < 256 / d; ++half) {
      PagedKv kv;
      kv.page_size = 1;
      kv.num_kv_heads = 1;
      kv.head_dim = d;
      kv.hnd = half == 0;
      kv.fp8 = true;
      kv.k_scale = 0.25f;
      kv.v_scale = 3.0f;
      kv.page_bytes = 2 * d;
      std::vector<uint8_t> page(kv.page_bytes, 0x38);  // K all 1.0 codes
      for (int i = 0; i < d; ++i) page[d + i] = static_cast<uint8_t>(half * d + i);
      kv.base = page.data();
      const int32_t table[1] = {0};
      const AttnSeq seq{0, 1, 0, table};
      const int32_t token_seq[1] = {0};
      std::vector<float> q(d, 0.1f), out(d, -1.0f);
      AttentionArgs a;
      a.kv = kv;
      a.num_heads = 1;
      a.q = q.data();
      a.ldq = d;
      a.out = out.data();
      a.ldo = d;
      a.seqs = &seq;
      a.num_seqs = 1;
      a.token_seq = token_seq;
      a.num_tokens = 1;
      a.scale = 0.125f;
      std::vector<float> scratch(kernels::AttentionItemScratchFloats(1, d) + 64);
      isa.attention_item(a, 0, 0, scratch.data());
      for (int i = 0; i < d; ++i) {
        const float want = ref::LoadKv(kv, page.data() + d, i, 1);
        if (std::isnan(want)) {
          EXPECT_TRUE(std::isnan(out[i])) << "code " << half * d + i;
        } else {
          EXPECT_EQ(out[i], want) << isa.name << " code " << half * d + i;
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Isas, KvFp8IsaTest,
                         ::testing::Values(IsaLevel::kScalar, IsaLevel::kAvx2, IsaLevel::kAvx512),
                         [](const auto& info) { return std::string(IsaLevelName(info.param)); });

}  // namespace
}  // namespace pd::engine
