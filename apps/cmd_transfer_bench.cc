// pdserve transfer-bench: one-sided write throughput and latency of the transfer engine between two
// processes, against a plain TCP stream between the same two processes measured in the same run.
// The command starts its peer itself (it re-executes pdserve with a hidden --peer-fd flag).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "apps/command.h"
#include "common/log.h"
#include "common/mutex.h"
#include "common/subprocess.h"
#include "messenger/shard_plan.h"
#include "messenger/shard_writes.h"
#include "transfer/domain_group.h"

namespace pd::apps {
namespace {

using transfer::DomainGroup;
using transfer::DomainGroupOptions;
using transfer::DomainOptions;

struct BenchOptions {
  std::string provider = "tcp;ofi_rxm";
  std::string node = "127.0.0.1";
  uint64_t min_bytes = 4 << 10;
  uint64_t max_bytes = 16 << 20;
  uint64_t bytes_per_row = 256 << 20;  // bytes moved per throughput measurement
  int repeats = 3;                     // best of
  int kv_layers = 32;
  int kv_pages = 32;
  uint64_t kv_page_bytes = 64 << 10;
  bool json = false;
  // --shard-plans: sharded KV transfers (TP 2->1 and 1->2, HND against NHD) instead of the sweep.
  bool shard_plans = false;
  int shard_kv_heads = 8;
  int shard_head_dim = 128;
  int shard_page_size = 16;
  int shard_elem_bytes = 2;
  int peer_fd = -1;  // hidden: run as the peer
};

constexpr uint64_t kPeerRegionBytes = 64 << 20;

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Anonymous shared mapping, like the KV regions.
struct Region {
  explicit Region(size_t n) : size(n) {
    data = static_cast<char*>(
        mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
    PD_CHECK(data != MAP_FAILED);
    memset(data, 1, n);
  }
  ~Region() { munmap(data, size); }
  char* data;
  size_t size;
};

bool WriteAll(int fd, const void* p, size_t n) {
  const char* c = static_cast<const char*>(p);
  while (n > 0) {
    ssize_t w = send(fd, c, n, MSG_NOSIGNAL);
    if (w <= 0) return false;
    c += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

bool ReadAll(int fd, void* p, size_t n) {
  char* c = static_cast<char*>(p);
  while (n > 0) {
    ssize_t r = recv(fd, c, n, 0);
    if (r <= 0) return false;
    c += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

bool SendBlob(int fd, const std::string& s) {
  uint64_t n = s.size();
  return WriteAll(fd, &n, 8) && WriteAll(fd, s.data(), n);
}

bool RecvBlob(int fd, std::string* s) {
  uint64_t n = 0;
  if (!ReadAll(fd, &n, 8) || n > (1 << 20)) return false;
  s->resize(n);
  return ReadAll(fd, s->data(), n);
}

DomainGroupOptions GroupOptions(const BenchOptions& o, int domains) {
  DomainGroupOptions g;
  g.policy = transfer::SpreadPolicy::kRoundRobin;
  for (int i = 0; i < domains; ++i) {
    DomainOptions d;
    d.provider = o.provider;
    d.node = o.node;
    g.domains.push_back(d);
  }
  return g;
}

// ---- peer -------------------------------------------------------------------------------------

// TCP sink: for each request "u64 bytes, u64 chunk" it receives that many bytes into the region in
// chunk-sized recv calls and answers one byte.
void ServeTcp(int listen_fd, Region* region) {
  int fd = accept(listen_fd, nullptr, nullptr);
  if (fd < 0) return;
  uint64_t header[2];
  while (ReadAll(fd, header, sizeof(header)) && header[0] != 0) {
    uint64_t left = header[0], off = 0;
    while (left > 0) {
      size_t n = std::min<uint64_t>({left, header[1], region->size - off});
      if (!ReadAll(fd, region->data + off, n)) return;
      left -= n;
      off = (off + n) % region->size;
    }
    char ack = 1;
    if (!WriteAll(fd, &ack, 1)) break;
  }
  close(fd);
}

int RunPeer(const BenchOptions& o) {
  int ctl = o.peer_fd;
  auto group = DomainGroup::Create(GroupOptions(o, 2));
  if (!group.ok()) {
    SendBlob(ctl, "error: " + group.status().ToString());
    return 1;
  }
  Region region(kPeerRegionBytes);
  auto reg = (*group)->RegisterMemory(region.data, region.size);
  if (!reg.ok()) {
    SendBlob(ctl, "error: " + reg.status().ToString());
    return 1;
  }
  int lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  inet_pton(AF_INET, o.node.c_str(), &addr.sin_addr);
  socklen_t len = sizeof(addr);
  if (bind(lfd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || listen(lfd, 4) != 0 ||
      getsockname(lfd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    SendBlob(ctl, std::string("error: tcp listen: ") + strerror(errno));
    return 1;
  }
  Region tcp_region(kPeerRegionBytes);
  std::thread tcp([&] { ServeTcp(lfd, &tcp_region); });
  SendBlob(ctl, "ok " + std::to_string(ntohs(addr.sin_port)));
  SendBlob(ctl, reg->descriptor.ToBytes());
  std::string cmd;
  while (RecvBlob(ctl, &cmd) && cmd != "exit") {
  }
  shutdown(lfd, SHUT_RDWR);
  tcp.join();
  close(lfd);
  return 0;
}

// ---- parent -----------------------------------------------------------------------------------

struct Row {
  std::string workload;
  uint64_t bytes_per_write = 0;
  int domains = 0;
  uint64_t writes = 0;
  double fabric_gbps = 0, tcp_gbps = 0, p50_us = 0, p99_us = 0;
};

// One completion at a time: Callback's completion from any thread, Wait on the submitter's.
class Waiter {
 public:
  transfer::Completion Callback() {
    return [this](const Status& s) {
      MutexLock lock(&mu_);
      status_ = s;
      done_ = true;
      cv_.SignalAll();
    };
  }
  Status Wait() EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    while (!done_) cv_.Wait(&mu_);
    done_ = false;
    return status_;
  }

 private:
  Mutex mu_;
  CondVar cv_;
  bool done_ GUARDED_BY(mu_) = false;
  Status status_ GUARDED_BY(mu_);
};

// Counts `n` completions down; Wait returns the first error once every one has come.
class Latch {
 public:
  explicit Latch(size_t n) : left_(n) {}
  void Done(const Status& s) EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    if (!s.ok() && first_.ok()) first_ = s;
    if (--left_ == 0) cv_.SignalAll();
  }
  Status Wait() EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    while (left_ > 0) cv_.Wait(&mu_);
    return first_;
  }

 private:
  Mutex mu_;
  CondVar cv_;
  size_t left_ GUARDED_BY(mu_);
  Status first_ GUARDED_BY(mu_);
};

struct Parent {
  BenchOptions o;
  int tcp_fd = -1;
  std::unique_ptr<Region> src;
  transfer::GroupDescriptor peer_desc;
  std::unique_ptr<DomainGroup> groups[2];
  transfer::GroupRegion regions[2];
  transfer::GroupRemote remotes[2];

  // Moves `writes` pages of `bytes` each as one paged write; returns seconds.
  Result<double> FabricRun(int g, uint64_t bytes, uint64_t writes, uint64_t src_stride,
                           uint64_t dst_stride) {
    transfer::PagedWriteRequest shape;
    uint64_t src_slots = src->size / src_stride, dst_slots = kPeerRegionBytes / dst_stride;
    for (uint64_t k = 0; k < writes; ++k) {
      shape.src_pages.push_back(static_cast<uint32_t>(k % src_slots));
      shape.dst_pages.push_back(static_cast<uint32_t>(k % dst_slots));
    }
    shape.bytes_per_page = bytes;
    shape.src_stride = src_stride;
    shape.dst_stride = dst_stride;
    shape.imm = 7;
    Waiter w;
    double t0 = Now();
    ASSIGN_OR_RETURN(auto id,
                     groups[g]->SubmitPagedWrite(regions[g], remotes[g], shape, w.Callback()));
    (void)id;
    RETURN_IF_ERROR(w.Wait());
    return Now() - t0;
  }

  Result<double> TcpRun(uint64_t bytes, uint64_t writes) {
    uint64_t header[2] = {bytes * writes, bytes};
    double t0 = Now();
    if (!WriteAll(tcp_fd, header, sizeof(header))) return IoError("tcp send header");
    uint64_t off = 0;
    for (uint64_t k = 0; k < writes; ++k) {
      if (off + bytes > src->size) off = 0;
      if (!WriteAll(tcp_fd, src->data + off, bytes)) return IoError("tcp send");
      off += bytes;
    }
    char ack;
    if (!ReadAll(tcp_fd, &ack, 1)) return IoError("tcp ack");
    return Now() - t0;
  }

  // Latency of single writes at queue depth 1, in microseconds: p50 and p99.
  Result<std::pair<double, double>> Latency(int g, uint64_t bytes) {
    int n = bytes >= (4 << 20) ? 20 : 100;
    std::vector<double> us;
    for (int i = 0; i < n; ++i) {
      ASSIGN_OR_RETURN(double s, FabricRun(g, bytes, 1, bytes, bytes));
      us.push_back(s * 1e6);
    }
    std::sort(us.begin(), us.end());
    return std::make_pair(us[us.size() / 2], us[std::min(us.size() - 1, us.size() * 99 / 100)]);
  }

  Result<Row> Measure(const std::string& workload, int g, uint64_t bytes, uint64_t writes,
                      uint64_t src_stride, uint64_t dst_stride) {
    Row row{workload, bytes, g + 1, writes};
    double best_f = 1e30, best_t = 1e30;
    for (int r = 0; r < o.repeats; ++r) {  // interleaved, so drifting load hits both alike
      ASSIGN_OR_RETURN(double f, FabricRun(g, bytes, writes, src_stride, dst_stride));
      ASSIGN_OR_RETURN(double t, TcpRun(bytes, writes));
      best_f = std::min(best_f, f);
      best_t = std::min(best_t, t);
    }
    row.fabric_gbps = bytes * writes / best_f / 1e9;
    row.tcp_gbps = bytes * writes / best_t / 1e9;
    ASSIGN_OR_RETURN(auto lat, Latency(g, bytes));
    row.p50_us = lat.first;
    row.p99_us = lat.second;
    return row;
  }
};

void PrintRows(const std::vector<Row>& rows, bool json) {
  if (json) {
    nlohmann::json out;
    out["rows"] = nlohmann::json::array();
    for (const Row& r : rows) {
      out["rows"].push_back({{"workload", r.workload},
                             {"bytes_per_write", r.bytes_per_write},
                             {"domains", r.domains},
                             {"writes", r.writes},
                             {"fabric_gbytes_per_s", r.fabric_gbps},
                             {"tcp_gbytes_per_s", r.tcp_gbps},
                             {"ratio", r.fabric_gbps / r.tcp_gbps},
                             {"p50_us", r.p50_us},
                             {"p99_us", r.p99_us}});
    }
    printf("%s\n", out.dump(2).c_str());
    return;
  }
  printf("%-10s %12s %7s %7s %12s %12s %7s %10s %10s\n", "workload", "bytes/write", "domains",
         "writes", "fabric GB/s", "tcp GB/s", "ratio", "p50 us", "p99 us");
  for (const Row& r : rows) {
    printf("%-10s %12llu %7d %7llu %12.3f %12.3f %7.2f %10.1f %10.1f\n", r.workload.c_str(),
           static_cast<unsigned long long>(r.bytes_per_write), r.domains,
           static_cast<unsigned long long>(r.writes), r.fabric_gbps, r.tcp_gbps,
           r.fabric_gbps / r.tcp_gbps, r.p50_us, r.p99_us);
  }
}

Status SetUpParent(Parent& p, int ctl) {
  std::string hello, desc;
  if (!RecvBlob(ctl, &hello) || hello.rfind("ok ", 0) != 0) {
    return Unavailable("bench peer failed to start: " + hello);
  }
  int port = std::stoi(hello.substr(3));
  if (!RecvBlob(ctl, &desc)) return Unavailable("bench peer sent no descriptor");
  ASSIGN_OR_RETURN(p.peer_desc, transfer::GroupDescriptor::FromBytes(desc));
  uint64_t src_bytes = std::max<uint64_t>(p.o.max_bytes * 4, kPeerRegionBytes);
  p.src = std::make_unique<Region>(src_bytes);
  for (int g = 0; g < 2; ++g) {
    ASSIGN_OR_RETURN(p.groups[g], DomainGroup::Create(GroupOptions(p.o, g + 1)));
    ASSIGN_OR_RETURN(p.regions[g], p.groups[g]->RegisterMemory(p.src->data, p.src->size));
    ASSIGN_OR_RETURN(p.remotes[g], p.groups[g]->AddRemote(p.peer_desc));
  }
  p.tcp_fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, p.o.node.c_str(), &addr.sin_addr);
  if (connect(p.tcp_fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    return IoError(std::string("tcp connect: ") + strerror(errno));
  }
  return OkStatus();
}

// ---- sharded KV transfers (--shard-plans)
// --------------------------------------------------------

struct ShardRow {
  int prefill_tp = 0, decode_tp = 0;
  uint64_t request_bytes = 0;
  uint64_t writes[2] = {0, 0};  // [hnd, nhd] writes per request
  double seconds[2] = {0, 0};   // best time per request
};

// One request: every (run, layer) of the plan as one paged write over the request's pages, all in
// flight at once on the two-domain group. Source rank s's region is the s-th slice of the
// source buffer, decode rank d's the d-th slice of the peer's region (each (layers, pages, page)).
Result<double> ShardRequest(Parent& p, const messenger::ShardPlan& plan) {
  const uint64_t blocks = uint64_t(p.o.kv_layers) * p.o.kv_pages;
  const uint64_t src_rank_bytes = blocks * plan.src_page_bytes;
  const uint64_t dst_rank_bytes = blocks * plan.dst_page_bytes;
  if (src_rank_bytes * plan.prefill.tp_size > p.src->size ||
      dst_rank_bytes * plan.decode.tp_size > kPeerRegionBytes) {
    return InvalidArgument("shard bench: --kv-layers x --kv-pages x page bytes exceeds the " +
                           std::to_string(kPeerRegionBytes >> 20) + " MiB regions");
  }
  // One paged write per (run, layer), as the prefill messenger posts layer by layer. Decode pages
  // come in another order than prefill pages, as page tables make them.
  std::vector<uint32_t> src_pages, dst_pages;
  for (int k = 0; k < p.o.kv_pages; ++k) {
    src_pages.push_back(static_cast<uint32_t>(k));
    dst_pages.push_back(static_cast<uint32_t>(p.o.kv_pages - 1 - k));
  }
  std::vector<transfer::PagedWriteRequest> shapes;
  for (const messenger::ShardSlice& slice : plan.slices) {
    for (const messenger::PageRun& run : slice.runs) {
      for (int l = 0; l < p.o.kv_layers; ++l) {
        transfer::PagedWriteRequest shape;
        shape.src_pages = src_pages;
        shape.dst_pages = dst_pages;
        shape.imm = 7;
        messenger::SetRunGeometry(
            plan, run,
            {l, uint64_t(p.o.kv_pages), uint64_t(p.o.kv_pages), slice.src_rank * src_rank_bytes,
             slice.dst_rank * dst_rank_bytes},
            &shape);
        shapes.push_back(std::move(shape));
      }
    }
  }
  Latch latch(shapes.size());
  auto done = [&latch](const Status& s) { latch.Done(s); };
  double t0 = Now();
  for (size_t i = 0; i < shapes.size(); ++i) {
    Result<transfer::TransferId> id =
        p.groups[1]->SubmitPagedWrite(p.regions[1], p.remotes[1], shapes[i], done);
    if (!id.ok()) latch.Done(id.status());  // never posted: count it as finished
  }
  RETURN_IF_ERROR(latch.Wait());
  return Now() - t0;
}

Result<std::vector<ShardRow>> RunShardRows(Parent& p) {
  std::vector<ShardRow> rows;
  const std::pair<int, int> pairs[] = {{2, 1}, {1, 2}, {2, 2}};
  for (auto [ptp, dtp] : pairs) {
    ShardRow row{ptp, dtp};
    messenger::ShardPlan plans[2];
    for (int li = 0; li < 2; ++li) {
      messenger::PageFormat f{p.o.shard_head_dim, p.o.shard_page_size,
                              li == 0 ? engine::KvLayout::kHND : engine::KvLayout::kNHD,
                              p.o.shard_elem_bytes};
      ASSIGN_OR_RETURN(plans[li], messenger::ComputeShardPlan({ptp, p.o.shard_kv_heads},
                                                              {dtp, p.o.shard_kv_heads}, f, 1));
      messenger::WriteCounts c = messenger::ExpectedWrites(plans[li], p.o.kv_pages, p.o.kv_layers);
      row.writes[li] = c.total_writes;
      row.request_bytes = 0;
      for (uint64_t b : c.bytes_per_dst_rank) row.request_bytes += b;
      row.seconds[li] = 1e30;
      if (!p.o.json) PD_LOG_INFO("{}", messenger::DescribeShardPlan(plans[li]));
    }
    for (int r = 0; r < p.o.repeats; ++r) {  // interleaved, so drifting load hits both alike
      for (int li = 0; li < 2; ++li) {
        ASSIGN_OR_RETURN(double s, ShardRequest(p, plans[li]));
        row.seconds[li] = std::min(row.seconds[li], s);
      }
    }
    rows.push_back(row);
  }
  return rows;
}

void PrintShardRows(const std::vector<ShardRow>& rows, const BenchOptions& o) {
  if (o.json) {
    nlohmann::json out;
    out["shard_rows"] = nlohmann::json::array();
    for (const ShardRow& r : rows) {
      out["shard_rows"].push_back({{"prefill_tp", r.prefill_tp},
                                   {"decode_tp", r.decode_tp},
                                   {"request_bytes", r.request_bytes},
                                   {"hnd_writes", r.writes[0]},
                                   {"nhd_writes", r.writes[1]},
                                   {"hnd_ms", r.seconds[0] * 1e3},
                                   {"nhd_ms", r.seconds[1] * 1e3},
                                   {"hnd_gbytes_per_s", r.request_bytes / r.seconds[0] / 1e9},
                                   {"nhd_gbytes_per_s", r.request_bytes / r.seconds[1] / 1e9}});
    }
    printf("%s\n", out.dump(2).c_str());
    return;
  }
  printf("request: %d layers x %d pages of %d tokens, %d KV heads x %d dims x %d B\n", o.kv_layers,
         o.kv_pages, o.shard_page_size, o.shard_kv_heads, o.shard_head_dim, o.shard_elem_bytes);
  printf("%-6s %10s | %10s %9s %9s | %10s %9s %9s | %9s\n", "tp", "MiB/req", "hnd writes", "hnd ms",
         "hnd GB/s", "nhd writes", "nhd ms", "nhd GB/s", "hnd/nhd");
  for (const ShardRow& r : rows) {
    double g[2] = {r.request_bytes / r.seconds[0] / 1e9, r.request_bytes / r.seconds[1] / 1e9};
    printf("%d->%-3d %10.1f | %10llu %9.2f %9.3f | %10llu %9.2f %9.3f | %9.2f\n", r.prefill_tp,
           r.decode_tp, r.request_bytes / 1048576.0, static_cast<unsigned long long>(r.writes[0]),
           r.seconds[0] * 1e3, g[0], static_cast<unsigned long long>(r.writes[1]),
           r.seconds[1] * 1e3, g[1], g[0] / g[1]);
  }
}

Result<std::vector<Row>> RunRows(Parent& p) {
  std::vector<Row> rows;
  for (int g = 0; g < 2; ++g) {
    for (uint64_t bytes = p.o.min_bytes; bytes <= p.o.max_bytes; bytes *= 4) {
      uint64_t writes = std::clamp<uint64_t>(p.o.bytes_per_row / bytes, 16, 8192);
      ASSIGN_OR_RETURN(Row row, p.Measure("pages", g, bytes, writes, bytes, bytes));
      rows.push_back(row);
      if (!p.o.json)
        PD_LOG_INFO("{} B x {} on {} domain(s): {:.3f} GB/s", bytes, writes, g + 1,
                    row.fabric_gbps);
    }
    // KV-shaped: every layer's pages, each a head-shard half of an HND page (strided on both
    // sides).
    uint64_t writes = uint64_t(p.o.kv_layers) * p.o.kv_pages;
    uint64_t half = p.o.kv_page_bytes / 2;
    ASSIGN_OR_RETURN(Row kv, p.Measure("kv", g, half, writes, p.o.kv_page_bytes, half));
    kv.workload = "kv" + std::to_string(p.o.kv_layers) + "x" + std::to_string(p.o.kv_pages);
    rows.push_back(kv);
  }
  return rows;
}

int RunBench(const BenchOptions& o) {
  if (o.peer_fd >= 0) return RunPeer(o);
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) return 1;
  SubprocessOptions peer_options;
  peer_options.path = "/proc/self/exe";
  peer_options.argv = {"pdserve",    "--log-level",
                       "warn",       "transfer-bench",
                       "--peer-fd",  std::to_string(sv[1]),
                       "--provider", o.provider,
                       "--node",     o.node};
  peer_options.inherit_fds = {sv[1]};
  Result<Subprocess> peer = Subprocess::Spawn(peer_options);
  close(sv[1]);
  if (!peer.ok()) {
    close(sv[0]);
    fprintf(stderr, "transfer-bench: the peer: %s\n", peer.status().ToString().c_str());
    return 1;
  }
  Parent p;
  p.o = o;
  Status s = SetUpParent(p, sv[0]);
  Result<std::vector<ShardRow>> shard_rows = std::vector<ShardRow>{};
  if (s.ok() && o.shard_plans) {
    shard_rows = RunShardRows(p);
    if (!shard_rows.ok()) s = shard_rows.status();
  }
  Result<std::vector<Row>> rows = !s.ok()         ? Result<std::vector<Row>>(s)
                                  : o.shard_plans ? std::vector<Row>{}
                                                  : RunRows(p);
  if (p.tcp_fd >= 0) {
    uint64_t bye[2] = {0, 0};
    WriteAll(p.tcp_fd, bye, sizeof(bye));
    close(p.tcp_fd);
  }
  SendBlob(sv[0], "exit");
  if (Result<ExitStatus> status = peer->Wait(std::chrono::seconds(60)); !status.ok()) {
    fprintf(stderr, "transfer-bench: the peer: %s\n", status.status().ToString().c_str());
  }
  close(sv[0]);
  if (!rows.ok()) {
    fprintf(stderr, "transfer-bench: %s\n", rows.status().ToString().c_str());
    return 1;
  }
  if (o.shard_plans) {
    PrintShardRows(*shard_rows, o);
  } else {
    PrintRows(*rows, o.json);
  }
  return 0;
}

CommandRunner SetUpCommand(CLI::App* app) {
  auto o = std::make_shared<BenchOptions>();
  app->add_option("--provider", o->provider, "libfabric provider")->capture_default_str();
  app->add_option("--node", o->node, "local address both processes bind")->capture_default_str();
  app->add_option("--min-bytes", o->min_bytes, "smallest write")->capture_default_str();
  app->add_option("--max-bytes", o->max_bytes, "largest write")->capture_default_str();
  app->add_option("--bytes-per-row", o->bytes_per_row, "bytes moved per measurement")
      ->capture_default_str();
  app->add_option("--repeats", o->repeats, "measurements per row (best is kept)")
      ->capture_default_str();
  app->add_option("--kv-layers", o->kv_layers, "KV workload: layers")->capture_default_str();
  app->add_option("--kv-pages", o->kv_pages, "KV workload: pages per layer")->capture_default_str();
  app->add_option("--kv-page-bytes", o->kv_page_bytes, "KV workload: bytes of one HND page")
      ->capture_default_str();
  app->add_flag("--json", o->json, "print the rows as JSON");
  app->add_flag("--shard-plans", o->shard_plans,
                "sharded KV requests instead: TP 2->1, 1->2, 2->2, HND against NHD (uses "
                "--kv-layers, --kv-pages, --repeats)");
  app->add_option("--shard-kv-heads", o->shard_kv_heads, "sharded KV: the model's KV heads")
      ->capture_default_str();
  app->add_option("--shard-head-dim", o->shard_head_dim, "sharded KV: head_dim")
      ->capture_default_str();
  app->add_option("--shard-page-size", o->shard_page_size, "sharded KV: tokens per page")
      ->capture_default_str();
  app->add_option("--shard-elem-bytes", o->shard_elem_bytes, "sharded KV: bytes per element")
      ->capture_default_str();
  app->add_option("--peer-fd", o->peer_fd, "run as the benchmark's peer")->group("");
  return [o] { return RunBench(*o); };
}

// The name has a dash, so register directly rather than through PD_REGISTER_COMMAND.
const bool kRegistered = RegisterCommand(
    {"transfer-bench",
     "Fabric write throughput/latency between two processes vs a TCP stream (starts its peer)",
     SetUpCommand});

}  // namespace

}  // namespace pd::apps
