#include "model/kv_scales.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>

#include "model/dtype.h"
#include "model/test_util.h"

namespace pd::model {
namespace {

using ::testing::HasSubstr;
using testing::ScratchDir;

NamedTensor Scalar(const std::string& name, float v, std::vector<int64_t> shape = {}) {
  NamedTensor t{name, DType::kF32, std::move(shape), std::vector<uint8_t>(4)};
  std::memcpy(t.bytes.data(), &v, 4);
  return t;
}

NamedTensor Bf16Scalar(const std::string& name, float v) {
  NamedTensor t{name, DType::kBF16, {1}, std::vector<uint8_t>(2)};
  const uint16_t b = F32ToBf16(v);
  std::memcpy(t.bytes.data(), &b, 2);
  return t;
}

Result<std::vector<KvScales>> Load(const std::vector<NamedTensor>& tensors, int layers) {
  ScratchDir dir;
  Status s = WriteSafetensors(dir / "model.safetensors", tensors);
  if (!s.ok()) return s;
  ASSIGN_OR_RETURN(std::unique_ptr<Checkpoint> ckpt, Checkpoint::Open(dir.path()));
  return LoadKvScales(*ckpt, layers);
}

// As vLLM decides per layer: both scales, neither (1.0), or one standing for both; scalars of
// shape [] or [1], f32 or bf16.
TEST(KvScalesTest, LoadsPerLayerScalesAsVllmDoes) {
  auto scales = Load({Scalar("model.layers.0.self_attn.k_scale", 0.25f),
                      Scalar("model.layers.0.self_attn.v_scale", 0.5f, {1}),
                      Bf16Scalar("model.layers.2.self_attn.k_scale", 3.0f), Scalar("other", 9.0f)},
                     3);
  ASSERT_TRUE(scales.ok()) << scales.status().ToString();
  ASSERT_EQ(scales->size(), 3u);
  EXPECT_EQ((*scales)[0], (KvScales{0.25f, 0.5f}));
  EXPECT_EQ((*scales)[1], (KvScales{1.0f, 1.0f}));
  EXPECT_EQ((*scales)[2], (KvScales{3.0f, 3.0f}));
  EXPECT_THAT(DescribeKvScales(*scales),
              HasSubstr("k_scale 0.25..3, v_scale 0.5..3 over 3 layers"));
  EXPECT_THAT(DescribeKvScales({{}, {}}), HasSubstr("1.0 on every layer"));
}

TEST(KvScalesTest, RefusesPerHeadOrNonPositiveScalesNamingTheTensor) {
  NamedTensor per_head{
      "model.layers.1.self_attn.v_scale", DType::kF32, {2}, std::vector<uint8_t>(8, 0)};
  auto r = Load({per_head}, 2);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("model.layers.1.self_attn.v_scale"));
  EXPECT_THAT(r.status().message(), HasSubstr("one element"));
  r = Load({Scalar("model.layers.0.self_attn.k_scale", -1.0f)}, 1);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("not positive and finite"));
}

}  // namespace
}  // namespace pd::model
