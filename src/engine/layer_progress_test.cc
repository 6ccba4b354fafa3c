// LayerProgress's listener: called once per Bump, on the bumping thread, after the value moved;
// replaced and removed cleanly.
#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

#include "engine/model_runner.h"

namespace pd::engine {
namespace {

TEST(LayerProgressTest, ListenerSeesEveryBumpAfterTheValueMoved) {
  LayerProgress p;
  std::vector<uint64_t> seen;
  p.SetListener([&] { seen.push_back(p.Value()); });
  p.Bump();
  p.Bump();
  p.Bump();
  EXPECT_EQ(seen, (std::vector<uint64_t>{1, 2, 3}));
}

TEST(LayerProgressTest, RemovedListenerIsNotCalled) {
  LayerProgress p;
  int calls = 0;
  p.SetListener([&] { ++calls; });
  p.Bump();
  p.SetListener(nullptr);
  p.Bump();
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(p.Value(), 2u);
}

TEST(LayerProgressTest, ListenerRunsOnTheBumpingThread) {
  LayerProgress p;
  std::atomic<int> calls{0};
  std::thread::id where;
  p.SetListener([&] {
    where = std::this_thread::get_id();
    calls.fetch_add(1);
  });
  std::thread bumper([&] { p.Bump(); });
  const std::thread::id bumper_id = bumper.get_id();
  bumper.join();
  EXPECT_EQ(calls.load(), 1);
  EXPECT_EQ(where, bumper_id);
  EXPECT_TRUE(p.WaitAtLeast(1, 0));
}

}  // namespace
}  // namespace pd::engine
