#include "messenger/handshake.h"

#include <openssl/evp.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <string>

#include "common/log.h"
#include "common/rate_limited_log.h"
#include "engine/dp_engine.h"

namespace pd::messenger {

uint64_t ModelFingerprint(const model::ModelConfig& config, model::DType weights_dtype) {
  std::string text = model::ModelConfigToJson(config);
  text += "\ndtype=" + std::to_string(static_cast<int>(weights_dtype));
  for (const model::TensorSpec& t : model::RequiredTensors(config)) {
    text += "\n" + t.name + "[";
    for (int64_t d : t.shape) text += std::to_string(d) + ",";
    text += "]";
  }
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  PD_CHECK(EVP_Digest(text.data(), text.size(), digest, &len, EVP_sha256(), nullptr) == 1)
      << "SHA-256 failed";
  uint64_t hash = 0;
  std::memcpy(&hash, digest, sizeof(hash));
  return hash;
}

uint64_t ModelFingerprint(const model::ModelWeights& weights) {
  // An FP8 checkpoint and its bf16 source compute differently: they must not pair up.
  return ModelFingerprint(weights.config, weights.fp8 ? model::DType::kF8E4M3 : weights.dtype);
}

KvFormat MakeKvFormat(uint64_t model_hash, const engine::KvCacheSpec& spec, bool kv_checksum,
                      std::string speculative, DraftKvFormat draft_kv) {
  KvFormat f;
  f.model_hash = model_hash;
  f.num_layers = static_cast<uint32_t>(spec.num_layers);
  f.head_dim = static_cast<uint32_t>(spec.head_dim);
  f.page_size = static_cast<uint32_t>(spec.page_size);
  f.layout = static_cast<uint8_t>(spec.layout);
  f.kv_dtype = static_cast<uint8_t>(spec.dtype);
  f.kv_checksum = kv_checksum ? 1 : 0;
  f.latent_dim = static_cast<uint32_t>(spec.latent_dim);
  f.kv_scales = engine::KvScalesFingerprint(spec);
  f.speculative = std::move(speculative);
  f.draft_kv = draft_kv;
  return f;
}

Status CheckDraftKvRunner(engine::ModelRunner& runner, engine::ModelRunner* draft_kv) {
  if (draft_kv == nullptr) return OkStatus();
  auto refuse = [](const std::string& what) {
    return FailedPrecondition("the draft KV region cannot travel with the target's: " + what);
  };
  if (engine::DataParallelSize(runner) > 1)
    return refuse("data-parallel ranks keep a draft region each");
  const engine::KvRegion& target = runner.region();
  const engine::KvRegion& draft = draft_kv->region();
  if (draft.spec().page_size != target.spec().page_size)
    return refuse("page_size " + std::to_string(draft.spec().page_size) + ", the target's " +
                  std::to_string(target.spec().page_size));
  if (draft.num_pages() != target.num_pages())
    return refuse(std::to_string(draft.num_pages()) + " pages, the target's " +
                  std::to_string(target.num_pages()));
  if (draft_kv->num_ranks() != runner.num_ranks())
    return refuse(std::to_string(draft_kv->num_ranks()) + " ranks, the target's " +
                  std::to_string(runner.num_ranks()));
  return OkStatus();
}

DraftKvFormat MakeDraftKvFormat(engine::ModelRunner* draft_kv) {
  DraftKvFormat d;
  if (draft_kv == nullptr) return d;
  const engine::KvCacheSpec& spec = draft_kv->region().spec();
  d.num_layers = static_cast<uint32_t>(spec.num_layers);
  d.head_dim = static_cast<uint32_t>(spec.head_dim);
  d.num_kv_heads =
      static_cast<uint16_t>(draft_kv->config().is_mla() ? 1 : draft_kv->config().num_kv_heads);
  d.latent_dim = static_cast<uint32_t>(spec.latent_dim);
  d.layout = static_cast<uint8_t>(spec.layout);
  d.kv_dtype = static_cast<uint8_t>(spec.dtype);
  d.kv_scales = engine::KvScalesFingerprint(spec);
  return d;
}

KvFormat DraftRegionFormat(const KvFormat& format) {
  const DraftKvFormat& d = format.draft_kv;
  KvFormat f;
  f.model_hash = format.model_hash;
  f.num_layers = d.num_layers;
  f.head_dim = d.head_dim;
  f.page_size = format.page_size;
  f.layout = d.layout;
  f.kv_dtype = d.kv_dtype;
  f.latent_dim = d.latent_dim;
  f.kv_scales = d.kv_scales;
  return f;
}

ShardScheme DraftScheme(const KvFormat& format, uint16_t tp_size) {
  ShardScheme s;
  s.tp_size = tp_size;
  s.num_kv_heads = format.draft_kv.num_kv_heads;
  s.replicated = format.draft_kv.latent_dim > 0;
  return s;
}

Result<ShardPlan> PlanDraftTransfer(const ShardScheme& prefill, const ShardScheme& decode,
                                    const KvFormat& format, uint64_t seed) {
  auto plan = PlanTransfer(DraftScheme(format, prefill.tp_size),
                           DraftScheme(format, decode.tp_size), DraftRegionFormat(format), seed);
  if (!plan.ok()) return plan.status().WithContext("the draft KV region");
  return plan;
}

std::string SpeculativeIdentity(const engine::SpeculativeConfig& config,
                                uint64_t draft_fingerprint) {
  if (!config.enabled()) return "";
  std::string id = std::string(engine::SpecMethodName(config.method)) +
                   " k=" + std::to_string(config.num_speculative_tokens);
  if (config.method == engine::SpecMethod::kDraftModel ||
      config.method == engine::SpecMethod::kMtp) {
    char hex[24];
    std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(draft_fingerprint));
    id += " draft=" + std::string(hex);
  }
  return id;
}

