#include "server/kv_choice.h"

#include <algorithm>

#include "engine/prefix_cache.h"

namespace pd::server {

std::vector<KvCandidate> KvCandidatesFor(const KvIndex& index, std::span<const int32_t> tokens,
                                         std::span<const KvPeerLoad> peers) {
  const std::span<const int32_t> keyed = tokens.first(tokens.empty() ? 0 : tokens.size() - 1);
  struct Keys {
    uint64_t root;
    int page_size;
    std::vector<uint64_t> keys;
  };
  std::vector<Keys> by_format;  // one per (root, page size) among the peers: usually one
  auto keys_for = [&](uint64_t root, int page_size) -> const std::vector<uint64_t>& {
    for (const Keys& k : by_format)
      if (k.root == root && k.page_size == page_size) return k.keys;
    Keys k{root, page_size, {}};
    engine::ExtendPageKeys(root, keyed.first(keyed.size() / page_size * page_size), page_size,
                           &k.keys);
    by_format.push_back(std::move(k));
    return by_format.back().keys;
  };
  std::vector<KvCandidate> out;
  int any_page_size = 16;  // an unsynced peer's prompt pages are counted in a synced one's
  for (const KvPeerLoad& p : peers) {
    const std::string name(p.name);
    const KvBackendState state = index.State(name);
    KvCandidate c;
    c.load = p.load;
    if (state.synced && state.page_size > 0) {
      const std::vector<uint64_t>& keys = keys_for(state.root, state.page_size);
      c.prompt_pages = static_cast<int>(keys.size());
      c.cached_pages = index.CachedPages(name, keys);
      any_page_size = state.page_size;
    }
    out.push_back(c);
  }
  for (KvCandidate& c : out) {
    if (c.cached_pages < 0) c.prompt_pages = static_cast<int>(keyed.size()) / any_page_size;
  }
  return out;
}

KvPeerChooser::KvPeerChooser(const KvPeerChooserOptions& options)
    : options_(options), feed_(&index_, options.feed) {}

KvPeerChooser::~KvPeerChooser() { feed_.Stop(); }

void KvPeerChooser::SetPeers(const std::vector<std::string>& urls) { feed_.SetBackends(urls); }

int KvPeerChooser::Choose(std::span<const int32_t> tokens, std::span<const KvPeerLoad> peers) {
  if (peers.empty()) return -1;
  const std::vector<KvCandidate> c = KvCandidatesFor(index_, tokens, peers);
  const int i = ChooseKvAware(c, options_.compute_weight, options_.load_weight,
                              round_.fetch_add(1) % peers.size());
  if (i >= 0) {
    prompt_pages_.fetch_add(static_cast<uint64_t>(c[i].prompt_pages));
    cached_pages_.fetch_add(static_cast<uint64_t>(std::max(0, c[i].cached_pages)));
  }
  return i;
}

std::string KvPeerChooser::MetricsText(std::string_view prefix) const {
  const std::string p(prefix);
  std::string out = "# TYPE " + p + "_prompt_pages_total counter\n" + p + "_prompt_pages_total " +
                    std::to_string(prompt_pages_.load()) + "\n# TYPE " + p +
                    "_cached_pages_total counter\n" + p + "_cached_pages_total " +
                    std::to_string(cached_pages_.load()) + "\n# TYPE " + p +
                    "_feed_failures_total counter\n" + p + "_feed_failures_total " +
                    std::to_string(feed_.failures()) + "\n";
  std::string synced = "# TYPE " + p + "_synced gauge\n";
  std::string pages = "# TYPE " + p + "_indexed_pages gauge\n";
  for (const std::string& url : index_.Backends()) {
    const KvBackendState s = index_.State(url);
    const std::string label = "{peer=\"" + url + "\"} ";
    synced += p + "_synced" + label + (s.synced ? "1\n" : "0\n");
    pages += p + "_indexed_pages" + label + std::to_string(s.num_keys) + "\n";
  }
  return out + synced + pages;
}

}  // namespace pd::server
