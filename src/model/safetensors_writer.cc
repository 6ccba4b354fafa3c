// Writers of the Hugging Face safetensors format: an 8-byte little-endian header length, a JSON
// header padded with spaces to a multiple of 8 bytes, then the tensors' bytes back to back.
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>

#include "common/file_util.h"
#include "model/safetensors.h"

namespace pd::model {
namespace {

using Json = nlohmann::json;

size_t ByteSize(const NamedTensor& t) {
  size_t n = DTypeSize(t.dtype);
  for (int64_t d : t.shape) n *= static_cast<size_t>(d);
  return n;
}

std::string Header(const std::vector<NamedTensor>& tensors, const std::vector<size_t>& members) {
  Json header = Json::object();
  header["__metadata__"] = {{"format", "pt"}};
  size_t offset = 0;
  for (size_t i : members) {
    const NamedTensor& t = tensors[i];
    size_t size = ByteSize(t);
    header[t.name] = {{"dtype", std::string(DTypeName(t.dtype))},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + size}}};
    offset += size;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  return text;
}

// RAII FILE* that reports its errors with the path.
class OutFile {
 public:
  explicit OutFile(std::string path) : path_(std::move(path)) {}
  ~OutFile() {
    if (f_ != nullptr) std::fclose(f_);
  }
  Status Open() {
    f_ = std::fopen(path_.c_str(), "wb");
    if (f_ == nullptr) return IoError(path_ + ": cannot open for writing: " + std::strerror(errno));
    return OkStatus();
  }
  Status Write(const void* data, size_t size) {
    if (size != 0 && std::fwrite(data, 1, size, f_) != size) {
      return IoError(path_ + ": write failed: " + std::strerror(errno));
    }
    return OkStatus();
  }
  Status Close() {
    int rc = std::fclose(f_);
    f_ = nullptr;
    if (rc != 0) return IoError(path_ + ": close failed: " + std::strerror(errno));
    return OkStatus();
  }

 private:
  std::string path_;
  FILE* f_ = nullptr;
};

// Writes tensors[members] to path (through path.tmp and a rename, so readers never see half).
Status WriteFile(const std::string& path, const std::vector<NamedTensor>& tensors,
                 const std::vector<size_t>& members, const TensorFiller& fill) {
  std::string header = Header(tensors, members);
  std::string tmp = path + ".tmp";
  OutFile out(tmp);
  RETURN_IF_ERROR(out.Open());
  uint8_t len[8];
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(n >> (8 * i));
  RETURN_IF_ERROR(out.Write(len, 8));
  RETURN_IF_ERROR(out.Write(header.data(), header.size()));
  std::vector<uint8_t> bytes;
  for (size_t i : members) {
    bytes.clear();
    RETURN_IF_ERROR(fill(i, &bytes));
    if (bytes.size() != ByteSize(tensors[i])) {
      return InvalidArgument(
          path + ": tensor " + tensors[i].name + " has " + std::to_string(bytes.size()) +
          " bytes, but dtype " + std::string(DTypeName(tensors[i].dtype)) + " shape " +
          ShapeToString(tensors[i].shape) + " needs " + std::to_string(ByteSize(tensors[i])));
    }
    RETURN_IF_ERROR(out.Write(bytes.data(), bytes.size()));
  }
  RETURN_IF_ERROR(out.Close());
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) return IoError(path + ": rename from " + tmp + " failed: " + ec.message());
  return OkStatus();
}

Status CheckNames(const std::vector<NamedTensor>& tensors) {
  std::set<std::string> seen;
  for (const NamedTensor& t : tensors) {
    if (t.name.empty() || t.name == "__metadata__") {
      return InvalidArgument("invalid tensor name \"" + t.name + "\"");
    }
    if (!seen.insert(t.name).second) return InvalidArgument("duplicate tensor name " + t.name);
    for (int64_t d : t.shape) {
      if (d < 0)
        return InvalidArgument(t.name + ": negative dimension in " + ShapeToString(t.shape));
    }
  }
  return OkStatus();
}

std::vector<std::vector<size_t>> PlanShards(const std::vector<NamedTensor>& tensors,
                                            size_t max_shard_bytes) {
  std::vector<std::vector<size_t>> shards;
  size_t current = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    size_t size = ByteSize(tensors[i]);
    if (shards.empty() || (current > 0 && current + size > max_shard_bytes)) {
      shards.emplace_back();
      current = 0;
    }
    shards.back().push_back(i);
    current += size;
  }
  if (shards.empty()) shards.emplace_back();
  return shards;
}

std::string ShardName(size_t i, size_t n) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "model-%05zu-of-%05zu.safetensors", i + 1, n);
  return buf;
}

TensorFiller CopyFiller(const std::vector<NamedTensor>& tensors) {
  return [&tensors](size_t i, std::vector<uint8_t>* bytes) {
    *bytes = tensors[i].bytes;
    return OkStatus();
  };
}

}  // namespace

Status WriteCheckpointStreaming(const std::string& dir, const std::vector<NamedTensor>& tensors,
                                size_t max_shard_bytes, const TensorFiller& fill) {
  namespace fs = std::filesystem;
  RETURN_IF_ERROR(CheckNames(tensors));
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return IoError(dir + ": cannot create directory: " + ec.message());
  // Remove the other layout so a stale file cannot shadow the new checkpoint.
  fs::remove(
      dir + "/" + (max_shard_bytes == 0 ? "model.safetensors.index.json" : "model.safetensors"),
      ec);
  if (max_shard_bytes == 0) {
    std::vector<size_t> all(tensors.size());
    for (size_t i = 0; i < all.size(); ++i) all[i] = i;
    return WriteFile(dir + "/model.safetensors", tensors, all, fill);
  }
  std::vector<std::vector<size_t>> shards = PlanShards(tensors, max_shard_bytes);
  Json weight_map = Json::object();
  size_t total_size = 0;
  for (size_t s = 0; s < shards.size(); ++s) {
    std::string name = ShardName(s, shards.size());
    RETURN_IF_ERROR(WriteFile(dir + "/" + name, tensors, shards[s], fill));
    for (size_t i : shards[s]) {
      weight_map[tensors[i].name] = name;
      total_size += ByteSize(tensors[i]);
    }
  }
  Json index = {{"metadata", {{"total_size", total_size}}}, {"weight_map", weight_map}};
  return WriteStringToFile(dir + "/model.safetensors.index.json", index.dump(2) + "\n");
}

Status WriteSafetensors(const std::string& path, const std::vector<NamedTensor>& tensors) {
  RETURN_IF_ERROR(CheckNames(tensors));
  std::vector<size_t> all(tensors.size());
  for (size_t i = 0; i < all.size(); ++i) all[i] = i;
  return WriteFile(path, tensors, all, CopyFiller(tensors));
}

Status WriteShardedSafetensors(const std::string& dir, const std::vector<NamedTensor>& tensors,
                               size_t max_shard_bytes) {
  if (max_shard_bytes == 0) return InvalidArgument("max_shard_bytes must be positive");
  return WriteCheckpointStreaming(dir, tensors, max_shard_bytes, CopyFiller(tensors));
}

}  // namespace pd::model
