// Where the planner's tests find DistServe's reference data (../shared/distserve beside the
// repository, set by CMake as PD_DISTSERVE_DIR). Tests that need it skip when it is missing.
#pragma once

#include <filesystem>
#include <string>

namespace pd::planner::testing {

inline std::string DistServeDir() { return PD_DISTSERVE_DIR; }
inline std::string DistServePath(const std::string& rel) { return DistServeDir() + "/" + rel; }
inline bool HaveDistServe() {
  return std::filesystem::exists(DistServePath("a100-profile/profiler-a100-80g.distserve.json"));
}

}  // namespace pd::planner::testing

#define PD_REQUIRE_DISTSERVE_DATA()                                                            \
  do {                                                                                         \
    if (!::pd::planner::testing::HaveDistServe())                                              \
      GTEST_SKIP() << "DistServe data not found at " << ::pd::planner::testing::DistServeDir() \
                   << " (expected ../shared/distserve beside the repository)";                 \
  } while (0)
