// The members of one role of a cluster, as etcd has them, kept current: a range read of the
// role's prefix, then a watch from the next revision. Every change (a member that registered,
// re-registered with a new description, or whose key went: deregistered or lease expired) calls
// on_change with the whole current set. When etcd cannot be reached the set is kept as it was
// and the watch starts over (a fresh range read) as soon as etcd answers. Entries whose MAC does
// not match the cluster secret are ignored (logged once per key).
//
// Thread safety: members() from any thread; on_change runs on the watch's own thread.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "cluster/etcd_client.h"
#include "cluster/member.h"
#include "common/mutex.h"

namespace pd::cluster {

struct MemberWatchOptions {
  EtcdOptions etcd;
  std::string prefix;  // RolePrefix(cluster, role)
  std::string secret;  // the cluster secret the members' MACs are keyed with
  std::function<void(const std::vector<Member>& members)> on_change;
  double retry_s = 0.5;  // between attempts while etcd does not answer
  // After etcd comes back, a member missing from the fresh read is kept this long (unless its key
  // is deleted meanwhile): an etcd that lost its data knows nobody until each instance has put
  // its key again, which takes each of them up to a retry interval.
  double rejoin_grace_s = 2.0;
};

class MemberWatch {
 public:
  // Reads the members once (on_change is called with them before Create returns, even when there
  // are none) and starts watching. Unavailable when etcd cannot be reached.
  static Result<std::unique_ptr<MemberWatch>> Create(const MemberWatchOptions& options);
  ~MemberWatch();  // Stop()
  MemberWatch(const MemberWatch&) = delete;
  MemberWatch& operator=(const MemberWatch&) = delete;

  void Stop() EXCLUDES(mu_);
  std::vector<Member> members() const EXCLUDES(mu_);
  // Times the watch started over after losing etcd.
  int64_t restarts() const EXCLUDES(mu_);

 private:
  explicit MemberWatch(const MemberWatchOptions& options);
  // Range read: the set, and the revision to watch from. With `keep_missing` members not in it
  // stay, stale, for rejoin_grace_s.
  Result<int64_t> Load(bool keep_missing) EXCLUDES(mu_);
  // Drops stale members whose grace has passed; true when any went.
  bool DropExpired() EXCLUDES(mu_);
  // Watches from `revision` until the watch breaks or Stop.
  Status Follow(int64_t revision) EXCLUDES(mu_);
  void Apply(const std::vector<WatchEvent>& events) EXCLUDES(mu_);
  void Publish() EXCLUDES(mu_);
  void Loop() EXCLUDES(mu_);
  bool Pause(double seconds) EXCLUDES(mu_);
  // The member in `kv`, or nothing (and a log line the first time) when it is not valid.
  bool Decode(const KeyValue& kv, Member* member);

  const MemberWatchOptions options_;
  EtcdClient etcd_;
  std::thread thread_;
  std::set<std::string> refused_;  // keys logged as invalid (watch thread)
  mutable Mutex mu_;
  CondVar cv_;
  bool stop_ GUARDED_BY(mu_) = false;
  EtcdWatch* watch_ GUARDED_BY(mu_) = nullptr;  // the one Follow reads, for Stop to cancel
  std::map<std::string, Member> members_ GUARDED_BY(mu_);  // by key
  // Members kept through an etcd restart that have not registered again: when they go.
  std::map<std::string, std::chrono::steady_clock::time_point> stale_ GUARDED_BY(mu_);
  int64_t restarts_ GUARDED_BY(mu_) = 0;
};

}  // namespace pd::cluster