Result<uint64_t> DraftFingerprint(const engine::SpeculativeConfig& config,
                                  uint64_t target_fingerprint) {
  if (config.method == engine::SpecMethod::kMtp) return target_fingerprint;
  if (config.method != engine::SpecMethod::kDraftModel) return uint64_t{0};
  Result<model::ModelConfig> c = model::LoadModelConfig(config.model);
  if (!c.ok()) return c.status().WithContext("--speculative-config: model");
  return ModelFingerprint(*c, model::DType::kBF16);
}

namespace {

template <typename T>
void Differs(std::string* out, const char* field, T ours, T theirs) {
  if (ours == theirs) return;
  if (!out->empty()) *out += "; ";
  *out +=
      std::string(field) + ": ours " + std::to_string(ours) + ", theirs " + std::to_string(theirs);
}

void DiffersNamed(std::string* out, const char* field, std::string_view ours,
                  std::string_view theirs) {
  if (ours == theirs) return;
  if (!out->empty()) *out += "; ";
  *out += std::string(field) + ": ours " + std::string(ours) + ", theirs " + std::string(theirs);
}

std::string LayoutName(uint8_t v) {
  return std::string(engine::KvLayoutName(static_cast<engine::KvLayout>(v)));
}
std::string CacheKind(const KvFormat& f) {
  return f.latent_dim > 0 ? "MLA latent (latent_dim " + std::to_string(f.latent_dim) + ")"
                          : "per-head K/V (head_dim " + std::to_string(f.head_dim) + ")";
}
std::string ScalesText(uint64_t fingerprint) {
  char text[64];
  std::snprintf(text, sizeof(text), "fp8 k_scale/v_scale fingerprint %016llx",
                static_cast<unsigned long long>(fingerprint));
  return text;
}
std::string DTypeName(uint8_t v) {
  return std::string(engine::KvDTypeName(static_cast<engine::KvDType>(v)));
}

}  // namespace

