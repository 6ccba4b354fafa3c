#include "cluster/member.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>

#include <nlohmann/json.hpp>

#include "common/check.h"

namespace pd::cluster {
namespace {

using json = nlohmann::json;

std::string Hex(const unsigned char* data, size_t size) {
  static const char* kDigits = "0123456789abcdef";
  std::string out;
  for (size_t i = 0; i < size; ++i) {
    out += kDigits[data[i] >> 4];
    out += kDigits[data[i] & 15];
  }
  return out;
}

std::string Mac(const std::string& text, const std::string& secret) {
  unsigned char mac[32];
  size_t mac_len = 0;
  unsigned char* out = EVP_Q_mac(nullptr, "HMAC", nullptr, "SHA256", nullptr, secret.data(),
                                 secret.size(), reinterpret_cast<const unsigned char*>(text.data()),
                                 text.size(), mac, sizeof(mac), &mac_len);
  PD_CHECK(out != nullptr && mac_len == sizeof(mac)) << "HMAC-SHA256 failed";
  return Hex(mac, mac_len);
}

json ToJson(const Member& m) {
  return json{{"role", m.role},
              {"name", m.name},
              {"http_url", m.http_url},
              {"fabric_address", m.fabric_address},
              {"model_fingerprint", m.model_fingerprint},
              {"tensor_parallel_size", m.tensor_parallel_size},
              {"nics", m.nics}};
}

}  // namespace

std::string RolePrefix(const std::string& cluster, const std::string& role) {
  return "/pdserve/" + cluster + "/" + role + "/";
}

std::string MemberKey(const std::string& cluster, const Member& member) {
  return RolePrefix(cluster, member.role) + member.name;
}

std::string EncodeMember(const Member& member, const std::string& secret) {
  const std::string text = ToJson(member).dump();
  // The member as text, so the MAC covers exactly the bytes a reader checks.
  return json{{"member", text}, {"mac", Mac(text, secret)}}.dump();
}

Result<Member> DecodeMember(const std::string& value, const std::string& secret) {
  try {
    const json outer = json::parse(value);
    const std::string text = outer.at("member").get<std::string>();
    const std::string mac = outer.at("mac").get<std::string>();
    const std::string want = Mac(text, secret);
    if (mac.size() != want.size() || CRYPTO_memcmp(mac.data(), want.data(), want.size()) != 0) {
      return FailedPrecondition(
          "its MAC does not match: written with another cluster secret, or forged");
    }
    const json j = json::parse(text);
    Member m;
    m.role = j.at("role").get<std::string>();
    m.name = j.at("name").get<std::string>();
    m.http_url = j.at("http_url").get<std::string>();
    m.fabric_address = j.value("fabric_address", std::string());
    m.model_fingerprint = j.value("model_fingerprint", std::string());
    m.tensor_parallel_size = j.value("tensor_parallel_size", 1);
    m.nics = j.value("nics", std::vector<std::string>());
    return m;
  } catch (const std::exception& e) {
    return InvalidArgument(std::string("malformed member: ") + e.what());
  }
}

Status ValidateClusterName(const std::string& cluster) {
  if (cluster.empty() || cluster.size() > 63) {
    return InvalidArgument("--cluster must be 1 to 63 characters, got '" + cluster + "'");
  }
  for (char c : cluster) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_' && c != '.') {
      return InvalidArgument("--cluster '" + cluster + "': '" + std::string(1, c) +
                             "' is not a letter, digit, '-', '_' or '.'");
    }
  }
  return OkStatus();
}

}  // namespace pd::cluster
