// The HTTP limits every pdserve HTTP server shares (server::HttpLimits): the OpenAI front of
// `serve`, the bootstrap server of `serve --role prefill`, and `router` take the same flags.
#pragma once

#include <CLI/CLI.hpp>

#include "server/http_transport.h"

namespace pd::apps {

inline void AddHttpLimitFlags(CLI::App* app, server::HttpLimits* l) {
  app->add_option("--http-threads", l->num_threads,
                  "HTTP threads: they read and check requests (one event-loop thread writes every "
                  "answer, streamed or not)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app->add_option("--max-queued-connections", l->max_queued_connections,
                  "connections waiting for an HTTP thread; beyond it they get 503")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app->add_option("--max-idle-connections", l->max_idle_connections,
                  "connections open without a request in progress; beyond it new ones get 503")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app->add_option("--max-body-bytes", l->max_body_bytes, "largest request body; beyond it 413")
      ->capture_default_str();
  app->add_option("--max-header-bytes", l->max_header_bytes,
                  "largest request line + headers; beyond it 431")
      ->capture_default_str();
  app->add_option("--max-header-count", l->max_header_count, "most request headers; beyond it 431")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app->add_option("--read-timeout-ms", l->read_timeout_ms,
                  "per read of a request, and for its whole head; beyond it 408")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app->add_option("--request-timeout-ms", l->request_timeout_ms,
                  "the whole request, head and body, from its first byte; beyond it 408")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app->add_option("--write-timeout-ms", l->write_timeout_ms, "per write of a response")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app->add_option("--keep-alive-timeout-ms", l->keep_alive_timeout_ms,
                  "idle time allowed before a connection's (next) request")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
}

}  // namespace pd::apps
