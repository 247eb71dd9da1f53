// Where other nodes reach a daemon: what it tells a job's ranks, who publish it to the job's
// other nodes (the torch backend's rendezvous through its store).
#pragma once

#include <string>

namespace gradsync::transport {

// `listen` (HOST:PORT) as other hosts reach it. A specific IPv4 address is returned as it is.
// The unspecified address (0.0.0.0, listening on every interface) is replaced by one of this
// host's: the first IPv4 address its name resolves to that is not loopback, else the first
// non-loopback IPv4 address of an interface that is up. Throws std::runtime_error naming the
// fix (a specific `listen`) where there is none, and std::invalid_argument for a `listen` that
// is not HOST:PORT.
std::string reachable_address(const std::string& listen);

}  // namespace gradsync::transport
