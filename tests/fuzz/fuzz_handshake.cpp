// The cluster handshake's messages, as a peer (or anyone who reaches the inter-node port)
// sends them: anything decodes or is refused, what decodes encodes back to the same bytes, and
// checking a decoded proof never fails on its contents.
#include "tests/fuzz/fuzz_target.h"
#include "transport/handshake.h"

#include <string>
#include <vector>

namespace {

const gradsync::transport::ClusterKey& fuzz_key() {
  static const gradsync::transport::ClusterKey key(
      std::vector<uint8_t>(32, static_cast<uint8_t>('k')));
  return key;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace gradsync::transport;
  const std::optional<HandshakeMessage> message = decode_handshake({data, size});
  if (!message) return 0;
  if (encode(*message) != std::vector<uint8_t>(data, data + size)) {
    gradsync::fuzz::violated("a decoded handshake message encodes to other bytes");
  }
  if (message->address.size() > kMaxHandshakeText || message->reason.size() > kMaxHandshakeText) {
    gradsync::fuzz::violated("a decoded handshake message holds more text than the limit");
  }
  (void)fuzz_key().verify(message->proof, ClusterKey::Role::kClient, message->client_nonce,
                          message->server_nonce, message->address);
  return 0;
}

namespace gradsync::fuzz {

std::vector<std::vector<uint8_t>> seeds() {
  using namespace transport;
  HandshakeMessage hello;
  hello.type = HandshakeType::kHello;
  hello.has_key = true;
  hello.client_nonce.fill(1);
  hello.address = "198.18.0.2:9478";
  HandshakeMessage challenge;
  challenge.type = HandshakeType::kChallenge;
  challenge.client_nonce.fill(1);
  challenge.server_nonce.fill(2);
  challenge.proof = fuzz_key().prove(ClusterKey::Role::kServer, challenge.client_nonce,
                                     challenge.server_nonce, hello.address);
  HandshakeMessage proof = challenge;
  proof.type = HandshakeType::kProof;
  HandshakeMessage refused;
  refused.type = HandshakeType::kResult;
  refused.reason = "the connecting daemon has no cluster key, and this one requires it";
  HandshakeMessage accepted;
  accepted.type = HandshakeType::kResult;
  accepted.accepted = true;
  return {encode(hello), encode(challenge), encode(proof), encode(refused), encode(accepted)};
}

}  // namespace gradsync::fuzz
