// The cluster handshake's parts without a network: message encoding, proofs, and the rules a
// key file must meet.
#include "transport/handshake.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>

namespace gradsync::transport {
namespace {

ClusterKey key_of(std::string_view text) {
  return ClusterKey(std::vector<uint8_t>(text.begin(), text.end()));
}

Nonce nonce_of(uint8_t fill) {
  Nonce nonce{};
  nonce.fill(fill);
  return nonce;
}

TEST(HandshakeMessage, EveryTypeRoundTrips) {
  HandshakeMessage hello;
  hello.type = HandshakeType::kHello;
  hello.has_key = true;
  hello.client_nonce = nonce_of(1);
  hello.address = "198.18.0.2:9478";
  hello.version = "0.1.0";
  HandshakeMessage result;
  result.type = HandshakeType::kResult;
  result.client_nonce = nonce_of(2);
  result.reason = "the connecting daemon has no cluster key";
  HandshakeMessage challenge;
  challenge.type = HandshakeType::kChallenge;
  challenge.server_nonce = nonce_of(3);
  challenge.proof =
      key_of("sixteen bytes ok").prove(ClusterKey::Role::kServer, nonce_of(1), nonce_of(3), "x");
  HandshakeMessage goodbye;
  goodbye.type = HandshakeType::kGoodbye;
  for (const HandshakeMessage& message : {hello, result, challenge, goodbye}) {
    const auto decoded = decode_handshake(encode(message));
    ASSERT_TRUE(decoded.has_value());
    EXPECT_EQ(decoded->type, message.type);
    EXPECT_EQ(decoded->has_key, message.has_key);
    EXPECT_EQ(decoded->accepted, message.accepted);
    EXPECT_EQ(decoded->client_nonce, message.client_nonce);
    EXPECT_EQ(decoded->server_nonce, message.server_nonce);
    EXPECT_EQ(decoded->proof, message.proof);
    EXPECT_EQ(decoded->address, message.address);
    EXPECT_EQ(decoded->reason, message.reason);
    EXPECT_EQ(decoded->version, message.version);
  }
}

TEST(HandshakeMessage, MalformedInputIsRefused) {
  HandshakeMessage hello;
  hello.address = "127.0.0.1:1";
  const std::vector<uint8_t> good = encode(hello);
  ASSERT_TRUE(decode_handshake(good));
  auto altered = [&](auto change) {
    std::vector<uint8_t> bytes = good;
    change(bytes);
    return decode_handshake(bytes);
  };
  EXPECT_FALSE(decode_handshake({}));
  EXPECT_FALSE(altered([](auto& b) { b[0] = kHandshakeVersion + 1; })) << "version";
  EXPECT_FALSE(altered([](auto& b) { b[1] = 0; })) << "type";
  EXPECT_FALSE(altered([](auto& b) { b[1] = 8; })) << "type";
  EXPECT_FALSE(altered([](auto& b) { b[2] = 4; })) << "unknown flag";
  EXPECT_FALSE(altered([](auto& b) { b.pop_back(); })) << "truncated text";
  EXPECT_FALSE(altered([](auto& b) { b.push_back('x'); })) << "trailing bytes";
  EXPECT_FALSE(altered([](auto& b) { b.back() = '\n'; })) << "unprintable text goes to logs";
  EXPECT_FALSE(altered([](auto& b) { b.resize(50); })) << "shorter than the fixed part";
  constexpr size_t kVersionLength = 3 + 3 * 32;  // after the nonces and the proof
  EXPECT_FALSE(altered([](auto& b) { b[kVersionLength] = kMaxVersionText + 1; }))
      << "a version longer than the limit";
  EXPECT_FALSE(altered([](auto& b) { b[kVersionLength] = 60; })) << "a version past the end";
  // A length field claiming more text than the limit.
  EXPECT_FALSE(altered([&](auto& b) {
    const size_t at = b.size() - hello.address.size() - 2;
    b[at] = 0xff;
    b[at + 1] = 0xff;
  }));
}

TEST(ClusterKey, ProofsBindKeyRoleNoncesAndAddress) {
  const ClusterKey key = key_of("the cluster key of cluster one.");
  const Proof proof = key.prove(ClusterKey::Role::kClient, nonce_of(1), nonce_of(2), "a:1");
  EXPECT_TRUE(key.verify(proof, ClusterKey::Role::kClient, nonce_of(1), nonce_of(2), "a:1"));
  EXPECT_FALSE(key.verify(proof, ClusterKey::Role::kServer, nonce_of(1), nonce_of(2), "a:1"))
      << "a proof reflected back in the other role";
  EXPECT_FALSE(key.verify(proof, ClusterKey::Role::kClient, nonce_of(9), nonce_of(2), "a:1"));
  EXPECT_FALSE(key.verify(proof, ClusterKey::Role::kClient, nonce_of(1), nonce_of(9), "a:1"))
      << "a replay against a fresh server nonce";
  EXPECT_FALSE(key.verify(proof, ClusterKey::Role::kClient, nonce_of(1), nonce_of(2), "b:1"));
  EXPECT_FALSE(key_of("the cluster key of cluster two.")
                   .verify(proof, ClusterKey::Role::kClient, nonce_of(1), nonce_of(2), "a:1"));
  EXPECT_NE(random_nonce(), random_nonce());
}

class KeyFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/gradsync-key-XXXXXX";
    ASSERT_NE(::mkdtemp(pattern), nullptr);
    dir_ = pattern;
  }
  void TearDown() override { std::system(("rm -rf " + dir_).c_str()); }
  std::string write(const std::string& name, const std::string& content, mode_t mode) {
    std::string path = dir_ + "/" + name;
    std::ofstream(path) << content;
    ::chmod(path.c_str(), mode);
    return path;
  }
  static std::string refusal(const std::string& path) {
    try {
      ClusterKey::load(path);
    } catch (const std::runtime_error& e) {
      return e.what();
    }
    return "loaded";
  }
  std::string dir_;
};

