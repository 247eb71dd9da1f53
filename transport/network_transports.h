// Which network transports UCX has on this host, asked of UCT before the UCP context exists,
// so that the context's configuration can depend on them (mesh.cpp: bulk data over TCP).
#pragma once

#include <string>
#include <vector>

namespace gradsync::transport {

// The names of the UCT transports that reach other hosts ("tcp", "rc_mlx5", "ud_verbs", ...),
// each once, from every memory domain's network devices; shared memory and loop-back are left
// out. UCX_TLS does not narrow this list (it is read by UCP, later). Throws UcxError.
std::vector<std::string> network_transports();

// Whether every network transport is TCP: then the daemon sets where UCX's rendezvous starts
// (a handshake per message buys no remote memory access on TCP, only UCX's copies saved, which
// pays for large messages only); RDMA transports keep UCX's own choice.
bool tcp_only(const std::vector<std::string>& network_transports);

}  // namespace gradsync::transport
