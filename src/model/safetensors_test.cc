#include "model/safetensors.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "common/file_util.h"
#include "model/test_util.h"

namespace pd::model {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using testing::ScratchDir;
using testing::WriteRawSafetensors;
using Json = nlohmann::json;

NamedTensor MakeTensor(const std::string& name, DType dtype, std::vector<int64_t> shape,
                       float scale) {
  NamedTensor t{name, dtype, std::move(shape), {}};
  int64_t n = 1;
  for (int64_t d : t.shape) n *= d;
  t.bytes.resize(n * DTypeSize(dtype));
  for (int64_t i = 0; i < n; ++i) {
    float v = scale * static_cast<float>(i % 17 - 8);  // exact in every dtype
    if (dtype == DType::kF32) {
      std::memcpy(t.bytes.data() + 4 * i, &v, 4);
    } else {
      uint16_t h = dtype == DType::kBF16 ? F32ToBf16(v) : F32ToF16(v);
      std::memcpy(t.bytes.data() + 2 * i, &h, 2);
    }
  }
  return t;
}

void ExpectSame(const NamedTensor& t, const TensorView& v) {
  EXPECT_EQ(v.dtype, t.dtype) << t.name;
  EXPECT_EQ(v.shape, t.shape) << t.name;
  ASSERT_EQ(v.size_bytes(), t.bytes.size()) << t.name;
  EXPECT_EQ(std::memcmp(v.data, t.bytes.data(), t.bytes.size()), 0) << t.name;
}

std::vector<NamedTensor> SomeTensors(DType dtype) {
  return {MakeTensor("b.weight", dtype, {3, 5}, 0.5f), MakeTensor("a.bias", dtype, {7}, 2.0f),
          MakeTensor("c.scalar", dtype, {}, 1.0f), MakeTensor("d.empty", dtype, {0, 4}, 1.0f),
          MakeTensor("e.big", dtype, {33, 9}, 0.25f)};
}

class SafetensorsRoundTrip : public ::testing::TestWithParam<DType> {};

TEST_P(SafetensorsRoundTrip, SingleFile) {
  ScratchDir dir;
  auto tensors = SomeTensors(GetParam());
  ASSERT_TRUE(WriteSafetensors(dir / "model.safetensors", tensors).ok());
  // The header is padded with spaces so the data starts 8-byte aligned.
  std::string raw = *ReadFileToString(dir / "model.safetensors");
  uint64_t header_len = 0;
  std::memcpy(&header_len, raw.data(), 8);
  EXPECT_EQ(header_len % 8, 0u);
  Json header = Json::parse(raw.substr(8, header_len));
  EXPECT_EQ(header["__metadata__"]["format"], "pt");
  EXPECT_EQ(header["b.weight"]["dtype"], std::string(DTypeName(GetParam())));

  auto ckpt = Checkpoint::Open(dir.path());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status().ToString();
  EXPECT_EQ((*ckpt)->Names().size(), tensors.size());
  for (const auto& t : tensors) {
    auto v = (*ckpt)->Get(t.name);
    ASSERT_TRUE(v.ok()) << v.status().ToString();
    ExpectSame(t, *v);
    EXPECT_EQ((*ckpt)->FileOf(t.name), "model.safetensors");
  }
  auto v = (*ckpt)->Get("b.weight");
  EXPECT_EQ(v->At(0), -4.0f);  // 0.5 * (0 - 8)
  EXPECT_EQ(v->At(14), 0.5f * (14 - 8));
}

TEST_P(SafetensorsRoundTrip, Sharded) {
  ScratchDir dir;
  auto tensors = SomeTensors(GetParam());
  size_t max_shard = 20 * DTypeSize(GetParam());  // several shards; e.big alone exceeds it
  ASSERT_TRUE(WriteShardedSafetensors(dir.path(), tensors, max_shard).ok());
  Json index = Json::parse(*ReadFileToString(dir / "model.safetensors.index.json"));
  size_t total = 0;
  for (const auto& t : tensors) total += t.bytes.size();
  EXPECT_EQ(index["metadata"]["total_size"], total);
  std::set<std::string> shard_files;
  for (const auto& [name, file] : index["weight_map"].items()) shard_files.insert(file);
  EXPECT_GE(shard_files.size(), 3u);
  EXPECT_EQ(index["weight_map"]["b.weight"],
            "model-00001-of-0000" + std::to_string(shard_files.size()) + ".safetensors");
  EXPECT_FALSE(std::filesystem::exists(dir / "model.safetensors"));

  auto ckpt = Checkpoint::Open(dir.path());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status().ToString();
  for (const auto& t : tensors) {
    auto v = (*ckpt)->Get(t.name);
    ASSERT_TRUE(v.ok()) << v.status().ToString();
    ExpectSame(t, *v);
    EXPECT_EQ((*ckpt)->FileOf(t.name), index["weight_map"][t.name]);
  }
}

INSTANTIATE_TEST_SUITE_P(AllDTypes, SafetensorsRoundTrip,
                         ::testing::Values(DType::kF32, DType::kBF16, DType::kF16),
                         [](const auto& info) { return std::string(DTypeName(info.param)); });

TEST(SafetensorsWriterTest, StreamingRejectsWrongByteCount) {
  ScratchDir dir;
  std::vector<NamedTensor> specs = {{"x", DType::kF32, {4}, {}}};
  Status s = WriteCheckpointStreaming(dir.path(), specs, 0, [](size_t, std::vector<uint8_t>* b) {
    b->resize(12);
    return OkStatus();
  });
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("tensor x has 12 bytes, but dtype F32 shape [4] needs 16"));
}

