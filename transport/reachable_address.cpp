#include "transport/reachable_address.h"

#include "transport/mesh.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <unistd.h>

#include <array>
#include <memory>
#include <optional>
#include <stdexcept>

namespace gradsync::transport {
namespace {

bool usable(in_addr address) {
  const uint32_t host = ntohl(address.s_addr);
  return host != INADDR_ANY && (host >> 24) != 127;  // not unspecified, not 127.0.0.0/8
}

std::string text(in_addr address) {
  std::array<char, INET_ADDRSTRLEN> buffer{};
  ::inet_ntop(AF_INET, &address, buffer.data(), buffer.size());
  return buffer.data();
}

// Debian maps a host's own name to 127.0.1.1: hence the interfaces after it.
std::optional<in_addr> by_host_name() {
  std::array<char, 256> name{};
  if (::gethostname(name.data(), name.size() - 1) != 0) return std::nullopt;
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (::getaddrinfo(name.data(), nullptr, &hints, &found) != 0) return std::nullopt;
  const std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)> owned(found, &::freeaddrinfo);
  for (const addrinfo* a = found; a != nullptr; a = a->ai_next) {
    const in_addr address = reinterpret_cast<const sockaddr_in*>(a->ai_addr)->sin_addr;
    if (usable(address)) return address;
  }
  return std::nullopt;
}

// The first IPv4 address of an interface for which `wanted(address, flags)` holds; nullopt
// without one, or where the interfaces cannot be listed.
template <typename Predicate>
std::optional<in_addr> interface_address(Predicate wanted) {
  ifaddrs* found = nullptr;
  if (::getifaddrs(&found) != 0) return std::nullopt;
  const std::unique_ptr<ifaddrs, decltype(&::freeifaddrs)> owned(found, &::freeifaddrs);
  for (const ifaddrs* i = found; i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_INET) continue;
    const in_addr address = reinterpret_cast<const sockaddr_in*>(i->ifa_addr)->sin_addr;
    if (wanted(address, i->ifa_flags)) return address;
  }
  return std::nullopt;
}

std::optional<in_addr> by_interface() {
  return interface_address([](in_addr address, unsigned flags) {
    return (flags & IFF_UP) != 0 && (flags & IFF_LOOPBACK) == 0 && usable(address);
  });
}

}  // namespace

std::string reachable_address(const std::string& listen) {
  const sockaddr_in parsed = parse_host_port(listen);
  const std::string port = listen.substr(listen.rfind(':') + 1);
  if (parsed.sin_addr.s_addr != htonl(INADDR_ANY)) return listen;
  std::optional<in_addr> address = by_host_name();
  if (!address) address = by_interface();
  if (!address) {
    throw std::runtime_error("gradsyncd listens on " + listen +
                             " (every address) and this host has no IPv4 address other than "
                             "loopback: set `listen` to the address other nodes reach it at");
  }
  return text(*address) + ":" + port;
}

void check_listen_address(const std::string& listen) {
  const in_addr host = parse_host_port(listen).sin_addr;
  if (host.s_addr == htonl(INADDR_ANY)) return;
  const auto same = [host](in_addr address, unsigned) { return address.s_addr == host.s_addr; };
  if (interface_address(same)) return;
  throw std::runtime_error("cannot listen at " + listen + ": no interface of this host has " +
                           text(host) + " (UCX accepts connections only at an interface's " +
                           "address; on one host, 127.0.0.1 serves)");
}

}  // namespace gradsync::transport
