// What a prefill and a decode instance must agree on before any KV moves, and how many writes a
// transfer takes.
//
//   KvFormat mine = MakeKvFormat(ModelFingerprint(weights), runner.region().spec());
//   Status ok = CheckCompatible(mine, hello.format);   // a clear reason when they differ
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "engine/kv_cache.h"
#include "engine/model_runner.h"
#include "engine/spec_decode.h"
#include "messenger/channel.h"
#include "messenger/shard_plan.h"
#include "messenger/transfer_metrics.h"
#include "messenger/wire.h"
#include "model/config.h"
#include "model/weights.h"
#include "transfer/domain.h"

namespace pd::messenger {

// A hash of the config (as config.json would say it) and of every tensor's name, shape and the
// checkpoint dtype: two instances with equal fingerprints run the same architecture. (Weights'
// values are not hashed: reading them all would cost a pass over the checkpoint.)
uint64_t ModelFingerprint(const model::ModelConfig& config, model::DType weights_dtype);
uint64_t ModelFingerprint(const model::ModelWeights& weights);

// `kv_checksum`: --kv-checksum (kv_checksum.h); `speculative`: SpeculativeIdentity; `draft_kv`:
// MakeDraftKvFormat.
KvFormat MakeKvFormat(uint64_t model_hash, const engine::KvCacheSpec& spec,
                      bool kv_checksum = false, std::string speculative = "",
                      DraftKvFormat draft_kv = {});

// Whether a messenger can move `draft_kv`'s region (DisaggHooks::DraftKvRunner; null: none) with
// `runner`'s: the same page_size, pages and ranks, and no data-parallel ranks. FailedPrecondition
// naming what differs.
Status CheckDraftKvRunner(engine::ModelRunner& runner, engine::ModelRunner* draft_kv);
// The drafter's KV region of `draft_kv` (null: none) as the handshake describes it.
DraftKvFormat MakeDraftKvFormat(engine::ModelRunner* draft_kv);
// The draft region of `format` as a KvFormat of its own (its layers, heads, page_size and dtype;
// no checksum, no speculative), for PlanTransfer and KvBytesPerToken.
KvFormat DraftRegionFormat(const KvFormat& format);
// A side's scheme for the draft region: its tp_size over the drafter's heads (replicated for a
// latent cache).
ShardScheme DraftScheme(const KvFormat& format, uint16_t tp_size);
// PlanTransfer for the draft region between the two sides' (target) schemes.
Result<ShardPlan> PlanDraftTransfer(const ShardScheme& prefill, const ShardScheme& decode,
                                    const KvFormat& format, uint64_t seed);

// What the handshake compares of --speculative-config: "" when off, else the method, K and, for
// "draft_model" and "mtp", `draft_fingerprint` (the draft checkpoint's ModelFingerprint, or for MTP
// the target's, whose checkpoint holds the MTP layers) in hex: "ngram k=3",
// "draft_model k=4 draft=0123456789abcdef". The n-gram lookup bounds are decode's own business.
std::string SpeculativeIdentity(const engine::SpeculativeConfig& config,
                                uint64_t draft_fingerprint = 0);

// The drafter's fingerprint SpeculativeIdentity takes: for a draft model, its config and tensor
// shapes (the config's torch_dtype stands for its weights' dtype); for MTP, `target_fingerprint`
// (its checkpoint holds the MTP layers); 0 for ngram (no drafter model). An unreadable draft
// config is an error naming --speculative-config.
Result<uint64_t> DraftFingerprint(const engine::SpeculativeConfig& config,
                                  uint64_t target_fingerprint);

// OK when both sides can exchange KV pages; otherwise FailedPrecondition naming every field that
// differs with both values, e.g. "page_size: ours 16, theirs 8".
Status CheckCompatible(const KvFormat& ours, const KvFormat& theirs);

// Whether a prefill instance of `prefill_dp` data-parallel ranks (the dp_size of its HelloReply)
// with scheme `prefill` can send KV to a decode instance of `decode_dp` ranks with scheme `decode`.
// A DP instance's ranks each hold a whole MLA latent (a replicated scheme of TP 1), on either
// side. OK, or FailedPrecondition naming the side's dp_size and why, e.g. "decode dp_size 2 with
// tp_size 2: ...".
Status CheckDataParallel(uint16_t prefill_dp, const ShardScheme& prefill, uint16_t decode_dp,
                         const ShardScheme& decode);

// How a transfer's writes are counted: every KV page write carries the request's transfer_imm and
// the decode side's KV counter expects exactly ExpectedWrites(...) of them; the one metadata write
// (the last prefilled position's hidden state) carries metadata_imm and is counted apart, so the
// request decodes once its KV has landed, without waiting for the metadata (which the prefill can
// post only after its step's last MLP and final norm).
//
// KV writes the decode side must count for one transfer of `num_pages` pages (the prompt without
// its last token) between two TP 1 schemes: one write per page per layer (the metadata write is
// not included); other schemes are Unimplemented here (they need the page format: use the
// KvFormat overload below, which the messengers use).
Result<uint64_t> ExpectedWrites(const ShardScheme& prefill, const ShardScheme& decode,
                                uint32_t num_layers, uint32_t num_pages);

// An instance's scheme: the engine's rule (replicated KV heads when tp_size > KV heads); an MLA
// model's latent cache is one "head" every rank holds whole (replicated).
ShardScheme MakeShardScheme(const model::ModelConfig& config, int tp_size);

// Where a messenger's control messages go. On the fabric worker each is decoded (header, limits,
// MAC, body) and checked to be meant for our session; one that fails is dropped, counted in
// `metrics` (rejected; replayed too when meant for another session) and logged at most every
// 10 s per reason. Those that pass are posted to `queue` (while it lives) and handed to
// `on_frame` on the queue's thread; beyond `max_queued` waiting there, further ones are dropped
// and counted (queue_full) with a rate-limited warning.
struct ControlInbox {
  std::shared_ptr<const FrameCodec> codec;
  std::weak_ptr<TaskQueue> queue;
  std::function<void(Frame)> on_frame;
  TransferMetrics* metrics = nullptr;  // borrowed, outlives the domain
  std::string side;                    // "prefill messenger", for the log
  size_t max_queued = 1024;
};

// Opens a messenger's fabric domain that receives control messages of up to `max_message_bytes`
// (at least kMinMessageBytes) into `inbox`.
Result<std::unique_ptr<transfer::Domain>> OpenMessengerDomain(transfer::DomainOptions options,
                                                              uint32_t max_message_bytes,
                                                              ControlInbox inbox);

// Registers every rank's KV region with `domain`, each exactly its pages (KvRegion rounds up; the
// prefill side reads a decode rank's page count from the registered length). Index = rank.
// `access`: kRemoteWrite on the decode side (peers write into it), kLocalSource on the prefill
// side (the source of our writes).
Result<std::vector<transfer::MemoryRegion>> RegisterRankRegions(transfer::Domain& domain,
                                                                engine::ModelRunner& runner,
                                                                transfer::RegionAccess access);

// The shard plan of one transfer between the two schemes on the agreed format, with `seed` (the
// wire request id) choosing source replicas. FailedPrecondition saying why when the schemes cannot
// be paired (KV heads differ, a TP size that does not divide or is not a multiple of the heads).
Result<ShardPlan> PlanTransfer(const ShardScheme& prefill, const ShardScheme& decode,
                               const KvFormat& format, uint64_t seed);

// KV writes the decode side counts for one transfer of `num_pages` pages between any two schemes:
// the planner's runs, one write per (run, layer, page), the same for the draft region's when the
// format has one (PlanDraftTransfer), plus the checksum write under format.kv_checksum
// (kv_checksum.h); the metadata write is counted apart.
Result<uint64_t> ExpectedWrites(const ShardScheme& prefill, const ShardScheme& decode,
                                const KvFormat& format, uint32_t num_pages, uint64_t seed);

// The bytes one token's KV takes over every layer in one whole copy: num_layers x (latent_dim, or
// 2 x num_kv_heads x head_dim) x the KV dtype's size; plus the draft region's likewise.
uint64_t KvBytesPerToken(const KvFormat& format, const ShardScheme& scheme);

// "2 KV heads", or "replicated MLA latent, latent_dim 36" for logs.
std::string DescribeKvCache(const KvFormat& format, const ShardScheme& scheme);

// Decode pages a prompt of `num_prefill_tokens` tokens occupies on the wire.
inline uint32_t PagesForTokens(uint32_t num_prefill_tokens, uint32_t page_size) {
  return (num_prefill_tokens + page_size - 1) / page_size;
}

}  // namespace pd::messenger
