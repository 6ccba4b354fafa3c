// The etcd discovery flags `serve` (every role but colocated) and `router` share
// (cluster/discovery.h).
#pragma once

#include <CLI/CLI.hpp>

#include "cluster/discovery.h"

namespace pd::apps {

inline void AddDiscoveryFlags(CLI::App* app, cluster::DiscoveryFlags* f) {
  app->add_option("--discovery", f->url,
                  "etcd://HOST:PORT[,HOST:PORT...]: register this instance in etcd (under a lease "
                  "it keeps alive) and find the others there: the router follows the decode "
                  "instances, a decode instance the prefill instances (instead of --decode / "
                  "--prefill-peers)");
  app->add_option("--cluster", f->cluster,
                  "with --discovery: the deployment's name (its keys are /pdserve/NAME/...)")
      ->capture_default_str();
  app->add_option("--discovery-ttl-s", f->ttl_s,
                  "with --discovery: the registration's lease; an instance that dies is dropped "
                  "this long after its last keep-alive")
      ->capture_default_str();
  app->add_option("--advertise-url", f->advertise_url,
                  "with --discovery: the HTTP URL the others reach this instance at (default "
                  "http://HOST:PORT; required when --host is 0.0.0.0)");
}

}  // namespace pd::apps
