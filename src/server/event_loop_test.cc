// The event loop: posted tasks run in order on its thread (and those posted before Stop still
// run), a watched socket's events reach its handler until it is unwatched, and the tick runs.
#include "server/event_loop.h"

#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <mutex>
#include <vector>

#include "server/test_http.h"

namespace pd::server {
namespace {

using namespace std::chrono_literals;

TEST(EventLoopTest, PostedTasksRunInOrderOnTheLoopThreadAndBeforeStopEnds) {
  auto loop = EventLoop::Create({});
  ASSERT_TRUE(loop.ok()) << loop.status().ToString();
  std::mutex mu;
  std::vector<int> order;
  std::atomic<int> on_loop_thread{0};
  for (int i = 0; i < 100; ++i) {
    (*loop)->Post([&, i, raw = loop->get()] {
      if (raw->InLoopThread()) on_loop_thread.fetch_add(1);
      std::lock_guard<std::mutex> lock(mu);
      order.push_back(i);
    });
  }
  (*loop)->Stop();
  std::vector<int> want(100);
  for (int i = 0; i < 100; ++i) want[i] = i;
  EXPECT_EQ(order, want);
  EXPECT_EQ(on_loop_thread.load(), 100);
  bool ran = false;
  (*loop)->Post([&] { ran = true; });  // after Stop: dropped
  EXPECT_FALSE(ran);
}

TEST(EventLoopTest, AWatchedSocketReachesItsHandlerUntilUnwatched) {
  std::atomic<int> ticks{0};
  EventLoopOptions o;
  o.tick_ms = 1;
  o.on_tick = [&] { ticks.fetch_add(1); };
  auto loop = EventLoop::Create(o);
  ASSERT_TRUE(loop.ok());
  int fds[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, fds), 0);
  std::atomic<int> bytes{0};
  std::atomic<uint64_t> token{0};
  (*loop)->Post([&, raw = loop->get()] {
    token = raw->Watch(fds[0], EPOLLIN, [&, raw](uint32_t events) {
      char buf[16];
      if (events & EPOLLIN) bytes.fetch_add(static_cast<int>(::read(fds[0], buf, sizeof(buf))));
      if (bytes.load() >= 3) raw->Unwatch(token);  // from its own handler
    });
  });
  ASSERT_EQ(::write(fds[1], "abc", 3), 3);
  EXPECT_TRUE(testing::WaitFor([&] { return bytes.load() == 3; }, 5s));
  EXPECT_TRUE(testing::WaitFor([&] { return ticks.load() >= 3; }, 5s));
  ASSERT_EQ(::write(fds[1], "d", 1), 1);  // unwatched: never read
  std::atomic<size_t> watched{99};
  (*loop)->Post([&, raw = loop->get()] { watched = raw->num_watched(); });
  (*loop)->Stop();
  EXPECT_EQ(watched.load(), 0u);
  EXPECT_EQ(bytes.load(), 3);
  ::close(fds[0]);
  ::close(fds[1]);
}

}  // namespace
}  // namespace pd::server