TEST_F(KeyFileTest, AnOwnerOnlyFileLoadsWithoutItsTrailingNewline) {
  const std::string path = write("key", "0123456789abcdef0123456789abcdef\n", 0600);
  const ClusterKey loaded = ClusterKey::load(path);
  const Proof proof = loaded.prove(ClusterKey::Role::kServer, nonce_of(1), nonce_of(2), "a:1");
  EXPECT_TRUE(key_of("0123456789abcdef0123456789abcdef")
                  .verify(proof, ClusterKey::Role::kServer, nonce_of(1), nonce_of(2), "a:1"));
  EXPECT_EQ(refusal(write("read-only", "0123456789abcdef", 0400)), "loaded");
}

TEST_F(KeyFileTest, FilesOthersCouldReadOrChangeAreRefused) {
  EXPECT_THAT(
      refusal(write("group", "0123456789abcdef", 0640)),
      ::testing::AllOf(::testing::HasSubstr("mode 0640"), ::testing::HasSubstr("chmod 600")));
  EXPECT_THAT(refusal(write("world", "0123456789abcdef", 0604)), ::testing::HasSubstr("0604"));
  EXPECT_THAT(refusal(write("group-write", "0123456789abcdef", 0620)),
              ::testing::HasSubstr("0620"));
}

TEST_F(KeyFileTest, ShortMissingAndOddFilesAreRefused) {
  EXPECT_THAT(refusal(write("short", "too short\n", 0600)), ::testing::HasSubstr("too short"));
  EXPECT_THAT(refusal(dir_ + "/absent"), ::testing::HasSubstr("No such file"));
  const std::string target = write("target", "0123456789abcdef", 0600);
  ASSERT_EQ(::symlink(target.c_str(), (dir_ + "/link").c_str()), 0);
  EXPECT_NE(refusal(dir_ + "/link"), "loaded") << "a symbolic link is not followed";
  EXPECT_THAT(refusal(dir_), ::testing::HasSubstr("not a regular file"));
  EXPECT_THAT(refusal(write("huge", std::string(8192, 'k'), 0600)),
              ::testing::HasSubstr("too long"));
  EXPECT_THAT(refusal(write("blank", std::string(40, ' '), 0600)),
              ::testing::HasSubstr("too short"));
}

}  // namespace
}  // namespace gradsync::transport