Status CheckDataParallel(uint16_t prefill_dp, const ShardScheme& prefill, uint16_t decode_dp,
                         const ShardScheme& decode) {
  auto check = [](const char* side, uint16_t dp, const ShardScheme& scheme) -> Status {
    const std::string what = std::string(side) + " dp_size " + std::to_string(dp);
    if (dp == 0) return FailedPrecondition(what + ": must be at least 1");
    if (dp == 1) return OkStatus();
    if (scheme.tp_size != 1)
      return FailedPrecondition(what + " with tp_size " + std::to_string(scheme.tp_size) +
                                ": data-parallel ranks with tensor parallelism inside are not "
                                "supported");
    if (!scheme.replicated)
      return FailedPrecondition(what +
                                ": data-parallel ranks need a replicated (MLA latent) KV cache, "
                                "not " +
                                std::to_string(scheme.num_kv_heads) + " sharded KV heads");
    return OkStatus();
  };
  RETURN_IF_ERROR(check("prefill", prefill_dp, prefill));
  return check("decode", decode_dp, decode);
}

Status CheckCompatible(const KvFormat& ours, const KvFormat& theirs) {
  std::string diff;
  if (ours.model_hash != theirs.model_hash) {
    diff = "model fingerprint: ours " + std::to_string(ours.model_hash) + ", theirs " +
           std::to_string(theirs.model_hash) + " (not the same model)";
  }
  Differs(&diff, "num_layers", ours.num_layers, theirs.num_layers);
  if ((ours.latent_dim > 0) != (theirs.latent_dim > 0)) {
    DiffersNamed(&diff, "kv_cache", CacheKind(ours), CacheKind(theirs));
  } else {
    Differs(&diff, ours.latent_dim > 0 ? "latent_dim" : "head_dim", ours.head_dim, theirs.head_dim);
  }
  Differs(&diff, "page_size", ours.page_size, theirs.page_size);
  if (ours.layout != theirs.layout && ours.latent_dim == 0 && theirs.latent_dim == 0) {
    DiffersNamed(&diff, "kv_layout", LayoutName(ours.layout), LayoutName(theirs.layout));
  }
  if (ours.kv_dtype != theirs.kv_dtype) {
    DiffersNamed(&diff, "kv_dtype", DTypeName(ours.kv_dtype), DTypeName(theirs.kv_dtype));
  } else if (ours.kv_scales != theirs.kv_scales) {
    DiffersNamed(&diff, "kv_scales", ScalesText(ours.kv_scales), ScalesText(theirs.kv_scales));
  }
  if (ours.kv_checksum != theirs.kv_checksum) {
    DiffersNamed(&diff, "kv_checksum", ours.kv_checksum ? "on" : "off",
                 theirs.kv_checksum ? "on" : "off");
  }
  if (ours.speculative != theirs.speculative) {
    DiffersNamed(&diff, "speculative_config", ours.speculative.empty() ? "off" : ours.speculative,
                 theirs.speculative.empty() ? "off" : theirs.speculative);
  }
  const DraftKvFormat& a = ours.draft_kv;
  const DraftKvFormat& b = theirs.draft_kv;
  if ((a.num_layers > 0) != (b.num_layers > 0)) {
    DiffersNamed(&diff, "draft_kv", a.num_layers > 0 ? "a draft KV region" : "none",
                 b.num_layers > 0 ? "a draft KV region" : "none");
  } else if (a != b) {
    Differs(&diff, "draft_kv.num_layers", a.num_layers, b.num_layers);
    Differs(&diff, "draft_kv.head_dim", a.head_dim, b.head_dim);
    Differs(&diff, "draft_kv.num_kv_heads", a.num_kv_heads, b.num_kv_heads);
    Differs(&diff, "draft_kv.latent_dim", a.latent_dim, b.latent_dim);
    if (a.layout != b.layout)
      DiffersNamed(&diff, "draft_kv.layout", LayoutName(a.layout), LayoutName(b.layout));
    if (a.kv_dtype != b.kv_dtype) {
      DiffersNamed(&diff, "draft_kv.kv_dtype", DTypeName(a.kv_dtype), DTypeName(b.kv_dtype));
    } else if (a.kv_scales != b.kv_scales) {
      DiffersNamed(&diff, "draft_kv.kv_scales", ScalesText(a.kv_scales), ScalesText(b.kv_scales));
    }
  }
  if (diff.empty()) return OkStatus();
  return FailedPrecondition("KV format mismatch: " + diff);
}

