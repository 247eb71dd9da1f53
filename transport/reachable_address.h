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

// Throws std::runtime_error, naming the fix, where `listen` names a specific IPv4 address that
// no interface of this host has. The kernel lets a socket bind any of 127.0.0.0/8, but UCX
// finds a connection's device by its local address, so a daemon listening at, say, 127.0.0.2
// would accept every connection only to fail it ("Endpoint is not connected").
void check_listen_address(const std::string& listen);

}  // namespace gradsync::transport