TEST(SafetensorsWriterTest, RejectsDuplicateNames) {
  ScratchDir dir;
  std::vector<NamedTensor> t = {MakeTensor("x", DType::kF32, {1}, 1),
                                MakeTensor("x", DType::kF32, {1}, 1)};
  EXPECT_THAT(WriteSafetensors(dir / "m.safetensors", t).message(), HasSubstr("duplicate"));
}

TEST(SafetensorsWriterTest, RewritingSingleRemovesStaleIndex) {
  ScratchDir dir;
  auto tensors = SomeTensors(DType::kF32);
  ASSERT_TRUE(WriteShardedSafetensors(dir.path(), tensors, 100).ok());
  ASSERT_TRUE(WriteCheckpointStreaming(dir.path(), tensors, 0, [&](size_t i, auto* b) {
                *b = tensors[i].bytes;
                return OkStatus();
              }).ok());
  EXPECT_FALSE(std::filesystem::exists(dir / "model.safetensors.index.json"));
  auto ckpt = Checkpoint::Open(dir.path());
  ASSERT_TRUE(ckpt.ok());
  EXPECT_EQ((*ckpt)->FileOf("a.bias"), "model.safetensors");
}

// ---- Malformed files: each kind is refused with an error naming the file and what is wrong.

class BadSafetensorsTest : public ::testing::Test {
 protected:
  std::string Path() const { return dir_ / "model.safetensors"; }
  // Opens the file directly and through Checkpoint; both must fail the same way.
  std::string OpenError() {
    auto f = SafetensorsFile::Open(Path());
    EXPECT_FALSE(f.ok());
    auto c = Checkpoint::Open(dir_.path());
    EXPECT_FALSE(c.ok());
    if (f.ok() || c.ok()) return "";
    EXPECT_EQ(f.status().message(), c.status().message());
    EXPECT_THAT(f.status().message(), HasSubstr(Path()));
    return f.status().message();
  }
  ScratchDir dir_;
};

TEST_F(BadSafetensorsTest, TruncatedFile) {
  auto tensors = SomeTensors(DType::kBF16);
  ASSERT_TRUE(WriteSafetensors(Path(), tensors).ok());
  std::filesystem::resize_file(Path(), std::filesystem::file_size(Path()) - 10);
  EXPECT_THAT(OpenError(),
              AllOf(HasSubstr("tensor e.big"), HasSubstr("data_offsets ["),
                    HasSubstr("reach beyond the data section"), HasSubstr("truncated")));
}

TEST_F(BadSafetensorsTest, ShorterThanHeaderLength) {
  WriteRawSafetensors(Path(), "", "");
  std::filesystem::resize_file(Path(), 5);
  EXPECT_THAT(OpenError(), HasSubstr("file is 5 bytes, too short for a safetensors header"));
}

TEST_F(BadSafetensorsTest, HeaderLengthBeyondFileSize) {
  WriteRawSafetensors(Path(), "{}", "");
  std::fstream f(Path(), std::ios::in | std::ios::out | std::ios::binary);
  f.put(static_cast<char>(200));  // header length 200 in a 10-byte file
  f.close();
  EXPECT_THAT(OpenError(), HasSubstr("header length 200 exceeds the file size (10 bytes)"));
}

TEST_F(BadSafetensorsTest, HeaderLengthOverLimit) {
  // A sparse 101 MB file whose header claims 100 MB + 1: refused before parsing it.
  WriteRawSafetensors(Path(), "", "");
  std::filesystem::resize_file(Path(), (101ull << 20));
  uint64_t len = (100ull << 20) + 1;
  std::fstream f(Path(), std::ios::in | std::ios::out | std::ios::binary);
  f.write(reinterpret_cast<const char*>(&len), 8);
  f.close();
  EXPECT_THAT(OpenError(), HasSubstr("over the 100 MB limit"));
}

