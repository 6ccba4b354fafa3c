#include "cluster/registration.h"

#include <chrono>

#include "cluster/pause.h"
#include "common/log.h"
#include "common/thread_util.h"

namespace pd::cluster {

Registration::Registration(const RegistrationOptions& options)
    : options_(options), etcd_(options.etcd) {}

Result<std::unique_ptr<Registration>> Registration::Create(const RegistrationOptions& options) {
  if (options.ttl_s < 2) return InvalidArgument("the lease TTL must be at least 2 s");
  std::unique_ptr<Registration> r(new Registration(options));
  const auto end = std::chrono::steady_clock::now() +
                   std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                       std::chrono::duration<double>(options.start_timeout_s));
  Status s = r->Register();
  while (!s.ok() && std::chrono::steady_clock::now() < end) {
    (void)r->Pause(options.retry_s);
    s = r->Register();
  }
  if (!s.ok()) return s.WithContext("cannot register " + options.key + " in etcd");
  r->thread_ = std::thread([raw = r.get()] { raw->Loop(); });
  return r;
}

Registration::~Registration() { Deregister(); }

Status Registration::Register() {
  ASSIGN_OR_RETURN(int64_t lease, etcd_.GrantLease(options_.ttl_s));
  if (Status s = etcd_.Put(options_.key, options_.value, lease); !s.ok()) {
    (void)etcd_.Revoke(lease);
    return s;
  }
  MutexLock lock(&mu_);
  lease_ = lease;
  ++registrations_;
  return OkStatus();
}

bool Registration::Pause(double seconds) {
  MutexLock lock(&mu_);
  return PauseUnlessStopped(&mu_, &cv_, &stop_, seconds);
}

void Registration::Loop() {
  SetCurrentThreadName("pd-etcd-lease");
  const double interval_s = static_cast<double>(options_.ttl_s) / 3.0;
  bool healthy = true;
  while (Pause(healthy ? interval_s : options_.retry_s)) {
    Result<int64_t> ttl = etcd_.KeepAlive(lease());
    if (ttl.ok()) {
      if (!healthy) PD_LOG_INFO("etcd: {} is registered again (the lease lived on)", options_.key);
      healthy = true;
      continue;
    }
    if (ttl.status().code() != StatusCode::kNotFound) {  // etcd unreachable: keep trying
      if (healthy) {
        PD_LOG_WARN("etcd: cannot keep {} alive: {}; retrying every {} s", options_.key,
                    ttl.status().ToString(), options_.retry_s);
      }
      healthy = false;
      continue;
    }
    // The lease is gone (expired, or etcd restarted without its data): register anew.
    if (Status s = Register(); !s.ok()) {
      healthy = false;
      continue;
    }
    healthy = true;
    PD_LOG_INFO("etcd: {} re-registered under a new lease ({})", options_.key,
                ttl.status().message());
  }
}

void Registration::Deregister() {
  int64_t lease = 0;
  {
    MutexLock lock(&mu_);
    if (deregistered_) return;
    deregistered_ = true;
    stop_ = true;
    lease = lease_;
  }
  cv_.SignalAll();
  if (thread_.joinable()) thread_.join();
  if (lease == 0) return;  // never registered
  if (Status s = etcd_.Revoke(lease); !s.ok() && s.code() != StatusCode::kNotFound) {
    PD_LOG_WARN("etcd: cannot revoke the lease of {} ({}): it expires within {} s", options_.key,
                s.ToString(), options_.ttl_s);
  }
}

int64_t Registration::registrations() const {
  MutexLock lock(&mu_);
  return registrations_;
}

int64_t Registration::lease() const {
  MutexLock lock(&mu_);
  return lease_;
}

}  // namespace pd::cluster
