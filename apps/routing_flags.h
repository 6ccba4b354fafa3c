// The routing flags `router` and `up` share (server::RoutingPolicy, server::KvRoutingOptions).
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "server/router.h"

namespace pd::apps {

inline void AddRoutingFlags(CLI::App* app, std::string* routing, server::KvRoutingOptions* kv) {
  app->add_option("--routing", *routing,
                  "round-robin | least-loaded (fewest requests in flight) | kv-aware (where the "
                  "prompt's prefix is cached, weighed against load: see --kv-compute-weight)")
      ->check(CLI::IsMember({"round-robin", "least-loaded", "kv-aware"}))
      ->capture_default_str();
  app->add_option("--kv-compute-weight", kv->compute_weight,
                  "kv-aware: cost of one prompt page (page_size tokens) the instance lacks")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app->add_option("--kv-load-weight", kv->load_weight,
                  "kv-aware: cost of one request in flight on the instance")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
}

}  // namespace pd::apps
