// pdserve router: the OpenAI API in front of decode instances (least outstanding requests).
//
//   pdserve router --decode http://127.0.0.1:8101,http://127.0.0.1:8102 --port 8000
#include <signal.h>

#include <cstdio>
#include <memory>
#include <sstream>
#include <string>

#include "apps/command.h"
#include "apps/http_limit_flags.h"
#include "server/router.h"

namespace pd::apps {
namespace {

struct RouterFlags {
  std::string decode;
  std::string host = "127.0.0.1";
  int port = 8000;
  server::HttpLimits http = server::RouterHttpLimits();
  int max_open_streams = server::RouterOptions().max_open_streams;
};

int RunRouter(const RouterFlags& f) {
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGINT);
  sigaddset(&stop, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);
  server::RouterOptions o;
  o.host = f.host;
  o.port = f.port;
  o.http = f.http;
  o.max_open_streams = f.max_open_streams;
  std::stringstream urls(f.decode);
  std::string url;
  while (std::getline(urls, url, ',')) {
    if (!url.empty()) o.backends.push_back(url);
  }
  auto router = server::Router::Create(o);
  if (!router.ok()) {
    std::fprintf(stderr, "router: %s\n", router.status().ToString().c_str());
    return 1;
  }
  if (Status s = (*router)->Start(); !s.ok()) {
    std::fprintf(stderr, "router: %s\n", s.ToString().c_str());
    return 1;
  }
  std::printf("pdserve: router on http://%s:%d -> %zu decode instance(s)\n", f.host.c_str(),
              (*router)->port(), o.backends.size());
  std::fflush(stdout);
  int sig = 0;
  sigwait(&stop, &sig);
  (*router)->Stop();
  return 0;
}

}  // namespace

PD_REGISTER_COMMAND(router, "OpenAI API in front of decode instances", [](CLI::App* app) {
  auto f = std::make_shared<RouterFlags>();
  app->add_option("--decode", f->decode, "decode instances' base URLs, comma-separated")
      ->required();
  app->add_option("--host", f->host, "address to listen on")->capture_default_str();
  app->add_option("--port", f->port, "port (0: any)")->capture_default_str();
  AddHttpLimitFlags(app, &f->http);
  app->add_option("--max-open-streams", f->max_open_streams,
                  "relayed requests (streamed or not) open at once; beyond it 429")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  return [f] { return RunRouter(*f); };
});

}  // namespace pd::apps
