// Where the planner's tests find DistServe's reference data (data/distserve in the source tree,
// set by CMake as PD_DISTSERVE_DIR). The data ships with the repository, so a test that needs it
// fails when it is missing.
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

#define PD_REQUIRE_DISTSERVE_DATA()                                                      \
  do {                                                                                   \
    if (!::pd::planner::testing::HaveDistServe())                                        \
      FAIL() << "DistServe data not found at " << ::pd::planner::testing::DistServeDir() \
             << " (data/distserve in the source tree)";                                  \
  } while (0)
