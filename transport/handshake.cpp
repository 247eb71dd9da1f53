#include "transport/handshake.h"

#include <fcntl.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <string_view>

namespace gradsync::transport {

ClusterKey::ClusterKey(std::vector<uint8_t> bytes) : bytes_(std::move(bytes)) {
  if (bytes_.size() < kMinBytes || bytes_.size() > kMaxBytes) {
    throw std::invalid_argument(fmt::format("a cluster key holds {} to {} bytes, not {}", kMinBytes,
                                            kMaxBytes, bytes_.size()));
  }
}

ClusterKey ClusterKey::load(const std::string& path) {
  auto fail = [&](const std::string& why) {
    return std::runtime_error(fmt::format("cluster key file {}: {}", path, why));
  };
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) throw fail(std::strerror(errno));
  struct stat status {};
  std::vector<uint8_t> bytes;
  std::string problem;
  if (::fstat(fd, &status) != 0) {
    problem = std::strerror(errno);
  } else if (!S_ISREG(status.st_mode)) {
    problem = "not a regular file";
  } else if (status.st_uid != ::geteuid()) {
    problem =
        fmt::format("owned by uid {}, not by the daemon's uid {}", status.st_uid, ::geteuid());
  } else if ((status.st_mode & 077) != 0) {
    problem = fmt::format("mode {:04o} lets others read or change it; chmod 600 it",
                          status.st_mode & 07777);
  } else if (status.st_size > static_cast<off_t>(kMaxBytes + 64)) {
    problem = fmt::format("{} bytes is too long for a key", status.st_size);
  } else {
    bytes.resize(static_cast<size_t>(status.st_size));
    const ssize_t got = ::read(fd, bytes.data(), bytes.size());
    if (got != static_cast<ssize_t>(bytes.size())) problem = "short read";
  }
  ::close(fd);
  if (!problem.empty()) throw fail(problem);
  while (!bytes.empty() && std::isspace(bytes.back()) != 0) bytes.pop_back();
  if (bytes.size() < kMinBytes) {
    throw fail(
        fmt::format("{} bytes is too short; a key needs at least {} (32 random bytes "
                    "recommended)",
                    bytes.size(), kMinBytes));
  }
  ClusterKey key(std::move(bytes));
  return key;
}

Proof ClusterKey::prove(Role role, const Nonce& client_nonce, const Nonce& server_nonce,
                        const std::string& client_address) const {
  std::vector<uint8_t> input;
  constexpr std::string_view kDomain = "gradsync cluster handshake v1";
  input.insert(input.end(), kDomain.begin(), kDomain.end());
  input.push_back(static_cast<uint8_t>(role));
  input.insert(input.end(), client_nonce.begin(), client_nonce.end());
  input.insert(input.end(), server_nonce.begin(), server_nonce.end());
  input.insert(input.end(), client_address.begin(), client_address.end());
  Proof proof{};
  unsigned int length = 0;
  if (HMAC(EVP_sha256(), bytes_.data(), static_cast<int>(bytes_.size()), input.data(), input.size(),
           proof.data(), &length) == nullptr ||
      length != proof.size()) {
    throw std::runtime_error("HMAC-SHA-256 failed");
  }
  return proof;
}

bool ClusterKey::verify(const Proof& proof, Role role, const Nonce& client_nonce,
                        const Nonce& server_nonce, const std::string& client_address) const {
  const Proof expected = prove(role, client_nonce, server_nonce, client_address);
  return CRYPTO_memcmp(expected.data(), proof.data(), proof.size()) == 0;
}

Nonce random_nonce() {
  Nonce nonce{};
  if (RAND_bytes(nonce.data(), static_cast<int>(nonce.size())) != 1) {
    throw std::runtime_error("RAND_bytes failed: no randomness for a handshake nonce");
  }
  return nonce;
}

