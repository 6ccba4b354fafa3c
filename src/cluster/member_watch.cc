#include "cluster/member_watch.h"

#include <chrono>

#include "cluster/pause.h"
#include "common/log.h"
#include "common/thread_util.h"

namespace pd::cluster {

MemberWatch::MemberWatch(const MemberWatchOptions& options)
    : options_(options), etcd_(options.etcd) {}

Result<std::unique_ptr<MemberWatch>> MemberWatch::Create(const MemberWatchOptions& options) {
  std::unique_ptr<MemberWatch> w(new MemberWatch(options));
  ASSIGN_OR_RETURN(int64_t revision, w->Load(/*keep_missing=*/false));
  w->Publish();
  w->thread_ = std::thread([raw = w.get(), revision] {
    SetCurrentThreadName("pd-etcd-watch");
    Status s = raw->Follow(revision + 1);
    if (s.code() != StatusCode::kCancelled) raw->Loop();
  });
  return w;
}

MemberWatch::~MemberWatch() { Stop(); }

void MemberWatch::Stop() {
  {
    MutexLock lock(&mu_);
    stop_ = true;
    if (watch_ != nullptr) watch_->Cancel();
  }
  cv_.SignalAll();
  if (thread_.joinable()) thread_.join();
}

std::vector<Member> MemberWatch::members() const {
  MutexLock lock(&mu_);
  std::vector<Member> out;
  for (const auto& [key, m] : members_) out.push_back(m);
  return out;
}

int64_t MemberWatch::restarts() const {
  MutexLock lock(&mu_);
  return restarts_;
}

bool MemberWatch::Decode(const KeyValue& kv, Member* member) {
  Result<Member> m = DecodeMember(kv.value, options_.secret);
  if (m.ok()) {
    refused_.erase(kv.key);
    *member = std::move(m).value();
    return true;
  }
  if (refused_.insert(kv.key).second) {
    PD_LOG_WARN("etcd: ignoring member {}: {}", kv.key, m.status().message());
  }
  return false;
}

Result<int64_t> MemberWatch::Load(bool keep_missing) {
  ASSIGN_OR_RETURN(RangeResult range, etcd_.RangePrefix(options_.prefix));
  std::map<std::string, Member> now;
  for (const KeyValue& kv : range.kvs) {
    Member m;
    if (Decode(kv, &m)) now[kv.key] = std::move(m);
  }
  MutexLock lock(&mu_);
  stale_.clear();
  if (keep_missing) {
    const auto until = std::chrono::steady_clock::now() +
                       std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                           std::chrono::duration<double>(options_.rejoin_grace_s));
    for (auto& [key, m] : members_) {
      if (now.count(key) > 0) continue;
      stale_[key] = until;
      now[key] = std::move(m);
    }
  }
  members_ = std::move(now);
  return range.revision;
}

bool MemberWatch::DropExpired() {
  MutexLock lock(&mu_);
  const auto now = std::chrono::steady_clock::now();
  bool dropped = false;
  for (auto it = stale_.begin(); it != stale_.end();) {
    if (it->second > now) {
      ++it;
      continue;
    }
    PD_LOG_INFO("etcd: {} did not register again after etcd came back: dropped", it->first);
    members_.erase(it->first);
    it = stale_.erase(it);
    dropped = true;
  }
  return dropped;
}

void MemberWatch::Publish() {
  if (options_.on_change) options_.on_change(members());
}

void MemberWatch::Apply(const std::vector<WatchEvent>& events) {
  bool changed = false;
  for (const WatchEvent& e : events) {
    Member m;
    const bool valid = e.type == WatchEvent::Type::kPut && Decode(e.kv, &m);
    MutexLock lock(&mu_);
    stale_.erase(e.kv.key);  // registered again, or gone for good
    if (valid) {
      members_[e.kv.key] = std::move(m);
      changed = true;
    } else {
      changed |= members_.erase(e.kv.key) > 0;
    }
  }
  if (changed) Publish();
}

Status MemberWatch::Follow(int64_t revision) {
  ASSIGN_OR_RETURN(std::unique_ptr<EtcdWatch> watch, etcd_.WatchPrefix(options_.prefix, revision));
  {
    MutexLock lock(&mu_);
    if (stop_) return Cancelled("stopped");
    watch_ = watch.get();
  }
  Status s;
  while (s.ok()) {
    std::vector<WatchEvent> events;
    s = watch->Next(250, &events);
    if (!events.empty()) Apply(events);
    if (DropExpired()) Publish();
  }
  MutexLock lock(&mu_);
  watch_ = nullptr;
  return stop_ ? Cancelled("stopped") : s;
}

bool MemberWatch::Pause(double seconds) {
  MutexLock lock(&mu_);
  return PauseUnlessStopped(&mu_, &cv_, &stop_, seconds);
}

// After the first watch broke: start over (range, then watch) until Stop.
void MemberWatch::Loop() {
  bool logged = false;
  while (Pause(options_.retry_s)) {
    Result<int64_t> revision = Load(/*keep_missing=*/true);
    if (!revision.ok()) {
      if (!logged) {
        PD_LOG_WARN(
            "etcd: lost the watch on {} ({}); retrying every {} s, keeping the members "
            "as they were",
            options_.prefix, revision.status().ToString(), options_.retry_s);
      }
      logged = true;
      continue;
    }
    {
      MutexLock lock(&mu_);
      ++restarts_;
    }
    if (logged) PD_LOG_INFO("etcd: watching {} again", options_.prefix);
    logged = false;
    Publish();
    if (Follow(*revision + 1).code() == StatusCode::kCancelled) return;
  }
}

}  // namespace pd::cluster
