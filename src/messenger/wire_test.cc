#include "messenger/wire.h"

#include <gtest/gtest.h>

#include <random>

#include "messenger/byte_io.h"

namespace pd::messenger {
namespace {

const std::string kSecret = "cluster-secret";

PrefillRequest SampleRequest() {
  PrefillRequest m;
  m.request_id = 42;
  m.transfer_imm = 0xabcd;
  m.num_tokens = 6;
  m.num_pages = 3;
  m.token_ids = {1, 2, 3, 500};
  m.decode_scheme = {2, 8};
  m.rank_regions = {"region-rank-0", "region-rank-1"};
  m.dst_pages = {7, 3, 9};
  m.metadata_region = "meta";
  m.metadata_offset = 4096;
  m.metadata_bytes = 256;
  m.deadline_ms = 5000;
  m.metadata_imm = 0xabce;
  m.first_page = 1;
  m.nic_regions = {"nic1-rank-0", "nic1-rank-1"};
  return m;
}

TEST(WireTest, RoundTripsEveryMessage) {
  Hello hello{"prefill-0", {0x1234, 28, 128, 16, 1, 0}, {4, 8}, "fi-addr", "to-addr", 8192, {}};
  HelloReply reply{false, "page size differs", "decode-1", {1, 2, 3, 4, 0, 1}, {1, 1}, "x", 5000,
                   {}};
  PrefillDone done{42, static_cast<uint16_t>(StatusCode::kUnavailable), "peer gone", 17};
  PromptChunk chunk{42, 4, {6, 7}, 1, {5, 6}};
  hello.nic_addresses = {"nic-1", "nic-2"};
  reply.nic_addresses = {"nic-1"};
  std::vector<Message> messages = {hello,      reply, SampleRequest(), done,
                                   Cancel{99}, chunk, Reroute{42, 1},  RerouteReply{42, 0xabcf}};
  uint64_t seq = 1;
  for (const auto& message : messages) {
    auto bytes = EncodeFrame({7, 9, seq, message}, kSecret);
    auto decoded = DecodeFrame(bytes.data(), bytes.size(), kSecret);
    ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
    EXPECT_EQ(decoded->sender_seq, seq);
    EXPECT_EQ(decoded->sender_session, 7u);
    EXPECT_EQ(decoded->recipient_session, 9u);
    EXPECT_EQ(decoded->message.index(), message.index());
    // Re-encoding the decoded message gives the same bytes: every field survived.
    EXPECT_EQ(EncodeFrame(*decoded, kSecret), bytes);
    ++seq;
  }
  auto bytes = EncodeFrame({7, 9, 1, SampleRequest()}, kSecret);
  auto decoded = DecodeFrame(bytes.data(), bytes.size(), kSecret);
  const auto& req = std::get<PrefillRequest>(decoded->message);
  EXPECT_EQ(req.token_ids, (std::vector<int32_t>{1, 2, 3, 500}));
  EXPECT_EQ(req.rank_regions[1], "region-rank-1");
  EXPECT_EQ(req.metadata_offset, 4096u);
  EXPECT_EQ(req.metadata_imm, 0xabceu);
  EXPECT_EQ(req.num_tokens, 6u);
  EXPECT_EQ(req.num_pages, 3u);
  EXPECT_EQ(req.first_page, 1u);
  EXPECT_EQ(req.nic_regions[1], "nic1-rank-1");
}

// Several NICs: a request's further-NIC regions come in whole sets of decode ranks, a Hello names
// at most kMaxNics - 1 further NICs, and a Reroute names a NIC below kMaxNics.
TEST(WireTest, NicFieldsAreBounded) {
  auto refused = [](const Message& m, const std::string& what) {
    auto bytes = EncodeFrame({7, 9, 1, m}, kSecret);
    auto decoded = DecodeFrame(bytes.data(), bytes.size(), kSecret);
    ASSERT_FALSE(decoded.ok()) << what;
    EXPECT_NE(decoded.status().message().find(what), std::string::npos)
        << decoded.status().ToString();
  };
  PrefillRequest r = SampleRequest();
  r.nic_regions = {"one"};  // tp_size 2
  refused(r, "not a multiple of the decode tp_size");
  Hello hello;
  hello.nic_addresses.assign(kMaxNics, "nic");
  refused(hello, "above the limit");
  refused(Reroute{1, static_cast<uint16_t>(kMaxNics)}, "nic 16 unknown");
}

// The totals bound the first ids; a chunk's offsets stay within the wire limits; the handshake
// announces at least kMinMessageBytes.
TEST(WireTest, PromptTotalsAndChunkOffsetsAreBounded) {
  auto refused = [](const Message& m, const std::string& what) {
    auto bytes = EncodeFrame({7, 9, 1, m}, kSecret);
    auto decoded = DecodeFrame(bytes.data(), bytes.size(), kSecret);
    ASSERT_FALSE(decoded.ok()) << what;
    EXPECT_NE(decoded.status().message().find(what), std::string::npos)
        << decoded.status().ToString();
  };
  PrefillRequest r = SampleRequest();
  r.num_tokens = 3;  // fewer than the 4 ids it carries
  refused(r, "token_ids");
  r = SampleRequest();
  r.num_pages = 2;
  refused(r, "dst_pages");
  r = SampleRequest();
  r.num_tokens = kMaxPromptTokens + 1;
  refused(r, "above the limits");
  refused(PromptChunk{1, static_cast<uint32_t>(kMaxPromptTokens), {1}, 0, {}}, "beyond the limits");
  refused(PromptChunk{1, 0, {}, static_cast<uint32_t>(kMaxPages), {1}}, "beyond the limits");
  refused(PromptChunk{1, 0, {}, 0, {-1}}, "negative page");
  Hello small{"p", {}, {1, 1}, "a", "b", kMinMessageBytes - 1, {}};
  refused(small, "max_message_bytes");
  r = SampleRequest();
  r.first_page = r.num_pages;  // the decode side holds every page: nothing to write
  refused(r, "first_page 3 is not below num_pages 3");
  // A prompt of the longest contexts models accept fits the wire limits.
  EXPECT_GE(kMaxPromptTokens, 131072u * 4);
}

// Data-parallel shape: Hello and HelloReply say how many DP ranks their sender has (1..64), a
// PrefillRequest which DP rank it writes (below 64; the prefill side checks it against the Hello).
TEST(WireTest, DpSizeAndDpRankRoundTripAndAreBounded) {
  Hello hello{"d", {1, 2, 3, 4, 0, 0}, {1, 1, true}, "a", "b", kDefaultMessageBytes, {}, 4};
  HelloReply reply{true, "", "p", {1, 2, 3, 4, 0, 0}, {2, 1, true}, "a", kDefaultMessageBytes, {}};
  PrefillRequest r = SampleRequest();
  r.decode_scheme = {1, 1, true};
  r.rank_regions = {"dp-rank-3"};
  r.nic_regions = {"nic1-dp-rank-3"};
  r.dp_rank = 3;
  auto round_trip = [](const Message& m) {
    auto bytes = EncodeFrame({7, 9, 1, m}, kSecret);
    auto decoded = DecodeFrame(bytes.data(), bytes.size(), kSecret);
    EXPECT_TRUE(decoded.ok()) << decoded.status().ToString();
    return decoded.ok() ? decoded->message : Message(Cancel{});
  };
  EXPECT_EQ(std::get<Hello>(round_trip(hello)).dp_size, 4);
  EXPECT_EQ(std::get<HelloReply>(round_trip(reply)).dp_size, 1);  // the default: no DP ranks
  EXPECT_EQ(std::get<PrefillRequest>(round_trip(r)).dp_rank, 3);
  auto refused = [](const Message& m, const std::string& what) {
    auto bytes = EncodeFrame({7, 9, 1, m}, kSecret);
    auto decoded = DecodeFrame(bytes.data(), bytes.size(), kSecret);
    ASSERT_FALSE(decoded.ok()) << what;
    EXPECT_NE(decoded.status().message().find(what), std::string::npos)
        << decoded.status().ToString();
  };
  hello.dp_size = 0;
  refused(hello, "dp_size 0 is not in [1, 64]");
  reply.dp_size = kMaxRanks + 1;
  refused(reply, "dp_size 65 is not in [1, 64]");
  r.dp_rank = kMaxRanks;
  refused(r, "dp_rank 64 is not below the limit of 64 ranks");
}

TEST(WireTest, TheReplicatedFlagRoundTripsAndOnlyZeroOrOneIsAccepted) {
  Hello hello{"p", {1, 2, 3, 4, 0, 0}, {4, 1, true}, "a", "b", kDefaultMessageBytes, {}};
  auto bytes = EncodeFrame({7, 9, 1, hello}, kSecret);
  auto decoded = DecodeFrame(bytes.data(), bytes.size(), kSecret);
  ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
  EXPECT_EQ(std::get<Hello>(decoded->message).scheme, (ShardScheme{4, 1, true}));
  // The flag byte follows tp_size and num_kv_heads: the body is instance_name (u32 length + 1
  // byte), format (8 + 4 + 4 + 4 + 1 + 1 + 1 + 4 + 8, then speculative: u32 length + 0 bytes,
  // then draft_kv: 4 + 4 + 2 + 4 + 1 + 1 + 8), then the scheme.
  const size_t flag = kFrameHeaderBytes + 5 + 35 + 4 + 24 + 4;
  ASSERT_EQ(bytes[flag], 1);
  bytes[flag] = 2;
  // Re-sign the tampered frame so the body check, not the MAC, is what refuses it.
  auto mac = HmacSha256(kSecret, bytes.data(), bytes.size() - kMacBytes);
  std::copy(mac.begin(), mac.end(), bytes.end() - kMacBytes);
  decoded = DecodeFrame(bytes.data(), bytes.size(), kSecret);
  ASSERT_FALSE(decoded.ok());
  EXPECT_NE(decoded.status().message().find("replicated flag 2"), std::string::npos)
      << decoded.status().ToString();
}

TEST(WireTest, TheLatentDimRoundTripsAndMustEqualTheHeadDim) {
  KvFormat f{1, 2, 36, 16, 0, 0, 0, 36};  // an MLA latent of 36 values per token
  Hello hello{"p", f, {2, 1, true}, "a", "b", kDefaultMessageBytes, {}};
  auto bytes = EncodeFrame({7, 9, 1, hello}, kSecret);
  auto decoded = DecodeFrame(bytes.data(), bytes.size(), kSecret);
  ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
  EXPECT_EQ(std::get<Hello>(decoded->message).format, f);
  hello.format.latent_dim = 40;
  bytes = EncodeFrame({7, 9, 2, hello}, kSecret);
  decoded = DecodeFrame(bytes.data(), bytes.size(), kSecret);
  ASSERT_FALSE(decoded.ok());
  EXPECT_NE(decoded.status().message().find("format.latent_dim 40 differs from format.head_dim 36"),
            std::string::npos)
      << decoded.status().ToString();
}

TEST(WireTest, AnFp8DtypeAndItsScalesRoundTripAndUnknownDtypesAreRefused) {
  KvFormat f{1, 2, 36, 16, 0, 2, 0, 0, 0x0123456789abcdefull};  // fp8_e4m3 and its scales
  Hello hello{"p", f, {1, 2}, "a", "b", kDefaultMessageBytes, {}};
  auto bytes = EncodeFrame({7, 9, 1, hello}, kSecret);
  auto decoded = DecodeFrame(bytes.data(), bytes.size(), kSecret);
  ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
  EXPECT_EQ(std::get<Hello>(decoded->message).format, f);
  hello.format.kv_dtype = 3;
  bytes = EncodeFrame({7, 9, 2, hello}, kSecret);
  decoded = DecodeFrame(bytes.data(), bytes.size(), kSecret);
  ASSERT_FALSE(decoded.ok());
  EXPECT_NE(decoded.status().message().find("format.kv_dtype 3 unknown"), std::string::npos)
      << decoded.status().ToString();
}

TEST(WireTest, TheSpeculativeIdentityRoundTripsAndIsBounded) {
  KvFormat f{1, 2, 36, 16, 0, 0};
  f.speculative = "draft_model k=4 draft=0123456789abcdef";
  HelloReply reply{true, "", "d", f, {1, 2}, "a", kDefaultMessageBytes, {}};
  auto bytes = EncodeFrame({7, 9, 1, reply}, kSecret);
  auto decoded = DecodeFrame(bytes.data(), bytes.size(), kSecret);
  ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
  EXPECT_EQ(std::get<HelloReply>(decoded->message).format.speculative, f.speculative);
  reply.format.speculative.assign(kMaxStringBytes + 1, 'k');
  bytes = EncodeFrame({7, 9, 2, reply}, kSecret);
  decoded = DecodeFrame(bytes.data(), bytes.size(), kSecret);
  ASSERT_FALSE(decoded.ok());
  EXPECT_NE(decoded.status().message().find("format.speculative"), std::string::npos)
      << decoded.status().ToString();
}

TEST(WireTest, WrongSecretIsRefused) {
  auto bytes = EncodeFrame({7, 9, 1, Cancel{1}}, kSecret);
  auto decoded = DecodeFrame(bytes.data(), bytes.size(), "other-secret");
  ASSERT_FALSE(decoded.ok());
  EXPECT_NE(decoded.status().message().find("authentication failed"), std::string::npos);
}

TEST(WireTest, EveryTruncationIsAnErrorNotACrash) {
  auto bytes = EncodeFrame({7, 9, 1, SampleRequest()}, kSecret);
  for (size_t len = 0; len < bytes.size(); ++len) {
    auto decoded = DecodeFrame(bytes.data(), len, kSecret);
    EXPECT_FALSE(decoded.ok()) << "length " << len;
  }
}

TEST(WireTest, BitFlipsAreCaughtByTheMac) {
  auto bytes = EncodeFrame({7, 9, 1, SampleRequest()}, kSecret);
  for (size_t i = 0; i < bytes.size(); ++i) {
    auto copy = bytes;
    copy[i] ^= 0x10;
    EXPECT_FALSE(DecodeFrame(copy.data(), copy.size(), kSecret).ok()) << "byte " << i;
  }
}

// A peer that knows the secret but sends nonsense: every field is still bounds-checked.
TEST(WireTest, MalformedBodiesWithValidMacAreRejected) {
  PrefillRequest bad_regions = SampleRequest();
  bad_regions.rank_regions.push_back("extra");
  auto bytes = EncodeFrame({7, 9, 1, bad_regions}, kSecret);
  auto decoded = DecodeFrame(bytes.data(), bytes.size(), kSecret);
  ASSERT_FALSE(decoded.ok());
  EXPECT_NE(decoded.status().message().find("rank_regions"), std::string::npos);

  PrefillRequest negative_page = SampleRequest();
  negative_page.dst_pages[1] = -4;
  bytes = EncodeFrame({7, 9, 1, negative_page}, kSecret);
  decoded = DecodeFrame(bytes.data(), bytes.size(), kSecret);
  ASSERT_FALSE(decoded.ok());
  EXPECT_NE(decoded.status().message().find("negative page"), std::string::npos);

  Hello zero_tp{"p", {}, {0, 8}, "", "", kDefaultMessageBytes, {}};
  bytes = EncodeFrame({7, 9, 1, zero_tp}, kSecret);
  EXPECT_FALSE(DecodeFrame(bytes.data(), bytes.size(), kSecret).ok());
}

// UBSan under fuzz/wire_fuzz (corpus/wire/regress_empty_array): a zero-length array was copied
// with memcpy into an empty vector's data(), which may be null.
TEST(WireTest, EmptyArraysDecode) {
  ByteWriter writer;
  writer.PutArray(std::vector<int32_t>{});
  writer.Put<uint8_t>(7);
  ByteReader reader(writer.bytes().data(), writer.bytes().size());
  std::vector<int32_t> ids = {1, 2};
  ASSERT_TRUE(reader.GetArray("ids", 8, &ids).ok());
  EXPECT_TRUE(ids.empty());
  uint8_t tail = 0;
  ASSERT_TRUE(reader.Get("tail", &tail).ok());
  EXPECT_EQ(tail, 7);
  EXPECT_TRUE(reader.ExpectEnd("test").ok());
}

TEST(WireTest, RandomGarbageNeverDecodes) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 2000; ++trial) {
    std::vector<uint8_t> junk(rng() % 200);
    for (auto& b : junk) b = static_cast<uint8_t>(rng());
    EXPECT_FALSE(DecodeFrame(junk.data(), junk.size(), kSecret).ok());
  }
}

TEST(WireTest, VersionMismatchIsNamed) {
  auto bytes = EncodeFrame({7, 9, 1, Cancel{1}}, kSecret);
  bytes[4] = 10;  // version low byte
  auto decoded = DecodeFrame(bytes.data(), bytes.size(), kSecret);
  ASSERT_FALSE(decoded.ok());
  EXPECT_NE(decoded.status().message().find("version 10"), std::string::npos);
  // A peer of the previous version (no draft KV region) is refused saying both versions.
  bytes[4] = static_cast<uint8_t>(kWireVersion - 1);
  decoded = DecodeFrame(bytes.data(), bytes.size(), kSecret);
  ASSERT_FALSE(decoded.ok());
  EXPECT_NE(decoded.status().message().find("version " + std::to_string(kWireVersion - 1) +
                                            " is not supported (this build speaks " +
                                            std::to_string(kWireVersion) + ")"),
            std::string::npos)
      << decoded.status().ToString();
}

}  // namespace
}  // namespace pd::messenger
