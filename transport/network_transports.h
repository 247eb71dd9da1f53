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

// Whether bulk data should go eagerly, without a rendezvous handshake per message: asked for,
// and every network transport is TCP. TCP has no remote memory access, so UCX's rendezvous
// adds a round trip per message and copies anyway; RDMA transports keep their zero-copy
// rendezvous.
bool eager_bulk(bool eager_bulk_on_tcp, const std::vector<std::string>& network_transports);

}  // namespace gradsync::transport