Result<uint64_t> ExpectedWrites(const ShardScheme& prefill, const ShardScheme& decode,
                                uint32_t num_layers, uint32_t num_pages) {
  if (prefill.tp_size != 1 || decode.tp_size != 1) {
    return Unimplemented("KV transfers between tp_size " + std::to_string(prefill.tp_size) +
                         " and " + std::to_string(decode.tp_size) +
                         " need the shard planner (only TP 1 to TP 1 is supported)");
  }
  if (prefill.num_kv_heads != decode.num_kv_heads) {
    return FailedPrecondition("num_kv_heads differ: prefill " +
                              std::to_string(prefill.num_kv_heads) + ", decode " +
                              std::to_string(decode.num_kv_heads));
  }
  return uint64_t{num_layers} * num_pages;
}

ShardScheme MakeShardScheme(const model::ModelConfig& config, int tp_size) {
  ShardScheme s;
  s.tp_size = static_cast<uint16_t>(tp_size);
  if (config.is_mla()) {  // one latent row per token, the same on every rank
    s.num_kv_heads = 1;
    s.replicated = true;
    return s;
  }
  s.num_kv_heads = static_cast<uint16_t>(config.num_kv_heads);
  return s;
}

Result<ShardPlan> PlanTransfer(const ShardScheme& prefill, const ShardScheme& decode,
                               const KvFormat& format, uint64_t seed) {
  PageFormat f;
  f.head_dim = static_cast<int>(format.head_dim);
  f.page_size = static_cast<int>(format.page_size);
  f.layout = static_cast<engine::KvLayout>(format.layout);
  f.elem_bytes =
      static_cast<int>(engine::KvDTypeBytes(static_cast<engine::KvDType>(format.kv_dtype)));
  f.latent = format.latent_dim > 0;
  auto plan = ComputeShardPlan(ToShardSpec(prefill), ToShardSpec(decode), f, seed);
  if (!plan.ok()) {
    return FailedPrecondition("cannot pair prefill tp_size " + std::to_string(prefill.tp_size) +
                              " with decode tp_size " + std::to_string(decode.tp_size) + ": " +
                              plan.status().message());
  }
  return plan;
}

std::string DescribeKvCache(const KvFormat& format, const ShardScheme& scheme) {
  if (format.latent_dim > 0) {
    return "replicated MLA latent, latent_dim " + std::to_string(format.latent_dim);
  }
  return std::to_string(scheme.num_kv_heads) + " KV heads";
}

uint64_t KvBytesPerToken(const KvFormat& format, const ShardScheme& scheme) {
  const uint64_t elem = engine::KvDTypeBytes(static_cast<engine::KvDType>(format.kv_dtype));
  const uint64_t row = format.latent_dim > 0
                           ? uint64_t{format.latent_dim}
                           : 2ull * scheme.num_kv_heads * uint64_t{format.head_dim};
  uint64_t bytes = uint64_t{format.num_layers} * row * elem;
  if (format.draft_kv.num_layers > 0) {
    bytes += KvBytesPerToken(DraftRegionFormat(format), DraftScheme(format, scheme.tp_size));
  }
  return bytes;
}