TEST_F(BadSafetensorsTest, HeaderNotJson) {
  WriteRawSafetensors(Path(), "{\"a\": [1, 2", "");
  EXPECT_THAT(OpenError(), HasSubstr("header is not a JSON object"));
}

TEST_F(BadSafetensorsTest, HeaderNotObject) {
  WriteRawSafetensors(Path(), "[1, 2, 3]", "");
  EXPECT_THAT(OpenError(), HasSubstr("header is not a JSON object"));
}

TEST_F(BadSafetensorsTest, OffsetsOutOfRange) {
  WriteRawSafetensors(Path(), R"({"w": {"dtype": "F32", "shape": [4], "data_offsets": [8, 24]}})",
                      std::string(16, '\0'));
  EXPECT_THAT(OpenError(), AllOf(HasSubstr("tensor w: data_offsets [8, 24]"),
                                 HasSubstr("beyond the data section (16 bytes)")));
}

TEST_F(BadSafetensorsTest, OffsetsReversed) {
  WriteRawSafetensors(Path(), R"({"w": {"dtype": "F32", "shape": [0], "data_offsets": [8, 4]}})",
                      std::string(16, '\0'));
  EXPECT_THAT(OpenError(), HasSubstr("tensor w: data_offsets [8,4] end before they begin"));
}

TEST_F(BadSafetensorsTest, OverlappingOffsets) {
  WriteRawSafetensors(Path(),
                      R"({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
                          "b": {"dtype": "BF16", "shape": [4], "data_offsets": [12, 20]}})",
                      std::string(24, '\0'));
  EXPECT_THAT(OpenError(), HasSubstr("tensors a [0, 16] and b [12, 20] overlap"));
}

TEST_F(BadSafetensorsTest, SizeMismatchWithShape) {
  WriteRawSafetensors(Path(),
                      R"({"w": {"dtype": "BF16", "shape": [3, 5], "data_offsets": [0, 32]}})",
                      std::string(32, '\0'));
  EXPECT_THAT(OpenError(),
              HasSubstr("tensor w: data_offsets [0,32] hold 32 bytes, but dtype BF16 shape "
                        "[3, 5] needs 30"));
}

// Caught by fuzz/safetensors_fuzz's dimension check
// (corpus/safetensors/regress_negative_dimension): with a zero in the shape the element count stays
// 0, and a dimension above INT64_MAX became a negative one.
TEST_F(BadSafetensorsTest, DimensionAboveInt64Max) {
  WriteRawSafetensors(
      Path(),
      R"({"w": {"dtype": "F32", "shape": [0, 18446744073709551615], "data_offsets": [0, 0]}})", "");
  EXPECT_THAT(OpenError(), HasSubstr("tensor w: dimension 18446744073709551615 of shape "
                                     "[0,18446744073709551615] is impossibly large"));
  WriteRawSafetensors(
      Path(),
      R"({"w": {"dtype": "F32", "shape": [0, 9223372036854775807], "data_offsets": [0, 0]}})", "");
  auto file = SafetensorsFile::Open(Path());
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  EXPECT_EQ((*file)->tensors().at("w").shape, (std::vector<int64_t>{0, INT64_MAX}));
}

TEST_F(BadSafetensorsTest, UnsupportedDTypeI32) {
  WriteRawSafetensors(Path(), R"({"ids": {"dtype": "I32", "shape": [2], "data_offsets": [0, 8]}})",
                      std::string(8, '\0'));
  EXPECT_THAT(OpenError(), AllOf(HasSubstr("tensor ids"), HasSubstr("unsupported dtype \"I32\""),
                                 HasSubstr("F32, BF16, F16")));
}

TEST_F(BadSafetensorsTest, UnsupportedDTypeI64) {
  WriteRawSafetensors(Path(), R"({"pos": {"dtype": "I64", "shape": [1], "data_offsets": [0, 8]}})",
                      std::string(8, '\0'));
  EXPECT_THAT(OpenError(), AllOf(HasSubstr("tensor pos"), HasSubstr("\"I64\"")));
}

TEST_F(BadSafetensorsTest, EntryMissingFields) {
  WriteRawSafetensors(Path(), R"({"w": {"dtype": "F32", "shape": [1]}})", std::string(4, '\0'));
  EXPECT_THAT(OpenError(), HasSubstr("tensor w: header entry needs \"data_offsets\""));
  WriteRawSafetensors(Path(), R"({"w": {"shape": [1], "data_offsets": [0, 4]}})",
                      std::string(4, '\0'));
  EXPECT_THAT(OpenError(), HasSubstr("tensor w: header entry has no \"dtype\""));
  WriteRawSafetensors(Path(), R"({"w": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}})",
                      std::string(4, '\0'));
  EXPECT_THAT(OpenError(), HasSubstr("tensor w: bad shape [-1]"));
  WriteRawSafetensors(Path(), R"({"w": 5})", "");
  EXPECT_THAT(OpenError(), HasSubstr("tensor w: header entry is not a JSON object"));
}