// Layout: version, type, flags (1: has_key, 2: accepted), client nonce, server nonce, proof,
// the gradsync version's length (8 bits) and text, text length (16 bits, little end first),
// text (the address or the reason).
namespace {
constexpr size_t kFixedBytes = 3 + kNonceBytes + kNonceBytes + kProofBytes + 1 + 2;
constexpr uint8_t kHasKey = 1;
constexpr uint8_t kAccepted = 2;

// Text goes into logs: printable characters only.
bool printable(std::string_view text) {
  return std::all_of(text.begin(), text.end(),
                     [](unsigned char c) { return std::isprint(c) != 0; });
}
}  // namespace

std::vector<uint8_t> encode(const HandshakeMessage& message) {
  const std::string& text =
      message.type == HandshakeType::kHello ? message.address : message.reason;
  const size_t text_bytes = std::min(text.size(), kMaxHandshakeText);
  std::vector<uint8_t> bytes;
  bytes.reserve(kFixedBytes + text_bytes);
  bytes.push_back(kHandshakeVersion);
  bytes.push_back(static_cast<uint8_t>(message.type));
  bytes.push_back(
      static_cast<uint8_t>((message.has_key ? kHasKey : 0) | (message.accepted ? kAccepted : 0)));
  bytes.insert(bytes.end(), message.client_nonce.begin(), message.client_nonce.end());
  bytes.insert(bytes.end(), message.server_nonce.begin(), message.server_nonce.end());
  bytes.insert(bytes.end(), message.proof.begin(), message.proof.end());
  const size_t version_bytes = std::min(message.version.size(), kMaxVersionText);
  bytes.push_back(static_cast<uint8_t>(version_bytes));
  bytes.insert(bytes.end(), message.version.begin(),
               message.version.begin() + static_cast<ptrdiff_t>(version_bytes));
  bytes.push_back(static_cast<uint8_t>(text_bytes & 0xff));
  bytes.push_back(static_cast<uint8_t>(text_bytes >> 8));
  bytes.insert(bytes.end(), text.begin(), text.begin() + static_cast<ptrdiff_t>(text_bytes));
  return bytes;
}

std::optional<HandshakeMessage> decode_handshake(std::span<const uint8_t> bytes) {
  if (bytes.size() < kFixedBytes || bytes[0] != kHandshakeVersion) return std::nullopt;
  HandshakeMessage message;
  const uint8_t type = bytes[1];
  if (type < static_cast<uint8_t>(HandshakeType::kHello) ||
      type > static_cast<uint8_t>(HandshakeType::kGoodbye)) {
    return std::nullopt;
  }
  message.type = static_cast<HandshakeType>(type);
  const uint8_t flags = bytes[2];
  if ((flags & ~(kHasKey | kAccepted)) != 0) return std::nullopt;
  message.has_key = (flags & kHasKey) != 0;
  message.accepted = (flags & kAccepted) != 0;
  size_t at = 3;
  auto take = [&](auto& array) {
    std::copy_n(bytes.begin() + static_cast<ptrdiff_t>(at), array.size(), array.begin());
    at += array.size();
  };
  take(message.client_nonce);
  take(message.server_nonce);
  take(message.proof);
  const size_t version_bytes = bytes[at++];
  if (version_bytes > kMaxVersionText || bytes.size() < kFixedBytes + version_bytes) {
    return std::nullopt;
  }
  message.version.assign(reinterpret_cast<const char*>(bytes.data() + at), version_bytes);
  if (!printable(message.version)) return std::nullopt;  // it goes into logs
  at += version_bytes;
  const size_t text_bytes = bytes[at] | (size_t{bytes[at + 1]} << 8);
  at += 2;
  if (text_bytes > kMaxHandshakeText || bytes.size() != at + text_bytes) return std::nullopt;
  std::string text(reinterpret_cast<const char*>(bytes.data() + at), text_bytes);
  if (!printable(text)) return std::nullopt;  // it goes into logs
  (message.type == HandshakeType::kHello ? message.address : message.reason) = std::move(text);
  return message;
}

}  // namespace gradsync::transport
