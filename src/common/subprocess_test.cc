#include "common/subprocess.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <fstream>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace pd {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using ::testing::HasSubstr;

Subprocess SpawnOk(std::vector<std::string> argv) {
  SubprocessOptions o;
  o.argv = std::move(argv);
  Result<Subprocess> p = Subprocess::Spawn(o);
  EXPECT_TRUE(p.ok()) << p.status().ToString();
  return p.ok() ? std::move(p).value() : Subprocess();
}

// The state letter of /proc/PID/stat ('S' sleeping, 'T' stopped, ...), or '?'.
char ProcState(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string stat((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  const size_t paren = stat.rfind(')');
  return paren == std::string::npos || paren + 2 >= stat.size() ? '?' : stat[paren + 2];
}

TEST(SubprocessTest, TrueExitsZero) {
  Subprocess p = SpawnOk({"/bin/true"});
  EXPECT_GT(p.pid(), 0);
  Result<ExitStatus> s = p.Wait(seconds(30));
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_TRUE(s->ok());
  EXPECT_FALSE(p.running());
  EXPECT_EQ(p.exit_status(), ExitStatus{});
}

TEST(SubprocessTest, ReportsTheExitCode) {
  Subprocess p = SpawnOk({"/bin/sh", "-c", "exit 3"});
  Result<ExitStatus> s = p.Wait(seconds(30));
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(s->code, 3);
  EXPECT_EQ(s->signal, 0);
  EXPECT_FALSE(s->ok());
  EXPECT_EQ(s->ToString(), "exited with status 3");
  // Reaped: waiting again gives the same status, signalling it is refused.
  EXPECT_EQ(*p.Wait(milliseconds(0)), *s);
  EXPECT_EQ(p.Signal(SIGTERM).code(), StatusCode::kFailedPrecondition);
}

TEST(SubprocessTest, WaitTimesOutThenASignalEndsTheChild) {
  Subprocess p = SpawnOk({"/bin/sleep", "60"});
  Result<ExitStatus> early = p.Wait(milliseconds(20));
  ASSERT_FALSE(early.ok());
  EXPECT_EQ(early.status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_THAT(early.status().message(), HasSubstr("waitpid " + std::to_string(p.pid())));
  EXPECT_TRUE(p.running());
  ASSERT_TRUE(p.Signal(SIGTERM).ok());
  Result<ExitStatus> s = p.Wait(seconds(30));
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(s->signal, SIGTERM);
  EXPECT_EQ(s->ToString(), "was killed by signal 15 (SIGTERM)");
}

TEST(SubprocessTest, KillAndTerminate) {
  Subprocess a = SpawnOk({"/bin/sleep", "60"});
  Result<ExitStatus> killed = a.Kill();
  ASSERT_TRUE(killed.ok()) << killed.status().ToString();
  EXPECT_EQ(killed->signal, SIGKILL);
  // A child that ignores SIGTERM is killed once the grace period is over. It says when it
  // ignores it: a SIGTERM before that would end it.
  int ready[2];
  ASSERT_EQ(::pipe2(ready, O_CLOEXEC), 0);
  SubprocessOptions o;
  o.argv = {"/bin/sh", "-c", "trap '' TERM; echo ready; exec sleep 60"};
  o.stdout_fd = ready[1];
  Result<Subprocess> b = Subprocess::Spawn(o);
  ::close(ready[1]);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  char buf[6] = {};
  EXPECT_EQ(::read(ready[0], buf, 5), 5);
  ::close(ready[0]);
  Result<ExitStatus> stubborn = b->Terminate(milliseconds(100));
  ASSERT_TRUE(stubborn.ok()) << stubborn.status().ToString();
  EXPECT_EQ(stubborn->signal, SIGKILL);
}

TEST(SubprocessTest, DestructionKillsAndReapsARunningChild) {
  pid_t pid = -1;
  {
    Subprocess p = SpawnOk({"/bin/sleep", "60"});
    pid = p.pid();
    Subprocess moved = std::move(p);  // the moved-from handle owns nothing
    EXPECT_EQ(p.pid(), -1);
    EXPECT_EQ(moved.pid(), pid);
  }
  ASSERT_GT(pid, 0);
  // Reaped: no such process (not even a zombie) is left.
  EXPECT_EQ(::kill(pid, 0), -1);
  EXPECT_EQ(errno, ESRCH);
}

TEST(SubprocessTest, AMissingExecutableFailsTheSpawn) {
  SubprocessOptions o;
  o.argv = {"/nonexistent-pdserve-dir/program", "--flag"};
  Result<Subprocess> p = Subprocess::Spawn(o);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(p.status().message(),
              HasSubstr("execve /nonexistent-pdserve-dir/program: No such file or directory"));
  o.argv.clear();
  EXPECT_EQ(Subprocess::Spawn(o).status().code(), StatusCode::kInvalidArgument);
}

TEST(SubprocessTest, EnvironmentOutputAndInheritedDescriptors) {
  char path[] = "/tmp/pd_subprocess_test_XXXXXX";
  const int out = ::mkstemp(path);
  ASSERT_GE(out, 0);
  ::unlink(path);
  int pipe_fds[2];
  ASSERT_EQ(::pipe2(pipe_fds, O_CLOEXEC), 0);
  SubprocessOptions o;
  const std::string fd = std::to_string(pipe_fds[1]);
  o.argv = {"/bin/sh", "-c", "echo \"$PD_SUBPROCESS_TEST\"; echo to-stderr >&2; echo fd >&" + fd};
  o.env = {{"PD_SUBPROCESS_TEST", "from the parent"}};
  o.stdout_fd = out;
  o.stderr_fd = out;
  o.inherit_fds = {pipe_fds[1]};
  Result<Subprocess> p = Subprocess::Spawn(o);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  ::close(pipe_fds[1]);
  ASSERT_TRUE(p->Wait(seconds(30)).ok());
  char buf[64] = {};
  EXPECT_EQ(::read(pipe_fds[0], buf, sizeof(buf) - 1), 3);
  EXPECT_STREQ(buf, "fd\n");
  ::close(pipe_fds[0]);
  std::string text(256, '\0');
  const ssize_t n = ::pread(out, text.data(), text.size(), 0);
  ::close(out);
  ASSERT_GT(n, 0);
  text.resize(static_cast<size_t>(n));
  EXPECT_EQ(text, "from the parent\nto-stderr\n");
}

TEST(SubprocessTest, SuspendAndResume) {
  Subprocess p = SpawnOk({"/bin/sleep", "60"});
  ASSERT_TRUE(p.Suspend().ok());
  EXPECT_EQ(ProcState(p.pid()), 'T');
  ASSERT_TRUE(p.Resume().ok());
  EXPECT_NE(ProcState(p.pid()), 'T');
  EXPECT_TRUE(p.running());
}

TEST(SubprocessTest, PinsTheChildToTheGivenCpus) {
  SubprocessOptions o;
  o.argv = {"/bin/sh", "-c", "grep -q '^Cpus_allowed_list:[[:space:]]*0$' /proc/self/status"};
  o.cpus = {0};
  Result<Subprocess> p = Subprocess::Spawn(o);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  Result<ExitStatus> s = p->Wait(seconds(30));
  ASSERT_TRUE(s.ok());
  EXPECT_TRUE(s->ok()) << s->ToString();
  o.cpus = {-1};
  EXPECT_EQ(Subprocess::Spawn(o).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pd
