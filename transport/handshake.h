// Cluster authentication between node daemons: the cluster key, and the messages and proofs of
// the challenge-response each connection runs before it carries any job traffic.
//
// Every connection between two daemons is authenticated on its own, mutually:
//   client -> server  Hello      {has_key, client nonce, the client's listen address, its
//                                 gradsync version: daemons of another version are refused}
//   server -> client  Challenge  {server nonce, server proof}  (both hold a key)
//   client -> server  Proof      {client proof}
//   server -> client  Result     {accepted, or refused with a reason}
// A proof is HMAC-SHA-256 under the cluster key of the role, both nonces and the client's
// address: fresh nonces on both sides defeat replays, the role defeats reflecting a peer's own
// proof back at it, and the address binds the client's claim of who it is. Daemons without a
// key skip the challenge and accept only each other; a daemon with a key refuses one without.
//
// This authenticates daemons, not each message: UCX's tag matching does not say which
// connection a message arrived on. A daemon that fails the handshake is disconnected and never
// sent job traffic; a program that can forge traffic on the cluster network is outside what the
// key defends against (as for any unencrypted fabric).
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace gradsync::transport {

inline constexpr size_t kNonceBytes = 32;
inline constexpr size_t kProofBytes = 32;  // HMAC-SHA-256
using Nonce = std::array<uint8_t, kNonceBytes>;
using Proof = std::array<uint8_t, kProofBytes>;

class ClusterKey {
 public:
  static constexpr size_t kMinBytes = 16;
  static constexpr size_t kMaxBytes = 4096;

  // The key in `path`: its bytes less trailing whitespace (so that `openssl rand -hex 32 >
  // key` works). Throws std::runtime_error naming the file when it cannot be read, is not a
  // regular file, is not owned by this process's user, can be read or written by anyone else
  // (any group or other permission bit), or holds fewer than kMinBytes or more than kMaxBytes.
  static ClusterKey load(const std::string& path);
  explicit ClusterKey(std::vector<uint8_t> bytes);

  enum class Role : uint8_t { kServer = 1, kClient = 2 };
  Proof prove(Role role, const Nonce& client_nonce, const Nonce& server_nonce,
              const std::string& client_address) const;
  // In constant time.
  bool verify(const Proof& proof, Role role, const Nonce& client_nonce, const Nonce& server_nonce,
              const std::string& client_address) const;

 private:
  std::vector<uint8_t> bytes_;
};

Nonce random_nonce();  // from the operating system's CSPRNG (OpenSSL RAND_bytes)

// Ping and Pong (a nonce in client_nonce) check that an accepted connection still carries
// messages both ways: see Mesh::check_alive. Goodbye goes from a daemon that shuts down to
// each daemon connected to it, on that daemon's own connection: the peer fails our part of its
// jobs at once, and says so, instead of waiting for the connection to break.
enum class HandshakeType : uint8_t {
  kHello = 1,
  kChallenge = 2,
  kProof = 3,
  kResult = 4,
  kPing = 5,
  kPong = 6,
  kGoodbye = 7,
};

// One message of the handshake. Fields a type does not use stay empty.
struct HandshakeMessage {
  HandshakeType type = HandshakeType::kHello;
  bool has_key = false;   // Hello
  Nonce client_nonce{};   // every type: it names the handshake on the client's side
  Nonce server_nonce{};   // Challenge
  Proof proof{};          // Challenge (server's), Proof (client's)
  std::string address;    // Hello: the client's listen address
  std::string version;    // Hello: the client's gradsync version (GRADSYNC_VERSION)
  bool accepted = false;  // Result
  std::string reason;     // Result, when refused
};

inline constexpr uint8_t kHandshakeVersion = 2;
inline constexpr size_t kMaxHandshakeText = 256;  // address and reason
inline constexpr size_t kMaxVersionText = 64;

std::vector<uint8_t> encode(const HandshakeMessage& message);
// nullopt for anything malformed: wrong version, unknown type, wrong length, text too long.
std::optional<HandshakeMessage> decode_handshake(std::span<const uint8_t> bytes);

}  // namespace gradsync::transport
