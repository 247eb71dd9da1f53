#include "tools/transport_bench/transfers.h"

#include "ipc/system.h"

#include <fmt/core.h>

#include <algorithm>
#include <deque>
#include <memory>
#include <span>
#include <stdexcept>
#include <thread>
#include <vector>

namespace gradsync::tools {
namespace {

using transport::Mesh;
using transport::Operation;
using transport::PeerId;

constexpr uint64_t kExactTag = ~uint64_t{0};
// A data tag is the transfer's number above 16 bits of piece number; these no data tag is.
constexpr uint64_t kReceivedTag = uint64_t{1} << 63;
constexpr uint64_t kLastWordTag = kReceivedTag | 1;
constexpr uint64_t kMaxPieces = uint64_t{1} << 16;
constexpr uint64_t kTurnsPerClockRead = 1024;

uint64_t data_tag(uint64_t transfer, uint64_t piece) {
  return transfer << 16 | piece;
}

// What byte `offset` of every transfer holds: written, a period (251) no power-of-two piece
// divides, so that a piece landing in another's place shows; untouched, zero.
uint8_t expected_byte(uint64_t offset, SendMemory memory) {
  return memory == SendMemory::kWritten ? static_cast<uint8_t>(offset % 251) : 0;
}

void check_deadline(Clock::time_point deadline, const std::string& what) {
  if (Clock::now() > deadline) throw std::runtime_error(what + " within --timeout-s");
}

void check_status(const Operation& operation, const char* what) {
  if (operation.status() != UCS_OK) {
    throw std::runtime_error(
        fmt::format("{} failed: {}", what, ucs_status_string(operation.status())));
  }
}

// One transfer each way this side takes part in: `out` to `send_to`, `in` from the peer.
void run_transfer(Mesh& mesh, std::optional<PeerId> send_to, const uint8_t* out, uint8_t* in,
                  uint64_t transfer, const TransferSettings& settings) {
  const uint64_t pieces = (settings.bytes + settings.piece_bytes - 1) / settings.piece_bytes;
  const auto bytes_of = [&](uint64_t piece) {
    return std::min(settings.piece_bytes, settings.bytes - piece * settings.piece_bytes);
  };
  std::vector<Operation> receives;
  if (in != nullptr) {
    receives.reserve(pieces);
    for (uint64_t piece = 0; piece < pieces; ++piece) {
      receives.push_back(mesh.receive(data_tag(transfer, piece), kExactTag,
                                      in + piece * settings.piece_bytes, bytes_of(piece)));
    }
  }
  std::deque<Operation> sends;
  uint64_t next = send_to ? 0 : pieces;
  size_t received = 0;
  uint64_t turns = 0;
  while (next < pieces || !sends.empty() || received < receives.size()) {
    while (!sends.empty() && sends.front().done()) {
      check_status(sends.front(), "a send");
      sends.pop_front();
    }
    while (next < pieces && sends.size() < settings.pieces_ahead) {
      sends.push_back(mesh.send(*send_to, data_tag(transfer, next),
                                out + next * settings.piece_bytes, bytes_of(next)));
      ++next;
    }
    while (received < receives.size() && receives[received].done()) {
      check_status(receives[received], "a receive");
      ++received;
    }
    mesh.progress();
    // Now and then: reading the clock on every turn costs the loop a few percent.
    if (++turns % kTurnsPerClockRead == 0) {
      check_deadline(settings.deadline, fmt::format("transfer {} did not finish", transfer));
    }
  }
}

}  // namespace

std::vector<PeerId> connect_all(const std::vector<Mesh*>& meshes, const std::string& address,
                                Clock::time_point deadline) {
  std::vector<PeerId> peers;
  peers.reserve(meshes.size());
  for (Mesh* mesh : meshes) peers.push_back(mesh->connect(address));
  const auto accepted = [&] {
    for (size_t m = 0; m < meshes.size(); ++m) {
      if (!meshes[m]->authenticated(peers[m])) return false;
    }
    return true;
  };
  while (!accepted()) {
    for (size_t m = 0; m < meshes.size(); ++m) {
      Mesh& mesh = *meshes[m];
      mesh.progress();
      for (const PeerId failed : mesh.take_failed_peers()) {
        if (failed != peers[m]) continue;
        // The other side may not listen yet: it starts when it starts.
        check_deadline(deadline, fmt::format("no connection to {} (last: {})", address,
                                             mesh.failure(failed).empty() ? "refused or unreachable"
                                                                          : mesh.failure(failed)));
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        peers[m] = mesh.connect(address);
      }
    }
    check_deadline(deadline, "no connection to " + address);
  }
  return peers;
}

SideResult run_side(Mesh& mesh, std::optional<PeerId> send_to, bool receives,
                    const TransferSettings& settings) {
  if (settings.bytes == 0 || settings.piece_bytes == 0 || settings.transfers == 0 ||
      (settings.bytes + settings.piece_bytes - 1) / settings.piece_bytes > kMaxPieces) {
    throw std::invalid_argument(fmt::format(
        "a transfer needs bytes, a piece size that cuts it into at most {} pieces, and one "
        "timed transfer at least",
        kMaxPieces));
  }
  const ipc::Mapping out_memory =
      send_to ? ipc::Mapping::anonymous(settings.bytes) : ipc::Mapping();
  const std::span out(static_cast<uint8_t*>(out_memory.data()), out_memory.size());
  if (settings.send_memory == SendMemory::kWritten) {
    for (uint64_t offset = 0; offset < out.size(); ++offset) {
      out[offset] = expected_byte(offset, SendMemory::kWritten);
    }
  }
  std::vector<uint8_t> in(receives ? settings.bytes : 0);
  // The warm-up transfers, the timed ones, then one more whose bytes are checked: the receive
  // buffer is cleared for it after the clock stops, so that the check sees its bytes only.
  const uint32_t timed_end = settings.warmup + settings.transfers;
  Clock::time_point start = Clock::now();
  double seconds = 0;
  for (uint32_t transfer = 0; transfer <= timed_end; ++transfer) {
    if (transfer == settings.warmup) start = Clock::now();
    if (transfer == timed_end) {
      seconds = std::chrono::duration<double>(Clock::now() - start).count();
      std::fill(in.begin(), in.end(), uint8_t{0});
    }
    run_transfer(mesh, send_to, out.data(), receives ? in.data() : nullptr, transfer, settings);
  }
  for (uint64_t offset = 0; offset < in.size(); ++offset) {
    const uint8_t expected = expected_byte(offset, settings.send_memory);
    if (in[offset] != expected) {
      throw std::runtime_error(fmt::format(
          "byte {} of the checked transfer is {}, not {} (do both sides send from the same "
          "--send-memory?)",
          offset, in[offset], expected));
    }
  }
  return {seconds, uint64_t{settings.transfers} * settings.bytes};
}

void finish(Mesh& mesh, PeerId peer, Leaving leaving, bool sent, Clock::time_point deadline) {
  const auto say = [&](uint64_t tag) {
    mesh.post(peer, tag, std::make_shared<const std::vector<uint8_t>>(1, uint8_t{1}),
              transport::Lane::kControl);
  };
  const auto wait_for = [&](uint64_t tag, const char* what) {
    while (!mesh.poll_message(tag, kExactTag)) {
      if (mesh.failed(peer)) {
        throw std::runtime_error(
            fmt::format("the peer went before {}: {}", what, mesh.failure(peer)));
      }
      mesh.progress();
      check_deadline(deadline, fmt::format("the peer did not say {}", what));
    }
  };
  if (leaving == Leaving::kFirst) {
    say(kReceivedTag);
    wait_for(kLastWordTag, "its last word");
    // Handed to the network before the process ends.
    while (mesh.unfinished_sends() > 0 && Clock::now() < deadline) mesh.progress();
    return;
  }
  if (sent) wait_for(kReceivedTag, "it had everything");
  say(kLastWordTag);
  while (!mesh.failed(peer) && Clock::now() < deadline) mesh.progress();
}

}  // namespace gradsync::tools
