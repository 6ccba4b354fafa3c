// pdserve router: the OpenAI API in front of decode instances (--routing: least outstanding
// requests by default, round-robin, or kv-aware with --model: where the prompt is cached),
// given as a list or found in etcd:
//
//   pdserve router --decode http://127.0.0.1:8101,http://127.0.0.1:8102 --port 8000
//   pdserve router --discovery etcd://10.0.0.5:2379 --cluster prod --cluster-secret-file S
//
// SIGTERM drains (new requests 503, those relayed finish within --drain-timeout-s), SIGINT stops
// at once.
#include <signal.h>

#include <cstdio>
#include <memory>
#include <sstream>
#include <string>

#include "apps/command.h"
#include "apps/discovery_flags.h"
#include "apps/http_limit_flags.h"
#include "apps/routing_flags.h"
#include "cluster/discovery.h"
#include "common/file_util.h"
#include "model/tokenizer.h"
#include "server/drain.h"
#include "server/router.h"

namespace pd::apps {
namespace {

struct RouterFlags {
  std::string decode;
  std::string host = "127.0.0.1";
  int port = 8000;
  server::HttpLimits http = server::RouterHttpLimits();
  int max_open_streams = server::RouterOptions().max_open_streams;
  double drain_timeout_s = 30.0;
  cluster::DiscoveryFlags discovery;
  std::string cluster_secret_file;  // --discovery: checks the members' MACs
  bool insecure_no_secret = false;
  bool dry_run = false;
  std::string routing = "least-loaded";
  std::string model;          // kv-aware: the instances' model directory (its tokenizer)
  std::string chat_template;  // kv-aware: the instances' --chat-template
  server::KvRoutingOptions kv;
};

std::vector<std::string> SplitUrls(const std::string& list) {
  std::vector<std::string> out;
  std::stringstream urls(list);
  std::string url;
  while (std::getline(urls, url, ',')) {
    if (!url.empty()) out.push_back(url);
  }
  return out;
}

// Every flag that can be checked without a network; each error names its flag.
Status ValidateRouterFlags(const RouterFlags& f) {
  if (f.decode.empty() && !f.discovery.enabled()) {
    return InvalidArgument("give --decode URL[,URL...] or --discovery etcd://HOST:PORT");
  }
  if (!f.decode.empty() && f.discovery.enabled()) {
    return InvalidArgument("give either --decode or --discovery, not both");
  }
  for (const std::string& url : SplitUrls(f.decode)) {
    if (url.rfind("http://", 0) != 0) {
      return InvalidArgument("--decode: '" + url + "' is not http://HOST:PORT");
    }
  }
  RETURN_IF_ERROR(cluster::ValidateDiscoveryFlags(f.discovery));
  auto routing = server::ParseRoutingPolicy(f.routing);
  if (!routing.ok()) return routing.status().WithContext("--routing");
  if (*routing == server::RoutingPolicy::kKvAware && f.model.empty())
    return InvalidArgument(
        "--routing kv-aware needs --model DIR (the instances' model: the router tokenizes "
        "prompts as they do)");
  if (f.discovery.enabled() && f.cluster_secret_file.empty() && !f.insecure_no_secret) {
    return InvalidArgument(
        "--discovery needs --cluster-secret-file FILE (the instances' secret: members in etcd "
        "without its MAC are ignored), or --insecure-no-secret");
  }
  if (!f.cluster_secret_file.empty()) {
    auto text = ReadFileToString(f.cluster_secret_file);
    if (!text.ok()) return text.status().WithContext("--cluster-secret-file");
  }
  return OkStatus();
}

Result<std::string> ReadRouterSecret(const RouterFlags& f) {
  if (f.cluster_secret_file.empty()) return std::string();
  ASSIGN_OR_RETURN(std::string s, ReadFileToString(f.cluster_secret_file));
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r')) s.pop_back();
  return s;
}

int RunRouter(const RouterFlags& f) {
  if (Status s = ValidateRouterFlags(f); !s.ok()) {
    std::fprintf(stderr, "router: %s\n", s.message().c_str());
    return 2;
  }
  if (f.dry_run) {
    std::printf("router: --dry-run: the flags are valid\n");
    return 0;
  }
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
  o.backends = SplitUrls(f.decode);
  o.dynamic_backends = f.discovery.enabled();
  auto fail = [](const Status& s) {
    std::fprintf(stderr, "router: %s\n", s.ToString().c_str());
    return 1;
  };
  o.routing = *server::ParseRoutingPolicy(f.routing);
  o.kv = f.kv;
  std::unique_ptr<model::Tokenizer> tokenizer;
  if (o.routing == server::RoutingPolicy::kKvAware) {
    auto t = model::Tokenizer::Load(f.model, f.chat_template);
    if (!t.ok()) return fail(t.status().WithContext("--model"));
    tokenizer = std::move(t).value();
    o.kv.tokenizer = tokenizer.get();
  }
  auto router = server::Router::Create(o);
  if (!router.ok()) return fail(router.status());
  std::unique_ptr<cluster::MemberWatch> watch;
  if (f.discovery.enabled()) {
    auto secret = ReadRouterSecret(f);
    if (!secret.ok()) return fail(secret.status().WithContext("--cluster-secret-file"));
    auto w = cluster::FeedRouter(f.discovery, *secret, router->get());
    if (!w.ok()) return fail(w.status().WithContext("--discovery"));
    watch = std::move(w).value();
  }
  if (Status s = (*router)->Start(); !s.ok()) return fail(s);
  std::printf("pdserve: router on http://%s:%d -> %zu decode instance(s)%s, routing %s\n",
              f.host.c_str(), (*router)->port(), (*router)->backends().size(),
              f.discovery.enabled() ? " (etcd discovery)" : "", f.routing.c_str());
  std::fflush(stdout);
  int sig = 0;
  sigwait(&stop, &sig);
  if (sig == SIGTERM) {
    server::Router* r = router->get();
    server::DrainHooks hooks;
    hooks.begin = [r] { r->BeginDrain(); };
    hooks.in_flight = [r] { return r->open_streams(); };
    hooks.end_running = [r](const std::string& why) { r->EndRunning(why); };
    (void)server::Drain(hooks, f.drain_timeout_s, "router");
  }
  watch.reset();
  (*router)->Stop();
  return 0;
}

}  // namespace

PD_REGISTER_COMMAND(router, "OpenAI API in front of decode instances", [](CLI::App* app) {
  auto f = std::make_shared<RouterFlags>();
  app->add_option("--decode", f->decode, "decode instances' base URLs, comma-separated");
  app->add_option("--host", f->host, "address to listen on")->capture_default_str();
  app->add_option("--port", f->port, "port (0: any)")->capture_default_str();
  AddHttpLimitFlags(app, &f->http);
  app->add_option("--max-open-streams", f->max_open_streams,
                  "relayed requests (streamed or not) open at once; beyond it 429")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app->add_option("--drain-timeout-s", f->drain_timeout_s,
                  "on SIGTERM: refuse new requests (503 with Retry-After), let the relayed ones "
                  "finish for at most this long, end what is left with an error, exit 0 (SIGINT "
                  "stops at once)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  AddDiscoveryFlags(app, &f->discovery);
  app->add_option("--cluster-secret-file", f->cluster_secret_file,
                  "with --discovery: the cluster secret the instances sign their etcd entries "
                  "with (entries without its MAC are ignored)");
  app->add_flag("--insecure-no-secret", f->insecure_no_secret,
                "with --discovery: accept entries signed with no secret (tests on one host)");
  AddRoutingFlags(app, &f->routing, &f->kv);
  app->add_option("--model", f->model,
                  "with --routing kv-aware: the instances' model directory (the router tokenizes "
                  "prompts with its tokenizer, as the instances do)");
  app->add_option("--chat-template", f->chat_template,
                  "with --routing kv-aware: the instances' --chat-template");
  app->add_option("--api-key", f->kv.api_key,
                  "with --routing kv-aware: the instances' API key (for GET /v1/kv_events)");
  app->add_flag("--dry-run", f->dry_run, "check the flags (and the files they name) and exit");
  return [f] { return RunRouter(*f); };
});

}  // namespace pd::apps
