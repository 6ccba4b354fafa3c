// An instance's entry in etcd, kept alive: a lease of ttl_s seconds, the key put under it, and a
// thread that refreshes the lease every ttl_s / 3. When etcd forgets the lease (it expired while
// etcd was unreachable, or etcd restarted without its data) the thread grants a new one and puts
// the key again as soon as etcd answers; when this process dies, the key goes with the lease.
// Deregister revokes the lease, so the key disappears at once (a graceful drain's first step).
//
// Thread safety: every public method may be called from any thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include "cluster/etcd_client.h"
#include "common/mutex.h"
#include "common/status.h"

namespace pd::cluster {

struct RegistrationOptions {
  EtcdOptions etcd;
  std::string key;
  std::string value;
  int64_t ttl_s = 10;
  // How long Create keeps trying to reach etcd for the first registration.
  double start_timeout_s = 30.0;
  double retry_s = 0.5;  // between attempts while etcd does not answer
};

class Registration {
 public:
  // Registers (granting the lease and putting the key) and starts the keep-alive thread.
  // Unavailable naming the endpoints when etcd did not answer within start_timeout_s.
  static Result<std::unique_ptr<Registration>> Create(const RegistrationOptions& options);
  ~Registration();  // Deregister()
  Registration(const Registration&) = delete;
  Registration& operator=(const Registration&) = delete;

  // Stops the keep-alive thread and revokes the lease (the key goes with it). Idempotent; a
  // revocation that fails (etcd unreachable) leaves the key to expire with the lease.
  void Deregister() EXCLUDES(mu_);
  // How many times the key was put: 1, plus one per re-registration.
  int64_t registrations() const EXCLUDES(mu_);
  int64_t lease() const EXCLUDES(mu_);

 private:
  explicit Registration(const RegistrationOptions& options);
  Status Register() EXCLUDES(mu_);  // a new lease, the key under it
  void Loop() EXCLUDES(mu_);
  // Waits `seconds` or until Deregister; false when deregistered.
  bool Pause(double seconds) EXCLUDES(mu_);

  const RegistrationOptions options_;
  EtcdClient etcd_;
  std::thread thread_;
  mutable Mutex mu_;
  CondVar cv_;
  bool stop_ GUARDED_BY(mu_) = false;
  bool deregistered_ GUARDED_BY(mu_) = false;
  int64_t lease_ GUARDED_BY(mu_) = 0;
  int64_t registrations_ GUARDED_BY(mu_) = 0;
};

}  // namespace pd::cluster
