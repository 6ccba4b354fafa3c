#include "model/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "common/file_util.h"

namespace pd::model {
namespace {

using Json = nlohmann::json;

constexpr uint64_t kMaxHeaderBytes = 100ull << 20;  // the safetensors format's own limit
constexpr const char* kIndexName = "model.safetensors.index.json";
constexpr const char* kSingleName = "model.safetensors";

std::string Errno() { return std::strerror(errno); }

// A parsed header entry before it becomes a view.
struct Entry {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;
};

Status ParseEntry(const std::string& path, const std::string& name, const Json& v, Entry* out) {
  std::string where = path + ": tensor " + name;
  if (!v.is_object()) return DataLoss(where + ": header entry is not a JSON object");
  if (!v.contains("dtype") || !v["dtype"].is_string()) {
    return DataLoss(where + ": header entry has no \"dtype\" string");
  }
  Result<DType> dtype = ParseSafetensorsDType(v["dtype"].get<std::string>());
  if (!dtype.ok()) return InvalidArgument(where + ": " + dtype.status().message());
  if (!v.contains("shape") || !v["shape"].is_array()) {
    return DataLoss(where + ": header entry has no \"shape\" list");
  }
  out->name = name;
  out->dtype = *dtype;
  __int128 numel = 1;
  for (const Json& d : v["shape"]) {
    if (!d.is_number_unsigned()) return DataLoss(where + ": bad shape " + v["shape"].dump());
    // A zero elsewhere in the shape keeps numel small, so check each dimension on its own: one
    // above INT64_MAX would become a negative int64 in the view.
    if (d.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) {
      return DataLoss(where + ": dimension " + d.dump() + " of shape " + v["shape"].dump() +
                      " is impossibly large");
    }
    out->shape.push_back(d.get<int64_t>());
    numel *= d.get<uint64_t>();
    if (numel > (static_cast<__int128>(1) << 60)) {
      return DataLoss(where + ": shape " + v["shape"].dump() + " is impossibly large");
    }
  }
  const Json& offsets = v.contains("data_offsets") ? v["data_offsets"] : Json();
  if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() ||
      !offsets[1].is_number_unsigned()) {
    return DataLoss(where + ": header entry needs \"data_offsets\": [begin, end], found " +
                    offsets.dump());
  }
  out->begin = offsets[0].get<uint64_t>();
  out->end = offsets[1].get<uint64_t>();
  if (out->end < out->begin) {
    return DataLoss(where + ": data_offsets " + offsets.dump() + " end before they begin");
  }
  uint64_t expected = static_cast<uint64_t>(numel) * DTypeSize(out->dtype);
  if (out->end - out->begin != expected) {
    return DataLoss(where + ": data_offsets " + offsets.dump() + " hold " +
                    std::to_string(out->end - out->begin) + " bytes, but dtype " +
                    std::string(DTypeName(out->dtype)) + " shape " + ShapeToString(out->shape) +
                    " needs " + std::to_string(expected));
  }
  return OkStatus();
}

// Checks every entry against the data section and against each other.
Status CheckLayout(const std::string& path, std::vector<Entry>& entries, uint64_t data_size) {
  for (const Entry& e : entries) {
    if (e.end > data_size) {
      return DataLoss(path + ": tensor " + e.name + ": data_offsets [" + std::to_string(e.begin) +
                      ", " + std::to_string(e.end) + "] reach beyond the data section (" +
                      std::to_string(data_size) + " bytes): truncated or corrupt file");
    }
  }
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  for (size_t i = 1; i < entries.size(); ++i) {
    const Entry& prev = entries[i - 1];
    const Entry& cur = entries[i];
    if (cur.begin < prev.end) {
      return DataLoss(path + ": tensors " + prev.name + " [" + std::to_string(prev.begin) + ", " +
                      std::to_string(prev.end) + "] and " + cur.name + " [" +
                      std::to_string(cur.begin) + ", " + std::to_string(cur.end) + "] overlap");
    }
  }
  return OkStatus();
}

// Reads and validates the header of a mapped file of file_size (>= 8) bytes.
Status ParseHeader(const std::string& path, const uint8_t* bytes, uint64_t file_size,
                   uint64_t* header_len_out, std::vector<Entry>* entries) {
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | bytes[i];  // little-endian
  if (header_len > file_size - 8) {
    return DataLoss(path + ": header length " + std::to_string(header_len) +
                    " exceeds the file size (" + std::to_string(file_size) +
                    " bytes): truncated or not a safetensors file");
  }
  if (header_len > kMaxHeaderBytes) {
    return DataLoss(path + ": header length " + std::to_string(header_len) +
                    " is over the 100 MB limit: not a safetensors file");
  }
  std::string_view header_text(reinterpret_cast<const char*>(bytes + 8), header_len);
  Json header = Json::parse(header_text, nullptr, /*allow_exceptions=*/false);
  if (header.is_discarded() || !header.is_object()) {
    return DataLoss(path + ": header is not a JSON object: not a safetensors file");
  }
  try {
    for (const auto& [name, value] : header.items()) {
      if (name == "__metadata__") continue;
      Entry e;
      RETURN_IF_ERROR(ParseEntry(path, name, value, &e));
      entries->push_back(std::move(e));
    }
  } catch (const std::exception& ex) {  // a JSON type surprise not caught above
    return DataLoss(path + ": malformed header: " + ex.what());
  }
  *header_len_out = header_len;
  return CheckLayout(path, *entries, file_size - 8 - header_len);
}

}  // namespace