Result<uint64_t> ExpectedWrites(const ShardScheme& prefill, const ShardScheme& decode,
                                const KvFormat& format, uint32_t num_pages, uint64_t seed) {
  ASSIGN_OR_RETURN(ShardPlan plan, PlanTransfer(prefill, decode, format, seed));
  uint64_t writes = ExpectedWrites(plan, num_pages, format.num_layers).total_writes;
  if (format.draft_kv.num_layers > 0) {
    ASSIGN_OR_RETURN(ShardPlan draft, PlanDraftTransfer(prefill, decode, format, seed));
    writes += ExpectedWrites(draft, num_pages, format.draft_kv.num_layers).total_writes;
  }
  return writes + (format.kv_checksum ? 1 : 0);  // the checksum record (kv_checksum.h)
}

Result<std::vector<transfer::MemoryRegion>> RegisterRankRegions(transfer::Domain& domain,
                                                                engine::ModelRunner& runner,
                                                                transfer::RegionAccess access) {
  std::vector<transfer::MemoryRegion> mrs;
  const int num_layers = runner.config().num_layers;
  for (int r = 0; r < runner.num_ranks(); ++r) {
    engine::KvRegion& region = runner.rank_region(r);
    const uint64_t kv_bytes =
        uint64_t{region.spec().page_bytes()} * num_layers * region.num_pages();
    ASSIGN_OR_RETURN(transfer::MemoryRegion mr,
                     domain.RegisterMemory(region.base(), kv_bytes, access));
    mrs.push_back(std::move(mr));
  }
  return mrs;
}

namespace {

// The state the fabric worker's message handler shares with the tasks it posts.
struct InboxState {
  ControlInbox inbox;
  std::atomic<size_t> queued{0};
  RateLimitedLog warnings{10.0};  // per reason

  void Warn(const std::string& key, const std::string& what) {
    PD_LOG_WARN_LIMITED(warnings, key, "{}: dropped a control message: {}", inbox.side, what);
  }

  // On the fabric worker: nothing reaches the messenger's queue unauthenticated.
  void OnBytes(std::string_view bytes, const std::shared_ptr<InboxState>& self) {
    auto frame = inbox.codec->Decode(bytes);
    if (!frame.ok()) {
      if (inbox.metrics != nullptr) inbox.metrics->Rejected();
      Warn(std::string(StatusCodeName(frame.status().code())), frame.status().ToString());
      return;
    }
    if (Status s = inbox.codec->CheckRecipient(*frame); !s.ok()) {
      if (inbox.metrics != nullptr) inbox.metrics->Replayed();
      Warn("recipient", s.ToString());
      return;
    }
    auto q = inbox.queue.lock();
    if (q == nullptr) return;
    if (queued.fetch_add(1) >= inbox.max_queued) {
      queued.fetch_sub(1);
      if (inbox.metrics != nullptr) inbox.metrics->QueueFull();
      Warn("queue", std::to_string(inbox.max_queued) + " messages already wait for the " +
                        inbox.side + " thread");
      return;
    }
    q->Post([self, f = std::move(frame).value()]() mutable {
      self->queued.fetch_sub(1);
      self->inbox.on_frame(std::move(f));
    });
  }
};

}  // namespace

Result<std::unique_ptr<transfer::Domain>> OpenMessengerDomain(transfer::DomainOptions options,
                                                              uint32_t max_message_bytes,
                                                              ControlInbox inbox) {
  if (max_message_bytes < kMinMessageBytes) {
    return InvalidArgument("control messages of " + std::to_string(max_message_bytes) +
                           " bytes at most: below the minimum of " +
                           std::to_string(kMinMessageBytes));
  }
  auto state = std::make_shared<InboxState>();
  state->inbox = std::move(inbox);
  options.on_message = [state](std::string_view m) { state->OnBytes(m, state); };
  options.message_bytes = max_message_bytes;
  return transfer::Domain::Create(options);
}

}  // namespace pd::messenger
