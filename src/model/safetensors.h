// Memory-mapped safetensors checkpoints, single-file (model.safetensors) or sharded
// (model.safetensors.index.json + shards). Every header is validated before a tensor is exposed:
// offsets inside the file, sizes matching dtype x shape, no overlaps.
//
// Thread safety: immutable after Open; views stay valid while the Checkpoint lives.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "model/tensor.h"

namespace pd::model {

// One mapped .safetensors file.
class SafetensorsFile {
 public:
  static Result<std::unique_ptr<SafetensorsFile>> Open(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const std::map<std::string, TensorView>& tensors() const { return tensors_; }

 private:
  SafetensorsFile() = default;
  std::string path_;
  void* map_ = nullptr;
  size_t map_size_ = 0;
  std::map<std::string, TensorView> tensors_;
};

// All tensors of a model directory, from one file or from the shards an index names.
class Checkpoint {
 public:
  static Result<std::unique_ptr<Checkpoint>> Open(const std::string& model_dir);

  // The tensor called `name`, or NotFound naming the tensor and the checkpoint.
  Result<TensorView> Get(const std::string& name) const;
  // Like Get, and checks dtype-independent shape: error names file, tensor, expected and actual.
  Result<TensorView> GetWithShape(const std::string& name,
                                  const std::vector<int64_t>& expected_shape) const;
  // The file that holds `name` ("" if none).
  std::string FileOf(const std::string& name) const;
  std::vector<std::string> Names() const;

 private:
  std::string dir_;
  std::string source_;  // "model.safetensors" or "model.safetensors.index.json", for errors
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, std::pair<const SafetensorsFile*, TensorView>> index_;
};

struct NamedTensor {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;  // little-endian, dtype x shape
};

// Writes tensors as one safetensors file (header sorted by name, 8-byte aligned data).
Status WriteSafetensors(const std::string& path, const std::vector<NamedTensor>& tensors);
// Splits tensors into shards of at most max_shard_bytes each and writes
// model-0000i-of-0000n.safetensors plus model.safetensors.index.json into dir.
Status WriteShardedSafetensors(const std::string& dir, const std::vector<NamedTensor>& tensors,
                               size_t max_shard_bytes);

// Streaming form of the two writers above, for checkpoints too large to hold in memory:
// `tensors` gives names, dtypes and shapes (bytes left empty); `fill(i, &bytes)` then produces
// tensor i's bytes (exactly its size) just before they are written. max_shard_bytes == 0 writes
// one model.safetensors; otherwise shards plus model.safetensors.index.json.
using TensorFiller = std::function<Status(size_t index, std::vector<uint8_t>* bytes)>;
Status WriteCheckpointStreaming(const std::string& dir, const std::vector<NamedTensor>& tensors,
                                size_t max_shard_bytes, const TensorFiller& fill);

}  // namespace pd::model