Result<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return NotFound(path + ": cannot open: " + Errno());
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    Status s = IoError(path + ": fstat: " + Errno());
    ::close(fd);
    return s;
  }
  uint64_t file_size = static_cast<uint64_t>(st.st_size);
  if (file_size < 8) {
    ::close(fd);
    return DataLoss(path + ": file is " + std::to_string(file_size) +
                    " bytes, too short for a safetensors header (at least 8): truncated file");
  }
  void* map = ::mmap(nullptr, file_size, PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);
  if (map == MAP_FAILED) return IoError(path + ": mmap: " + Errno());
  std::unique_ptr<SafetensorsFile> file(new SafetensorsFile());
  file->path_ = path;
  file->map_ = map;
  file->map_size_ = file_size;
  const auto* bytes = static_cast<const uint8_t*>(map);
  uint64_t header_len = 0;
  std::vector<Entry> entries;
  RETURN_IF_ERROR(ParseHeader(path, bytes, file_size, &header_len, &entries));
  const uint8_t* data = bytes + 8 + header_len;
  for (Entry& e : entries) {
    file->tensors_[e.name] = TensorView{e.dtype, std::move(e.shape), data + e.begin};
  }
  return file;
}

SafetensorsFile::~SafetensorsFile() {
  if (map_ != nullptr) ::munmap(map_, map_size_);
}

// ---------------------------------------------------------------------------------------------
// Checkpoint

namespace {

std::string BaseName(const std::string& path) {
  return std::filesystem::path(path).filename().string();
}

Result<std::map<std::string, std::string>> ReadWeightMap(const std::string& index_path) {
  ASSIGN_OR_RETURN(std::string text, ReadFileToString(index_path));
  Json root = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded() || !root.is_object()) {
    return DataLoss(index_path + ": not a JSON object");
  }
  if (!root.contains("weight_map") || !root["weight_map"].is_object()) {
    return DataLoss(index_path + ": missing \"weight_map\" object");
  }
  std::map<std::string, std::string> weight_map;
  for (const auto& [name, file] : root["weight_map"].items()) {
    if (!file.is_string()) {
      return DataLoss(index_path + ": weight_map[\"" + name + "\"] is not a file name");
    }
    std::string f = file.get<std::string>();
    if (f.empty() || f.find('/') != std::string::npos || f == "..") {
      return DataLoss(index_path + ": weight_map[\"" + name + "\"] = \"" + f +
                      "\" is not a plain file name");
    }
    weight_map[name] = f;
  }
  return weight_map;
}

}  // namespace

Result<std::unique_ptr<Checkpoint>> Checkpoint::Open(const std::string& model_dir) {
  namespace fs = std::filesystem;
  std::unique_ptr<Checkpoint> ckpt(new Checkpoint());
  ckpt->dir_ = model_dir;
  std::string index_path = model_dir + "/" + kIndexName;
  std::string single_path = model_dir + "/" + kSingleName;
  std::error_code ec;
  if (fs::exists(index_path, ec)) {
    ckpt->source_ = kIndexName;
    ASSIGN_OR_RETURN(auto weight_map, ReadWeightMap(index_path));
    std::map<std::string, const SafetensorsFile*> opened;
    for (const auto& [name, file] : weight_map) {
      if (opened.count(file)) continue;
      std::string path = model_dir + "/" + file;
      if (!fs::exists(path, ec)) {
        return NotFound(index_path + ": names shard " + file + " (for tensor " + name +
                        "), which does not exist in " + model_dir);
      }
      ASSIGN_OR_RETURN(auto f, SafetensorsFile::Open(path));
      opened[file] = f.get();
      ckpt->files_.push_back(std::move(f));
    }
    for (const auto& [name, file] : weight_map) {
      const SafetensorsFile* f = opened[file];
      auto it = f->tensors().find(name);
      if (it == f->tensors().end()) {
        return DataLoss(index_path + ": maps tensor " + name + " to " + file +
                        ", which does not contain it");
      }
      ckpt->index_[name] = {f, it->second};
    }
    return ckpt;
  }
  if (!fs::exists(single_path, ec)) {
    return NotFound(model_dir + ": no " + kSingleName + " or " + kIndexName);
  }
  ckpt->source_ = kSingleName;
  ASSIGN_OR_RETURN(auto f, SafetensorsFile::Open(single_path));
  for (const auto& [name, view] : f->tensors()) ckpt->index_[name] = {f.get(), view};
  ckpt->files_.push_back(std::move(f));
  return ckpt;
}

Result<TensorView> Checkpoint::Get(const std::string& name) const {
  auto it = index_.find(name);
  if (it == index_.end()) return NotFound(source_ + ": tensor " + name + " not found");
  return it->second.second;
}

Result<TensorView> Checkpoint::GetWithShape(const std::string& name,
                                            const std::vector<int64_t>& expected_shape) const {
  auto it = index_.find(name);
  if (it == index_.end()) {
    return NotFound(source_ + ": tensor " + name + " (expected shape " +
                    ShapeToString(expected_shape) + ") not found");
  }
  const TensorView& view = it->second.second;
  if (view.shape != expected_shape) {
    return InvalidArgument(BaseName(it->second.first->path()) + ": " + name + ": expected shape " +
                           ShapeToString(expected_shape) + ", found " + ShapeToString(view.shape));
  }
  return view;
}

std::string Checkpoint::FileOf(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? "" : BaseName(it->second.first->path());
}

std::vector<std::string> Checkpoint::Names() const {
  std::vector<std::string> names;
  names.reserve(index_.size());
  for (const auto& [name, unused] : index_) names.push_back(name);
  return names;
}

}  // namespace pd::model
