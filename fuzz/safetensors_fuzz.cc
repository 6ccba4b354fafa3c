// Fuzzes the safetensors header parser (model/safetensors.h SafetensorsFile::Open): the input is
// a whole .safetensors file (u64 header length | JSON header | data), written to an in-memory
// file (memfd) that Open maps like a checkpoint on disk. Every tensor of an accepted file must lie
// inside the mapping; ASan checks that reading its bytes stays in bounds.
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "common/check.h"
#include "model/safetensors.h"

namespace {

// One memfd for the whole run, rewritten for each input.
int InputFd() {
  static const int fd = [] {
    const int created = memfd_create("safetensors_fuzz", MFD_CLOEXEC);
    if (created < 0) {
      std::perror("memfd_create");
      std::abort();
    }
    return created;
  }();
  return fd;
}

void WriteAll(int fd, const uint8_t* data, size_t size) {
  PD_CHECK(ftruncate(fd, 0) == 0);
  size_t written = 0;
  while (written < size) {
    const ssize_t n = pwrite(fd, data + written, size - written, static_cast<off_t>(written));
    PD_CHECK(n > 0) << "pwrite to the memfd failed";
    written += static_cast<size_t>(n);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const int fd = InputFd();
  WriteAll(fd, data, size);
  const std::string path = "/proc/self/fd/" + std::to_string(fd);
  auto file = pd::model::SafetensorsFile::Open(path);
  if (!file.ok()) {
    PD_CHECK(!file.status().message().empty()) << "a refused file's error names no problem";
    return 0;
  }
  for (const auto& [name, view] : (*file)->tensors()) {
    for (int64_t dim : view.shape) PD_CHECK(dim >= 0) << name << ": negative dimension " << dim;
    // Touch the first and last byte of every non-empty tensor.
    const size_t num_bytes = view.size_bytes();
    if (num_bytes == 0) continue;
    const auto* bytes = static_cast<const uint8_t*>(view.data);
    volatile uint8_t sink = bytes[0] ^ bytes[num_bytes - 1];
    (void)sink;
  }
  return 0;
}
