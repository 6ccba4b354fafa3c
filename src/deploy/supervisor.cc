#include "deploy/supervisor.h"

#include <httplib.h>
#include <signal.h>

#include <algorithm>
#include <cstdio>
#include <thread>

#include "common/clock.h"

namespace pd::deploy {

Result<OnFailure> ParseOnFailure(const std::string& text) {
  if (text == "restart") return OnFailure::kRestart;
  if (text == "stop") return OnFailure::kStop;
  return InvalidArgument("--on-failure must be restart or stop, got '" + text + "'");
}

namespace {

std::string FormatSeconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f", s);
  return buf;
}

}  // namespace

Supervisor::Supervisor(SupervisorOptions options) : options_(std::move(options)) {}

Supervisor::~Supervisor() { StopAll(std::chrono::seconds(10)); }

double Supervisor::Now() const { return SystemClock::Get().NowSeconds(); }

void Supervisor::Log(const std::string& line) const {
  if (options_.log) return options_.log(line);
  std::fprintf(stderr, "%s\n", line.c_str());
  std::fflush(stderr);
}

size_t Supervisor::Add(ChildSpec spec) {
  children_.emplace_back(std::move(spec), options_.policy);
  return children_.size() - 1;
}

bool Supervisor::healthy(size_t child) const { return children_[child].state == State::kHealthy; }

Status Supervisor::Spawn(Child& c) {
  Result<Subprocess> p = Subprocess::Spawn(c.spec.process);
  if (!p.ok()) return p.status().WithContext(c.spec.name);
  c.process = std::move(p).value();
  c.state = State::kStarting;
  c.started_at = Now();
  c.next_health_check = c.started_at;
  c.tracker.Started(c.started_at);
  return OkStatus();
}

Status Supervisor::Start(size_t child) { return Spawn(children_[child]); }

bool Supervisor::CheckHealth(Child& c) {
  if (c.spec.health_url.empty()) return true;
  httplib::Client client(c.spec.health_url);
  client.set_connection_timeout(1, 0);
  client.set_read_timeout(2, 0);
  auto res = client.Get("/health");
  return res && res->status == 200;
}

Status Supervisor::WaitHealthy(const std::vector<size_t>& children, double timeout_s,
                               const std::function<bool()>& cancelled) {
  const double end = Now() + timeout_s;
  for (size_t k : children) {
    Child& c = children_[k];
    while (c.state != State::kHealthy) {
      for (Child& other : children_) {
        if (!other.process.running()) continue;
        Result<std::optional<ExitStatus>> s = other.process.Poll();
        if (!s.ok() || s->has_value()) {
          return FailedPrecondition(
              other.spec.name + " (pid " + std::to_string(other.process.pid()) + ") " +
              (s.ok() ? (*s)->ToString() : s.status().ToString()) + " during start-up");
        }
      }
      if (CheckHealth(c)) {
        c.state = State::kHealthy;
        c.tracker.Healthy(Now());
        break;
      }
      if (cancelled && cancelled()) return Cancelled("interrupted during start-up");
      if (Now() > end) {
        return DeadlineExceeded(c.spec.name + " did not become healthy within " +
                                FormatSeconds(timeout_s) + " s");
      }
      std::this_thread::sleep_for(std::chrono::duration<double>(options_.health_poll_s));
    }
  }
  return OkStatus();
}

Status Supervisor::Failed(Child& c, const std::string& how) {
  const std::string who = c.spec.name + " (pid " + std::to_string(c.process.pid()) + ") " + how;
  if (options_.on_failure == OnFailure::kStop) {
    return Unavailable(who + ": stopping every instance (--on-failure stop)");
  }
  const RestartDecision d = c.tracker.Exited(Now());
  if (d.give_up) {
    return Unavailable(who + ": it failed " + std::to_string(d.failures_in_a_row) +
                       " times in a row, never running healthily for " +
                       FormatSeconds(options_.policy.stable_after_s) +
                       " s in between: giving up, stopping every instance");
  }
  Log(who + "; restarting it in " + FormatSeconds(d.backoff_s) + " s (failure " +
      std::to_string(d.failures_in_a_row) + " in a row)");
  c.state = State::kWaitingToRestart;
  c.restart_at = d.restart_at;
  return OkStatus();
}

Status Supervisor::StepChild(Child& c, double now) {
  if (c.state == State::kWaitingToRestart) {
    if (now < c.restart_at) return OkStatus();
    if (Status s = Spawn(c); !s.ok()) return Failed(c, "could not be restarted: " + s.ToString());
    Log("restarted " + c.spec.name + " (pid " + std::to_string(c.process.pid()) + ")");
    return OkStatus();
  }
  Result<std::optional<ExitStatus>> status = c.process.Poll();
  if (!status.ok()) return Failed(c, "cannot be waited for: " + status.status().ToString());
  if (status->has_value()) return Failed(c, (*status)->ToString());
  if (c.state != State::kStarting || now < c.next_health_check) return OkStatus();
  if (CheckHealth(c)) {
    c.state = State::kHealthy;
    c.tracker.Healthy(now);
    if (c.tracker.restarts() > 0) {
      Log(c.spec.name + " (pid " + std::to_string(c.process.pid()) + ") is healthy again, " +
          FormatSeconds(now - c.started_at) + " s after its restart");
    }
    return OkStatus();
  }
  c.next_health_check = now + options_.health_poll_s;
  if (now - c.started_at > options_.start_timeout_s) {
    (void)c.process.Kill();
    return Failed(c, "did not become healthy within " + FormatSeconds(options_.start_timeout_s) +
                         " s and was killed");
  }
  return OkStatus();
}

Status Supervisor::Step() {
  if (stopped_) return OkStatus();
  for (Child& c : children_) RETURN_IF_ERROR(StepChild(c, Now()));
  return OkStatus();
}

void Supervisor::StopAll(std::chrono::milliseconds grace) {
  for (Child& c : children_) {
    if (c.process.running()) (void)c.process.Signal(SIGTERM);
  }
  const auto end = std::chrono::steady_clock::now() + grace;
  for (Child& c : children_) {
    if (!c.process.running()) continue;
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(
        std::max(end - std::chrono::steady_clock::now(), std::chrono::steady_clock::duration(0)));
    if (!c.process.Wait(left).ok()) (void)c.process.Kill();
  }
  stopped_ = true;
}

}  // namespace pd::deploy