TEST_F(BadSafetensorsTest, MetadataIsSkipped) {
  WriteRawSafetensors(Path(),
                      R"({"__metadata__": {"format": "pt"},
                          "w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})",
                      std::string(4, '\0'));
  auto f = SafetensorsFile::Open(Path());
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ((*f)->tensors().size(), 1u);
}

// ---- Checkpoint directories.

class CheckpointTest : public ::testing::Test {
 protected:
  void WriteSharded() {
    tensors_ = SomeTensors(DType::kF32);
    ASSERT_TRUE(WriteShardedSafetensors(dir_.path(), tensors_, 100).ok());
    index_ = Json::parse(*ReadFileToString(dir_ / "model.safetensors.index.json"));
  }
  void RewriteIndex() {
    ASSERT_TRUE(WriteStringToFile(dir_ / "model.safetensors.index.json", index_.dump()).ok());
  }
  std::string OpenError() {
    auto c = Checkpoint::Open(dir_.path());
    EXPECT_FALSE(c.ok());
    return c.ok() ? "" : c.status().message();
  }
  ScratchDir dir_;
  std::vector<NamedTensor> tensors_;
  Json index_;
};

TEST_F(CheckpointTest, NoCheckpointFiles) {
  EXPECT_THAT(OpenError(), AllOf(HasSubstr(dir_.path()), HasSubstr("no model.safetensors")));
}

TEST_F(CheckpointTest, IndexNamesMissingFile) {
  WriteSharded();
  index_["weight_map"]["a.bias"] = "model-00009-of-00009.safetensors";
  RewriteIndex();
  EXPECT_THAT(OpenError(), AllOf(HasSubstr(dir_ / "model.safetensors.index.json"),
                                 HasSubstr("names shard model-00009-of-00009.safetensors"),
                                 HasSubstr("tensor a.bias"), HasSubstr("does not exist")));
}

TEST_F(CheckpointTest, IndexTensorMissingFromShard) {
  WriteSharded();
  index_["weight_map"]["z.extra"] = index_["weight_map"]["a.bias"];
  RewriteIndex();
  std::string file = index_["weight_map"]["a.bias"];
  EXPECT_THAT(OpenError(),
              AllOf(HasSubstr("model.safetensors.index.json"),
                    HasSubstr("maps tensor z.extra to " + file), HasSubstr("does not contain it")));
}

TEST_F(CheckpointTest, MalformedIndex) {
  WriteSharded();
  ASSERT_TRUE(WriteStringToFile(dir_ / "model.safetensors.index.json", "{\"weight_map\": ").ok());
  EXPECT_THAT(OpenError(), HasSubstr("model.safetensors.index.json: not a JSON object"));
  index_.erase("weight_map");
  RewriteIndex();
  EXPECT_THAT(OpenError(), HasSubstr("missing \"weight_map\""));
  index_["weight_map"] = {{"a.bias", "../elsewhere.safetensors"}};
  RewriteIndex();
  EXPECT_THAT(OpenError(), HasSubstr("is not a plain file name"));
}

TEST_F(CheckpointTest, BadShardIsNamed) {
  WriteSharded();
  std::string file = index_["weight_map"]["e.big"];
  std::filesystem::resize_file(dir_ / file, 20);
  EXPECT_THAT(OpenError(), HasSubstr(dir_ / file));
}

TEST_F(CheckpointTest, GetErrorsNameFileTensorAndExpectation) {
  WriteSharded();
  auto ckpt = Checkpoint::Open(dir_.path());
  ASSERT_TRUE(ckpt.ok());
  auto missing = (*ckpt)->Get("nope");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(missing.status().message(), "model.safetensors.index.json: tensor nope not found");
  auto missing2 = (*ckpt)->GetWithShape("nope", {2, 3});
  EXPECT_EQ(missing2.status().message(),
            "model.safetensors.index.json: tensor nope (expected shape [2, 3]) not found");
  std::string file = index_["weight_map"]["b.weight"];
  auto wrong = (*ckpt)->GetWithShape("b.weight", {3, 4});
  ASSERT_FALSE(wrong.ok());
  EXPECT_EQ(wrong.status().message(), file + ": b.weight: expected shape [3, 4], found [3, 5]");
  EXPECT_TRUE((*ckpt)->GetWithShape("b.weight", {3, 5}).ok());
  EXPECT_EQ((*ckpt)->FileOf("nope"), "");
}

}  // namespace
}  // namespace pd::model
